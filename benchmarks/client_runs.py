"""One benchmarks/bench_client.py run against a started server, as every served benchmark builds it
(served_bench, full_model_bench, multi_gpu_bench, sequence_parallel_bench, official_layout_bench):

- `bench_client_command`: the one builder of a bench_client.py command line (run it with cwd = the
  repository root);
- `dit_totals`: h3_dit's step and pack totals on /metrics (and, per_model, Triton's execute counts
  and durations of each model), read before and after a run for its deltas;
- `without_machine_paths`: a run's document without this machine's folders and interpreter, so
  that a result filed in the repository names no path of the machine it ran on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.metrics import metric_samples, read_metrics  # noqa: E402 - after the sys.path set-up above

BENCH_CLIENT = "benchmarks/bench_client.py"  # relative to ROOT, the runs' working directory
# Triton's per-model counters that say where a served step's time goes between executes
TRITON_TOTALS = (
    "nv_inference_exec_count",
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
SERVED_MODELS = ("h3_encoder", "h3_dit", "h3_vae")


def bench_client_command(
    url: str | None,
    *,
    metrics_url: str | None = None,
    shape: tuple[int, int, int] | None = None,
    steps: int | None = None,
    num_prompts: int | None = None,
    max_concurrency: int | None = None,
    warmup_requests: int = 0,
    warmup_steps: int | None = None,
    mp4: bool = False,
    label: str | None = None,
    output_json: Path | None = None,
    output_png: Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of one bench_client.py run: this interpreter, BENCH_CLIENT, then the flags
    of the arguments given (None leaves a flag out, and bench_client.py's default applies): --url
    (None: H3_GRPC_URL), --metrics-url, --height --width --num-frames from shape (height, width,
    frames; pixels and frames), --steps, --num-prompts, --max-concurrency, --warmup-requests,
    --warmup-steps, --no-mp4 unless mp4, --label, --output-json, --output-png, then `extra` (more
    bench_client.py flags, e.g. arrivals) unchanged."""
    flags: list[tuple[str, object]] = [
        ("--url", url),
        ("--metrics-url", metrics_url),
        *zip(("--height", "--width", "--num-frames"), shape or (None, None, None), strict=True),
        ("--steps", steps),
        ("--num-prompts", num_prompts),
        ("--max-concurrency", max_concurrency),
        ("--warmup-requests", warmup_requests),
        ("--warmup-steps", warmup_steps),
    ]
    command = [sys.executable, BENCH_CLIENT]
    command += [text for flag, value in flags if value is not None for text in (flag, str(value))]
    command += [] if mp4 else ["--no-mp4"]
    for flag, value in (("--label", label), ("--output-json", output_json), ("--output-png", output_png)):
        if value is not None:
            command += [flag, str(value)]
    return command + list(extra)


def dit_totals(metrics_url: str, per_model: bool = False) -> dict[str, float]:
    """h3_step_seconds and h3_pack_rows _sum and _count on /metrics, each summed over its series
    (seconds, rows, counts; 0 for each when nothing answers); with per_model also TRITON_TOTALS of
    each SERVED_MODELS model as `<model>.<metric>` (counts, microseconds)."""
    text = read_metrics(metrics_url) or ""
    names = [f"h3_{metric}_{part}" for metric in ("step_seconds", "pack_rows") for part in ("sum", "count")]
    totals = {name: sum(s.value for s in metric_samples(text, name)) for name in names}
    for model in SERVED_MODELS if per_model else ():
        for name in TRITON_TOTALS:
            # prometheus_client's parser names a counter's samples <name>_total
            totals[f"{model}.{name}"] = sum(s.value for s in metric_samples(text, f"{name}_total", model=model))
    return totals


def without_machine_paths(document: dict, work: Path, out: Path, executable: str = sys.executable) -> dict:
    """`document` with this machine's folders written as $WORK and $OUT and the interpreter as
    python3, so that a result filed in the repository names no path of the machine it ran on."""
    text = json.dumps(document)
    for path, name in ((str(work), "$WORK"), (str(out), "$OUT"), (executable, "python3")):
        text = text.replace(json.dumps(path)[1:-1], name)
    return json.loads(text)
