"""The networks: the H3 DiT (blocks, attention backends, RoPE, AdaLN, refiner) and the PackedBatch it
reads, the VAEs (encode, decode, decode_clip), the text encoder, seeded initialisation (docs/model.md §1,
§4). Imports nothing from diffusion/, weights/, serving/ or parallel/."""

from .dit import H3DiT

__all__ = ["H3DiT"]
