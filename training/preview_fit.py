"""Fit the preview's latent-to-RGB map to a trained video VAE and write it beside the weights.

    python -m training.preview_fit --weights weights/demo [--neighbourhood 5] [--patch 8] \
        [--variants 4] [--no-products] [--no-save]

h3_dit previews a request without a VAE (h3_core.diffusion.engine.Engine.preview_frame): the
middle latent frame of the clean estimate, each latent cell mapped to a p x p RGB patch from the
features of its n x n neighbourhood (h3_core.model.preview.PreviewMap: the 24 channels, and with
--products their products z_i z_j per cell). This fits that map by ridge least squares (normal
equations with RIDGE x the mean of their diagonal added, solved by torch.linalg.lstsq in float64)
on rendered training clips (training.data, seeded): the inputs are the VAE's normalised
encoding, float32 [24, T_lat, 4, 6]; the targets are each latent's group of frames averaged
(h3_core.model.vae.frames_to_groups: a 1-frame group repeats its frame), in [-1, 1], averaged
over (16 / p) x (16 / p) pixel blocks.

On the 36 held-out clips (data.HELD_OUT) it measures the previews of every latent frame of the
VAE's encoding as h3_dit shows them (uint8, the map at its stored float16 precision), against
the group-mean frames at full resolution (the preview scaled up by 16 / p, nearest): the root
mean square error in 8-bit levels over all pixels and over the shape's pixels (a target more
than 0.1 from the background in some channel), and the evaluation's colour and direction
classifiers (training.measure.measure_video) on each clip's 7 preview frames: the fraction of
clips whose preview has the clip's colour / direction. The same for the fixed random map used
without a fitted one (RANDOM_PREVIEW). Writes --weights/preview.safetensors
(h3_core.weights.checkpoint.PREVIEW_FILE) unless --no-save. The last line printed is the JSON
report.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from h3_core.config import VIDEO_LATENT_CHANNELS, VIDEO_SPATIAL_DOWNSAMPLE
from h3_core.model.preview import PRODUCTS, RANDOM_PREVIEW, PreviewMap, cell_features
from h3_core.model.vae import GROUP_FRAMES, VideoVAE, frames_to_groups
from h3_core.weights.checkpoint import PREVIEW_FILE, VIDEO_VAE_FILE, load_weights, save_preview

from . import data, measure

RIDGE = 1e-4  # relative to the mean diagonal of the normal equations
CHUNK = 128  # latent frames per block of least-squares rows (memory)


def encode(clips: list[data.Clip], vae: VideoVAE) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE latents float32 [N, T_lat, 24, Hl, Wl] of the rendered clips and the mean of each
    latent's group of frames, float32 [N, T_lat, 3, H, W] in [-1, 1]."""
    latents, frames = [], []
    for video in data.render_video(clips):
        latents.append(vae.encode(video).transpose(0, 1))
        groups = frames_to_groups(video)
        frames.append(groups.view(len(groups), GROUP_FRAMES, 3, *groups.shape[2:]).mean(1))
    return torch.stack(latents), torch.stack(frames)


def design(latents: torch.Tensor, neighbourhood: int, num_features: int) -> torch.Tensor:
    """The least-squares rows of latent frames float32 [B, 24, Hl, Wl]: float64 [B * Hl * Wl,
    num_features * n^2 + 1], each cell's neighbourhood features (cell_features, zero-padded) in
    the order of PreviewMap's weight [.., C, n, n], then 1 (the bias)."""
    features = cell_features(latents, num_features)
    rows = F.unfold(features, neighbourhood, padding=neighbourhood // 2).transpose(1, 2).flatten(0, 1)
    return torch.cat([rows, torch.ones(len(rows), 1)], 1).double()


def patches(frames: torch.Tensor, patch: int) -> torch.Tensor:
    """The targets of frames float32 [B, 3, H, W]: float64 [B * Hl * Wl, 3 p^2], each latent
    cell's 16 x 16 pixels averaged over (16 / p)-pixel blocks, ordered (RGB, row, column) as
    PreviewMap's weight [3, p, p, ...]."""
    pooled = F.avg_pool2d(frames, VIDEO_SPATIAL_DOWNSAMPLE // patch)  # [B, 3, Hl * p, Wl * p]
    batch, _, height, width = pooled.shape
    cells = pooled.view(batch, 3, height // patch, patch, width // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return cells.reshape(-1, 3 * patch * patch).double()


def fit(latents: torch.Tensor, frames: torch.Tensor, neighbourhood: int, patch: int, products: bool) -> PreviewMap:
    """Ridge least squares (module docstring) of the map from latents float32 [N, T_lat, 24,
    Hl, Wl] to the frames float32 [N, T_lat, 3, H, W] (encode's), for neighbourhood n (odd),
    patch p (dividing 16) and the features with or without products. The map's tensors are
    rounded to float16, the precision save_preview stores.

    Raises ValueError for an even neighbourhood or a patch not dividing 16."""
    if neighbourhood % 2 == 0 or neighbourhood < 1:
        raise ValueError(f"neighbourhood must be odd and positive, got {neighbourhood}")
    if patch < 1 or VIDEO_SPATIAL_DOWNSAMPLE % patch:
        raise ValueError(f"patch must divide {VIDEO_SPATIAL_DOWNSAMPLE}, got {patch}")
    num_features = VIDEO_LATENT_CHANNELS + (PRODUCTS if products else 0)
    size = num_features * neighbourhood**2 + 1
    gram = torch.zeros(size, size, dtype=torch.float64)
    moment = torch.zeros(size, 3 * patch * patch, dtype=torch.float64)
    for chunk, frame_chunk in zip(latents.flatten(0, 1).split(CHUNK), frames.flatten(0, 1).split(CHUNK), strict=True):
        rows = design(chunk, neighbourhood, num_features)
        gram += rows.T @ rows
        moment += rows.T @ patches(frame_chunk, patch)
    gram += RIDGE * gram.diagonal().mean() * torch.eye(size, dtype=torch.float64)
    solution = torch.linalg.lstsq(gram, moment).solution.T.half().float()  # [3 p^2, size]
    weight = solution[:, :-1].reshape(3, patch, patch, num_features, neighbourhood, neighbourhood)
    return PreviewMap(weight.contiguous(), solution[:, -1].reshape(3, patch, patch).contiguous())


def previews(preview: PreviewMap, latents: torch.Tensor) -> torch.Tensor:
    """uint8 [N, T_lat, Hl * p, Wl * p, 3]: every latent frame of latents float32 [N, T_lat, 24,
    Hl, Wl] as preview_frame shows it."""
    images = [preview.rgb(latent) for latent in latents.flatten(0, 1)]
    shown = ((torch.stack(images) * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
    return shown.view(*latents.shape[:2], *shown.shape[1:])


def scores(preview: PreviewMap, clips: list[data.Clip], latents: torch.Tensor, frames: torch.Tensor) -> dict:
    """The module docstring's measurements of `preview` on the clips (encode's latents and
    frames): {"rms_levels", "rms_levels_shape", "colour", "direction"} (levels to 0.01, fractions
    to 0.001)."""
    shown = previews(preview, latents)
    scale = VIDEO_SPATIAL_DOWNSAMPLE // preview.patch
    full = shown.repeat_interleave(scale, 2).repeat_interleave(scale, 3).permute(0, 1, 4, 2, 3).float()
    target = (frames + 1.0) * 127.5
    background = torch.tensor(data.BACKGROUND, dtype=torch.float32)[:, None, None]
    shape = ((target - background).abs() > 0.1 * 127.5).any(2, keepdim=True).expand_as(target)
    error = (full - target).pow(2)
    measured = [measure.measure_video(clip_previews) for clip_previews in shown.numpy()]
    return {
        "rms_levels": round(float(error.mean().sqrt()), 2),
        "rms_levels_shape": round(float(error[shape].mean().sqrt()), 2),
        "colour": round(float(np.mean([m["colour"] == c.colour for m, c in zip(measured, clips, strict=True)])), 3),
        "direction": round(
            float(np.mean([m["direction"] == c.direction for m, c in zip(measured, clips, strict=True)])), 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"))
    parser.add_argument("--variants", type=int, default=4, help="clips per training combination")
    parser.add_argument("--neighbourhood", type=int, default=5, help="n: latent cells per side around a cell (odd)")
    parser.add_argument("--patch", type=int, default=8, help="p: preview pixels per latent cell per side (divides 16)")
    parser.add_argument("--products", action=argparse.BooleanOptionalAction, default=True, help="z_i z_j features")
    parser.add_argument("--save", action=argparse.BooleanOptionalAction, default=True, help="write the map")
    args = parser.parse_args()
    torch.manual_seed(0)
    vae = VideoVAE()
    load_weights(vae, args.weights / VIDEO_VAE_FILE)
    vae.eval()
    preview = fit(*encode(data.train_clips(args.variants, seed=1), vae), args.neighbourhood, args.patch, args.products)
    held_out = data.held_out_clips()
    latents, frames = encode(held_out, vae)
    if args.save:
        save_preview(preview, args.weights / PREVIEW_FILE)
        print(f"wrote {args.weights / PREVIEW_FILE}")
    report = {
        "train_clips": len(data.TRAIN_COMBOS) * args.variants,
        "held_out_clips": len(held_out),
        "weight": list(preview.weight.shape),
        "fit": scores(preview, held_out, latents, frames),
        "random": scores(RANDOM_PREVIEW, held_out, latents, frames),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
