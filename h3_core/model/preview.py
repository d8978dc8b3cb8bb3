"""The latent-to-RGB map of previews (h3_core.diffusion.engine.Engine.preview_frame): fitted to a
trained video VAE and shipped with its weights (h3_core.weights.checkpoint.load_preview), or a
fixed random map (RANDOM_PREVIEW) for weights without one."""

from dataclasses import dataclass

import torch

from ..config import VIDEO_LATENT_CHANNELS


@dataclass(frozen=True)
class PreviewMap:
    """The affine latent-to-RGB map of previews: rgb = latent @ projection + bias, per latent
    cell; rgb in [-1, 1] is shown as (rgb + 1) / 2 x 255. projection float32 [24, 3], bias
    float32 [3]. Fitted to a trained video VAE by training.preview_fit and shipped beside its
    weights (h3_core.weights.checkpoint.load_preview); RANDOM_PREVIEW without one."""

    projection: torch.Tensor
    bias: torch.Tensor

    def rgb(self, latent: torch.Tensor) -> torch.Tensor:
        """float32 [..., 24] normalised latents -> float32 [..., 3] colours (about [-1, 1]), on
        the latents' device."""
        return latent @ self.projection.to(latent.device) + self.bias.to(latent.device)


# Weights without a fitted map: a fixed random projection [24, 3] (seeded, scaled to keep values
# O(1)), no bias. Its preview is an arbitrary colour map of the latent: motion visible, colours
# meaningless.
RANDOM_PREVIEW = PreviewMap(
    torch.randn(VIDEO_LATENT_CHANNELS, 3, generator=torch.Generator().manual_seed(0)) / VIDEO_LATENT_CHANNELS**0.5,
    torch.zeros(3),
)
