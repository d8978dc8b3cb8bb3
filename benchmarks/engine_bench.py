"""In-process engine benchmark (no Triton): step time, fused vs separate, packing curve (issue 7).

    PYTHONUNBUFFERED=1 python benchmarks/engine_bench.py --out DIR

On CUDA it uses the `bench` DiT (full H3 width, 8 layers, bf16, random weights from seed 0,
text width 5120, 9 text tokens) with the default bitwise settings (per-document SDPA, row tiles
of 4096) and measures, through `Engine.denoise_step` (what the server runs per step):
  (a) step time for 1, 2, 3, 4 requests of 672x384, 209 frames (16,384 rows each), and the
      step's model FLOP/s against the measured bf16 matmul rate (FLOPs counted as h3_spec §8:
      per layer 2*S*(4AH + 3FH) + 4*U^2*A per request, plus 2*S*256*H for patch in/out);
  (b) kernel time of 3 separate single-request forwards vs one fused 3-request forward, summed
      per kernel family from torch.profiler (attention, GEMM, norm, elementwise/copy), with
      kernel launch counts, two runs to show the spread;
  (e) the packing curve: requests of 128, 256, 1,024, 4,096 and 16,384 rows, 8 packed per step
      vs one at a time: throughput ratio = 8 x t(one) / t(8 packed).
On the CPU the same code runs the `tiny` DiT with small shapes as a smoke test. Prints a short
table last; writes DIR/engine_bench.json.
"""

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3_core.checkpoint import init_weights  # noqa: E402 - after the sys.path set-up above
from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.engine import Engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model import H3DiT  # noqa: E402 - after the sys.path set-up above
from h3_core.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above

# Packing curve: padded rows per request -> (height, width, num_frames) of a request whose padded
# length make_states(seq_len=rows) pins to that many rows (its used rows stay those of the shape).
GPU_CURVE = {128: (64, 96, 22), 256: (128, 192, 22), 1024: (288, 448, 22), 4096: (416, 768, 39), 16384: (384, 672, 209)}
CPU_CURVE = {128: (64, 96, 22), 256: (128, 192, 22)}
GPU_LARGE, CPU_LARGE = (384, 672, 209), (64, 96, 22)
TEXT_LEN = 9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_flops(engine: Engine, states) -> float:
    """Model FLOPs of one packed step (h3_spec §8): linears over padded rows S, attention over
    used rows U, patch projections; the refiner and AdaLN are left out (under 0.1%)."""
    cfg = engine.dit.cfg
    hidden, attn, ffn = cfg.hidden_size, cfg.attn_width, cfg.ffn_size
    total = 0.0
    for state in states:
        rows, used = state.layout.seq_len, state.layout.used
        total += cfg.num_layers * (2 * rows * (4 * attn * hidden + 3 * ffn * hidden) + 4 * used**2 * attn)
        total += 2 * rows * 256 * hidden
    return total


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """Measured dense matmul FLOP/s (8192^3 on CUDA, 1024^3 on the CPU)."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / timed(lambda: a @ b, device, 10)


def make_states(engine: Engine, shape, count: int, seq_len: int | None = None):
    """`count` request states of one shape (seeds 0..count-1), random text states."""
    height, width, frames = shape
    text = torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    states = []
    for seed in range(count):
        request = GenerationRequest("bench", height, width, frames, 30, seed=seed)
        state = engine.prepare(request, text)[0]
        if seq_len is not None:  # pin the padded length to the curve's row count
            state.layout = dataclasses.replace(state.layout, seq_len=seq_len)
        states.append(state)
    return states


# Kernel name fragments per family; anything else counts as elementwise/copy.
KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas", "addmm", "aten::mm", "linear")),
    ("norm", ("norm", "reduce")),
)


def family(name: str) -> str:
    lowered = name.lower()
    for label, keys in KERNEL_FAMILIES:
        if any(key in lowered for key in keys):
            return label
    return "elementwise/copy"


def kernel_profile(fn, device: torch.device) -> dict:
    """GPU kernel time (ms) and launch count per kernel family of one call of fn()."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    fn()
    sync(device)
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    out = {}
    for event in prof.key_averages():
        us = event.device_time_total if device.type == "cuda" else event.self_cpu_time_total
        if device.type == "cuda" and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if us <= 0:
            continue
        label = family(event.key)
        entry = out.setdefault(label, {"ms": 0.0, "launches": 0})
        entry["ms"] += us / 1000
        entry["launches"] += event.count
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cfg = get_config("bench" if cuda else "tiny")
    large, curve = (GPU_LARGE, GPU_CURVE) if cuda else (CPU_LARGE, CPU_CURVE)
    repeats = 3 if cuda else 1
    dit = H3DiT(cfg, device=device)
    init_weights(dit, 0)
    engine = Engine(
        dit.eval(), None, None, None, RequestLimits(max_height=1024, max_width=1024, max_num_frames=257, max_rows=2**20)
    )
    hardware = torch.cuda.get_device_name() if cuda else "CPU"
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": hardware,
        "torch": torch.__version__,
        "config": cfg.name,
        "command": "python benchmarks/engine_bench.py --out DIR",
        "row_tile": dit.video_patch_proj.row_tile,
        "attention": "sdpa",
    }
    rate = matmul_rate(device, cfg.torch_dtype)
    results["matmul_flops_per_s"] = rate

    # (a) step time for 1..4 large requests, and model FLOP/s
    states = make_states(engine, large, 4)
    steps = {}
    for n in (1, 2, 3, 4):
        seconds = timed(lambda n=n: engine.denoise_step(states[:n]), device, repeats)
        flops = step_flops(engine, states[:n])
        steps[n] = {
            "seconds": seconds,
            "flops": flops,
            "mfu": flops / seconds / rate,
            "rows": sum(s.rows for s in states[:n]),
        }
    results["a_step"] = steps

    # (b) fused vs separate, kernel time per family, two runs
    fused_runs = []
    for _ in range(2):
        separate = kernel_profile(lambda: [engine.denoise_step([s]) for s in states[:3]], device)
        fused = kernel_profile(lambda: engine.denoise_step(states[:3]), device)
        total_sep = sum(v["ms"] for v in separate.values())
        total_fused = sum(v["ms"] for v in fused.values())
        fused_runs.append(
            {
                "separate": separate,
                "fused": fused,
                "separate_ms": total_sep,
                "fused_ms": total_fused,
                "fused_over_separate": total_fused / total_sep,
            }
        )
    results["b_fused_vs_separate"] = fused_runs

    # (e) packing curve: 8 packed vs one at a time
    curve_out = {}
    for rows, shape in curve.items():
        pack = make_states(engine, shape, 8, seq_len=rows)
        one = timed(lambda pack=pack: engine.denoise_step(pack[:1]), device, repeats)
        eight = timed(lambda pack=pack: engine.denoise_step(pack), device, repeats)
        curve_out[rows] = {
            "one_s": one,
            "eight_packed_s": eight,
            "speedup": 8 * one / eight,
            "used_rows": pack[0].layout.used,
        }
    results["e_packing_curve"] = curve_out
    results["summary"] = {
        "step_mfu": steps[1]["mfu"],
        "fused_over_separate_3x16384": max(r["fused_over_separate"] for r in fused_runs),
        "pack8_speedup_256_rows_e": curve_out[256]["speedup"],
        "pack8_min_speedup_e": min(v["speedup"] for v in curve_out.values()),
    }
    (args.out / "engine_bench.json").write_text(json.dumps(results, indent=2))

    print(f"{hardware}, {cfg.name} DiT, matmul {rate / 1e12:.1f} TFLOP/s")
    print("(a) requests  rows    step ms   model TFLOP/s  MFU")
    for n, v in steps.items():
        print(
            f"    {n}         {v['rows']:<7} {v['seconds'] * 1e3:8.1f}  "
            f"{v['flops'] / v['seconds'] / 1e12:10.1f}  {v['mfu']:.1%}"
        )
    print("(b) run  separate ms  fused ms  fused/separate")
    for i, r in enumerate(fused_runs):
        print(f"    {i + 1}    {r['separate_ms']:10.2f}  {r['fused_ms']:8.2f}  {r['fused_over_separate']:.3f}")
    for label in sorted(fused_runs[0]["separate"]):
        sep, fus = fused_runs[0]["separate"][label], fused_runs[0]["fused"].get(label, {"ms": 0.0, "launches": 0})
        print(
            f"    {label:18} {sep['ms']:9.2f} -> {fus['ms']:9.2f} ms  launches {sep['launches']} -> {fus['launches']}"
        )
    print("(e) rows/request  one ms   8 packed ms  speedup")
    for rows, v in curve_out.items():
        print(f"    {rows:<13} {v['one_s'] * 1e3:8.2f} {v['eight_packed_s'] * 1e3:10.2f}  {v['speedup']:.2f}x")


if __name__ == "__main__":
    main()
