"""Figures and picture of the demo's LoRAs (docs/lora.md §"The demo's LoRAs"), in-process on the CPU.

    python -m training.lora_evaluate [--weights weights/demo] [--clips 36] \
        [--out benchmarks/results/lora_demo_cpu.json] [--picture docs/lora_demo.png]

Loads the demo engine (training.evaluate's) with both adapters of --weights through read_lora
and Engine.add_lora, as the server loads them ("turbo", "style"), and generates the held-out
prompts (data.held_out_clips: the 36 combinations never trained on, seed 0, evaluate.py's gate),
`--pack` requests a forward:

- turbo: `turbo2_psnr_vs_base8_db`, the median over every frame of every clip of the frame PSNR
  (measure.psnr) of the turbo's 2-step clips (its base_schedule's sigmas, default_sigmas) against
  the base's 8-step clips, beside the base's own 2-step clips (`base2_psnr_vs_base8_db`);
  `turbo1_attribute_accuracy` (measure.SCORED) and `turbo1_colour_accuracy` of 1-step clips
  ([1, 0]), beside the base's at 1 step;
- style (8 steps): `style_brightness_shift`, the mean over the clips of the shape's brightness
  (`shape_brightness`) with the adapter at scale 1 minus without, and `style_half_scale_shift`
  at scale 0.5, both in levels of 255; `style_per_attribute` at scale 1.

Writes the JSON (date, command, hardware, weights, clips, seed, summary, seconds) and the
picture: one held-out clip's frames 0, 7, 14 and 21 as rows base 8-step, base 2-step, turbo
2-step, turbo 1-step; style scale 0, 0.5, 1.0 (8 steps).
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from h3_core.diffusion.sampling import default_sigmas
from h3_core.factory import load_engine
from h3_core.weights.lora_formats import read_lora

from . import data, measure
from .evaluate import generate_states, report
from .lora_train import FILES
from .strips import FRAMES, GAP, SCALE, strip

LABEL_WIDTH = 120  # px of the picture's row labels (before SCALE)


def shape_brightness(frames: np.ndarray) -> float:
    """The shape's mean brightness in levels of 255: the mean of R, G and B over the pixels
    measure.foreground finds in frames uint8 [T, H, W, 3]; nan when there are none."""
    mask = measure.foreground(frames)
    return float(np.asarray(frames, np.float64)[mask].mean()) if mask.any() else float("nan")


def median_frame_psnr(outputs: list, references: list) -> float:
    """The median over every frame of every clip of measure.psnr(frame, reference frame);
    outputs / references: (frames uint8 [T, H, W, 3], audio) per clip, in the same order."""
    values = [
        measure.psnr(f, r)
        for (a, _), (b, _) in zip(outputs, references, strict=True)
        for f, r in zip(a, b, strict=True)
    ]
    return float(np.median(values))


def evaluate_loras(engine, clips: list[data.Clip], turbo_schedule: str, pack: int = 12, seed: int = 0) -> tuple:
    """Every figure of the module docstring; returns (summary dict, {row label: frames of clips[0]})."""

    def run(steps: int, lora=(), sigmas=None) -> list:
        states = generate_states(engine, clips, steps, seed, pack, lora=lora, sigmas=sigmas)
        return [(frames, audio) for _, frames, audio in states]

    turbo = (("turbo", 1.0),)
    runs = {
        "base 8-step": run(8),
        "base 2-step": run(2),
        "turbo 2-step": run(2, turbo, default_sigmas(turbo_schedule)),
        "base 1-step": run(1),
        "turbo 1-step": run(1, turbo),
        "style 0.5": run(8, (("style", 0.5),)),
        "style 1.0": run(8, (("style", 1.0),)),
    }
    scores = {name: report(clips, outputs) for name, outputs in runs.items()}
    bright = {
        name: np.mean([shape_brightness(f) for f, _ in runs[name]])
        for name in ("base 8-step", "style 0.5", "style 1.0")
    }
    summary = {
        "turbo2_psnr_vs_base8_db": round(median_frame_psnr(runs["turbo 2-step"], runs["base 8-step"]), 2),
        "base2_psnr_vs_base8_db": round(median_frame_psnr(runs["base 2-step"], runs["base 8-step"]), 2),
        "turbo1_attribute_accuracy": scores["turbo 1-step"]["attribute_accuracy"],
        "base1_attribute_accuracy": scores["base 1-step"]["attribute_accuracy"],
        "turbo1_colour_accuracy": scores["turbo 1-step"]["per_attribute"]["colour"],
        "base1_colour_accuracy": scores["base 1-step"]["per_attribute"]["colour"],
        "turbo2_attribute_accuracy": scores["turbo 2-step"]["attribute_accuracy"],
        "base2_attribute_accuracy": scores["base 2-step"]["attribute_accuracy"],
        "base8_attribute_accuracy": scores["base 8-step"]["attribute_accuracy"],
        "base8_shape_brightness": round(float(bright["base 8-step"]), 2),
        "style_brightness_shift": round(float(bright["style 1.0"] - bright["base 8-step"]), 2),
        "style_half_scale_shift": round(float(bright["style 0.5"] - bright["base 8-step"]), 2),
        "style_per_attribute": scores["style 1.0"]["per_attribute"],
    }
    picture = {"style 0": runs["base 8-step"][0][0], **{name: outputs[0][0] for name, outputs in runs.items()}}
    order = ("base 8-step", "base 2-step", "turbo 2-step", "turbo 1-step", "style 0", "style 0.5", "style 1.0")
    return summary, {name: picture[name] for name in order}


def draw_picture(rows: dict[str, np.ndarray], path: Path) -> None:
    """A PNG of one strip (strips.strip of FRAMES) per row of `rows` (label -> frames uint8 [T, H,
    W, 3]), its label at the left, SCALE times larger."""
    strips = [strip(None, [frames[i] for i in FRAMES]) for frames in rows.values()]
    height, width = strips[0].shape[:2]
    image = Image.new("RGB", (LABEL_WIDTH + width, len(strips) * (height + GAP) - GAP), "white")
    draw = ImageDraw.Draw(image)
    for k, (label, tile) in enumerate(zip(rows, strips, strict=True)):
        image.paste(Image.fromarray(tile), (LABEL_WIDTH, k * (height + GAP)))
        draw.text((4, k * (height + GAP) + height // 2 - 6), label, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.resize((image.width * SCALE, image.height * SCALE), Image.NEAREST).save(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"), help="base and LoRA files")
    parser.add_argument("--clips", type=int, default=len(data.HELD_OUT), help="held-out prompts (from the first)")
    parser.add_argument("--pack", type=int, default=12, help="requests co-batched in one DiT forward")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lora_demo_cpu.json"))
    parser.add_argument("--picture", type=Path, default=Path("docs/lora_demo.png"))
    args = parser.parse_args(argv)
    start = time.monotonic()
    engine = load_engine("demo", args.weights)
    adapters = {name: read_lora(args.weights / FILES[name], engine.dit.cfg) for name in FILES}
    for name, adapter in adapters.items():
        engine.add_lora(name, adapter)
    clips = data.held_out_clips()[: args.clips]
    summary, rows = evaluate_loras(engine, clips, adapters["turbo"].base_schedule, args.pack)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python -m training.lora_evaluate", *(argv if argv is not None else sys.argv[1:])]),
        "hardware": f"the {os.cpu_count()}-core CPU ({platform.machine()}, torch threads {torch.get_num_threads()})",
        "weights": str(args.weights),
        "clips": len(clips),
        "seed": 0,
        "turbo_base_schedule": adapters["turbo"].base_schedule,
        "summary": summary,
        "seconds": round(time.monotonic() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    draw_picture(rows, args.picture)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
