"""In-process engine benchmark (no Triton): step time, fused vs separate, packing curve, roofline
and bitwise parity of the served DiT (issues 7 and 16).

    PYTHONUNBUFFERED=1 python benchmarks/engine_bench.py --out DIR [--sections a b e roofline bitwise attention]
        [--attention NAME]

The DiT is built as the server builds it (h3_core.factory.load_engine, what h3_dit runs): on CUDA
use_bitwise_cublas() first (CUBLAS_WORKSPACE_CONFIG=:0:0, set here before the process's first CUDA
GEMM, the matmul probe included), the default row tile (one GEMM per linear on CUDA, 64-row tiles
on the CPU), weights from `random:0` (init_weights(dit, 0) on the DiT's device) and, on CUDA,
H3DiT.compile_blocks and CUDA graphs for packs of up to 4,096 rows (H3DiT.use_cuda_graphs; the
JSON's cuda_graphs counts the captures); then Engine.warm_up, the server's start-up step, whose seconds are the
compile time reported (compile_seconds; on the CPU nothing is compiled and it is the plain first
step). On CUDA that is the `bench` DiT (full H3 width, 8 layers, bf16, text width 5120, 9 text
tokens, per-document SDPA). Through `Engine.denoise_step` (what the server runs per step) it
measures:
  (a) step time for 1, 2, 3, 4 requests of 672x384, 209 frames (16,384 rows each), and the
      step's model FLOP/s against the measured bf16 matmul rate (FLOPs counted as docs/model.md §8:
      per layer 2*S*(4AH + 3FH) + 4*U^2*A per request, plus 2*S*256*H for patch in/out);
  (b) kernel time of 3 separate single-request forwards vs one fused 3-request forward, summed
      per kernel family from torch.profiler (attention, GEMM, norm, elementwise/copy), with
      kernel launch counts and the wall time of the same calls; 3 interleaved runs (separate
      first, then fused first, then separate first): fused_over_separate_3x16384 is the median
      of the 3 kernel-time ratios, with their min and max (and _wall_: the median wall ratio);
  (e) the packing curve: requests of 128, 256, 1,024, 4,096 and 16,384 rows, 8 packed per step
      (4 at 16,384 rows: a pack may not pass H3DiT.max_compiled_rows, 74,898 rows) vs one at a
      time: throughput ratio = n x t(one) / t(n packed);
  roofline: median step time (5 runs after a warm-up) of the packs 1 x 128, 8 x 128, 4 x 1,024,
      1 x 16,384 and 4 x 16,384 rows beside max(weight-read time at 4.8 TB/s, FLOPs / matmul
      rate), with the GPU kernel time and launch count of one profiled step: roofline_ratio_max
      (the worst step / floor) and small_step_ms_128 (the 1 x 128 step);
  bitwise: for each pack 1 x 128; 8 x 128; 128 + 16,384; 3 x 16,384; 64 + 1,024 + 4,096 (rows at
      offsets 0, 64, 1,088: no multiple of cuBLAS's 128- or 256-row tiles), requests of 2 or 3
      steps alternately (seeds 0, 1, ...; from step 1 on a pack mixes timesteps, and a finished
      request leaves it, moving the others' offsets): every request's velocity in the packed
      first step equals its solo step (denoise_step([state])), and its latents after the packed
      run (step mode: all unfinished requests in one step) equal those of request mode (the
      loop of Engine.generate: the request stepped alone to completion, decode left out) bit
      for bit -> bitwise_solo_packed_request. On CUDA the packs of at most 4,096 rows and every
      solo and request-mode step replay CUDA graphs, the larger packs run eagerly (compiled), so
      this also checks a graph replay against the eager forward.
  attention: the step of 1 and of 3 16,384-row requests with `sdpa` and with `auto` as the DiT's
      attention (auto sends documents of 8,192 rows or more to flash_attn4 where flash-attn-4 is
      installed), 3 interleaved runs; `<n>_over_sdpa` is the median ratio.
The matmul rate is the 8192^3 bf16 probe (512^3 on the CPU) of this process, run at the start
and again at the end (the H200 probe varies by several per cent between processes); the higher
of the two is the rate (the lower MFU). Recompilations and graph breaks of the compiled blocks
are counted over the whole run.
On the CPU the same code runs the `tiny` DiT with small shapes as a smoke test (CPU_* below:
128-row requests for the 16,384-row ones of (a) and (b), curve rows 128 and 256, roofline packs
1 x 128 and 4 x 128 without profiles, bitwise packs 3 x 128 and 64 + 128 + 256; (b) in 2
interleaved runs; single timed runs without warm-up in (a) and (e)). Prints a short table last;
writes DIR/engine_bench.json (after every section, so that a run cut short keeps what it
measured). --sections runs a part (the summary then has that part's keys); --attention sets the
DiT's attention backend for every section but `attention` (default sdpa, the served default).
"""

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.engine import Engine  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model.attention import get_attention_backend, installed_version  # noqa: E402 - after the sys.path set-up above
from h3_core.model.dit import use_bitwise_cublas  # noqa: E402 - after the sys.path set-up above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timing import (  # noqa: E402 - after the sys.path set-up above
    kernel_profile,
    matmul_rate,
    spread,
    step_flops,
    timed,
    total_ms,
    wall,
)

# Packing curve: padded rows per request -> (height, width, num_frames) of a request whose padded
# length make_states(seq_len=rows) pins to that many rows (its used rows stay those of the shape).
GPU_CURVE = {128: (64, 96, 22), 256: (128, 192, 22), 1024: (288, 448, 22), 4096: (416, 768, 39), 16384: (384, 672, 209)}
CPU_CURVE = {128: (64, 96, 22), 256: (128, 192, 22)}
GPU_LARGE, CPU_LARGE = (384, 672, 209), (64, 96, 22)
TEXT_LEN = 9
SECTIONS = ("a", "b", "e", "roofline", "bitwise", "attention")
ATTENTION_COMPARED = ("sdpa", "auto")  # the attention section's backends, in the served DiT
WEIGHTS = "random:0"  # the server's `random:0` weight source: init_weights(dit, 0) on the DiT's device
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e bandwidth: the weight-read floor of a step
# Request shapes (height, width, num_frames) by the padded rows they are pinned to (9 text tokens).
SHAPES = {64: (64, 96, 5), 128: (64, 96, 22), 256: (128, 192, 22), 1024: (288, 448, 22), 4096: (416, 768, 39)}
SHAPES[16384] = GPU_LARGE
GPU_ROOFLINE = {"1x128": [128], "8x128": [128] * 8, "4x1024": [1024] * 4, "1x16384": [16384], "4x16384": [16384] * 4}
CPU_ROOFLINE = {"1x128": [128], "4x128": [128] * 4}
GPU_BITWISE = {
    "1x128": [128],
    "8x128": [128] * 8,
    "128+16384": [128, 16384],
    "3x16384": [16384] * 3,
    "64+1024+4096": [64, 1024, 4096],
}
CPU_BITWISE = {"3x128": [128] * 3, "64+128+256": [64, 128, 256]}  # smaller packs
BITWISE_STEPS = (2, 3)  # request i of a pack takes BITWISE_STEPS[i % 2] steps
SUMMARY = (  # engine_bench.json's summary keys in their order (after compile_seconds)
    "step_mfu",
    "fused_over_separate_3x16384",
    "fused_over_separate_3x16384_min",
    "fused_over_separate_3x16384_max",
    "fused_over_separate_wall_3x16384",
    "pack8_speedup_256_rows_e",
    "pack8_min_speedup_e",
    "roofline_ratio_max",
    "small_step_ms_128",
    "bitwise_solo_packed_request",
)


def make_states(engine: Engine, shape, count: int, seq_len: int | None = None, first_seed: int = 0, steps: int = 30):
    """`count` request states of one shape (seeds first_seed, first_seed + 1, ...), random text
    states, `steps` inference steps each."""
    height, width, frames = shape
    text = torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    states = []
    for seed in range(first_seed, first_seed + count):
        request = GenerationRequest("bench", height, width, frames, steps, seed=seed)
        state = engine.prepare(request, text)[0]
        if seq_len is not None:  # pin the padded length to the curve's row count
            state.layout = dataclasses.replace(state.layout, seq_len=seq_len)
        states.append(state)
    return states


def pack_states(engine: Engine, rows_list: list[int], steps: tuple[int, ...] = (30,)):
    """One state per entry of rows_list (a request of SHAPES[rows] pinned to that many rows), request
    i with seed i and steps[i % len(steps)] inference steps."""
    return [
        make_states(engine, SHAPES[rows], 1, seq_len=rows, first_seed=i, steps=steps[i % len(steps)])[0]
        for i, rows in enumerate(rows_list)
    ]


def fused_vs_separate(engine: Engine, states, device: torch.device, runs: int = 3) -> list[dict]:
    """`runs` interleaved runs of (b): 3 separate single-request forwards and one fused forward of
    the same 3 requests, profiled per kernel family, then timed on the wall clock; run i measures
    separate first when i is even, fused first when odd (so a drift over the run cancels). On CUDA
    the first run's profiles are preceded by an unprofiled call (later ones, and the CPU's after
    (a), find all warm)."""

    def separate():
        return [engine.denoise_step([s]) for s in states]

    def fused():
        return engine.denoise_step(states)

    out = []
    for i in range(runs):
        order = ("separate", "fused") if i % 2 == 0 else ("fused", "separate")
        fns = {"separate": separate, "fused": fused}
        profiles = {name: kernel_profile(fns[name], device, warm_up=i == 0 and device.type == "cuda") for name in order}
        walls = {name: wall(fns[name], device) for name in order}
        sep_ms, fused_ms = total_ms(profiles["separate"]), total_ms(profiles["fused"])
        out.append(
            {
                "order": list(order),
                "separate": profiles["separate"],
                "fused": profiles["fused"],
                "separate_ms": sep_ms,
                "fused_ms": fused_ms,
                "fused_over_separate": fused_ms / sep_ms,
                "separate_wall_ms": walls["separate"] * 1e3,
                "fused_wall_ms": walls["fused"] * 1e3,
                "fused_over_separate_wall": walls["fused"] / walls["separate"],
            }
        )
    return out


def attention_steps(engine: Engine, states, device: torch.device, runs: int = 3) -> dict:
    """Step time of 1 and 3 of `states` (16,384-row requests on CUDA, so no CUDA graph) with each
    backend of ATTENTION_COMPARED as the DiT's attention, `runs` interleaved runs (the order of
    the backends reversed every other run), each the median of 3 timed steps after a warm-up;
    then the DiT's own backend again. Returns {"1"|"3": {backend: [seconds per run]}, and
    "<n>_over_sdpa": the median ratio per backend}."""
    own = engine.dit.attention
    results = {}
    for n in (1, 3):
        seconds = {name: [] for name in ATTENTION_COMPARED}
        for i in range(runs):
            for name in ATTENTION_COMPARED if i % 2 == 0 else reversed(ATTENTION_COMPARED):
                engine.dit.attention = get_attention_backend(name, device, engine.dit.cfg.torch_dtype)
                seconds[name].append(timed(lambda n=n: engine.denoise_step(states[:n]), device, 3))
        results[str(n)] = seconds
        results[f"{n}_over_sdpa"] = {
            name: statistics.median(a / b for a, b in zip(seconds[name], seconds["sdpa"], strict=True))
            for name in ATTENTION_COMPARED
        }
    engine.dit.attention = own
    return results


def roofline(engine: Engine, packs: dict, device: torch.device, rate: float, repeats: int = 5) -> dict:
    """Per pack: median step seconds (`repeats` runs after a warm-up), FLOPs, the floor max(weight
    bytes / HBM_BYTES_PER_S, FLOPs / rate), the ratio, and on CUDA the kernel time and launches
    of one more step (torch.profiler; None on the CPU)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.dit.parameters())
    results = {}
    for name, rows_list in packs.items():
        states = pack_states(engine, rows_list)
        seconds = timed(lambda states=states: engine.denoise_step(states), device, repeats)
        profile = None
        if device.type == "cuda":
            profile = kernel_profile(lambda states=states: engine.denoise_step(states), device, warm_up=False)
        flops = step_flops(engine, states)
        weight_s, compute_s = weight_bytes / HBM_BYTES_PER_S, flops / rate
        floor = max(weight_s, compute_s)
        results[name] = {
            "rows": sum(rows_list),
            "requests": len(rows_list),
            "seconds": seconds,
            "flops": flops,
            "weight_bytes": weight_bytes,
            "weight_read_seconds": weight_s,
            "compute_seconds": compute_s,
            "floor_seconds": floor,
            "bound": "weights" if weight_s >= compute_s else "compute",
            "over_floor": seconds / floor,
            "mfu": flops / seconds / rate,
            "kernel_ms": total_ms(profile) if profile else None,
            "launches": sum(v["launches"] for v in profile.values()) if profile else None,
        }
        del states
    return results


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """0.0 when a and b are equal bit for bit (torch.equal), else the largest |a - b|."""
    return 0.0 if torch.equal(a, b) else float((a.float() - b.float()).abs().max())


def bitwise(engine: Engine, packs: dict) -> dict:
    """Per pack: the largest difference between (1) each request's velocity in the packed first
    step and its solo step, (2) its latents after the packed run (every step one forward over all
    unfinished requests, each advanced by Engine.update) and after request mode; 0.0 = bitwise."""
    results = {}
    for name, rows_list in packs.items():
        states = pack_states(engine, rows_list, BITWISE_STEPS)
        pack_sizes, solo = [], [0.0]  # solo: the differences of the first step's velocities

        def first_step_solo(step, pack, velocities, pack_sizes=pack_sizes, solo=solo):
            """Each step's pack size; in the first, each velocity against its solo step (read at
            once: a later forward may reuse the output's memory)."""
            pack_sizes.append(len(pack))
            for state, packed in zip(pack, velocities, strict=True) if step == 0 else ():
                solo += map(max_difference, packed, engine.denoise_step([state])[0])

        engine.run_to_completion(states, on_step=first_step_solo)
        solo_worst = max(solo)
        request_worst = 0.0
        for state, alone in zip(states, pack_states(engine, rows_list, BITWISE_STEPS), strict=True):
            engine.run_to_completion([alone])  # request mode: alone to completion
            for field in ("video_latents", "audio_latents"):
                request_worst = max(request_worst, max_difference(getattr(state, field), getattr(alone, field)))
        results[name] = {
            "rows": rows_list,
            "steps": [s.total_steps for s in states],
            "pack_sizes": pack_sizes,
            "packed_vs_solo_max_difference": solo_worst,
            "packed_vs_request_mode_max_difference": request_worst,
            "bitwise": solo_worst == 0.0 and request_worst == 0.0,
        }
        del states, solo
    return results


def compile_counters() -> dict:
    """Dynamo's recompilations and graph breaks so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0,
        "graph_breaks": sum(counters["graph_break"].values()) if "graph_break" in counters else 0,
        "unique_graphs": counters["stats"]["unique_graphs"],  # 2 (the two block halves) unless recompiled
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to measure (default: all)"
    )
    parser.add_argument(
        "--attention", default="sdpa", help="the DiT's attention backend (default: sdpa, the served default)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        use_bitwise_cublas()  # before the first CUDA GEMM of this process (the matmul probe's)
    cfg = get_config("bench" if cuda else "tiny")
    large, curve = (GPU_LARGE, GPU_CURVE) if cuda else (CPU_LARGE, CPU_CURVE)
    large_rows = 16384 if cuda else 128  # rows of the (a) and (b) requests
    repeats = 3 if cuda else 1
    limits = RequestLimits(max_height=1024, max_width=1024, max_num_frames=257, max_rows=2**20, max_request_mb=2**20)
    start = time.perf_counter()
    engine = load_engine(
        cfg.name, WEIGHTS, str(device), args.attention, with_encoder=False, with_vaes=False, limits=limits
    )
    load_seconds = time.perf_counter() - start
    dit = engine.dit
    compile_seconds = engine.warm_up()
    hardware = torch.cuda.get_device_name() if cuda else "CPU"
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": hardware,
        "torch": torch.__version__,
        "config": cfg.name,
        "command": "python benchmarks/engine_bench.py --out DIR"
        + ("" if args.sections == list(SECTIONS) else " --sections " + " ".join(args.sections))
        + ("" if args.attention == "sdpa" else f" --attention {args.attention}"),
        "sections": args.sections,
        "weights": WEIGHTS,
        "row_tile": dit.video_patch_proj.row_tile,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "compiled_blocks": cuda,
        "attention": args.attention,
        "flash_attn_4": installed_version("flash-attn-4"),
        "load_seconds": load_seconds,
        "compile_seconds": compile_seconds,
    }
    probes = [matmul_rate(device, cfg.torch_dtype)]
    summary = {}
    steps = roof = None

    def save() -> None:
        """Write engine_bench.json (after every section, so that a run cut short keeps what was
        measured), the FLOP-rate figures against the highest probe so far."""
        rate = max(probes)
        results["matmul_probes_flops_per_s"] = probes
        results["matmul_flops_per_s"] = rate
        results["compile"] = {"compile_seconds": compile_seconds, **compile_counters()}
        if dit.graphs is not None:  # CUDA graphs of small packs (H3DiT.use_cuda_graphs)
            results["cuda_graphs"] = {
                "max_rows": dit.graphs.max_rows,
                "kept": dit.graphs.kept,
                "captures": dit.graphs.captures,
            }
        if steps is not None:
            for step in steps.values():
                step["mfu"] = step["flops"] / step["seconds"] / rate
            summary["step_mfu"] = steps[1]["mfu"]
        if roof is not None:
            for entry in roof.values():
                entry["compute_seconds"] = entry["flops"] / rate
                entry["floor_seconds"] = max(entry["weight_read_seconds"], entry["compute_seconds"])
                entry["bound"] = "weights" if entry["weight_read_seconds"] >= entry["compute_seconds"] else "compute"
                entry["over_floor"] = entry["seconds"] / entry["floor_seconds"]
                entry["mfu"] = entry["flops"] / entry["seconds"] / rate
            summary["roofline_ratio_max"] = max(v["over_floor"] for v in roof.values())
            summary["small_step_ms_128"] = roof["1x128"]["seconds"] * 1e3
        results["summary"] = {"compile_seconds": compile_seconds, **{k: summary[k] for k in SUMMARY if k in summary}}
        (args.out / "engine_bench.json").write_text(json.dumps(results, indent=2))

    if "a" in args.sections or "b" in args.sections or "attention" in args.sections:
        states = make_states(engine, large, 4)
        results["first_step_seconds_large"] = wall(lambda: engine.denoise_step(states[:1]), device)
    if "a" in args.sections:  # step time for 1..4 large requests (FLOP/s against the final rate below)
        steps = {}
        for n in (1, 2, 3, 4):
            seconds = timed(lambda n=n: engine.denoise_step(states[:n]), device, repeats, warm_up=cuda)
            steps[n] = {
                "seconds": seconds,
                "flops": step_flops(engine, states[:n]),
                "rows": sum(s.rows for s in states[:n]),
            }
        results["a_step"] = steps
        save()
    if "b" in args.sections:  # fused vs separate, kernel time per family, 3 interleaved runs
        fused_runs = fused_vs_separate(engine, states[:3], device, runs=3 if cuda else 2)
        results["b_fused_vs_separate"] = fused_runs
        ratios = spread([r["fused_over_separate"] for r in fused_runs])
        walls = spread([r["fused_over_separate_wall"] for r in fused_runs])
        results["b_summary"] = {"kernel_time": ratios, "wall": walls}
        summary["fused_over_separate_3x16384"] = ratios["median"]
        summary["fused_over_separate_3x16384_min"] = ratios["min"]
        summary["fused_over_separate_3x16384_max"] = ratios["max"]
        summary["fused_over_separate_wall_3x16384"] = walls["median"]
        save()
    if "attention" in args.sections:  # the DiT step with each attention backend, interleaved
        results["attention_step"] = attention_steps(engine, states, device, runs=3 if cuda else 1)
        save()
    if "a" in args.sections or "b" in args.sections or "attention" in args.sections:
        del states
    if "e" in args.sections:  # packing curve: n packed vs one at a time
        curve_out = {}
        for rows, shape in curve.items():
            count = min(8, (dit.max_compiled_rows or 8 * rows) // rows)  # 4 at 16,384 rows on CUDA
            pack = make_states(engine, shape, count, seq_len=rows)
            one = timed(lambda pack=pack: engine.denoise_step(pack[:1]), device, repeats, warm_up=cuda)
            packed = timed(lambda pack=pack: engine.denoise_step(pack), device, repeats, warm_up=cuda)
            curve_out[rows] = {
                "one_s": one,
                "packed": count,
                "packed_s": packed,
                "speedup": count * one / packed,
                "used_rows": pack[0].layout.used,
            }
            del pack
        results["e_packing_curve"] = curve_out
        summary["pack8_speedup_256_rows_e"] = curve_out[256]["speedup"]
        summary["pack8_min_speedup_e"] = min(v["speedup"] for v in curve_out.values())
        save()
    if "roofline" in args.sections:
        roof = roofline(engine, GPU_ROOFLINE if cuda else CPU_ROOFLINE, device, max(probes), repeats=5 if cuda else 1)
        results["roofline"] = roof
        save()
    if "bitwise" in args.sections:
        parity = bitwise(engine, GPU_BITWISE if cuda else CPU_BITWISE)
        results["bitwise"] = parity
        summary["bitwise_solo_packed_request"] = all(r["bitwise"] for r in parity.values())
        save()

    probes.append(matmul_rate(device, cfg.torch_dtype))  # the rate: the higher of the start and end probes
    save()
    print_tables(results, large_rows)


def print_tables(results: dict, large_rows: int) -> None:
    """The short report of engine_bench.json's numbers."""
    rate = results["matmul_flops_per_s"]
    probes = ", ".join(f"{p / 1e12:.4g}" for p in results["matmul_probes_flops_per_s"])
    compile_info = results["compile"]
    print(
        f"{results['hardware']}, {results['config']} DiT ({results['weights']}), row_tile {results['row_tile']}, "
        f"CUBLAS_WORKSPACE_CONFIG={results['cublas_workspace_config']}, compiled blocks {results['compiled_blocks']}"
    )
    print(
        f"load {results['load_seconds']:.1f} s, warm-up (compile) {compile_info['compile_seconds']:.1f} s, "
        f"recompiles {compile_info['recompiles']}, unique graphs {compile_info['unique_graphs']}, "
        f"graph breaks {compile_info['graph_breaks']}; "
        f"matmul {rate / 1e12:.4g} TFLOP/s (probes {probes})"
    )
    if "a_step" in results:
        print(
            "(a) requests  rows    step ms   model TFLOP/s  MFU   "
            f"(first step {results['first_step_seconds_large'] * 1e3:.1f} ms)"
        )
        for n, v in results["a_step"].items():
            print(
                f"    {n}         {v['rows']:<7} {v['seconds'] * 1e3:8.1f}  "
                f"{v['flops'] / v['seconds'] / 1e12:10.1f}  {v['mfu']:.1%}"
            )
    if "b_fused_vs_separate" in results:
        runs = results["b_fused_vs_separate"]
        print(
            f"(b) 3 x {large_rows} rows: run  first     separate ms  fused ms  fused/separate  "
            "wall sep ms  wall fused ms  wall ratio"
        )
        for i, r in enumerate(runs):
            print(
                f"    {i + 1}    {r['order'][0]:9} {r['separate_ms']:10.2f}  {r['fused_ms']:8.2f}  "
                f"{r['fused_over_separate']:14.3f}  {r['separate_wall_ms']:11.2f}  {r['fused_wall_ms']:13.2f}  "
                f"{r['fused_over_separate_wall']:.3f}"
            )
        b = results["b_summary"]
        print(
            f"    median fused/separate {b['kernel_time']['median']:.3f} (min {b['kernel_time']['min']:.3f}, "
            f"max {b['kernel_time']['max']:.3f}); wall {b['wall']['median']:.3f} "
            f"({b['wall']['min']:.3f}-{b['wall']['max']:.3f})"
        )
        for label in sorted(runs[0]["separate"]):
            sep, fus = runs[0]["separate"][label], runs[0]["fused"].get(label, {"ms": 0.0, "launches": 0})
            print(
                f"    {label:18} {sep['ms']:9.2f} -> {fus['ms']:9.2f} ms  "
                f"launches {sep['launches']} -> {fus['launches']}"
            )
    if "e_packing_curve" in results:
        print("(e) rows/request  one ms   n packed ms  speedup")
        for rows, v in results["e_packing_curve"].items():
            packed = f"{v['packed']:>2} x {v['packed_s'] * 1e3:9.2f}"
            print(f"    {rows:<13} {v['one_s'] * 1e3:8.2f} {packed}  {v['speedup']:.2f}x")
    if "roofline" in results:
        print("roofline  pack       rows    step ms  kernel ms  launches  weights ms  FLOPs/rate ms  floor/step  MFU")
        for name, v in results["roofline"].items():
            print(
                f"          {name:10} {v['rows']:<7} {v['seconds'] * 1e3:8.2f} {v['kernel_ms'] or 0:9.2f} "
                f"{v['launches'] or 0:9d}"
                f" {v['weight_read_seconds'] * 1e3:10.2f} {v['compute_seconds'] * 1e3:13.2f} {v['over_floor']:10.2f}x"
                f"  {v['mfu']:.1%}"
            )
    if "bitwise" in results:
        print("bitwise   pack            steps          packed vs solo  packed vs request mode")
        for name, v in results["bitwise"].items():
            print(
                f"          {name:15} {','.join(map(str, v['steps'])):14} {v['packed_vs_solo_max_difference']:14.3g}  "
                f"{v['packed_vs_request_mode_max_difference']:.3g}"
            )
    if "attention_step" in results:
        steps = results["attention_step"]
        for n in ("1", "3"):
            ms = "  ".join(f"{name} {statistics.median(v) * 1e3:.2f} ms" for name, v in steps[n].items())
            ratios = ", ".join(f"{name} {r:.4f}" for name, r in steps[f"{n}_over_sdpa"].items())
            print(f"attention {n} x {large_rows} rows: {ms}; over sdpa: {ratios}")
    if "cuda_graphs" in results:
        print(f"CUDA graphs: {results['cuda_graphs']}")
    print("summary")
    for key, value in results["summary"].items():
        print(f"    {key:<36} {value}")


if __name__ == "__main__":
    main()
