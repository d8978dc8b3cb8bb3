"""What the writer would do with the official MiniMax-H3 checkpoint on 1, 2, 4 and 8 H200s, computed
on any machine: `python -m server.repository --plan` prints plan_table() (docs/deploy_h200.md holds
its output).

For each GPU count, quantization (bf16, fp8) and placement of h3_encoder and h3_vae
(server.placement.PLACED) it runs server.planner.plan for the `h3` config with each GPU's free
memory given to the sizing code (H200_FREE_BYTES, the writer's probe on this project's H200s) and
the Qwen3-VL cut's weights given (QWEN3VL_H3_BYTES: its folder is not here), and reports what goes
where, the rows of each h3_dit instance, the largest request (max_batch_rows), the requests in
flight and requests per minute of THE REQUEST (672 x 384 px, 209 frames, 16,384 rows, 30 steps:
the benchmarks' request). Requests per minute = sum over the instances of 60 x k / (30 x t(k)),
k = the requests an instance steps together (max_num_seqs, and its rows // 16,384), t(k) the
measured step of k x 16,384 rows of the full DiT on one H200 (benchmarks/results/fp8_h200.json:
1 and 4 requests measured, 2 and 3 on the line between); a server whose largest request is below
16,384 rows refuses the request (0). Not counted: the few percent a step waits for a decode's turn
beside it (docs/deploy_h200.md), the text encoding and decoding themselves, and Triton's round
trips.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from h3_core.config import get_config
from h3_core.serving.shared.settings import DitSettings

from . import planner as R
from . import sizing

GPU_COUNTS = (1, 2, 4, 8)
H200_FREE_BYTES = 142_629 * sizing.MIB  # free before anything loads (the writer's probe on this project's H200s)
# The Qwen3-VL text decoder cut to 50 layers in bf16: 25,157,829,120 parameters x 2 bytes, the count
# transformers' Qwen3VLTextModel has with these dims (the H200 run built it, docs/gpu_memory.md). Its
# vision tower (fl2va keyframes) is not counted: its size is not known here.
QWEN3VL_H3_BYTES = 50_315_658_752
QUANTIZATIONS = {"none": "bf16", "fp8": "fp8"}
STEPS = 30  # the benchmarks' request: 672 x 384 px, 209 frames, 30 steps
MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "fp8_h200.json"


def measured_steps(path: Path = MEASURED) -> dict[str, tuple[float, float]]:
    """{quantization: (seconds of a 1 x 16,384-row step, of a 4 x 16,384-row step)} of the h3 DiT
    on one H200, from the summary of benchmarks/results/fp8_h200.json."""
    summary = json.loads(path.read_text())["summary"]
    return {
        quantization: (summary[f"{name}_step_s_1x16384_h3"], summary[f"{name}_step_s_4x16384_h3"])
        for quantization, name in QUANTIZATIONS.items()
    }


def step_seconds(requests: int, measured: tuple[float, float]) -> float:
    """Seconds of a step of `requests` (1..4) requests of 16,384 rows: measured (1, 4), the line
    between them for 2 and 3."""
    one, four = measured
    return one + (four - one) * (requests - 1) / 3


def counted(values) -> str:
    """'65,536 x 7, 7,616 x 1': each distinct value with how many times it occurs, the largest first."""
    return ", ".join(f"{value:,} x {count}" for value, count in sorted(Counter(values).items(), reverse=True))


def span(gpus: Sequence[int]) -> str:
    """'0-6' for consecutive GPU indices, else '0, 2, 4'."""
    consecutive = len(gpus) > 1 and list(gpus) == list(range(gpus[0], gpus[-1] + 1))
    return f"{gpus[0]}-{gpus[-1]}" if consecutive else ", ".join(map(str, gpus))


def plan_row(repository: R.Repository, measured: tuple[float, float], request: int) -> list[str]:
    """The table cells of one planned repository (plan_table's columns after the first three)."""
    dit, groups = repository.dit, repository.groups
    firsts = groups[DitSettings.MODEL].gpus
    rows = [dit.for_gpu(gpu).max_batch_rows for gpu in firsts]
    side = groups[R.VaeSettings.MODEL].gpus
    where = f"GPU {side[0]}" if side else "CPU"
    stepped = [min(dit.max_num_seqs, rows_of // request) if dit.max_batch_rows >= request else 0 for rows_of in rows]
    per_minute = sum(60 * k / (STEPS * step_seconds(k, measured)) for k in stepped if k)
    return [
        f"{len(firsts)} (GPU {span(firsts)})",
        where,
        counted(rows),
        f"{dit.max_batch_rows:,}" + ("" if dit.max_batch_rows >= request else " (refuses it)"),
        f"{sum(stepped)} / {len(firsts) * (dit.max_num_seqs + dit.max_waiting)}",
        f"{per_minute:.2f}",
    ]


def planner(gpus: list[int], machine: sizing.Machine, quantization: str):
    """placement -> the h3 config's Repository on `gpus` of `machine` in `quantization`, with the
    Qwen3-VL cut's weights given (QWEN3VL_H3_BYTES); each placement planned once."""
    plans: dict[str, R.Repository] = {}

    def plan_with(placement: str) -> R.Repository:
        if placement not in plans:
            plans[placement] = R.plan(
                "h3",
                "random:0",
                "cuda",
                gpus,
                overrides={DitSettings.MODEL: {"quantization": quantization}},
                machine=machine,
                placement=placement,
                text_encoder_bytes=QWEN3VL_H3_BYTES,
            )
        return plans[placement]

    return plan_with


def plan_table(gpu_counts=GPU_COUNTS, free_bytes: int = H200_FREE_BYTES, measured=None) -> str:
    """The markdown table (module docstring) for `gpu_counts` GPUs of `free_bytes` each, every
    quantization and placement, the default placement (server.planner.default_placement)
    marked; `measured` as measured_steps() returns it (default: read from its file)."""
    measured = measured_steps() if measured is None else measured
    request = R.request_rows(get_config("h3"))
    lines = [
        "| H200s | DiT | placement | h3_dit instances | h3_encoder, h3_vae on | rows per instance "
        "| largest request, rows | requests stepped together / held | requests per minute |",
        "|---:|---|---|---|---|---|---:|---:|---:|",
    ]
    for quantization, name in QUANTIZATIONS.items():
        for count in gpu_counts:
            gpus = list(range(count))
            machine = sizing.Machine(16, dict.fromkeys(gpus, free_bytes))
            plan_with = planner(gpus, machine, quantization)
            chosen = R.default_placement(gpus, machine, request, plan_with).notes[0].split()[1]
            for placement in ("shared", "own", "cpu") if count > 1 else ("shared", "cpu"):
                label = f"**{placement}** (default)" if placement == chosen else placement
                cells = [str(count), name, label, *plan_row(plan_with(placement), measured[quantization], request)]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
