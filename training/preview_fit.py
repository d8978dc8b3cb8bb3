"""Fit the preview's latent-to-RGB map to a trained video VAE and write it beside the weights.

    python -m training.preview_fit --weights weights/demo

h3_dit previews a request without a VAE (h3_core.diffusion.engine.Engine.preview_frame): the
middle latent frame of the clean estimate, mapped per latent cell to RGB by an affine map
rgb = latent @ projection + bias. This fits that map by least squares (with a bias: a [25, 3]
solution of [latent, 1] @ W = rgb) on rendered training clips (training.data, seeded): the
latents are the VAE's normalised encoding, float32 [24, T_lat, 4, 6]; the targets are the clip's
frames in [-1, 1] averaged over each 16 x 16 pixel block and over the frames of each latent's
group (h3_core.model.vae.frames_to_groups: a 1-frame group repeats its frame). The error is the
root mean square over the held-out clips' latent cells and channels, in 8-bit levels (x 127.5),
for the fit and for the fixed random map used without one (RANDOM_PREVIEW): over all cells, and
over the shape's cells (a target more than 0.1 from the background in some channel).
Writes --weights/preview.safetensors (h3_core.weights.checkpoint.PREVIEW_FILE): "projection"
float32 [24, 3], "bias" float32 [3].
"""

import argparse
import json
from pathlib import Path

import torch

from h3_core.config import VIDEO_LATENT_CHANNELS, VIDEO_SPATIAL_DOWNSAMPLE
from h3_core.diffusion.engine import RANDOM_PREVIEW, PreviewMap
from h3_core.model.vae import GROUP_FRAMES, VideoVAE, frames_to_groups
from h3_core.weights.checkpoint import PREVIEW_FILE, VIDEO_VAE_FILE, load_weights, save_preview

from . import data


def cells(clips: list[data.Clip], vae: VideoVAE) -> tuple[torch.Tensor, torch.Tensor]:
    """Per latent cell of every clip: the VAE latent float32 [M, 24] and the target colour
    float32 [M, 3] in [-1, 1] (block and group mean, module docstring); M = clips x 7 x 4 x 6."""
    latents, colours = [], []
    step = VIDEO_SPATIAL_DOWNSAMPLE
    for frames in data.render_video(clips):
        latent = vae.encode(frames)  # [24, T_lat, Hl, Wl]
        groups = frames_to_groups(frames)  # [T_lat, 12, H, W]
        t, _, h, w = groups.shape
        colour = groups.view(t, GROUP_FRAMES, 3, h // step, step, w // step, step).mean((1, 4, 6))
        latents.append(latent.permute(1, 2, 3, 0).reshape(-1, VIDEO_LATENT_CHANNELS))
        colours.append(colour.permute(0, 2, 3, 1).reshape(-1, 3))
    return torch.cat(latents), torch.cat(colours)


def fit(latents: torch.Tensor, colours: torch.Tensor) -> PreviewMap:
    """Least squares [latents, 1] @ W = colours (float64), W [25, 3] split into the map's
    projection [24, 3] and bias [3] (float32)."""
    design = torch.cat([latents, torch.ones(len(latents), 1)], 1).double()
    solution = torch.linalg.lstsq(design, colours.double(), driver="gelsd").solution.float()
    return PreviewMap(solution[:-1].contiguous(), solution[-1].contiguous())


def rms_levels(preview: PreviewMap, latents: torch.Tensor, colours: torch.Tensor) -> float:
    """Root mean square of preview.rgb(latents) - colours, in 8-bit levels (x 127.5)."""
    return float((preview.rgb(latents) - colours).pow(2).mean().sqrt() * 127.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"))
    parser.add_argument("--variants", type=int, default=2, help="clips per training combination")
    args = parser.parse_args()
    torch.manual_seed(0)
    vae = VideoVAE()
    load_weights(vae, args.weights / VIDEO_VAE_FILE)
    vae.eval()
    preview = fit(*cells(data.train_clips(args.variants, seed=1), vae))
    latents, colours = cells(data.held_out_clips(), vae)
    background = torch.tensor(data.BACKGROUND) / 127.5 - 1.0
    shape = (colours - background).abs().amax(1) > 0.1
    save_preview(preview, args.weights / PREVIEW_FILE)
    report = {"train_clips": len(data.TRAIN_COMBOS) * args.variants, "held_out_clips": len(data.HELD_OUT)}
    for name, candidate in (("fit", preview), ("random", RANDOM_PREVIEW)):
        report[f"rms_levels_{name}"] = round(rms_levels(candidate, latents, colours), 2)
        report[f"rms_levels_{name}_shape_cells"] = round(rms_levels(candidate, latents[shape], colours[shape]), 2)
    print(f"wrote {args.weights / PREVIEW_FILE}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
