"""Statistics, report and plots of the serving benchmark (benchmarks/bench_client.py).

Pure functions over RequestRecords (times in seconds from the first measured submit):
summarize() gives the summary numbers, render_timeline() the ASCII timeline, format_report() the
printed report and save_png() the same timeline drawn with matplotlib (imported only there).
Percentiles are h3_core.serving.dit.simulate.percentile's nearest rank, the simulator's definition.

The report (60-wide banner, labels in 40 columns) ends with an ASCII timeline: one line per
request over [0, wall] in 72 columns, '-' from submit to first step, '=' from first step to
completion, ' ' outside.

merge_results() files the summaries of engine_bench.py / served_bench.py runs into a results file
such as benchmarks/results/h200.json (its `summary` keys: existing keys stay where they are with
the new values, new keys are appended; the values they replace go to `summary_history`; a compact
copy of each run goes under `measurements`):

    python benchmarks/bench_report.py --merge-into benchmarks/results/h200.json \
        OUT1/engine_bench.json OUT2/served_bench.json OUT3/served_bench.json [--dry-run]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a script (merge_results): the repository root for h3_core
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3_core.serving.dit.simulate import percentile  # noqa: E402 - after the sys.path set-up above

STAGES = ("queue", "encode", "denoise", "decode")
BANNER_WIDTH = 60
LABEL_WIDTH = 40
TIMELINE_WIDTH = 72
TICK_STEPS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)
GPU_MEMORY_METRIC = "nv_gpu_memory_used_bytes"


@dataclass
class RequestRecord:
    """One measured request. Times are seconds from the first measured submit (None: did not
    happen). first_step_s: first progress response with step >= 1 (end of the first forward);
    last_step_s: the progress response of the last step (end of the last forward), so
    (last_step_s - first_step_s) / (steps - 1) is the served time per step."""

    index: int
    request_id: str = ""
    prompt: str = ""
    arrival_s: float = 0.0  # when it was due (before waiting for a concurrency slot)
    submit_s: float | None = None
    first_step_s: float | None = None
    last_step_s: float | None = None  # progress response of the request's last step
    complete_s: float | None = None  # stream end: result or error
    success: bool = False
    error_code: str | None = None
    error: str | None = None
    stage_seconds: dict | None = None
    largest_pack: int | None = None
    peak_memory_mb: float | None = None  # only when the server's INFO carries it
    server_info: dict | None = None


def mean(values: Sequence[float]) -> float | None:
    """The arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


def peak_outstanding(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once, client view: submitted and not yet completed; a request
    is outstanding over [submit_s, complete_s), so one ending as another starts does not overlap."""
    events = []
    for record in records:
        if record.submit_s is None:
            continue
        events.append((record.submit_s, 1))
        if record.complete_s is not None:
            events.append((record.complete_s, -1))
    peak = current = 0
    for _, delta in sorted(events):  # at equal times -1 sorts before +1
        current += delta
        peak = max(peak, current)
    return peak


def wall_seconds(records: Sequence[RequestRecord]) -> float:
    """Last completion - first submit, in seconds; 0.0 without both."""
    starts = [r.submit_s for r in records if r.submit_s is not None]
    ends = [r.complete_s for r in records if r.complete_s is not None]
    return max(ends) - min(starts) if starts and ends else 0.0


def step_interval(record: RequestRecord) -> float | None:
    """Seconds between the request's consecutive steps as the client sees them:
    (last_step_s - first_step_s) / (steps - 1), steps from the server's INFO
    num_inference_steps; None without both progress times or with fewer than 2 steps."""
    steps = (record.server_info or {}).get("num_inference_steps")
    if record.first_step_s is None or record.last_step_s is None or not steps or steps < 2:
        return None
    return (record.last_step_s - record.first_step_s) / (steps - 1)


def summarize(records: Sequence[RequestRecord], gpu_memory_metrics_mb: float | None = None) -> dict:
    """The benchmark's summary numbers (seconds; throughput per minute; memory in MB). Latency,
    time to first step (submit -> first step: encode, the DiT queue and one step; the server's
    own DiT queue time is the `queue` stage), step interval and stage means are over the
    successful requests; p50 and p95 are nearest-rank percentiles. Peak GPU memory: the largest
    INFO peak_memory_mb, else gpu_memory_metrics_mb (from the metrics endpoint), else None."""
    ok = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    wall = wall_seconds(records)
    latency = [r.complete_s - r.submit_s for r in ok]
    ttfs = [r.first_step_s - r.submit_s for r in ok if r.first_step_s is not None]
    step_intervals = [s for s in map(step_interval, ok) if s is not None]
    codes: dict[str, int] = {}
    for r in failed:
        codes[r.error_code or "UNKNOWN"] = codes.get(r.error_code or "UNKNOWN", 0) + 1
    packs = [r.largest_pack for r in ok if r.largest_pack is not None]
    info_memory = [r.peak_memory_mb for r in records if r.peak_memory_mb is not None]
    if info_memory:
        memory, memory_source = max(info_memory), "INFO peak_memory_mb"
    elif gpu_memory_metrics_mb is not None:
        memory, memory_source = gpu_memory_metrics_mb, f"metrics {GPU_MEMORY_METRIC} (max per GPU)"
    else:
        memory, memory_source = None, None
    stages = {
        stage: mean([r.stage_seconds[stage] for r in ok if r.stage_seconds and stage in r.stage_seconds])
        for stage in STAGES
    }
    return {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "error_codes": codes,
        "wall_s": wall,
        "throughput_req_per_min": len(ok) / wall * 60.0 if wall > 0 else None,
        "latency_s": {
            "mean": mean(latency),
            "p50": percentile(latency, 50),
            "p95": percentile(latency, 95),
            "max": max(latency, default=None),
        },
        "time_to_first_step_s": {"mean": mean(ttfs), "p50": percentile(ttfs, 50), "max": max(ttfs, default=None)},
        "step_interval_s": {"mean": mean(step_intervals), "p50": percentile(step_intervals, 50)},
        "peak_outstanding": peak_outstanding(records),
        "peak_pack_size": max(packs, default=None),
        "peak_gpu_memory_mb": memory,
        "peak_gpu_memory_source": memory_source,
        "stage_seconds_mean": stages,
    }


def _overlaps(start: float | None, end: float | None, c0: float, c1: float) -> bool:
    return start is not None and end is not None and end > start and start < c1 and end > c0


def render_timeline(records: Sequence[RequestRecord], wall: float, width: int = TIMELINE_WIDTH) -> list[str]:
    """ASCII timeline: a header of second ticks, then one line per request. Column j covers
    [wall*j/width, wall*(j+1)/width); it shows '=' if the request computed (first step ..
    completion) at any time in it, else '-' if it waited (submit .. first step), else ' '. A
    request without a first step is all '=' if it succeeded and all '-' if it failed; failed
    lines end with the error code."""
    names = [f"r{r.index}" for r in records]
    label_width = max((len(name) for name in names), default=2)
    lines = [" " * (label_width + 2) + _tick_header(wall, width)]
    for name, r in zip(names, records, strict=True):
        if r.first_step_s is not None:
            waiting, computing = (r.submit_s, r.first_step_s), (r.first_step_s, r.complete_s)
        elif r.success:
            waiting, computing = (None, None), (r.submit_s, r.complete_s)
        else:
            waiting, computing = (r.submit_s, r.complete_s), (None, None)
        bar = []
        for j in range(width):
            c0, c1 = wall * j / width, wall * (j + 1) / width
            bar.append("=" if _overlaps(*computing, c0, c1) else "-" if _overlaps(*waiting, c0, c1) else " ")
        suffix = "" if r.success else f" FAILED {r.error_code or 'UNKNOWN'}"
        lines.append(f"{name:<{label_width}} |{''.join(bar)}|{suffix}")
    return lines


def _tick_header(wall: float, width: int) -> str:
    """Labels '<t>s' starting at the column that holds time t, every `step` seconds, where
    `step` is the smallest of TICK_STEPS leaving at least 8 columns between ticks (sub-second
    steps only for runs of a few seconds)."""
    if wall <= 0:
        return "0s"
    step = next((s for s in TICK_STEPS if s * width / wall >= 8), TICK_STEPS[-1])
    header, k = "", 0
    while k * step <= wall:
        column = int(k * step * width / wall)
        if column >= width:
            break
        if column >= len(header) + (1 if header else 0):
            header = header.ljust(column) + f"{k * step:g}s"
        k += 1
    return header


def _fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _row(label: str, value) -> str:
    return f"{label:<{LABEL_WIDTH}}{value}"


def _section(title: str) -> str:
    return f"{' ' + title + ' ':-^{BANNER_WIDTH}}"


def format_report(summary: dict, config: dict, timeline: Sequence[str]) -> str:
    """The printed report: banner, configuration, traffic, latency blocks, stage means, timeline.
    `config` holds the command-line settings (None: the server's default)."""

    def given(key: str) -> str:
        return "default" if config.get(key) is None else str(config[key])

    shape = f"{given('height')}x{given('width')}"
    frames, steps = given("num_frames"), given("steps")
    if config.get("arrival_interval") is not None:
        arrivals = f"every {config['arrival_interval']:g} s"
    elif math.isinf(config.get("request_rate", math.inf)):
        arrivals = "all at t=0 (rate inf)"
    else:
        arrivals = f"Poisson {config['request_rate']:g} req/s (seed {config.get('seed', 0)})"
    concurrency = config.get("max_concurrency") or "unlimited"
    failed = str(summary["failed"])
    if summary["error_codes"]:
        failed += " (" + ", ".join(f"{code} x{n}" for code, n in sorted(summary["error_codes"].items())) + ")"
    latency, ttfs = summary["latency_s"], summary["time_to_first_step_s"]
    memory = summary["peak_gpu_memory_mb"]
    lines = [
        f"{' Serving Benchmark Result ':=^{BANNER_WIDTH}}",
        _row("Label:", config.get("label") or "-"),
        _row("Endpoint:", f"h3_pipeline @ {config.get('url', '?')}"),
        _row("Request shape (HxW, frames, steps):", f"{shape}, {frames}, {steps}"),
        _row("Arrivals:", arrivals),
        _row("Max concurrency:", concurrency),
        _row("Warm-up requests (not measured):", config.get("warmup_requests", 0)),
        _section("Traffic"),
        _row("Benchmark duration (s):", _fmt(summary["wall_s"])),
        _row("Completed requests:", f"{summary['completed']}/{summary['num_requests']}"),
        _row("Failed requests:", failed),
        _row("Request throughput (req/min):", _fmt(summary["throughput_req_per_min"], ".2f")),
        _section("Latency (submit -> completion)"),
        _row("Mean latency (s):", _fmt(latency["mean"])),
        _row("P50 latency (s):", _fmt(latency["p50"])),
        _row("P95 latency (s):", _fmt(latency["p95"])),
        _row("Max latency (s):", _fmt(latency["max"])),
        _section("First step (submit -> end of step 1)"),
        _row("Mean time to first step (s):", _fmt(ttfs["mean"])),
        _row("P50 time to first step (s):", _fmt(ttfs["p50"])),
        _row("Max time to first step (s):", _fmt(ttfs["max"])),
        _row("Mean step interval (s):", _fmt(summary["step_interval_s"]["mean"])),
        _section("Load"),
        _row("Peak outstanding requests (client):", summary["peak_outstanding"]),
        _row("Peak pack size (largest_pack):", _fmt(summary["peak_pack_size"], "d")),
        _row(
            "Peak GPU memory (MB):",
            _fmt(memory, ".1f") + (f"  [{summary['peak_gpu_memory_source']}]" if memory is not None else ""),
        ),
        _section("Stage Durations Mean (s)"),
        *(_row(f"{stage}:", _fmt(summary["stage_seconds_mean"][stage])) for stage in STAGES),
        "=" * BANNER_WIDTH,
        f"Timeline: '-' submit..first step, '=' first step..completion "
        f"({TIMELINE_WIDTH} columns = {_fmt(summary['wall_s'])} s)",
        *timeline,
    ]
    return "\n".join(str(line) for line in lines)


def save_png(path: Path, records: Sequence[RequestRecord], wall: float, label: str | None) -> None:
    """Write the timeline to `path` as a PNG (folders made as needed): horizontal bars per
    request, waiting (submit..first step) and computing (first step..completion); failed
    requests in red; x axis in seconds over [0, wall]."""
    import matplotlib  # here: the report's other functions need no matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.3 * len(records) + 1.2)), dpi=100)
    for y, r in enumerate(records):
        if r.submit_s is None or r.complete_s is None:
            continue
        split = r.first_step_s if r.first_step_s is not None else (r.submit_s if r.success else r.complete_s)
        if split > r.submit_s:
            ax.barh(y, split - r.submit_s, left=r.submit_s, color="#f2b134", edgecolor="none")
        if r.complete_s > split:
            ax.barh(y, r.complete_s - split, left=split, color="#2f78c4" if r.success else "#d9412b", edgecolor="none")
    ax.set_yticks(range(len(records)), [f"r{r.index}" for r in records])
    ax.invert_yaxis()
    ax.set_xlim(0, max(wall, 1e-6))
    ax.set_xlabel("seconds since the first submit")
    ax.set_title(f"h3_pipeline serving benchmark{f' - {label}' if label else ''}")
    ax.legend(
        handles=[
            Patch(color="#f2b134", label="waiting (submit..first step)"),
            Patch(color="#2f78c4", label="computing (first step..completion)"),
            Patch(color="#d9412b", label="failed"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=3,
        fontsize="small",
        frameon=False,
    )
    ax.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


# Fields of a run kept in its compact copy under `measurements` (merge_results).
ENGINE_FIELDS = (
    "command",
    "date",
    "hardware",
    "torch",
    "config",
    "weights",
    "row_tile",
    "cublas_workspace_config",
    "compiled_blocks",
    "load_seconds",
    "compile",
    "matmul_probes_flops_per_s",
    "matmul_flops_per_s",
    "first_step_seconds_large",
    "a_step",
    "b_summary",
    "e_packing_curve",
    "roofline",
    "bitwise",
)
SERVED_FIELDS = (
    "command",
    "date",
    "hardware",
    "torch",
    "h3_dit_overrides",
    "c_step4_over_request_pairs",
    "in_process",
    "in_process_128",
    "run_seconds",
    "skipped",
)


def compact_run(document: dict) -> dict:
    """What merge_results keeps of an engine_bench.json or served_bench.json document: its
    headline fields and, per served client run, the summary figures (no per-request records)."""
    if "runs" not in document:  # engine_bench.json
        b_runs = [
            {key: run[key] for key in run if key not in ("separate", "fused")}
            for run in document.get("b_fused_vs_separate", [])
        ]
        return {**{key: document[key] for key in ENGINE_FIELDS if key in document}, "b_runs": b_runs}
    runs = {}
    for name, run in document["runs"].items():
        summary = run["summary"]
        runs[name] = {
            "wall_s": summary["wall_s"],
            "throughput_req_per_min": summary["throughput_req_per_min"],
            "latency_mean_s": summary["latency_s"]["mean"],
            "latency_p95_s": summary["latency_s"]["p95"],
            "time_to_first_step_mean_s": summary["time_to_first_step_s"]["mean"],
            "step_interval_mean_s": summary["step_interval_s"]["mean"],
            "peak_pack_size": summary["peak_pack_size"],
            "server_ready_s": run.get("server_ready_s"),
            "dit_steps": run.get("dit_steps"),
            "h3_dit": run.get("h3_dit"),
        }
    return {**{key: document[key] for key in SERVED_FIELDS if key in document}, "runs": runs}


def merge_results(target: dict, sources: Sequence[tuple[str, dict]], today: str | None = None) -> dict:
    """`target` (a results file's JSON, e.g. benchmarks/results/h200.json) with the `summary` of
    every (name, document) of `sources` merged in, later sources winning: keys already in
    target["summary"] keep their place and take the new value, new keys are appended; one entry
    is appended to target["summary_history"] (the merge date, the sources and every replaced
    value, so nothing measured before is lost); target["measurements"][f"{kind}_{date}"] gets
    compact_run(document) (kind engine_bench or served_bench, numbered when taken). Raises
    ValueError when a source ran on other hardware than target["hardware"] (a CPU smoke run is
    never filed as a GPU result) or has no summary."""
    merged = json.loads(json.dumps(target))  # a deep copy
    summary = merged.setdefault("summary", {})
    measurements = merged.setdefault("measurements", {})
    replaced, described = {}, []
    for name, document in sources:
        if "summary" not in document:
            raise ValueError(f"{name} has no summary")
        if "hardware" in merged and document.get("hardware") != merged["hardware"]:
            raise ValueError(f"{name} ran on {document.get('hardware')!r}, not {merged['hardware']!r}")
        kind = "served_bench" if "runs" in document else "engine_bench"
        key = f"{kind}_{document.get('date', 'undated')}"
        number = 2
        while key in measurements:
            key = f"{kind}_{document.get('date', 'undated')}_{number}"
            number += 1
        measurements[key] = {"file": name, **compact_run(document)}
        for field, value in document["summary"].items():
            if field in summary and summary[field] != value and field not in replaced:
                replaced[field] = summary[field]
            summary[field] = value
        described.append({"file": name, "measurement": key, "command": document.get("command")})
    merged.setdefault("summary_history", []).append(
        {"merged": today or datetime.date.today().isoformat(), "sources": described, "replaced": replaced}
    )
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description="File engine_bench / served_bench summaries into a results file.")
    parser.add_argument("--merge-into", type=Path, required=True, help="e.g. benchmarks/results/h200.json")
    parser.add_argument("documents", type=Path, nargs="+", help="engine_bench.json / served_bench.json files")
    parser.add_argument("--dry-run", action="store_true", help="print the new summary, write nothing")
    args = parser.parse_args()
    target = json.loads(args.merge_into.read_text())
    sources = [(str(path), json.loads(path.read_text())) for path in args.documents]
    try:
        merged = merge_results(target, sources)
    except ValueError as error:
        sys.exit(f"bench_report.py: {error}")
    old = target.get("summary", {})
    for key, value in merged["summary"].items():
        mark = "new" if key not in old else ("   " if old[key] == value else "was")
        print(f"{key:<44} {value!s:<24} {mark} {old.get(key, '') if mark == 'was' else ''}")
    if not args.dry_run:
        args.merge_into.write_text(json.dumps(merged, indent=2) + "\n")
        print(f"wrote {args.merge_into}")


if __name__ == "__main__":
    main()
