"""Evaluate the demo model's conditioned tasks (fl2va keyframes, ref2va image and tone) and t2va
in-process on the held-out attribute combinations.

    python -m training.evaluate_conditions [--clips 36] [--steps 8] [--pack 4] \
        [--config demo] [--weights weights/demo] [--device cpu] [--out out/eval_conditions.json]

For each held-out clip (data.held_out_clips: combinations never trained on, seed 0) and each task
of data.TASKS it generates one clip with the engine (evaluate.generate: the task's caption and
Conditions built as h3_encoder builds them, evaluate.conditions) and measures (measure.py):

- first_frame_centre_px / last_frame_centre_px: the median distance (pixels) of the shape's
  centre in the generated first / last frame from its centre in the keyframe (measure.
  object_centre), over the cases with that keyframe ("first" and "both" / "last" and "both");
  a frame without a shape counts the canvas diagonal (115.4 px); *_within_3px: the fraction of
  those cases within 3 px; *_psnr_db: the mean PSNR of that frame against the keyframe;
- vae_round_trip_psnr_db: the mean PSNR of the held-out clips' first and last frames through
  the video VAE alone (encode, decode): the ceiling the keyframe PSNR is compared with;
  vae_round_trip_first_centre_px / _last_centre_px / _last_within_3px: the same round trip's
  centre distances (vae_round_trip), the floor of the keyframe centre distances;
- fl2va_direction_accuracy: the fraction of fl2va cases (first, last, both) whose motion
  (measure.measure_video) is the caption's direction;
- reference_image_accuracy: the fraction of "image" cases whose colour is the reference
  image's (the caption leaves colour out; shape is not scored);
- reference_audio_accuracy: the fraction of "audio" cases whose pitch and side are both the
  reference tone's (the caption leaves them out);
- t2va_attribute_accuracy: evaluate.report's attribute_accuracy of the text-only clips;
- per_task: evaluate.report's per_attribute of each task.

The last line printed is one JSON object with those keys and "n_cases" (clips per task),
"steps", "seed", "pack", "seconds". Runs on the CPU and on CUDA (--device).
"""

import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from h3_core.diffusion.engine import Engine
from h3_core.factory import load_engine

from . import data, measure, text_states
from .evaluate import generate, report, run_arguments

MISSING_DISTANCE = math.hypot(data.HEIGHT, data.WIDTH)  # px: a generated frame without a shape
CENTRE_TOLERANCE = 3.0  # px


def keyframe_scores(clips: list[data.Clip], outputs: list[tuple[np.ndarray, np.ndarray]], frame: int) -> dict:
    """Per clip, the generated frame `frame` (0 or -1) of outputs' (frames uint8 [T, H, W, 3],
    audio) against the clip's rendered keyframe: {"distance_px": [the shape centres' distance,
    MISSING_DISTANCE when either frame has no shape], "psnr_db": [measure.psnr]}."""
    keyframes = data.render_video(clips)[:, frame].numpy()
    distances, psnrs = [], []
    for keyframe, (frames, _) in zip(keyframes, outputs, strict=True):
        want, got = measure.object_centre(keyframe), measure.object_centre(frames[frame])
        distances.append(MISSING_DISTANCE if want is None or got is None else math.dist(want, got))
        psnrs.append(measure.psnr(frames[frame], keyframe))
    return {"distance_px": distances, "psnr_db": psnrs}


def summary(scores: list[dict]) -> dict:
    """{"centre_px": median distance, "within_3px": fraction within CENTRE_TOLERANCE, "psnr_db":
    mean PSNR} of keyframe_scores' results pooled, rounded to 4 places."""
    distances = [d for s in scores for d in s["distance_px"]]
    psnrs = [p for s in scores for p in s["psnr_db"]]
    return {
        "centre_px": round(statistics.median(distances), 4),
        "within_3px": round(sum(d <= CENTRE_TOLERANCE for d in distances) / len(distances), 4),
        "psnr_db": round(statistics.fmean(psnrs), 4),
    }


@torch.no_grad()
def vae_round_trip(video_vae, clips: list[data.Clip]) -> dict:
    """The video VAE alone (encode, decode) on the clips: {"psnr_db": mean PSNR of the first and
    last frames, "first_centre_px" / "last_centre_px": median shape-centre distance of the first /
    last frame, "first_within_3px" / "last_within_3px": the fraction of first / last frames within
    3 px} - what a keyframe can
    at best be matched to (the last frame is the fourth of its latent's 4-frame group)."""
    psnrs, distances = [], {0: [], -1: []}
    for frames in data.render_video(clips):
        decoded = video_vae.decode(video_vae.encode(frames)).cpu().numpy()[: data.NUM_FRAMES]
        psnrs += [measure.psnr(decoded[i], frames[i].numpy()) for i in (0, -1)]
        for i in (0, -1):
            want, got = measure.object_centre(frames[i].numpy()), measure.object_centre(decoded[i])
            distances[i].append(MISSING_DISTANCE if want is None or got is None else math.dist(want, got))
    return {
        "psnr_db": round(statistics.fmean(psnrs), 4),
        "first_centre_px": round(statistics.median(distances[0]), 4),
        "first_within_3px": round(sum(d <= CENTRE_TOLERANCE for d in distances[0]) / len(distances[0]), 4),
        "last_centre_px": round(statistics.median(distances[-1]), 4),
        "last_within_3px": round(sum(d <= CENTRE_TOLERANCE for d in distances[-1]) / len(distances[-1]), 4),
    }


def fraction(flags: list[bool]) -> float:
    return round(sum(flags) / max(len(flags), 1), 4)


def evaluate(
    engine: Engine,
    clips: list[data.Clip],
    steps: int | None = None,
    seed: int = 0,
    pack: int = 4,
    text_states: dict[str, torch.Tensor] | None = None,
) -> dict:
    """Generate every task of data.TASKS for `clips` (steps None: the config's default_steps;
    text_states as evaluate.generate's) and measure them (module docstring). Returns the dict
    printed as the JSON line."""
    start = time.monotonic()
    steps = steps or engine.dit.cfg.default_steps
    outputs = {task: generate(engine, clips, steps, seed, pack, text_states, task) for task in data.TASKS}
    reports = {task: report(clips, outputs[task]) for task in data.TASKS}
    first = summary([keyframe_scores(clips, outputs[task], 0) for task in ("first", "both")])
    last = summary([keyframe_scores(clips, outputs[task], -1) for task in ("last", "both")])
    correct = {task: [s["correct"] for s in reports[task]["clips"]] for task in data.TASKS}
    vae = vae_round_trip(engine.video_vae, clips)
    return {
        "first_frame_centre_px": first["centre_px"],
        "first_frame_within_3px": first["within_3px"],
        "first_frame_psnr_db": first["psnr_db"],
        "last_frame_centre_px": last["centre_px"],
        "last_frame_within_3px": last["within_3px"],
        "last_frame_psnr_db": last["psnr_db"],
        "vae_round_trip_psnr_db": vae["psnr_db"],
        "vae_round_trip_first_centre_px": vae["first_centre_px"],
        "vae_round_trip_last_centre_px": vae["last_centre_px"],
        "vae_round_trip_last_within_3px": vae["last_within_3px"],
        "fl2va_direction_accuracy": fraction([c["direction"] for t in ("first", "last", "both") for c in correct[t]]),
        "reference_image_accuracy": fraction([c["colour"] for c in correct["image"]]),
        "reference_audio_accuracy": fraction([c["pitch"] and c["side"] for c in correct["audio"]]),
        "t2va_attribute_accuracy": reports["t2va"]["attribute_accuracy"],
        "per_task": {task: reports[task]["per_attribute"] for task in data.TASKS},
        "n_cases": len(clips),
        "steps": steps,
        "seed": seed,
        "pack": pack,
        "seconds": round(time.monotonic() - start, 1),
    }


def main() -> None:
    parser = run_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    parser.add_argument(
        "--captions", type=Path, help="caption states (training.text_states) instead of the MiniLM encoder"
    )
    args = parser.parse_args()
    states = None
    if args.captions is not None:
        captions, _, tensors = text_states.load(args.captions)
        states = dict(zip(captions, tensors, strict=True))
    engine = load_engine(args.config, args.weights, device=args.device, with_encoder=states is None)
    result = evaluate(engine, data.held_out_clips()[: args.clips], args.steps, args.seed, args.pack, states)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
