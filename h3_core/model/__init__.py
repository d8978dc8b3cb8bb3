"""The H3 DiT: attention backends, RoPE and the transformer (h3_spec §1)."""

from .dit import H3DiT

__all__ = ["H3DiT"]
