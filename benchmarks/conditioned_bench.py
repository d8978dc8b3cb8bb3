"""What fl2va costs (issue 28): the step of a pack with keyframe-conditioned requests against a pack
of t2va requests of the same rows, and the encoder's cost per keyframe.

    PYTHONUNBUFFERED=1 python benchmarks/conditioned_bench.py --out DIR

The DiT is built as h3_dit builds it (h3_core.factory.load_engine: `bench` on CUDA, i.e. the full H3
width with 8 layers, compiled blocks and CUDA graphs for packs up to 4,096 rows; `tiny` on the CPU,
smaller shapes, as a smoke test), weights `random:0`.

- step: packs of N requests of 672 x 384 px, 209 frames, both keyframes (fl2va: 16,329 + 504
  condition rows, 16,896 padded rows each) against N t2va requests whose prompt is 504 tokens
  longer, so every request has the same used and padded rows; N = 1 and 3 (and 8 x 1,344-row
  requests, 384 x 224 px). Each pack's Engine.denoise_step time is the median of 10 after a
  warm-up; the two packs alternate 3 times and the ratio fl2va / t2va is the median of the 3
  per-run ratios (a conditioned pack adds one timestep, 0.999, to the AdaLN and the anchors'
  concatenation; its rows are the same).
- keyframe: the encoder's work for one 1344 x 768 PNG keyframe: h3_core.inputs.images.decode_image + fit_image
  (CPU, 672 x 384 canvas) and h3_core.model.vae.keyframe_latent with this project's video VAE
  (seeded, on the device), medians of 10. The official VAE's encoder is not in this repository.
Prints a short table last; writes DIR/conditioned_bench.json.
"""

import argparse
import datetime
import io
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from step_timing import timed  # noqa: E402 - benchmarks/ is on sys.path when this script runs

from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.factory import load_engine
from h3_core.inputs.images import ImageLimits, decode_image, fit_image
from h3_core.model.dit import use_bitwise_cublas
from h3_core.model.vae import create_vaes, keyframe_latent

GPU_PACKS = {"1 x 16,896": (384, 672, 209, 1), "3 x 16,896": (384, 672, 209, 3), "8 x 1,344": (224, 384, 33, 8)}
CPU_PACKS = {"1 x small": (64, 96, 22, 1), "3 x small": (64, 96, 22, 3)}
REPEATS = 10  # timed calls per measurement (median)
TEXT_LEN = 9  # the fl2va prompt's tokens; the t2va twin gets TEXT_LEN + the condition rows


def states(engine, height: int, width: int, frames: int, count: int, conditioned: bool) -> list:
    """`count` states of one shape: both keyframes with TEXT_LEN tokens, or t2va with as many more
    tokens as the keyframes' condition rows (same used and padded rows)."""
    cfg = engine.dit.cfg
    condition_rows = 2 * (height // 32) * (width // 32)
    text_len = TEXT_LEN if conditioned else TEXT_LEN + condition_rows
    text = torch.randn(text_len, cfg.text_dim, generator=torch.Generator().manual_seed(0))
    latents = torch.randn(2, 24, 1, height // 16, width // 16)
    conditions = [Condition("keyframe", frame, latent) for frame, latent in zip((0, -1), latents, strict=True)]
    made = []
    for seed in range(count):
        request = GenerationRequest(
            "bench", height, width, frames, 30, seed=seed, task="fl2va" if conditioned else "t2va"
        )
        made += engine.prepare(request, text, conditions if conditioned else ())
    return made


def step_ratios(engine, packs: dict, device: torch.device, runs: int = 3) -> dict:
    results = {}
    for name, (height, width, frames, count) in packs.items():
        fl2va, t2va = (states(engine, height, width, frames, count, conditioned) for conditioned in (True, False))
        assert [s.layout.seq_len for s in fl2va] == [s.layout.seq_len for s in t2va]
        assert [s.layout.used for s in fl2va] == [s.layout.used for s in t2va]
        ratios, fl_s, t2_s = [], [], []
        for _ in range(runs):
            t2 = timed(lambda t2va=t2va: engine.denoise_step(t2va), device, REPEATS)
            fl = timed(lambda fl2va=fl2va: engine.denoise_step(fl2va), device, REPEATS)
            ratios.append(fl / t2)
            fl_s.append(fl)
            t2_s.append(t2)
        results[name] = {
            "rows_per_request": fl2va[0].layout.seq_len,
            "condition_rows_per_request": fl2va[0].layout.condition_rows,
            "fl2va_step_s": statistics.median(fl_s),
            "t2va_step_s": statistics.median(t2_s),
            "fl2va_over_t2va": statistics.median(ratios),
            "ratios": ratios,
        }
        print(f"  {name}: fl2va / t2va = {results[name]['fl2va_over_t2va']:.4f}", flush=True)
    return results


def keyframe_cost(device: torch.device) -> dict:
    pixels = np.random.default_rng(0).integers(0, 256, (768, 1344, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    data, limits = out.getvalue(), ImageLimits()
    video_vae, _ = create_vaes(1)
    video_vae = video_vae.to(device).eval()
    image = fit_image(decode_image(data, "KEYFRAMES[0]", limits), 384, 672, "crop")
    frames = torch.from_numpy(image.copy())  # fit_image may return a read-only view
    return {
        "png_bytes": len(data),
        "decode_and_fit_s": timed(
            lambda: fit_image(decode_image(data, "KEYFRAMES[0]", limits), 384, 672, "crop"),
            torch.device("cpu"),
            REPEATS,
        ),
        "vae_encode_s": timed(lambda: keyframe_latent(video_vae, frames), device, REPEATS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for conditioned_bench.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    if cuda:
        use_bitwise_cublas()
    device = torch.device("cuda" if cuda else "cpu")
    config = "bench" if cuda else "tiny"
    limits = RequestLimits(max_height=1024, max_width=1024, max_num_frames=257, max_rows=2**20, max_request_mb=2**20)
    engine = load_engine(config, "random:0", device.type, with_encoder=False, with_vaes=False, limits=limits)
    engine.warm_up()
    print(f"conditioned_bench: {config} DiT on {device}", flush=True)
    results = {
        "what": "fl2va pack step vs t2va pack of the same rows; encoder cost per keyframe",
        "command": "python benchmarks/conditioned_bench.py --out DIR",
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "config": config,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "step": step_ratios(engine, GPU_PACKS if cuda else CPU_PACKS, device),
        "keyframe": keyframe_cost(device),
    }
    (args.out / "conditioned_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{'pack':<12} {'rows/req':>9} {'fl2va ms':>10} {'t2va ms':>10} {'ratio':>8}")
    for name, row in results["step"].items():
        print(
            f"{name:<12} {row['rows_per_request']:>9} {row['fl2va_step_s'] * 1e3:>10.2f} "
            f"{row['t2va_step_s'] * 1e3:>10.2f} {row['fl2va_over_t2va']:>8.4f}"
        )
    key = results["keyframe"]
    decode_ms, encode_ms = key["decode_and_fit_s"] * 1e3, key["vae_encode_s"] * 1e3
    print(f"keyframe: decode+fit {decode_ms:.1f} ms (CPU), VAE encode {encode_ms:.2f} ms")


if __name__ == "__main__":
    main()
