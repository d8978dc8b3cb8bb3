"""Evaluate the demo model in-process on the held-out attribute combinations.

    python -m training.evaluate [--clips 36] [--steps 8] [--pack 4] [--out out/eval] \
        [--config demo] [--weights weights/demo]

Loads the engine (h3_core.factory.load_engine: the DiT, both VAEs and the MiniLM text encoder)
for `--config` with the weights folder `--weights`, generates one clip per held-out combination
(data.HELD_OUT: attribute combinations never trained on, seed 0, the 64 x 96 x 22 canvas) with
`--pack` requests co-batched in each DiT forward, as the server's step loop packs them (a
co-batched request's output is bit-identical to the same request alone), and scores each clip
with measure.py: dominant colour, direction of the shape's motion, dominant pitch, stereo side.
--out keeps the MP4s and a JSON report. tests/test_demo_model.py scores clips served by
tritonserver with the same `report`.

The last line printed is one JSON object: {"attribute_accuracy", "n_clips", "per_attribute",
"steps", "seed", "pack", "seconds"}.
"""

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
import torch

from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.engine import Engine, RequestState
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine
from h3_core.media import write_mp4
from h3_core.serving.encoder.conditioning import Keyframes, References, keyframe_conditions, reference_conditions

from . import data, measure

KEYFRAME_INDICES = {"first": [L.FIRST_FRAME], "last": [L.LAST_FRAME], "both": [L.FIRST_FRAME, L.LAST_FRAME]}


def conditions(engine: Engine, clip: data.Clip, task: str) -> list[Condition]:
    """The Conditions of `clip` for a task of data.TASKS, built as h3_encoder builds them
    (h3_core.serving.encoder.conditioning): "first" / "last" / "both" the clip's rendered first / last
    frames as KEYFRAMES (keyframe_conditions), "image" its reference image and "audio" its
    reference tone (data.render_reference_image, data.render_audio of REFERENCE_SAMPLES) as
    REFERENCE_IMAGES / REFERENCE_AUDIO (reference_conditions), with the engine's VAEs; [] for
    t2va. Raises KeyError for another task."""
    if task == "t2va":
        return []
    if task in KEYFRAME_INDICES:
        frames = data.render_video([clip])[0].numpy()
        indices = KEYFRAME_INDICES[task]
        return keyframe_conditions(engine.video_vae, Keyframes(indices, [frames[i] for i in indices]))
    refs = {
        "image": lambda: References(images=[data.render_reference_image([clip])[0].numpy()]),
        "audio": lambda: References(audio=[data.render_audio([clip], samples=data.REFERENCE_SAMPLES)[0].numpy()]),
    }[task]()
    return reference_conditions(engine.video_vae, engine.audio_vae, refs)


def generate(
    engine: Engine,
    clips: list[data.Clip],
    steps: int,
    seed: int = 0,
    pack: int = 4,
    text_states: dict[str, torch.Tensor] | None = None,
    task: str = "t2va",
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One clip per entry of `clips` (its caption for `task`, Clip.caption_for, with the task's
    `conditions`, the training canvas, `steps` Euler steps, `seed`), `pack` requests per packed
    DiT forward (request mode when pack is 1).

    text_states: caption -> [L, text_dim] text states; None encodes each caption with the
    engine's text encoder. task: one of data.TASKS (the request's TASK is data.REQUEST_TASKS').
    Returns per clip (frames uint8 [22, 64, 96, 3], audio float32 [2, 29333]) as numpy arrays.
    Raises ValueError for a request outside the engine's limits and KeyError for a caption
    missing from text_states or an unknown task.
    """
    return [
        (frames, audio) for _, frames, audio in generate_states(engine, clips, steps, seed, pack, text_states, task)
    ]


def generate_states(
    engine: Engine,
    clips: list[data.Clip],
    steps: int,
    seed: int = 0,
    pack: int = 4,
    text_states: dict[str, torch.Tensor] | None = None,
    task: str = "t2va",
    cache_threshold: float = 0.0,
    lora: tuple[tuple[str, float], ...] = (),
    sigmas: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> list[tuple[RequestState, np.ndarray, np.ndarray]]:
    """`generate` with each clip's finished RequestState (its rows, its step cache's skipped
    steps) before its frames and audio; cache_threshold: each request's (0: every step
    computed; the engine's limits bound it); lora: each request's adapters (name, scale), loaded
    with Engine.add_lora; sigmas: each request's (video_sigmas, audio_sigmas), steps + 1 points
    each (None: the shifted uniform schedule)."""
    outputs = []
    for start in range(0, len(clips), pack):
        states = []
        for clip in clips[start : start + pack]:
            prompt = clip.caption_for(task)
            request = GenerationRequest(
                prompt,
                data.HEIGHT,
                data.WIDTH,
                data.NUM_FRAMES,
                steps,
                seed,
                task=data.REQUEST_TASKS[task],
                cache_threshold=cache_threshold,
                video_sigmas=None if sigmas is None else sigmas[0],
                audio_sigmas=None if sigmas is None else sigmas[1],
                lora=lora,
            )
            embeds = None if text_states is None else text_states[prompt]
            states += engine.prepare(request, embeds, conditions(engine, clip, task))
        for state, frames, audio in engine.run_to_completion(states, decode=True):
            outputs.append((state, frames.cpu().numpy(), audio.cpu().numpy()))
    return outputs


def report(clips: list[data.Clip], outputs: list[tuple[np.ndarray, np.ndarray]], log=None) -> dict:
    """Score each clip's (frames uint8 [T, H, W, 3], audio float32 [2, N]) with measure.score.

    Returns {"attribute_accuracy": right / scored attributes, "n_clips", "per_attribute":
    {name: fraction right}, "clips": the measure.score of each clip}, fractions rounded to 4
    places. log(line), when given, gets one line per clip naming the wrong attributes.
    """
    scored = [measure.score(clip, frames, audio) for clip, (frames, audio) in zip(clips, outputs, strict=True)]
    if log is not None:
        for s in scored:
            log(
                f"{s['caption']!r}: "
                + " ".join(
                    f"{k}={'ok' if v else 'WRONG(' + str(s['measured'][k]) + ')'}" for k, v in s["correct"].items()
                )
            )
    total = sum(len(s["correct"]) for s in scored)
    right = sum(sum(s["correct"].values()) for s in scored)
    return {
        "attribute_accuracy": round(right / max(total, 1), 4),
        "n_clips": len(scored),
        "per_attribute": {
            k: round(sum(s["correct"][k] for s in scored) / max(len(scored), 1), 4) for k in measure.SCORED
        },
        "clips": scored,
    }


def evaluate(
    engine: Engine,
    clips: list[data.Clip],
    steps: int | None = None,
    seed: int = 0,
    pack: int = 4,
    out: Path | None = None,
    log=print,
) -> dict:
    """Generate (steps None: the config's default_steps) and score `clips` with `engine`; returns
    report's dict without "clips" plus "steps", "seed", "pack" and "seconds" (wall time). With
    `out`, writes <out>/<caption>.mp4 per clip and <out>/report.json (the full report)."""
    start = time.monotonic()
    steps = steps or engine.dit.cfg.default_steps
    outputs = generate(engine, clips, steps, seed, pack)
    result = {
        **report(clips, outputs, log),
        "steps": steps,
        "seed": seed,
        "pack": pack,
        "seconds": round(time.monotonic() - start, 1),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for clip, (frames, audio) in zip(clips, outputs, strict=True):
            write_mp4(out / f"{re.sub(r'[^a-z0-9]+', '-', clip.caption)[:80].strip('-')}.mp4", frames, audio)
        (out / "report.json").write_text(json.dumps(result, indent=1))
    return {k: v for k, v in result.items() if k != "clips"}


def run_arguments(description: str) -> argparse.ArgumentParser:
    """The command line both evaluations take: --clips (held-out prompts, from the first),
    --steps, --pack, --config, --weights, --seed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--clips", type=int, default=len(data.HELD_OUT), help="how many held-out prompts (from the first)"
    )
    parser.add_argument("--steps", type=int, help="denoise steps (default: the config's)")
    parser.add_argument("--pack", type=int, default=4, help="requests co-batched in one DiT forward")
    parser.add_argument("--config", default="demo")
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"), help="checkpoint folder")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> None:
    parser = run_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the MP4s and report.json")
    args = parser.parse_args()
    engine = load_engine(args.config, args.weights)
    print(json.dumps(evaluate(engine, data.held_out_clips()[: args.clips], args.steps, args.seed, args.pack, args.out)))


if __name__ == "__main__":
    main()
