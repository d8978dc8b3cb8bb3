"""Reference rows' keys and values reused every k steps (issue 49 item 3, h3_core.model.reference_kv):
how far they drift, what reuse saves and what it costs in quality.

    OMP_NUM_THREADS=1 python benchmarks/ref_kv_reuse.py --model demo [--clips 8] [--seeds 0 1 2] \
        [--steps 8] [--out benchmarks/results/ref_kv_reuse_cpu.json]
    python benchmarks/ref_kv_reuse.py --model bench [--steps 30] --out benchmarks/results/ref_kv_reuse_h200.json

--model demo (CPU): the trained demo model (weights/demo, its MiniLM text encoder) on the first
--clips held-out clips of the ref2va tasks (a reference image, a reference tone;
training.evaluate.conditions), every seed of --seeds, 4 requests a pack. Per k of KS: the step
time (seconds of Engine.run_to_completion over the packs / steps taken), the frames' SSIM and PSNR
and the audio's SNR against k = 1 (training.measure; min and mean over the clips) and the attribute
accuracy (training.evaluate.report) against k = 1's. The demo's references are small (an image:
6 of 138 used rows, the same 192 padded rows without them), so "large_references" also times
requests whose references are most of their rows (large_references).
--model bench (CUDA): the bench DiT (the full H3 width, 8 layers, bf16, compiled blocks, weights
random:0) on one 672 x 384 px, 209-frame ref2va request whose references (a video of the same
canvas and length, an image, a 348-latent tone) are over half its rows (16,572 of 32,901 used
rows); per k the median step time over --steps steps of a whole run (refresh and reuse steps
alternate, so the mean step is what a request sees) and the latents' relative error and cosine
against k = 1 (no VAE: the bench DiT has random weights). Without CUDA it runs the tiny DiT on
smaller shapes instead (BENCH_SHAPES), as a smoke test (tests/test_reference_kv.py).

Both: per block, the relative drift of the reference rows' keys and values along the exact
(k = 1) trajectory, ||X_s - X_r|| / ||X_r|| with r the last refresh step before s for k of KS
(mean and max over the steps), read from every step's keys and values (reference_drift).
Writes --out with "summary": ref_kv_reuse_<k>_speedup (k = 1's step time / k's; demo: of
large_references) and ref_kv_reuse_<k>_ssim (demo: min over clips; bench: none).
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.factory import load_engine
from h3_core.model.dit import use_bitwise_cublas
from h3_core.model.reference_kv import ReferenceKV

KS = (2, 4)
PACK = 4
WEIGHTS = Path("weights/demo")


class EveryStep(ReferenceKV):
    """A cache that refreshes at every step (never reuses): the exact trajectory, with every step's
    reference keys and values kept for reference_drift to read."""

    def reuses(self, step: int) -> bool:
        return False


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of a and b flattened, in float64."""
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def reference_drift(engine, states: list, ks=KS) -> dict:
    """Run `states` (ref2va, prepared) to completion exactly (EveryStep caches) and return per k
    of ks {"keys": [per block {"mean", "max"}], "values": [...]} of the relative drift of every
    state's reference keys / values at step s from those of its last refresh step s - s % k, over
    the steps with s % k != 0 and the states. Measured as the run goes, keeping one refresh's
    keys and values per state and k (not every step's: the bench DiT's are 3.8 GB a step)."""
    layers = engine.dit.cfg.num_layers
    refreshed: dict[tuple[int, int], tuple] = {}  # (state, k) -> its last refresh's (keys, values)
    drift = {k: [[[] for _ in range(layers)] for _ in range(2)] for k in ks}  # k -> [keys, values][layer]
    for state in states:
        state.reference_kv = EveryStep(refresh=2)

    def measure(step, pack, velocities):
        for state in pack:
            now = (state.reference_kv.keys, state.reference_kv.values)  # this step's lists (keep replaces them)
            for k in ks:
                if step % k == 0:
                    refreshed[id(state), k] = now
                    continue
                for index in range(2):
                    for layer in range(layers):
                        then = refreshed[id(state), k][index][layer]
                        drift[k][index][layer].append(relative(now[index][layer], then))

    engine.run_to_completion(states, on_step=measure)
    return {
        str(k): {
            name: [{"mean": round(statistics.fmean(v), 5), "max": round(max(v), 5)} for v in drift[k][index]]
            for index, name in enumerate(("keys", "values"))
        }
        for k in ks
    }


def with_refresh(states: list, k: int) -> list:
    """`states` asking refresh k (fresh caches)."""
    for state in states:
        state.reference_kv = ReferenceKV(refresh=k)
    return states


def demo(args) -> dict:
    """--model demo (module docstring)."""
    import numpy as np

    from training import data, measure
    from training.evaluate import conditions, report

    limits = RequestLimits(max_ref_kv_refresh=max(KS))
    engine = load_engine("demo", WEIGHTS, "cpu", limits=limits)
    clips = data.held_out_clips()[: args.clips]

    def states(task: str, seed: int) -> list:
        made = []
        for clip in clips:
            prompt = clip.caption_for(task)
            request = GenerationRequest(
                prompt, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, args.steps, seed, task="ref2va"
            )
            made += engine.prepare(request, None, conditions(engine, clip, task))
        return made

    def run(task: str, seed: int, k: int) -> tuple[list, float]:
        outputs, seconds = [], 0.0
        prepared = with_refresh(states(task, seed), k)
        for start in range(0, len(prepared), PACK):
            begin = time.perf_counter()
            done = engine.run_to_completion(prepared[start : start + PACK])
            seconds += time.perf_counter() - begin
            outputs += [tuple(np.asarray(x) for x in engine.decode(state)) for state in done]
        return outputs, seconds / args.steps / len(range(0, len(prepared), PACK))

    example = states("image", 0)[0]
    start, end = example.layout.reference_span
    results = {"reference_rows": {"image": end - start, "used": example.layout.used}}
    results["drift"] = {task: reference_drift(engine, states(task, 0)[:PACK]) for task in ("image", "audio")}
    quality, speed = {}, {"1": []}
    for task in ("image", "audio"):
        for seed in args.seeds:
            exact, seconds = run(task, seed, 1)
            speed["1"].append(seconds)
            base = report(clips, exact)["attribute_accuracy"]
            for k in KS:
                outputs, seconds = run(task, seed, k)
                speed.setdefault(str(k), []).append(seconds)
                entry = quality.setdefault(str(k), {"ssim": [], "psnr": [], "audio_snr_db": [], "accuracy": []})
                entry["ssim"] += [measure.ssim(o[0], e[0]) for o, e in zip(outputs, exact, strict=True)]
                entry["psnr"] += [
                    statistics.fmean(measure.psnr(f, r) for f, r in zip(o[0], e[0], strict=True))
                    for o, e in zip(outputs, exact, strict=True)
                ]
                entry["audio_snr_db"] += [measure.snr_db(o[1], e[1]) for o, e in zip(outputs, exact, strict=True)]
                entry["accuracy"].append((task, seed, base, report(clips, outputs)["attribute_accuracy"]))
    results["step_s"] = {k: round(statistics.fmean(v), 5) for k, v in speed.items()}
    results["large_references"] = large_references(engine, args.steps)
    results["quality"] = {
        k: {
            "ssim_min": round(min(q["ssim"]), 4),
            "ssim_mean": round(statistics.fmean(q["ssim"]), 4),
            "psnr_min_db": round(min(q["psnr"]), 2),
            "psnr_mean_db": round(statistics.fmean(q["psnr"]), 2),
            "audio_snr_min_db": round(min(q["audio_snr_db"]), 2),
            "accuracy": [{"task": t, "seed": s, "k1": a, "k": b} for t, s, a, b in q["accuracy"]],
        }
        for k, q in quality.items()
    }
    results["summary"] = summary(results)
    return results


def summary(results: dict) -> dict:
    """The demo's summary: the speedups of large_references (the demo's own references, 6 of 138
    rows, leave its 192 padded rows unchanged: its step times differ by the machine's noise only)
    and the smallest SSIM of each k."""
    return {
        **{f"ref_kv_reuse_{k}_speedup": results["large_references"]["speedup"][str(k)] for k in KS},
        **{f"ref_kv_reuse_{k}_ssim": results["quality"][str(k)]["ssim_min"] for k in KS},
    }


def large_references(engine, steps: int, runs: int = 5) -> dict:
    """The demo DiT's step time per k for PACK requests whose references dominate: the demo canvas
    with a reference video of 7 latent frames at 128 x 192 px (168 rows) beside an image
    reference (6 rows), seeded random latents (timing only: the demo never saw such a reference).
    Median over `runs` runs of seconds per step (the k's interleaved), and the packed rows a
    request takes per step (mean over its steps)."""
    g = torch.Generator().manual_seed(0)
    references = [
        Condition("video", 0, torch.randn(24, 7, 8, 12, generator=g)),
        Condition("image", 0, torch.randn(24, 1, 4, 4, generator=g)),
    ]
    text = torch.randn(9, engine.dit.cfg.text_dim, generator=g)
    request = GenerationRequest("large references", 64, 96, 22, steps, seed=0, task="ref2va")
    example = engine.prepare(request, text, references)[0]
    start, end = example.layout.reference_span
    result = {"reference_rows": end - start, "used": example.layout.used, "rows": example.layout.seq_len}
    times: dict[str, list[float]] = {str(k): [] for k in (1, *KS)}
    for _ in range(runs):  # the k's interleaved, so that a change of the machine's load hits them alike
        for k in (1, *KS):
            states = with_refresh([engine.prepare(request, text, references)[0] for _ in range(PACK)], k)
            begin = time.perf_counter()
            engine.run_to_completion(states)
            times[str(k)].append((time.perf_counter() - begin) / steps)
    step_s = {k: round(statistics.median(t), 5) for k, t in times.items()}
    reduced = -(-(example.layout.used - (end - start)) // 64) * 64
    result["step_s"] = step_s
    result["speedup"] = {str(k): round(step_s["1"] / step_s[str(k)], 3) for k in KS}
    result["rows_per_step"] = {  # a request's packed rows, mean over its steps
        str(k): round(statistics.fmean(example.rows if s % k == 0 else reduced for s in range(steps)), 1)
        for k in (1, *KS)
    }
    return result


# --model bench: (config, height, width, frames, reference video latent [T, h, w], reference tone
# latents) on CUDA, and the CPU smoke test's tiny stand-in (references 128 of 253 used rows)
BENCH_SHAPES = {"cuda": ("bench", 384, 672, 209, (62, 24, 42), 348), "cpu": ("tiny", 64, 96, 22, (7, 4, 6), 40)}


def bench(args) -> dict:
    """--model bench (module docstring); on a machine without CUDA the tiny DiT on smaller shapes
    (BENCH_SHAPES["cpu"]), a smoke test."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config, height, width, frames, video, tone = BENCH_SHAPES[device]
    if device == "cuda":  # as load_engine: the process's environment is left alone on the CPU (its smoke
        use_bitwise_cublas()  # test runs inside a pytest process whose later subprocesses inherit it)
    limits = RequestLimits(
        max_height=1024,
        max_width=1024,
        max_num_frames=257,
        max_rows=2**20,
        max_request_mb=2**30,
        max_ref_kv_refresh=max(KS),
    )
    engine = load_engine(config, "random:0", device, with_encoder=False, with_vaes=False, limits=limits)
    engine.warm_up()
    g = torch.Generator().manual_seed(0)
    text = torch.randn(9, engine.dit.cfg.text_dim, generator=g)
    references = [
        Condition("video", 0, torch.randn(24, *video, generator=g)),
        Condition("image", 0, torch.randn(24, 1, *video[1:], generator=g)),
        Condition("audio", 0, None, torch.randn(2, 32, tone, generator=g)),
    ]
    request = GenerationRequest("bench", height, width, frames, args.steps, seed=0, task="ref2va")

    def prepared(k: int):
        return with_refresh(engine.prepare(dataclasses.replace(request, ref_kv_refresh=k), text, references), k)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    example = prepared(1)[0]
    start, end = example.layout.reference_span
    results = {"config": config, "reference_rows": end - start, "used": example.layout.used}
    results["rows"] = example.layout.seq_len
    results["drift"] = reference_drift(engine, prepared(1))
    finals, step_s = {}, {}
    for k in (1, *KS):
        times = []

        def timing(step, pack, velocities, times=times):
            sync()
            times.append(time.perf_counter())

        sync()
        begin = time.perf_counter()
        (state,) = engine.run_to_completion(prepared(k), on_step=timing)
        sync()
        steps = [b - a for a, b in zip([begin, *times], times, strict=False)]
        step_s[str(k)] = round(statistics.fmean(steps[1:]), 5)  # the first step also pays warm-up
        finals[str(k)] = state.video_latents.float().cpu()
    results["step_s"] = step_s
    results["latent_error"] = {
        str(k): {
            "relative": float(f"{relative(finals[str(k)], finals['1']):.4g}"),
            "cosine": round(cosine(finals[str(k)], finals["1"]), 9),
        }
        for k in KS
    }
    results["summary"] = {f"ref_kv_reuse_{k}_speedup": round(step_s["1"] / step_s[str(k)], 3) for k in KS}
    return results


def cpu_name() -> str:
    """This CPU, as the other CPU results name theirs."""
    return f"the {os.cpu_count()}-core development CPU ({platform.machine()}, OMP threads {torch.get_num_threads()})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("demo", "bench"), default="demo")
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="Euler steps (demo 8, bench 30)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ref_kv_reuse_cpu.json"))
    args = parser.parse_args()
    args.steps = args.steps or (8 if args.model == "demo" else 30)
    results = {
        "what": "reference rows' keys and values reused every k steps: drift, step time, quality against k = 1",
        "command": " ".join(
            ["OMP_NUM_THREADS=1" if args.model == "demo" else "", "python benchmarks/ref_kv_reuse.py", *sys.argv[1:]]
        ).strip(),
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name(),
        "model": args.model,
        "steps": args.steps,
        "torch": torch.__version__,
        **(demo(args) if args.model == "demo" else bench(args)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
