"""The latent-to-RGB map of previews (h3_core.diffusion.engine.Engine.preview_frame): fitted to a
trained video VAE and shipped with its weights (h3_core.weights.checkpoint.load_preview), or a
fixed random map (RANDOM_PREVIEW) for weights without one."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import VIDEO_LATENT_CHANNELS

# The quadratic features of a latent cell: the products z_i z_j (i <= j) of its 24 channels, in
# torch.triu_indices order.
PRODUCTS = VIDEO_LATENT_CHANNELS * (VIDEO_LATENT_CHANNELS + 1) // 2  # 300
FEATURES = (VIDEO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS + PRODUCTS)  # affine, quadratic: 24, 324


def cell_features(latent: torch.Tensor, num_features: int) -> torch.Tensor:
    """The per-cell features of a map: float32 [..., 24, Hl, Wl] latents -> [..., num_features,
    Hl, Wl]: the 24 channels (num_features 24), then their products z_i z_j, i <= j
    (num_features 324).

    Raises ValueError for another num_features (allowed: FEATURES)."""
    if num_features not in FEATURES:
        raise ValueError(f"preview features must be one of {FEATURES}, got {num_features}")
    if num_features == VIDEO_LATENT_CHANNELS:
        return latent
    i, j = torch.triu_indices(VIDEO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS, device=latent.device)
    return torch.cat([latent, latent[..., i, :, :] * latent[..., j, :, :]], -3)


@dataclass(frozen=True)
class PreviewMap:
    """The latent-to-RGB map of previews: each latent cell becomes a p x p RGB patch, a map of the
    features (cell_features) of the n x n cells around it (zero-padded at the borders) plus a
    bias, i.e. a 2D convolution (kernel n x n, padding n // 2) of the feature map to 3 p^2
    channels, rearranged to pixels (pixel shuffle). rgb in [-1, 1] is shown as (rgb + 1) / 2 x 255.

    weight: float32 [3, p, p, C, n, n] (C = 24: affine in the latent; C = 324: with the cell's
    channel products), bias: float32 [3, p, p]; n odd. n, p and C are read from the shapes, so
    the per-cell affine map of RANDOM_PREVIEW is the n = p = 1, C = 24 case. Fitted to a trained
    video VAE by least squares (training.preview_fit) and shipped beside its weights
    (h3_core.weights.checkpoint.load_preview)."""

    weight: torch.Tensor
    bias: torch.Tensor

    @property
    def patch(self) -> int:
        """p: the pixels per latent cell along each side of the preview."""
        return self.weight.shape[1]

    def rgb(self, latent: torch.Tensor) -> torch.Tensor:
        """float32 [24, Hl, Wl] normalised latent frame -> float32 [Hl * p, Wl * p, 3] colours
        (about [-1, 1]), on the latent's device."""
        _, p, _, channels, n, _ = self.weight.shape
        features = cell_features(latent, channels)[None]  # [1, C, Hl, Wl]
        kernel = self.weight.to(latent.device).reshape(3 * p * p, channels, n, n)
        patches = F.conv2d(features, kernel, self.bias.to(latent.device).reshape(-1), padding=n // 2)
        return F.pixel_shuffle(patches, p)[0].permute(1, 2, 0)


# Weights without a fitted map: a fixed random projection of the 24 channels to RGB per cell
# (seeded, scaled to keep values O(1)), no bias. Its preview is an arbitrary colour map of the
# latent at latent resolution: motion visible, colours meaningless.
RANDOM_PREVIEW = PreviewMap(
    (torch.randn(VIDEO_LATENT_CHANNELS, 3, generator=torch.Generator().manual_seed(0)) / VIDEO_LATENT_CHANNELS**0.5)
    .T.reshape(3, 1, 1, VIDEO_LATENT_CHANNELS, 1, 1)
    .contiguous(),
    torch.zeros(3, 1, 1),
)
