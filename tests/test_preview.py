"""The previews' latent-to-RGB map (h3_core.model.preview.PreviewMap): its least-squares fit
(training.preview_fit) recovers a known map, the file round trip, the file's shape checks and the
random map of weights without one."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from h3_core.model.preview import RANDOM_PREVIEW, PreviewMap
from h3_core.weights.checkpoint import PREVIEW_FILE, load_preview, save_preview
from training import preview_fit


def test_the_fit_recovers_a_map_from_its_previews_and_the_file_keeps_it(tmp_path):
    """Frames rendered by a known map (3 x 3 cells of the 24 channels, 2 x 2 px per cell, each
    pixel an 8 x 8 block) from random latents: the fit gives back the known map (to the float16
    rounding and the ridge), the same map twice, and save / load keep it exactly. (The channel
    products' features: tests/test_demo_model.py checks the shipped map against the formula.)"""
    generator = torch.Generator().manual_seed(0)
    known = PreviewMap(
        torch.randn(3, 2, 2, 24, 3, 3, generator=generator) * 0.01, torch.randn(3, 2, 2, generator=generator) * 0.1
    )
    latents = torch.randn(8, 7, 24, 4, 6, generator=generator)  # 1,344 cells for 217 unknowns
    rgb = torch.stack([known.rgb(latent) for latent in latents.flatten(0, 1)])  # [56, 8, 12, 3]
    frames = F.interpolate(rgb.permute(0, 3, 1, 2), scale_factor=8, mode="nearest").view(8, 7, 3, 64, 96)
    fitted = preview_fit.fit(latents, frames, neighbourhood=3, patch=2, products=False)
    assert fitted.weight.shape == (3, 2, 2, 24, 3, 3) and fitted.bias.shape == (3, 2, 2)
    torch.testing.assert_close(fitted.weight, known.weight, rtol=0, atol=1e-3)
    torch.testing.assert_close(fitted.bias, known.bias, rtol=0, atol=1e-3)
    again = preview_fit.fit(latents, frames, neighbourhood=3, patch=2, products=False)
    assert torch.equal(again.weight, fitted.weight) and torch.equal(again.bias, fitted.bias)
    assert torch.equal(fitted.weight, fitted.weight.half().float())  # already at the stored precision
    save_preview(fitted, tmp_path / PREVIEW_FILE)
    loaded = load_preview(tmp_path)
    assert torch.equal(loaded.weight, fitted.weight) and torch.equal(loaded.bias, fitted.bias)
    assert loaded.patch == 2 and loaded.rgb(latents[0, 0]).shape == (8, 12, 3)


def test_the_fit_checks_its_sizes():
    latents, frames = torch.zeros(1, 2, 24, 4, 6), torch.zeros(1, 2, 3, 64, 96)
    with pytest.raises(ValueError, match="neighbourhood must be odd and positive, got 2"):
        preview_fit.fit(latents, frames, neighbourhood=2, patch=4, products=False)
    with pytest.raises(ValueError, match="patch must divide 16, got 3"):
        preview_fit.fit(latents, frames, neighbourhood=1, patch=3, products=False)


@pytest.mark.parametrize(
    "tensors, error",
    [
        (
            {"weight": torch.zeros(3, 2, 2, 25, 1, 1), "bias": torch.zeros(3, 2, 2)},
            "must be [3, p, p, C, n, n] with C in (24, 324), n odd, got (3, 2, 2, 25, 1, 1)",
        ),
        (
            {"weight": torch.zeros(3, 2, 2, 24, 2, 2), "bias": torch.zeros(3, 2, 2)},
            "must be [3, p, p, C, n, n] with C in (24, 324), n odd, got (3, 2, 2, 24, 2, 2)",
        ),
        (
            {"projection": torch.zeros(24, 3), "bias": torch.zeros(3)},
            "must be [3, p, p, C, n, n] with C in (24, 324), n odd, got ()",
        ),
        (
            {"weight": torch.zeros(3, 2, 2, 24, 1, 1), "bias": torch.zeros(3)},
            "tensor 'bias' has shape (3,), expected (3, 2, 2)",
        ),
    ],
)
def test_a_preview_file_of_other_shapes_is_refused(tmp_path, tensors, error):
    save_file(tensors, tmp_path / PREVIEW_FILE)
    with pytest.raises(ValueError) as raised:
        load_preview(tmp_path)
    assert error in str(raised.value)


def test_the_random_map_is_a_per_cell_projection_at_latent_resolution():
    """RANDOM_PREVIEW: 1 x 1 cells, 1 px per cell, no products, no bias: rgb = latent @ a seeded
    [24, 3] projection."""
    projection = torch.randn(24, 3, generator=torch.Generator().manual_seed(0)) / 24**0.5
    latent = torch.randn(24, 4, 6, generator=torch.Generator().manual_seed(1))
    rgb = RANDOM_PREVIEW.rgb(latent)
    assert RANDOM_PREVIEW.patch == 1 and rgb.shape == (4, 6, 3)
    torch.testing.assert_close(rgb, latent.permute(1, 2, 0) @ projection, rtol=0, atol=1e-6)
