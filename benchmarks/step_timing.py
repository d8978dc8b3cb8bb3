"""Timing and counting a DiT step, shared by the engine benchmarks (engine_bench, batch_invariance,
conditioned_bench, fp8_bench, clip768_bench): wall seconds with the device synchronised (timed,
wall), model FLOPs of a packed step (step_flops) against the measured matmul rate (matmul_rate),
GPU kernel time per kernel family (kernel_profile), and a median with its range (spread).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from h3_core.diffusion.engine import Engine


def sync(device: torch.device) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeats: int, warm_up: bool = True) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up call (warm_up False: none)."""
    if warm_up:
        fn()
        sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def wall(fn, device: torch.device) -> float:
    """Seconds of one call of fn(), the device synchronised before and after (no warm-up)."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def step_flops(engine: Engine, states) -> float:
    """Model FLOPs of one packed step (docs/model.md §8): linears over padded rows S, attention over
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
    """Measured dense matmul FLOP/s: 8192^3 on CUDA (the median over 5 batches of 10 back-to-back
    GEMMs, so one synchronisation is spread over 10 of them), 512^3 on the CPU (median of 10)."""
    if device.type != "cuda":
        n = 512
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        return 2 * n**3 / timed(lambda: a @ b, device, 10)
    n, batch = 8192, 10
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)

    def gemms():
        for _ in range(batch):
            torch.mm(a, b, out=out)

    return 2 * n**3 * batch / timed(gemms, device, 5)


# Kernel name fragments per family; anything else counts as elementwise/copy. Inductor's fused
# kernels are named after the ops they fuse (triton_red_fused_..._rms_norm_... counts as norm).
KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas", "addmm", "aten::mm", "linear")),
    ("norm", ("norm", "reduce")),
)


def family(name: str) -> str:
    """The KERNEL_FAMILIES label of a kernel or operator name, else "elementwise/copy"."""
    lowered = name.lower()
    for label, keys in KERNEL_FAMILIES:
        if any(key in lowered for key in keys):
            return label
    return "elementwise/copy"


def kernel_profile(fn, device: torch.device, warm_up: bool = True) -> dict:
    """GPU kernel time (ms) and launch count per kernel family of one call of fn() (after one
    unprofiled call, unless warm_up is False); on the CPU the self CPU time of every operator."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    if warm_up:
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


def total_ms(profile: dict) -> float:
    """The milliseconds of a kernel_profile, every family summed."""
    return sum(v["ms"] for v in profile.values())


def spread(values: list[float]) -> dict:
    """Median, min and max of `values` (the runs in their order under "runs")."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}
