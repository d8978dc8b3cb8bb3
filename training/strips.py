"""The demo model's conditioned clips as strips for README: per held-out case the condition (the
first-frame keyframe, or the reference image) then generated frames 0, 7, 14 and 21.

    python -m training.strips --out docs/demo_model_conditions.png [--weights weights/demo] [--clips 2]

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
TASKS = {"first": "keyframe", "image": "reference image"}  # task -> what its first tile shows


def condition_tile(clip: data.Clip, task: str) -> np.ndarray:
    """What the request was conditioned on, uint8 [64, 96, 3]: the clip's rendered first frame
    (task "first") or its reference image (task "image")."""
    if task == "first":
        return data.render_video([clip])[0, 0].numpy()
    return data.render_reference_image([clip])[0].numpy()


def strip(tiles: list[np.ndarray]) -> np.ndarray:
    """uint8 [H, W, 3] tiles side by side with GAP white columns between them and after the first
    (the condition) a double gap."""
    height = tiles[0].shape[0]
    gap = np.full((height, GAP, 3), 255, np.uint8)
    parts = [tiles[0], gap, gap]
    for tile in tiles[1:]:
        parts += [tile, gap]
    return np.concatenate(parts[:-1], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"))
    parser.add_argument("--clips", type=int, default=3, help="held-out cases per task, each of another colour")
    args = parser.parse_args()
    engine = load_engine("demo", args.weights)
    by_colour = {clip.combo[0]: clip for clip in reversed(data.held_out_clips())}  # one clip per colour
    clips = list(by_colour.values())[: args.clips]
    rows = []
    for task in TASKS:
        outputs = generate(engine, clips, engine.dit.cfg.default_steps, 0, len(clips), None, task)
        for clip, (frames, _) in zip(clips, outputs, strict=True):
            rows.append(strip([condition_tile(clip, task), *(frames[i] for i in FRAMES)]))
            print(f"{TASKS[task]}: {clip.caption_for(task)!r}")
    gap = np.full((GAP, rows[0].shape[1], 3), 255, np.uint8)
    image = np.concatenate([part for row in rows for part in (row, gap)][:-1], axis=0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).resize((image.shape[1] * SCALE, image.shape[0] * SCALE), Image.NEAREST).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
