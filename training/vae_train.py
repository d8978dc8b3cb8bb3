"""Train the video and audio VAEs (h3_core.model.vae) on the procedural clips; resumable.

    python -m training.vae_train --work build/demo/train --which video audio \
        --seconds 600 --total-seconds 600 [--device cpu]
    python -m training.vae_train --work DIR --which video --init VIDEO_VAE.safetensors \
        --seconds 480 --total-seconds 480 [--lr 1e-3] [--centre-weight 0.2]   # a fine-tune
    python -m training.vae_train --work build/demo/train --check   # the held-out round trip

Video: batches of latent frame groups (frames_to_groups of freshly rendered training clips,
12 x 64 x 96 in [-1, 1]); loss = L1 + MSE with the pixels of the shape weighted 5x (it covers
about 5 % of the frame), plus centre_weight (default CENTRE_WEIGHT) x the mean distance in pixels
(|dx| + |dy|) between each decoded frame's shape centre and the target frame's (shape_centres:
the centre of mass of the pixels, each weighted by how far its RGB is from the background beyond
CENTRE_THRESHOLD, so it is differentiable). The centre term makes the codec keep where the shape is
in every frame of a 4-frame group: without it the first and last frame of a group come out near
the group's middle, and the last frame of a clip is such a frame. That happens because the encoder
hardly codes which way the shape moves inside a group (a group and its 4 frames reversed encode a
few % of the latent RMS apart, under the latent noise below), and neither the reconstruction nor
the centre term alone gets it to (fine-tuning the shipped VAE with them left the round trip's last
frame 3.7 px off). So a third term, REVERSAL_WEIGHT x relu(REVERSAL_MARGIN - d) averaged over the
batch's moving groups, where d is the RMS of encoder(group) - encoder(the group reversed) over the
batch's latent RMS (reversal_distance reports a similar ratio: the median over 4-frame groups),
makes the encoder code the order above the noise; the decoder then learns to use it.

Audio: each stereo channel as a mono crop of 8,000 samples (10 latents, crops start at latent
boundaries); loss = 100 x MSE + L1 on the waveform. (A first try with a
multi-resolution STFT loss and gradient clipping at 1 collapsed to silence: the log-magnitude
gradients dominated and the clipping starved the waveform terms.) For both, the latent gets Gaussian
noise of 0.1 x the batch's latent RMS before decoding (and a 1e-4 * mean(z^2) penalty that only
pins the scale), so the decoder tolerates the DiT's imperfect latents. AdamW, lr 1e-3 with
warm-up + cosine over --total-seconds; gradient norm clipped at 1 for the video VAE only.
`--init FILE` starts from trained weights (e.g. weights/demo/video_vae.safetensors) and fine-tunes
encoder and decoder.

At the end the per-channel latents_mean / latents_std buffers are measured over 256 training
clips (so the DiT sees unit-scale latents) and the VAE is written to <work>/<which>_vae.safetensors.
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch

from h3_core.config import FRAMES_PER_LATENT
from h3_core.model.initialization import init_weights
from h3_core.model.vae import GROUP_FRAMES, AudioVAE, VideoVAE, frames_to_groups
from h3_core.weights.checkpoint import load_weights, save_weights

from . import data, measure
from .loop import Run

LATENT_NOISE, LATENT_PENALTY, FOREGROUND_WEIGHT = 0.1, 1e-4, 5.0
CENTRE_WEIGHT = 0.2  # loss per pixel of shape-centre distance (docs/demo_model.md compares 0.05)
REVERSAL_WEIGHT, REVERSAL_MARGIN = 1.0, 0.3  # the margin: 3 x the latent noise
CENTRE_THRESHOLD = 0.5  # L1 RGB distance from the background (in [-1, 1] units) below which a pixel weighs 0
AUDIO_INIT_GAIN = 3.0  # N(0, gain / fan_in): keeps the activation RMS about 0.5 through all 16 layers
AUDIO_CROP = 8000


def random_clips(rng: random.Random, n: int) -> list[data.Clip]:
    return [data.Clip(*rng.choice(data.TRAIN_COMBOS), seed=rng.randrange(2**31)) for _ in range(n)]


def video_groups(clips: list[data.Clip], device) -> torch.Tensor:
    """float32 [N * 7, 12, 64, 96] latent-frame groups of the clips."""
    frames = data.render_video(clips, device)
    return torch.cat([frames_to_groups(f) for f in frames])


def add_noise(z: torch.Tensor) -> torch.Tensor:
    return z + LATENT_NOISE * z.detach().pow(2).mean().sqrt() * torch.randn_like(z)


def shape_centres(frames: torch.Tensor) -> torch.Tensor:
    """The shape's centre in each frame: frames float [..., 3, H, W] in [-1, 1] -> float [..., 2]
    (x, y in pixels), the centre of mass of the pixels weighted by relu(L1 RGB distance from
    data.BACKGROUND - CENTRE_THRESHOLD); differentiable in `frames`. A frame without such pixels
    gives (0, 0)."""
    background = torch.tensor(data.BACKGROUND, device=frames.device) / 127.5 - 1.0
    weight = ((frames - background[:, None, None]).abs().sum(-3) - CENTRE_THRESHOLD).relu()  # [..., H, W]
    ys = torch.arange(frames.shape[-2], device=frames.device, dtype=frames.dtype)
    xs = torch.arange(frames.shape[-1], device=frames.device, dtype=frames.dtype)
    mass = weight.sum((-2, -1)).clamp(min=1e-6)
    cx = (weight.sum(-2) * xs).sum(-1) / mass
    cy = (weight.sum(-1) * ys).sum(-1) / mass
    return torch.stack([cx, cy], -1)


def video_loss(vae: VideoVAE, groups: torch.Tensor, centre_weight: float = CENTRE_WEIGHT) -> tuple[torch.Tensor, dict]:
    """The video VAE's training loss (module docstring) of float32 [N, 12, H, W] latent-frame
    groups in [-1, 1]: (loss scalar with gradient, float logs: "loss" the weighted L1 + MSE,
    "centre_px" the mean |dx| + |dy| of the frames' shape centres, "latent_rms", "reversal" the
    hinge of the reversal term)."""
    z = vae.encoder(groups)
    recon = vae.decoder(add_noise(z))
    background = torch.tensor(data.BACKGROUND, device=groups.device) / 127.5 - 1.0
    target = groups.view(groups.shape[0], 4, 3, *groups.shape[2:])
    moving = (target != target.flip(1)).flatten(1).any(1)  # 1-frame groups repeat their frame
    z_reversed = vae.encoder(target[moving].flip(1).flatten(1, 2))
    gap = (z[moving] - z_reversed).pow(2).mean((1, 2, 3)).sqrt() / z.detach().pow(2).mean().sqrt()
    reversal = (REVERSAL_MARGIN - gap).relu().mean() if gap.numel() else gap.sum()
    foreground = (target - background[None, None, :, None, None]).abs().amax(2, keepdim=True) > 0.1
    weight = (1 + (FOREGROUND_WEIGHT - 1) * foreground.float()).expand_as(target).reshape(groups.shape)
    err = recon - groups
    rec = (weight * (err.abs() + err**2)).mean()
    centre = (shape_centres(recon.view_as(target)) - shape_centres(target)).abs().sum(-1).mean()
    penalty = LATENT_PENALTY * z.pow(2).mean()
    logs = {"loss": rec.item(), "centre_px": centre.item(), "latent_rms": z.pow(2).mean().sqrt().item()}
    logs["reversal"] = reversal.item()
    return rec + centre_weight * centre + REVERSAL_WEIGHT * reversal + penalty, logs


def audio_crops(clips: list[data.Clip], rng: random.Random, device) -> torch.Tensor:
    """float32 [2N, 1, AUDIO_CROP] mono crops (both channels of each clip)."""
    audio = data.render_audio(clips, device).reshape(-1, data.AUDIO_SAMPLES)
    starts = [800 * rng.randrange((data.AUDIO_SAMPLES - AUDIO_CROP) // 800 + 1) for _ in range(audio.shape[0])]
    return torch.stack([a[s : s + AUDIO_CROP] for a, s in zip(audio, starts, strict=True)])[:, None, :]


def audio_loss(vae: AudioVAE, crops: torch.Tensor) -> tuple[torch.Tensor, dict]:
    z = vae.encoder(crops)
    recon = vae.decoder(add_noise(z))
    err = recon - crops
    mse, l1 = err.pow(2).mean(), err.abs().mean()
    penalty = LATENT_PENALTY * z.pow(2).mean()
    return 100 * mse + l1 + penalty, {
        "loss": (100 * mse + l1).item(),
        "wave_mse": mse.item(),
        "wave_l1": l1.item(),
        "latent_rms": z.pow(2).mean().sqrt().item(),
    }


@torch.no_grad()
def set_latent_stats(vae, which: str, device, n: int = 256) -> None:
    """Per-channel mean / std of the raw latents over n training clips -> the buffers."""
    rng = random.Random(12345)
    clips = random_clips(rng, n)
    zs = []
    for i in range(0, n, 32):
        part = clips[i : i + 32]
        if which == "video":
            zs.append(vae.encoder(video_groups(part, device)).transpose(0, 1).reshape(vae.latents_mean.shape[0], -1))
        else:
            audio = data.render_audio(part, device).reshape(-1, 1, data.AUDIO_SAMPLES)
            zs.append(vae.encoder(audio).transpose(0, 1).reshape(vae.latents_mean.shape[0], -1))
    z = torch.cat(zs, dim=1)
    vae.latents_mean.copy_(z.mean(1))
    vae.latents_std.copy_(z.std(1).clamp(min=1e-3))


def init_vae(vae, which: str, seed: int) -> None:
    """Video: init_weights (N(0, 1/fan_in)) with zero biases. Audio: N(0, 3/fan_in), zero
    biases, with a transposed conv's fan-in taken as in_channels x kernel / stride (what one
    output sample sees). With init_weights' N(0, 1/fan_in) over out_channels x kernel the
    signal shrank about 10x per transposed conv: the decoder started silent and, in a first
    try, still put out near-silence after 670 steps."""
    init_weights(vae, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.ConvTranspose1d)):
                module.bias.zero_()
                if which == "audio":
                    w = module.weight
                    if isinstance(module, torch.nn.ConvTranspose1d):
                        fan_in = w.shape[0] * w.shape[2] / module.stride[0]
                    else:
                        fan_in = w[0].numel()
                    w.copy_(torch.randn(w.shape, generator=generator) * (AUDIO_INIT_GAIN / fan_in) ** 0.5)


def train(
    which: str,
    work: Path,
    seconds: float,
    total_seconds: float,
    device: str,
    batch: int,
    lr: float = 1e-3,
    seed: int = 0,
    stats_clips: int = 256,
    init: Path | None = None,
    centre_weight: float = CENTRE_WEIGHT,
) -> Path:
    """Train (or resume, from <work>/<which>_vae_state-*) the `which` ("video" / "audio") VAE for
    `seconds` of `total_seconds` (module docstring); `init`: a weights file to start from instead
    of init_vae's random weights (a resumed state wins over it); `centre_weight`: video_loss's.
    Writes and returns <work>/<which>_vae.safetensors. Raises FileNotFoundError / ValueError as
    checkpoint.load_weights for a missing or mismatched `init`."""
    torch.manual_seed(seed)
    vae = (VideoVAE() if which == "video" else AudioVAE()).to(device)
    if init is None:
        init_vae(vae, which, seed + 1)
    else:
        load_weights(vae, init)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    run = Run(f"{which}_vae", work, vae, optimizer, seconds, total_seconds, lr, log_every=20)
    rng = random.Random(seed * 1000 + run.step)
    vae.train()
    while run.running():
        if which == "video":
            groups = video_groups(random_clips(rng, max(1, batch // 7 + 1)), device)
            groups = groups[torch.randperm(groups.shape[0], device=device)[:batch]]
            loss, logs = video_loss(vae, groups, centre_weight)
        else:
            loss, logs = audio_loss(vae, audio_crops(random_clips(rng, max(1, batch // 2)), rng, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if which == "video":
            torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        run.record(**logs)
    run.save()
    vae.eval()
    set_latent_stats(vae, which, device, stats_clips)
    out = work / f"{which}_vae.safetensors"
    save_weights(vae, out)
    print(f"[{which}_vae] {run.step} steps, {run.trained:.0f} s trained; wrote {out}", flush=True)
    return out


@torch.no_grad()
def reversal_distance(video_vae: VideoVAE, clips: list[data.Clip]) -> float:
    """How much the encoder codes the motion inside a latent group: over the 4-frame groups of the
    clips (frames_to_groups), the median RMS of encoder(group) - encoder(the group's 4 frames in
    reverse order), relative to the RMS of all the groups' latents (raw encoder output, before
    latents_mean / latents_std). 0 when the encoder ignores the frames' order."""
    device = video_vae.latents_mean.device
    groups = video_groups(clips, device)
    groups = groups.view(len(clips), -1, 4, 3, *groups.shape[2:])[
        :, [k for k in range(groups.shape[0] // len(clips)) if FRAMES_PER_LATENT[k % 5] == GROUP_FRAMES]
    ]
    groups = groups.flatten(0, 1)  # [N * 5, 4, 3, H, W]: the latents that code 4 frames
    z = video_vae.encoder(groups.flatten(1, 2))
    z_reversed = video_vae.encoder(groups.flip(1).flatten(1, 2))
    per_group = (z - z_reversed).pow(2).mean((1, 2, 3)).sqrt()
    return (per_group.median() / z.pow(2).mean().sqrt()).item()


@torch.no_grad()
def roundtrip_report(work: Path, device, clips: list[data.Clip]) -> dict:
    """Encode and decode `clips` with the trained VAEs of `work` (video_vae.safetensors,
    audio_vae.safetensors): {"attribute_accuracy": measure.score's fraction right, "n_clips",
    "video_psnr_db": mean PSNR (dB) of the whole videos, "keyframe_psnr_db", "first_centre_px",
    "first_within_3px", "last_centre_px", "last_within_3px": evaluate_conditions.vae_round_trip's
    of the first and last frames (median px, fraction within 3 px), "reversal_distance"}."""
    from h3_core.config import audio_num_samples

    from .evaluate_conditions import vae_round_trip

    video_vae, audio_vae = VideoVAE().to(device), AudioVAE().to(device)
    load_weights(video_vae, work / "video_vae.safetensors")
    load_weights(audio_vae, work / "audio_vae.safetensors")
    video_vae.eval(), audio_vae.eval()
    frames, audio = data.render_video(clips, device), data.render_audio(clips, device)
    right = total = 0
    psnr = []
    for clip, f, a in zip(clips, frames, audio, strict=True):
        f2 = video_vae.decode(video_vae.encode(f))
        a2 = audio_vae.decode(audio_vae.encode(a))[:, : audio_num_samples(data.NUM_FRAMES)]
        correct = measure.score(clip, f2.cpu().numpy(), a2.cpu().numpy())["correct"]
        right, total = right + sum(correct.values()), total + len(correct)
        mse = (f2.float() - f.float()).pow(2).mean().item()
        psnr.append(10 * torch.log10(torch.tensor(255.0**2 / max(mse, 1e-9))).item())
    keyframes = vae_round_trip(video_vae, clips)
    return {
        "attribute_accuracy": right / total,
        "n_clips": len(clips),
        "video_psnr_db": round(sum(psnr) / len(psnr), 4),
        "keyframe_psnr_db": keyframes["psnr_db"],
        **{k: keyframes[k] for k in ("first_centre_px", "first_within_3px", "last_centre_px", "last_within_3px")},
        "reversal_distance": round(reversal_distance(video_vae, clips), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("build/demo/train"))
    parser.add_argument("--which", nargs="+", default=["video", "audio"], choices=["video", "audio"])
    parser.add_argument("--seconds", type=float, default=600.0, help="training seconds of this run (each VAE)")
    parser.add_argument("--total-seconds", type=float, default=600.0, help="training seconds over all runs (each VAE)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16, help="video: groups per step; audio: mono crops per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--init", type=Path, help="weights file to fine-tune from (one --which)")
    parser.add_argument(
        "--centre-weight", type=float, default=CENTRE_WEIGHT, help="video loss per pixel of shape-centre distance"
    )
    parser.add_argument("--check", action="store_true", help="only report the round trip of the held-out clips")
    args = parser.parse_args()
    if args.init is not None and len(args.which) != 1:
        parser.error(f"--init takes one --which, got {args.which}")
    torch.set_flush_denormal(True)
    if args.check:
        print(json.dumps(roundtrip_report(args.work, args.device, data.held_out_clips())))
        return
    for which in args.which:
        start = time.monotonic()
        train(
            which,
            args.work,
            args.seconds,
            args.total_seconds,
            args.device,
            args.batch,
            lr=args.lr,
            init=args.init,
            centre_weight=args.centre_weight,
        )
        print(f"[{which}_vae] run took {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
