"""Train the video and audio VAEs (h3_core.vae) on the procedural clips; resumable.

    python -m h3_core.train.vae_train --work build/demo/train --which video audio \
        --seconds 600 --total-seconds 600 [--device cpu]

Video: batches of latent frame groups (frames_to_groups of freshly rendered training clips,
12 x 64 x 96 in [-1, 1]); loss = L1 + MSE with the pixels of the shape weighted 5x (it covers
about 5 % of the frame). Audio: each stereo channel as a mono crop of 8,000 samples (10 latents,
crops start at latent boundaries); loss = L1 on the waveform + multi-resolution STFT loss
(linear and log magnitudes, FFT sizes 256 / 512 / 1024). For both, the latent gets Gaussian
noise of 0.1 x the batch's latent RMS before decoding (and a 1e-4 * mean(z^2) penalty that only
pins the scale), so the decoder tolerates the DiT's imperfect latents. AdamW, lr 1e-3 with
warm-up + cosine over --total-seconds.

At the end the per-channel latents_mean / latents_std buffers are measured over 256 training
clips (so the DiT sees unit-scale latents) and the VAE is written to <work>/<which>_vae.safetensors.
"""
import argparse
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoint import init_weights, save_weights
from ..vae import AudioVAE, VideoVAE, frames_to_groups
from . import data
from .loop import Run

LATENT_NOISE, LATENT_PENALTY, FOREGROUND_WEIGHT = 0.1, 1e-4, 5.0
AUDIO_CROP = 8000
STFT_SIZES = (256, 512, 1024)


def random_clips(rng: random.Random, n: int) -> list[data.Clip]:
    return [data.Clip(*rng.choice(data.TRAIN_COMBOS), seed=rng.randrange(2**31)) for _ in range(n)]


def video_groups(clips: list[data.Clip], device) -> torch.Tensor:
    """float32 [N * 7, 12, 64, 96] latent-frame groups of the clips."""
    frames = data.render_video(clips, device)
    return torch.cat([frames_to_groups(f) for f in frames])


def add_noise(z: torch.Tensor) -> torch.Tensor:
    return z + LATENT_NOISE * z.detach().pow(2).mean().sqrt() * torch.randn_like(z)


def video_loss(vae: VideoVAE, groups: torch.Tensor) -> tuple[torch.Tensor, dict]:
    z = vae.encoder(groups)
    recon = vae.decoder(add_noise(z))
    background = torch.tensor(data.BACKGROUND, device=groups.device) / 127.5 - 1.0
    target = groups.view(groups.shape[0], 4, 3, *groups.shape[2:])
    foreground = ((target - background[None, None, :, None, None]).abs().amax(2, keepdim=True) > 0.1)
    weight = (1 + (FOREGROUND_WEIGHT - 1) * foreground.float()).expand_as(target).reshape(groups.shape)
    err = recon - groups
    rec = (weight * (err.abs() + err ** 2)).mean()
    penalty = LATENT_PENALTY * z.pow(2).mean()
    return rec + penalty, {"loss": rec.item(), "latent_rms": z.pow(2).mean().sqrt().item()}


def audio_crops(clips: list[data.Clip], rng: random.Random, device) -> torch.Tensor:
    """float32 [2N, 1, AUDIO_CROP] mono crops (both channels of each clip)."""
    audio = data.render_audio(clips, device).reshape(-1, data.AUDIO_SAMPLES)
    starts = [800 * rng.randrange((data.AUDIO_SAMPLES - AUDIO_CROP) // 800 + 1) for _ in range(audio.shape[0])]
    return torch.stack([a[s:s + AUDIO_CROP] for a, s in zip(audio, starts)])[:, None, :]


def stft_loss(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    total = 0.0
    for n in STFT_SIZES:
        window = torch.hann_window(n, device=recon.device)
        a, b = (torch.stft(x, n, n // 4, window=window, return_complex=True).abs() for x in (recon, target))
        total = total + (a - b).abs().mean() + (torch.log(a + 1e-4) - torch.log(b + 1e-4)).abs().mean()
    return total / len(STFT_SIZES)


def audio_loss(vae: AudioVAE, crops: torch.Tensor) -> tuple[torch.Tensor, dict]:
    z = vae.encoder(crops)
    recon = vae.decoder(add_noise(z))
    wave = (recon - crops).abs().mean()
    spec = stft_loss(recon[:, 0], crops[:, 0])
    penalty = LATENT_PENALTY * z.pow(2).mean()
    return 10 * wave + spec + penalty, {"loss": (10 * wave + spec).item(), "wave_l1": wave.item(),
                                        "stft": spec.item(), "latent_rms": z.pow(2).mean().sqrt().item()}


@torch.no_grad()
def set_latent_stats(vae, which: str, device, n: int = 256) -> None:
    """Per-channel mean / std of the raw latents over n training clips -> the buffers."""
    rng = random.Random(12345)
    clips = random_clips(rng, n)
    zs = []
    for i in range(0, n, 32):
        part = clips[i:i + 32]
        if which == "video":
            zs.append(vae.encoder(video_groups(part, device)).transpose(0, 1).reshape(vae.latents_mean.shape[0], -1))
        else:
            audio = data.render_audio(part, device).reshape(-1, 1, data.AUDIO_SAMPLES)
            zs.append(vae.encoder(audio).transpose(0, 1).reshape(vae.latents_mean.shape[0], -1))
    z = torch.cat(zs, dim=1)
    vae.latents_mean.copy_(z.mean(1))
    vae.latents_std.copy_(z.std(1).clamp(min=1e-3))


def train(which: str, work: Path, seconds: float, total_seconds: float, device: str,
          batch: int, lr: float = 1e-3, seed: int = 0, stats_clips: int = 256) -> Path:
    torch.manual_seed(seed)
    vae = (VideoVAE() if which == "video" else AudioVAE()).to(device)
    init_weights(vae, seed + 1)
    with torch.no_grad():  # conv biases start at 0 rather than init_weights' N(0, 0.02^2)
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    run = Run(f"{which}_vae", work, vae, optimizer, seconds, total_seconds, lr, log_every=20)
    rng = random.Random(seed * 1000 + run.step)
    vae.train()
    while run.running():
        if which == "video":
            groups = video_groups(random_clips(rng, max(1, batch // 7 + 1)), device)
            groups = groups[torch.randperm(groups.shape[0], device=device)[:batch]]
            loss, logs = video_loss(vae, groups)
        else:
            loss, logs = audio_loss(vae, audio_crops(random_clips(rng, max(1, batch // 2)), rng, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("build/demo/train"))
    parser.add_argument("--which", nargs="+", default=["video", "audio"], choices=["video", "audio"])
    parser.add_argument("--seconds", type=float, default=600.0, help="training seconds of this run (each VAE)")
    parser.add_argument("--total-seconds", type=float, default=600.0, help="training seconds over all runs (each VAE)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16, help="video: groups per step; audio: mono crops per step")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    for which in args.which:
        start = time.monotonic()
        train(which, args.work, args.seconds, args.total_seconds, args.device, args.batch)
        print(f"[{which}_vae] run took {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
