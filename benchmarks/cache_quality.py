"""Step caching on the demo model: quality and row-steps saved per cache_threshold (issue 34).

    OMP_NUM_THREADS=1 python -m benchmarks.cache_quality --fit      # writes weights/demo/step_cache.json
    python -m benchmarks.cache_quality --simulate                     # adds "simulation" to --out
    OMP_NUM_THREADS=1 python -m benchmarks.cache_quality [--clips 8] [--steps 8 30] \
        [--thresholds 0 0.01 0.02 0.05 0.1 0.2] [--out benchmarks/results/cache_demo_cpu.json] \
        [--figure docs/cache_curve.png]

In-process on the CPU, the demo engine (h3_core.factory.load_engine, weights/demo) with the
caption states of build/captions/caption_states.safetensors (training.text_states) instead of
the MiniLM encoder.

--fit: the step cache's polynomial (h3_core.diffusion.step_cache). For FIT_CLIPS held-out clips
(the last ones of data.held_out_clips, disjoint from the measured ones) and FIT_TASKS, each at
8 and 30 steps without caching, every step after the first gives one point (x: the relative
change of the first block's modulated input, step_cache.modulated_input; y: the relative change of
the velocity, video and audio rows together); numpy.polyfit of degree FIT_DEGREE through them
is written to the weights' CACHE_FILE with its source and fit residual. Degree 1: on the demo
model degree 2 fits barely better (rms residual 0.00887 against 0.00901) and turns down past
x = 0.27, where the accumulation would stop growing.

Measurement: for each step count and threshold, the first --clips held-out clips of every task
of TASKS (t2va, fl2va first / last keyframe, ref2va image / audio), `PACK` requests per packed
forward (evaluate.generate_states), against the uncached clips (threshold 0): the fraction of
steps skipped, the row-step reduction (rows x computed steps without / with caching), SSIM and
PSNR of the frames and SNR of the audio (training.measure; min and median over clips) and the
attribute accuracy (training.evaluate.report, per task; "accuracy_unchanged" when every task's
equals its uncached value). The recommended threshold is the largest whose SSIM is >= MIN_SSIM
for every clip at every step count and whose accuracy is unchanged. A bitwise check runs a
cached request solo, co-batched with three neighbours (other thresholds and tasks) and in
request mode (Engine.generate) and compares the latents with torch.equal. Writes the JSON
(with "summary": recommended_threshold, cache_row_step_reduction and cache_min_ssim at it,
cache_bitwise_solo_packed) and a figure of SSIM and row-step reduction per threshold.

--simulate: the serving simulator (h3_core.serving.dit.simulate, srpt) on the reference and mixed
workloads without caching and at the hit rate measured at each threshold above 0 (its skipped
fraction at the largest step count, 30), added to --out as "simulation" (one entry per
threshold, the recommended one marked): per workload the
capacity gain (DiT seconds of all its requests without / with caching, each alone) and both runs'
summaries on the same arrivals; for mixed also a cached run with the uncached run's arrival rate
(requests / last arrival) raised by the gain: the same utilisation as the uncached run."""

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from h3_core.diffusion.request import GenerationRequest
from h3_core.diffusion.step_cache import modulated_input, relative_change
from h3_core.factory import load_engine
from h3_core.weights.checkpoint import CACHE_FILE
from training import data, measure, text_states
from training.evaluate import conditions, generate_states, report

TASKS = ("t2va", "first", "last", "image", "audio")
FIT_TASKS, FIT_CLIPS, FIT_DEGREE = ("t2va", "first", "image"), 6, 1
MIN_SSIM, PACK = 0.97, 4
WEIGHTS, CAPTIONS = Path("weights/demo"), Path("build/captions/caption_states.safetensors")


def load(max_cache_threshold: float, device: str = "cpu"):
    """The demo engine on `device` (no text encoder, request limits allowing
    `max_cache_threshold`) and the caption -> text states map."""
    captions, _, states = text_states.load(CAPTIONS)
    engine = load_engine("demo", WEIGHTS, device, with_encoder=False)
    engine.limits = engine.limits.__class__(**{**engine.limits.__dict__, "max_cache_threshold": max_cache_threshold})
    return engine, dict(zip(captions, states, strict=True))


def fit(engine, states: dict) -> dict:
    """The polynomial fit of --fit (module docstring); returns what CACHE_FILE holds."""
    xs, ys = [], []
    for clip in data.held_out_clips()[-FIT_CLIPS:]:
        for task in FIT_TASKS:
            for steps in (8, 30):
                prompt = clip.caption_for(task)
                request = GenerationRequest(
                    prompt, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, steps, 0, task=data.REQUEST_TASKS[task]
                )
                previous = None  # the last step's (modulated input, velocity)

                def measure_step(step, pack, velocities):
                    nonlocal previous
                    ((state,), ((video, audio),)) = pack, velocities
                    k = state.step_index
                    modulated = modulated_input(
                        engine.dit,
                        state.video_latents,
                        state.audio_latents,
                        1.0 - state.sigmas_video[k],
                        1.0 - state.sigmas_audio[k],
                    )
                    velocity = torch.cat([video.flatten(), audio.flatten()]).clone()
                    if previous is not None:
                        xs.append(relative_change(modulated, previous[0]))
                        ys.append(relative_change(velocity, previous[1]))
                    previous = (modulated, velocity)

                engine.run_to_completion(
                    engine.prepare(request, states[prompt], conditions(engine, clip, task)), on_step=measure_step
                )
    coefficients = np.polyfit(xs, ys, FIT_DEGREE)
    residual = float(np.sqrt(np.mean((np.polyval(coefficients, xs) - ys) ** 2)))
    return {
        "polynomial": [float(c) for c in coefficients],
        "source": (
            f"benchmarks/cache_quality.py --fit: numpy.polyfit(degree {FIT_DEGREE}) of the velocity's relative "
            f"change against the first block's modulated input's, {len(xs)} steps of {FIT_CLIPS} held-out clips "
            f"(the last of data.held_out_clips) x tasks {list(FIT_TASKS)} x 8 and 30 steps, seed 0, no caching"
        ),
        "rms_residual": round(residual, 5),
        "x_range": [round(min(xs), 5), round(max(xs), 5)],
        "y_range": [round(min(ys), 5), round(max(ys), 5)],
    }


def run(engine, states: dict, clips: list, steps: int, threshold: float) -> dict:
    """Every task of TASKS for `clips` at `steps` and `threshold`: task -> [(state, frames, audio)]."""
    return {task: generate_states(engine, clips, steps, 0, PACK, states, task, threshold) for task in TASKS}


def compare(clips: list, runs: dict, reference: dict) -> dict:
    """One threshold's outputs `runs` against the uncached `reference` (module docstring)."""
    ssim, psnr, snr, rows_all, rows_done, skipped, total = [], [], [], 0, 0, 0, 0
    accuracy, unchanged = {}, True
    for task in TASKS:
        for (state, frames, audio), (_, ref_frames, ref_audio) in zip(runs[task], reference[task], strict=True):
            ssim.append(measure.ssim(frames, ref_frames))
            psnr.append(min(measure.psnr(frames, ref_frames), 99.0))
            snr.append(min(measure.snr_db(audio, ref_audio), 99.0))
            rows_all += state.rows * state.total_steps
            rows_done += state.rows * (state.total_steps - state.cache.skipped)
            skipped, total = skipped + state.cache.skipped, total + state.total_steps
        accuracy[task] = report(clips, [(f, a) for _, f, a in runs[task]])["attribute_accuracy"]
        unchanged &= accuracy[task] == report(clips, [(f, a) for _, f, a in reference[task]])["attribute_accuracy"]
    return {
        "skipped_fraction": round(skipped / total, 4),
        "row_step_reduction": round(rows_all / rows_done, 4),
        "ssim_min": round(min(ssim), 4),
        "ssim_median": round(float(np.median(ssim)), 4),
        "psnr_min_db": round(min(psnr), 2),
        "psnr_median_db": round(float(np.median(psnr)), 2),
        "audio_snr_min_db": round(min(snr), 2),
        "audio_snr_median_db": round(float(np.median(snr)), 2),
        "attribute_accuracy": accuracy,
        "accuracy_unchanged": unchanged,
    }


def bitwise_check(engine, states: dict, threshold: float) -> dict:
    """A cached request (t2va, 8 steps, `threshold`) solo, co-batched with three neighbours
    (thresholds 0, threshold / 2 and 2 x threshold capped at the limit; tasks first, image,
    t2va) and in request mode: whether its latents are torch.equal in all three, and its
    skipped steps."""
    clips = data.held_out_clips()[:4]
    thresholds = [threshold, 0.0, threshold / 2, min(2 * threshold, engine.limits.max_cache_threshold)]
    tasks = ["t2va", "first", "image", "t2va"]

    def prepare(clip, task, value):
        prompt = clip.caption_for(task)
        request = GenerationRequest(
            prompt, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, 8, 0, task=data.REQUEST_TASKS[task], cache_threshold=value
        )
        return engine.prepare(request, states[prompt], conditions(engine, clip, task))[0]

    (solo,) = engine.run_to_completion([prepare(clips[0], "t2va", threshold)])
    packed = engine.run_to_completion(
        [prepare(clip, task, value) for clip, task, value in zip(clips, tasks, thresholds, strict=True)]
    )
    prompt = clips[0].caption_for("t2va")
    request = GenerationRequest(prompt, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, 8, 0, cache_threshold=threshold)
    ((request_mode, _, _),) = engine.generate(request, states[prompt])
    equal = all(
        torch.equal(solo.video_latents, other.video_latents) and torch.equal(solo.audio_latents, other.audio_latents)
        for other in (packed[0], request_mode)
    )
    return {
        "threshold": threshold,
        "equal": equal,
        "skipped_steps": [solo.cache.skipped, packed[0].cache.skipped, request_mode.cache.skipped],
        "neighbours_skipped_steps": [state.cache.skipped for state in packed[1:]],
    }


def figure(result: dict, path: Path) -> None:
    """SSIM (min and median) and row-step reduction per threshold, one line per step count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for steps, rows in result["curves"].items():
        x = [row["threshold"] for row in rows]
        left.plot(x, [row["ssim_min"] for row in rows], "o-", label=f"{steps} steps, min")
        left.plot(x, [row["ssim_median"] for row in rows], "o--", label=f"{steps} steps, median")
        right.plot(x, [row["row_step_reduction"] for row in rows], "o-", label=f"{steps} steps")
    recommended = result["summary"]["recommended_threshold"]
    for axis in (left, right):
        axis.axvline(recommended, color="grey", linestyle=":", label=f"recommended {recommended}")
        axis.set_xlabel("cache_threshold")
        axis.legend(fontsize=8)
    left.axhline(MIN_SSIM, color="red", linewidth=0.8)
    left.set_ylabel("SSIM of frames vs uncached")
    right.axhline(1.5, color="red", linewidth=0.8)
    right.set_ylabel("row-step reduction (x)")
    fig.suptitle(
        f"Step caching on the demo model ({result['clips_per_task']} held-out clips x {len(TASKS)} tasks, CPU)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def simulation(hit_rate: float) -> dict:
    """--simulate's "simulation" for `hit_rate` (module docstring)."""
    from h3_core.serving.dit.simulate import make_workload, simulate, summarize

    def work(workload) -> float:  # DiT seconds of its requests, each alone, computed steps only
        return sum(
            (r.steps - min(round(workload.hit_rate * r.steps), max(r.steps - 2, 0))) * workload.cost.step_s(r.rows)
            for r in workload.requests
        )

    result = {"hit_rate": hit_rate, "policy": "srpt"}
    for name in ("reference", "mixed"):
        plain, cached = make_workload(name), make_workload(name, hit_rate=hit_rate)
        gain = work(plain) / work(cached)
        result[name] = {
            "capacity_gain": round(gain, 4),
            "uncached": summarize(plain, simulate(plain, "srpt")),
            "cached": summarize(cached, simulate(cached, "srpt")),
        }
        if name == "mixed":
            rate = len(plain.requests) * 60 / plain.requests[-1].submit_s * gain
            faster = make_workload(name, rate_per_min=rate, hit_rate=hit_rate)
            result[name]["cached_at_gain_x_rate"] = {
                "rate_per_min": round(rate, 3),
                **summarize(faster, simulate(faster, "srpt")),
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="fit the polynomial and write it beside the weights")
    parser.add_argument("--simulate", action="store_true", help="add the simulator's capacity gain to --out")
    parser.add_argument("--clips", type=int, default=8, help="held-out clips per task")
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 30])
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.05, 0.1, 0.2])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cache_demo_cpu.json"))
    parser.add_argument("--figure", type=Path, default=Path("docs/cache_curve.png"))
    args = parser.parse_args()
    if args.simulate:
        result = json.loads(args.out.read_text())
        recommended = result["summary"]["recommended_threshold"]
        result["simulation"] = [
            {
                "threshold": row["threshold"],
                "recommended": row["threshold"] == recommended,
                **simulation(row["skipped_fraction"]),
            }
            for row in result["curves"][str(max(args.steps))]
            if row["threshold"] > 0
        ]
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["simulation"]))
        return
    engine, states = load(max(args.thresholds))
    start = time.monotonic()
    if args.fit:
        fitted = fit(engine, states)
        (WEIGHTS / CACHE_FILE).write_text(json.dumps(fitted, indent=1) + "\n")
        print(json.dumps(fitted))
        return
    clips = data.held_out_clips()[: args.clips]
    curves = {}
    for steps in args.steps:
        reference = run(engine, states, clips, steps, 0.0)
        curves[steps] = []
        for threshold in args.thresholds:
            runs = reference if threshold == 0 else run(engine, states, clips, steps, threshold)
            curves[steps].append({"threshold": threshold, **compare(clips, runs, reference)})
            print(steps, json.dumps(curves[steps][-1]), flush=True)
    good = [
        threshold
        for index, threshold in enumerate(args.thresholds)
        if all(rows[index]["ssim_min"] >= MIN_SSIM and rows[index]["accuracy_unchanged"] for rows in curves.values())
    ]
    recommended = max(good)
    at = {steps: rows[args.thresholds.index(recommended)] for steps, rows in curves.items()}
    bitwise = bitwise_check(engine, states, recommended if recommended > 0 else args.thresholds[1])
    result = {
        "date": datetime.date.today().isoformat(),
        "command": "OMP_NUM_THREADS=1 python -m benchmarks.cache_quality " + " ".join(sys.argv[1:]),
        "hardware": f"{platform.processor() or platform.machine()}, OMP threads {torch.get_num_threads()}",
        "weights": str(WEIGHTS),
        "polynomial": list(engine.cache_polynomial),
        "clips_per_task": args.clips,
        "tasks": list(TASKS),
        "pack": PACK,
        "curves": curves,
        "bitwise": bitwise,
        "summary": {
            "recommended_threshold": recommended,
            "cache_row_step_reduction": {steps: row["row_step_reduction"] for steps, row in at.items()},
            "cache_skipped_fraction": {steps: row["skipped_fraction"] for steps, row in at.items()},
            "cache_min_ssim": min(row["ssim_min"] for row in at.values()),
            "cache_bitwise_solo_packed": bitwise["equal"] and min(bitwise["skipped_steps"]) > 0,
        },
        "seconds": round(time.monotonic() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    figure(result, args.figure)
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
