"""Client for the h3_pipeline Triton model: a small API over tritonclient.grpc streaming
(`client.api`) and the `generate` command (`python -m client.generate`)."""
from .api import GenerationResult, H3Client, H3Error

__all__ = ["GenerationResult", "H3Client", "H3Error"]
