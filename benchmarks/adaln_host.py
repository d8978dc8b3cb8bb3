"""clip768_bench.py's measurements of h3_dit adaln_weights = host (issue 48 item 3; the AdaLN
projection weights in pinned host memory, h3_core.model.adaln_table): one admission fill of a
49-forward schedule, its bits against the device-resident DiT's, and whether fp8 with host AdaLN
weights plus the real-size Qwen3-VL fits one 80 GB H100."""

import time
from pathlib import Path

import torch
from full_model_bench import QWEN3VL_DIMS

from h3_core.diffusion.engine import schedule_timesteps
from h3_core.diffusion.sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, sigma_schedule
from h3_core.model.adaln_table import DEFAULT_CAPACITY
from h3_core.model.encoder import QWEN3VL_H3_LAYER, drawn_weight_bytes
from h3_core.weights.official_checkpoint import write_weightless_qwen3vl

GIB = 2**30
FILL_STEPS = 49  # the schedule of adaln_host_fill_49_s: 49 forwards
ADALN_HOST_VALUES = 2 * FILL_STEPS + 2  # the host-weight DiT's table: a 49-forward schedule's values fit
# what CUDA reports as an H100 80GB HBM3's memory (benchmarks/results/clip768_profile_h100.json's total)
H100_GIB = 79.65


def host_fill(dit, device_dit, layout, cuda: bool) -> dict:
    """One admission fill (AdaLNTable.prefill, from a cold table) of the FILL_STEPS-forward
    default schedule's values for `layout` (schedule_timesteps) on `dit` (AdaLN weights in host
    memory): its seconds (`fill_s`, the device synchronised), values, passes, and `bitwise`:
    whether every filled value's rows equal those `device_dit` (the same weights on the device)
    fills for it (its table is replaced for that, then set back to DEFAULT_CAPACITY values)."""
    sigmas = sigma_schedule(FILL_STEPS, DEFAULT_VIDEO_SHIFT), sigma_schedule(FILL_STEPS, DEFAULT_AUDIO_SHIFT)
    values = schedule_timesteps(layout, *sigmas)
    table = dit.adaln_table
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    filled = table.prefill(values)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    device_dit.use_adaln_table(ADALN_HOST_VALUES)
    device_dit.adaln_table.prefill(values)
    keys = list(table.slot_of)
    ours = torch.tensor([table.slot_of[k] for k in keys], device=dit.device)
    theirs = torch.tensor([device_dit.adaln_table.slot_of[k] for k in keys], device=dit.device)
    bitwise = all(
        torch.equal(a.index_select(0, ours), b.index_select(0, theirs))
        for a, b in zip(table.values, device_dit.adaln_table.values, strict=True)
    )
    device_dit.use_adaln_table(DEFAULT_CAPACITY)  # as served again
    return {
        "schedule_values": len(values),
        "filled": filled,
        "passes": table.passes,
        "fill_s": seconds,
        "bitwise": bitwise,
        "host_weight_gib": sum(w.nbytes + b.nbytes for w, b in (p.host for p in table.projections)) / GIB,
    }


def qwen3vl_gib(folder: Path, dims: str) -> float:
    """GiB of the Qwen3-VL's weights as h3_encoder draws them (vision tower and the text decoder to
    QWEN3VL_H3_LAYER) for QWEN3VL_DIMS[dims] ("h3": the real size), from a weightless `folder`."""
    if not (folder / "config.json").is_file():
        write_weightless_qwen3vl(folder, QWEN3VL_DIMS[dims])
    return drawn_weight_bytes(folder, QWEN3VL_H3_LAYER) / GIB


def h100_fit(summary: dict, results: dict, qwen3vl: float) -> dict:
    """Whether fp8 with host AdaLN weights plus the Qwen3-VL's weights (`qwen3vl` GiB) and our
    VAE's decode peak (when measured) fit one H100 (H100_GIB): the fp8 profile's measured step
    peak (over what was allocated before its load) less the GPU memory the host load left off
    (fp8_dit_gpu_gib - fp8_dit_gpu_gib_adaln_off), plus the Qwen3-VL and the decode peak. The
    summary keys fp8_adaln_off_fits_h100 (None without GPU figures), the GiB needed and its terms."""
    profile, loads = results.get("profile", {}).get("fp8", {}), results.get("loads", {})
    off = summary.get("fp8_dit_gpu_gib_adaln_off")
    if profile.get("step_peak_gib") is None or off is None:
        return {"fp8_adaln_off_fits_h100": None}
    step_peak = profile["step_peak_gib"] - loads["fp8"]["allocated_gib_before"]
    freed = summary["fp8_dit_gpu_gib"] - off
    decode = summary.get("decode768_5s_peak_gib") or 0.0
    need = step_peak - freed + qwen3vl + decode
    return {
        "fp8_adaln_off_fits_h100": need <= H100_GIB,
        "fp8_adaln_off_h100_need_gib": need,
        "fp8_adaln_off_h100_terms_gib": {
            "fp8_step_peak": step_peak,
            "adaln_freed": freed,
            "qwen3vl_weights": qwen3vl,
            "decode_peak": decode,
            "h100": H100_GIB,
        },
    }
