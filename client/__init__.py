"""Client for the h3_pipeline Triton model: a small API over tritonclient.grpc streaming
(`client.api`) and the `generate` command (`python -m client.generate`). Needs no torch:
`pip install "h3-triton[client]"` installs what it uses."""

from .api import GenerationResult, H3Client, H3Error

__all__ = ["GenerationResult", "H3Client", "H3Error"]
