"""Client for the h3_pipeline Triton model: a small API over tritonclient.grpc streaming
(`client.api`) and the `generate` command (`python -m client.generate`). Needs no torch:
`pip install "h3-triton[client]"` installs what it uses.

The names below come from client.api at their first use (PEP 562), so that importing the package
loads no tritonclient: `python -m client.generate` installs its Ctrl-C handler before that import.
"""

__all__ = ["GenerationResult", "H3Client", "H3Error"]


def __getattr__(name: str):
    """client.GenerationResult, client.H3Client, client.H3Error: client.api's; raises
    AttributeError for any other name."""
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
