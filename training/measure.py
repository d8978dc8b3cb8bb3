"""Simple measurements of a generated clip, compared with the attributes its prompt names.

- colour: the mean RGB of the pixels that differ from the background by more than
  FOREGROUND_DISTANCE (over all frames), matched to the nearest of data.COLOURS;
- direction: the shape's centre (mean position of those pixels) in each frame; the slope of a
  least-squares line through the centres over time, along x and y; the larger axis and its
  sign give left / right / up / down;
- pitch: the peak of the magnitude spectrum of the summed channels (Hann window), matched to
  the nearest of data.PITCHES in log frequency;
- side: the louder channel by RMS;
- keyframes: the shape's centre in one frame (object_centre) and a frame's PSNR against the
  keyframe (psnr).

The background is the per-channel median over the clip (the shape covers under a quarter of
the frame), so a slightly off background colour does not matter.
"""

import math

import numpy as np

from h3_core.config import AUDIO_SAMPLE_RATE

from . import data

FOREGROUND_DISTANCE = 60.0  # RGB distance from the background that counts as the shape


def foreground(frames: np.ndarray) -> np.ndarray:
    """bool [..., H, W]: the pixels of frames uint8 [..., H, W, 3] farther than
    FOREGROUND_DISTANCE (RGB) from the background, the per-channel median of all the pixels."""
    f = np.asarray(frames, dtype=np.float32)
    background = np.median(f.reshape(-1, 3), axis=0)
    return np.linalg.norm(f - background, axis=-1) > FOREGROUND_DISTANCE


def object_centre(frame: np.ndarray) -> tuple[float, float] | None:
    """The shape's centre (x, y) in pixels (mean position of the foreground pixels) in one frame
    uint8 [H, W, 3], or None when it has fewer than 4 foreground pixels."""
    mask = foreground(frame)
    if mask.sum() < 4:
        return None
    ys, xs = np.nonzero(mask)
    return float(xs.mean()), float(ys.mean())


def psnr(frame: np.ndarray, reference: np.ndarray) -> float:
    """PSNR in dB of frame against reference (uint8 [H, W, 3] each): 10 log10(255^2 / MSE);
    inf for identical frames."""
    mse = np.mean((np.asarray(frame, np.float64) - np.asarray(reference, np.float64)) ** 2)
    return math.inf if mse == 0 else float(10 * math.log10(255.0**2 / mse))


SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03  # Wang et al. 2004, section III-C


def ssim(frames: np.ndarray, reference: np.ndarray) -> float:
    """Mean structural similarity of frames against reference (uint8 [..., H, W, 3] each, H and W
    >= 11): SSIM of Wang, Bovik, Sheikh and Simoncelli (IEEE TIP 2004, eq. 13) with their
    11 x 11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03 and L 255, per channel over the
    window positions inside the frame, averaged over positions, channels and frames; 1.0 for
    identical inputs."""
    import torch
    import torch.nn.functional as F

    def planes(x):  # [..., H, W, 3] -> [N, 1, H, W] float64
        t = torch.from_numpy(np.asarray(x, np.float64))
        return t.reshape(-1, *t.shape[-3:]).permute(0, 3, 1, 2).reshape(-1, 1, *t.shape[-3:-1])

    a, b = planes(frames), planes(reference)
    g = torch.exp(-((torch.arange(SSIM_WINDOW, dtype=torch.float64) - SSIM_WINDOW // 2) ** 2) / (2 * SSIM_SIGMA**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :])[None, None]

    def blur(x):
        return F.conv2d(x, window)

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (SSIM_K1 * 255.0) ** 2, (SSIM_K2 * 255.0) ** 2
    index = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(index.mean())


def snr_db(audio: np.ndarray, reference: np.ndarray) -> float:
    """Signal-to-noise ratio in dB of audio against reference (float arrays of one shape):
    10 log10(sum reference^2 / sum (audio - reference)^2); inf for identical arrays."""
    ref = np.asarray(reference, np.float64)
    noise = np.sum((np.asarray(audio, np.float64) - ref) ** 2)
    return math.inf if noise == 0 else float(10 * math.log10(np.sum(ref**2) / noise))


def measure_video(frames: np.ndarray) -> dict:
    """frames uint8 [T, H, W, 3] -> {"colour", "direction", "foreground_fraction",
    "slope_px_per_frame": (x, y)}; colour / direction are None when no shape pixels are found."""
    f = np.asarray(frames, dtype=np.float32)
    mask = foreground(frames)  # [T, H, W]
    result = {"foreground_fraction": float(mask.mean()), "colour": None, "direction": None, "slope_px_per_frame": None}
    if mask.sum() == 0:
        return result
    mean_rgb = f[mask].mean(axis=0)
    result["colour"] = min(data.COLOURS, key=lambda c: np.linalg.norm(mean_rgb - np.array(data.COLOURS[c])))
    ys, xs = np.mgrid[: f.shape[1], : f.shape[2]]
    times, cx, cy = [], [], []
    for t in range(f.shape[0]):
        if mask[t].sum() >= 4:
            times.append(t)
            cx.append(xs[mask[t]].mean())
            cy.append(ys[mask[t]].mean())
    if len(times) >= 2:
        sx, sy = np.polyfit(times, cx, 1)[0], np.polyfit(times, cy, 1)[0]
        result["slope_px_per_frame"] = (float(sx), float(sy))
        if abs(sx) >= abs(sy):
            result["direction"] = "right" if sx > 0 else "left"
        else:
            result["direction"] = "down" if sy > 0 else "up"
    return result


def measure_audio(audio: np.ndarray, sample_rate: int = AUDIO_SAMPLE_RATE) -> dict:
    """audio float32 [2, N] (left, right) -> {"pitch", "peak_hz", "side", "rms": (left, right)}."""
    a = np.asarray(audio, dtype=np.float64)
    mono = a.sum(axis=0)
    spectrum = np.abs(np.fft.rfft(mono * np.hanning(mono.shape[0])))
    spectrum[0] = 0.0
    peak_hz = float(np.argmax(spectrum) * sample_rate / mono.shape[0])
    pitch = min(data.PITCHES, key=lambda p: abs(math.log(max(peak_hz, 1.0) / data.PITCHES[p])))
    rms = np.sqrt((a**2).mean(axis=1))
    return {
        "pitch": pitch,
        "peak_hz": peak_hz,
        "side": "left" if rms[0] >= rms[1] else "right",
        "rms": (float(rms[0]), float(rms[1])),
    }


SCORED = ("colour", "direction", "pitch", "side")


def score(clip: "data.Clip", frames: np.ndarray, audio: np.ndarray) -> dict:
    """Measurements of one clip and, per scored attribute, whether it matches the clip's."""
    measured = {**measure_video(frames), **measure_audio(audio)}
    correct = {name: measured[name] == getattr(clip, name) for name in SCORED}
    return {"caption": clip.caption, "measured": measured, "correct": correct}
