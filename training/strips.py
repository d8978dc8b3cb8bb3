"""The demo model's clips as strips for README: per held-out case the condition (the first- or
last-frame keyframe, or the reference image; none for t2va) then generated frames 0, 7, 14 and 21.

    python -m training.strips --out docs/demo_model_conditions.png [--weights weights/demo] \
        [--clips 3] [--tasks first,last,image]
    python -m training.strips --out docs/demo_model_frames.png --tasks t2va --clips 4

The cases are held-out clips of different colours (the reference image alone gives the colour);
they are generated in-process as training.evaluate_conditions generates them (evaluate.generate:
Conditions built as h3_encoder builds them, 8 steps, seed 0), on the CPU with the MiniLM encoder.
"""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from h3_core.factory import load_engine

from . import data
from .evaluate import generate

FRAMES = (0, 7, 14, 21)  # the generated frames shown
GAP, SCALE = 4, 2  # white pixels between tiles; the PNG is drawn SCALE times larger (nearest)
# task -> what its first tile shows (t2va: no condition tile)
TASKS = {"t2va": None, "first": "first-frame keyframe", "last": "last-frame keyframe", "image": "reference image"}


def condition_tile(clip: data.Clip, task: str) -> np.ndarray | None:
    """What the request was conditioned on, uint8 [64, 96, 3]: the clip's rendered first / last
    frame (task "first" / "last") or its reference image (task "image"); None for "t2va".
    Raises KeyError for another task."""
    return {
        "t2va": lambda: None,
        "first": lambda: data.render_video([clip])[0, 0].numpy(),
        "last": lambda: data.render_video([clip])[0, -1].numpy(),
        "image": lambda: data.render_reference_image([clip])[0].numpy(),
    }[task]()


def strip(condition: np.ndarray | None, frames: list[np.ndarray]) -> np.ndarray:
    """uint8 [H, W, 3]: the condition tile (if any), a double gap, then the frames with GAP white
    columns between them."""
    gap = np.full((frames[0].shape[0], GAP, 3), 255, np.uint8)
    parts = [] if condition is None else [condition, gap, gap]
    for tile in frames:
        parts += [tile, gap]
    return np.concatenate(parts[:-1], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"))
    parser.add_argument("--clips", type=int, default=3, help="held-out cases per task, each of another colour")
    parser.add_argument("--tasks", default="first,last,image", help=f"comma-separated, of {', '.join(TASKS)}")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)} (allowed: {', '.join(TASKS)})")
    if "t2va" in tasks and len(tasks) > 1:
        parser.error("--tasks: t2va strips have no condition tile: draw them alone (--tasks t2va)")
    engine = load_engine("demo", args.weights)
    by_colour = {clip.combo[0]: clip for clip in reversed(data.held_out_clips())}  # one clip per colour
    clips = list(by_colour.values())[: args.clips]
    rows = []
    for task in tasks:
        outputs = generate(engine, clips, engine.dit.cfg.default_steps, 0, len(clips), None, task)
        for clip, (frames, _) in zip(clips, outputs, strict=True):
            rows.append(strip(condition_tile(clip, task), [frames[i] for i in FRAMES]))
            print(f"{TASKS[task] or 'text only'}: {clip.caption_for(task)!r}")
    gap = np.full((GAP, rows[0].shape[1], 3), 255, np.uint8)
    image = np.concatenate([part for row in rows for part in (row, gap)][:-1], axis=0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).resize((image.shape[1] * SCALE, image.shape[0] * SCALE), Image.NEAREST).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
