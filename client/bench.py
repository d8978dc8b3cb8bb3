"""Serving benchmark for h3_pipeline over gRPC streaming (random prompts, open or closed loop).

    python -m client.bench --num-prompts 10 --max-concurrency 4 --steps 20 \\
        --arrival-interval 5 --output-json out/bench.json --output-png out/bench.png

Every request is "Random prompt {i} for benchmarking diffusion models" with the same shape and
step count (seed: --seed + i). Request i is due at its arrival time: all at t = 0 by default
(--request-rate inf), Poisson arrivals with --request-rate R (exponential gaps, seeded by
--seed), or one every --arrival-interval seconds. A due request waits for a --max-concurrency
slot (0 = no limit; default 1 like the upstream client), is then submitted from its own thread
through client.api.H3Client, and the slot is freed when its stream ends. --warmup-requests run
one at a time before the measured phase and are not recorded.

Per request the client records (seconds from the first measured submit): submit, first step
and completion, success or the error's code word, and the server's INFO stage_seconds
(queue, encode, denoise, decode) and largest_pack. The first step is the arrival of the first
progress response with step >= 1, i.e. the END of the request's first DiT forward as the client
sees it; every request asks for progress_every=1, and a progress response costs about 0.15 ms
on the server (one per request per step), negligible against a step. Queue delay is that same
client-side interval (first step - submit; it includes encode, the DiT queue and one step);
the server's own DiT queue time is the `queue` stage.

Peak GPU memory is only printed when the server reports it: a `peak_memory_mb` field in the
result INFO, or else the maximum per-GPU `nv_gpu_memory_used_bytes` sampled from Triton's
metrics endpoint (--metrics-url, default $H3_METRICS_URL; a device-level figure like
nvidia-smi's, caching-allocator reserve included). Otherwise it is "n/a".

The report (60-wide banner, labels in 40 columns) ends with an ASCII timeline: one line per
request over [0, wall] in 72 columns, '-' from submit to first step, '=' from first step to
completion, ' ' outside. --output-json saves every per-request record, the summary, the exact
command line, the date and --label; --output-png draws the same timeline with matplotlib.
Exit status: 0 when every measured request succeeded, 1 otherwise (also when a warm-up request
fails: nothing is measured then), 2 for bad flags, 130 on Ctrl-C (in-flight
requests are cancelled on the server by id).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shlex
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from .api import H3Client, H3Error

PROMPT_TEMPLATE = "Random prompt {i} for benchmarking diffusion models"
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


# --------------------------------------------------------------------------------------------
# Pure functions: schedule, statistics, timeline, report
# --------------------------------------------------------------------------------------------

def arrival_offsets(n: int, request_rate: float = math.inf, arrival_interval: float | None = None,
                    seed: int = 0) -> list[float]:
    """Due times of n requests: the first at 0, then fixed gaps of arrival_interval, else
    exponential gaps with mean 1/request_rate (random.Random(seed)), else all at 0."""
    if arrival_interval is not None:
        return [i * arrival_interval for i in range(n)]
    if math.isinf(request_rate):
        return [0.0] * n
    rng, offsets, t = random.Random(seed), [], 0.0
    for i in range(n):
        offsets.append(t)
        t += rng.expovariate(request_rate)
    return offsets


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
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
    """Last completion - first submit (submit times are relative to the first, so the last
    completion)."""
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
    """The benchmark's summary numbers (seconds; throughput per minute). Latency, time to first
    step, queue delay and stage means are over the successful requests."""
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
    stages = {stage: mean([r.stage_seconds[stage] for r in ok if r.stage_seconds and stage in r.stage_seconds])
              for stage in STAGES}
    return {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "error_codes": codes,
        "wall_s": wall,
        "throughput_req_per_min": len(ok) / wall * 60.0 if wall > 0 else None,
        "latency_s": {"mean": mean(latency), "p50": percentile(latency, 50), "p95": percentile(latency, 95),
                      "max": max(latency, default=None)},
        "time_to_first_step_s": {"mean": mean(ttfs), "p50": percentile(ttfs, 50), "max": max(ttfs, default=None)},
        "step_interval_s": {"mean": mean(step_intervals), "p50": percentile(step_intervals, 50)},
        "queue_delay_s": {"mean": mean(ttfs), "max": max(ttfs, default=None)},
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
    for name, r in zip(names, records):
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
    """The printed report: banner, configuration, traffic, latency blocks, stage means, timeline."""
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
    latency, ttfs, queue = summary["latency_s"], summary["time_to_first_step_s"], summary["queue_delay_s"]
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
        _row("Mean queue delay (s):", _fmt(queue["mean"])),
        _row("Max queue delay (s):", _fmt(queue["max"])),
        _row("Mean step interval (s):", _fmt(summary["step_interval_s"]["mean"])),
        _section("Load"),
        _row("Peak outstanding requests (client):", summary["peak_outstanding"]),
        _row("Peak pack size (largest_pack):", _fmt(summary["peak_pack_size"], "d")),
        _row("Peak GPU memory (MB):", _fmt(memory, ".1f")
             + (f"  [{summary['peak_gpu_memory_source']}]" if memory is not None else "")),
        _section("Stage Durations Mean (s)"),
        *(_row(f"{stage}:", _fmt(summary["stage_seconds_mean"][stage])) for stage in STAGES),
        "=" * BANNER_WIDTH,
        f"Timeline: '-' submit..first step, '=' first step..completion "
        f"({TIMELINE_WIDTH} columns = {_fmt(summary['wall_s'])} s)",
        *timeline,
    ]
    return "\n".join(str(line) for line in lines)


# --------------------------------------------------------------------------------------------
# Running the benchmark
# --------------------------------------------------------------------------------------------

class GpuMemorySampler:
    """Polls Triton's metrics endpoint for the largest per-GPU nv_gpu_memory_used_bytes while
    the benchmark runs; `peak_mb` stays None when the server publishes no GPU metric."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url, self.interval_s, self.peak_mb = url, interval_s, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GpuMemorySampler":
        if self.url:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.url:
            self._stop.set()
            self._thread.join(5.0)
            self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        try:
            with urllib.request.urlopen(self.url, timeout=2.0) as response:
                text = response.read().decode()
        except (OSError, ValueError):
            return
        values = parse_gpu_memory_mb(text)
        if values:
            self.peak_mb = max([self.peak_mb or 0.0, *values])


def parse_gpu_memory_mb(metrics_text: str) -> list[float]:
    """Per-GPU nv_gpu_memory_used_bytes of a Prometheus text page, in MB (10^6 bytes)."""
    values = []
    for line in metrics_text.splitlines():
        if line.startswith(GPU_MEMORY_METRIC + "{") or line.startswith(GPU_MEMORY_METRIC + " "):
            try:
                values.append(float(line.rsplit(None, 1)[1]) / 1e6)
            except (IndexError, ValueError):
                pass
    return values


def _generate_kwargs(args, index: int, steps: int | None) -> dict:
    return dict(height=args.height, width=args.width, num_frames=args.num_frames,
                num_inference_steps=steps, seed=args.seed + index, return_mp4=not args.no_mp4)


def run_request(client: H3Client, args, record: RequestRecord, origin: float, steps: int | None) -> None:
    """Submit one request of `steps` steps and fill `record` (times relative to `origin`)."""
    first_step: list[float] = []
    last_step: list[float] = []

    def on_progress(step: int, total: int, position: int) -> None:
        if step >= 1 and not first_step:
            first_step.append(time.perf_counter())
        if step >= 1 and step == total:
            last_step.append(time.perf_counter())

    record.submit_s = time.perf_counter() - origin
    try:
        result = client.generate(record.prompt, progress_every=1, request_id=record.request_id,
                                 on_progress=on_progress, **_generate_kwargs(args, record.index, steps))[0]
    except H3Error as error:
        record.error_code, record.error = error.code, error.message
    except Exception as error:  # a transport error must not lose the record
        record.error_code, record.error = "UNKNOWN", f"{type(error).__name__}: {error}"
    else:
        record.success = True
        record.server_info = result.info
        record.stage_seconds = result.info.get("stage_seconds")
        record.largest_pack = result.info.get("largest_pack")
        record.peak_memory_mb = result.info.get("peak_memory_mb")
    record.complete_s = time.perf_counter() - origin
    if first_step:
        record.first_step_s = first_step[0] - origin
    if last_step:
        record.last_step_s = last_step[0] - origin


class WarmupFailed(Exception):
    """A warm-up request failed: the measured phase would not start warm, so none is run."""


def run_benchmark(args) -> tuple[list[RequestRecord], float | None]:
    """Warm-up, then the measured phase. Returns the records (times from the first measured
    submit) and the metrics endpoint's peak GPU memory (MB) or None."""
    client = H3Client(args.url, timeout_s=args.timeout)
    run_id = uuid.uuid4().hex[:8]
    for i in range(args.warmup_requests):
        warm = RequestRecord(index=i, request_id=f"bench-{run_id}-warmup-{i}",
                             prompt=f"Warm-up prompt {i} for benchmarking diffusion models")
        run_request(client, args, warm, time.perf_counter(),
                    args.steps if args.warmup_steps is None else args.warmup_steps)
        if not warm.success:
            raise WarmupFailed(f"warm-up request {i} failed: {warm.error_code}: {warm.error}")
    offsets = arrival_offsets(args.num_prompts, args.request_rate, args.arrival_interval, args.seed)
    records = [RequestRecord(index=i, request_id=f"bench-{run_id}-{i}", prompt=PROMPT_TEMPLATE.format(i=i),
                             arrival_s=offsets[i]) for i in range(args.num_prompts)]
    slots = threading.BoundedSemaphore(args.max_concurrency) if args.max_concurrency > 0 else None
    threads: list[threading.Thread] = []

    def worker(record: RequestRecord) -> None:
        try:
            run_request(client, args, record, origin, args.steps)
        finally:
            if slots is not None:
                slots.release()

    origin = time.perf_counter()
    try:
        with GpuMemorySampler(args.metrics_url) as sampler:
            for record in records:
                delay = origin + record.arrival_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                if slots is not None:
                    slots.acquire()
                thread = threading.Thread(target=worker, args=(record,), daemon=True)
                thread.start()
                threads.append(thread)
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
    except KeyboardInterrupt:
        running = [r for r, t in zip(records, threads) if t.is_alive()]
        print(f"\ninterrupted: cancelling {len(running)} in-flight request(s)", file=sys.stderr)
        for record in running:
            try:
                client.cancel(record.request_id)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        raise
    # Relative to the first measured submit (normally ~0 already; arrival_s stays the schedule).
    first = min((r.submit_s for r in records if r.submit_s is not None), default=0.0)
    for record in records:
        for name in ("submit_s", "first_step_s", "last_step_s", "complete_s"):
            value = getattr(record, name)
            if value is not None:
                setattr(record, name, value - first)
    return records, sampler.peak_mb


def save_png(path: Path, records: Sequence[RequestRecord], wall: float, label: str | None) -> None:
    """Horizontal bars per request: waiting (submit..first step) and computing (first
    step..completion); failed requests in red."""
    import matplotlib
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
    ax.legend(handles=[Patch(color="#f2b134", label="waiting (submit..first step)"),
                       Patch(color="#2f78c4", label="computing (first step..completion)"),
                       Patch(color="#d9412b", label="failed")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize="small", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m client.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default=os.environ.get("H3_GRPC_URL", "127.0.0.1:8001"), help="Triton gRPC host:port")
    p.add_argument("--metrics-url", default=os.environ.get("H3_METRICS_URL"),
                   help="Triton metrics URL, polled for nv_gpu_memory_used_bytes (none: not polled)")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-concurrency", type=int, default=1, help="requests in flight at most (0 = no limit)")
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument("--request-rate", type=float, default=math.inf,
                          help="Poisson arrivals at this many req/s (seeded by --seed); inf = all at t=0")
    arrivals.add_argument("--arrival-interval", type=float, help="fixed seconds between arrivals")
    p.add_argument("--height", type=int, help="server default when omitted")
    p.add_argument("--width", type=int, help="server default when omitted")
    p.add_argument("--num-frames", type=int, help="server default when omitted")
    p.add_argument("--steps", type=int, help="denoise steps per request (server default when omitted)")
    p.add_argument("--seed", type=int, default=0, help="request i uses seed + i; also seeds the arrivals")
    p.add_argument("--warmup-requests", type=int, default=1, help="sequential requests before the measured phase")
    p.add_argument("--warmup-steps", type=int, help="steps of each warm-up request (default: --steps)")
    p.add_argument("--no-mp4", action="store_true",
                   help="send return_mp4=false: the VAE decodes, no MP4 is encoded (servers without PyAV)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each response")
    p.add_argument("--output-json", type=Path, help="save records, summary, command line, date, label")
    p.add_argument("--output-png", type=Path, help="save the timeline as a PNG")
    p.add_argument("--label", default="", help="a name for this run, printed and saved")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.num_prompts < 1 or args.max_concurrency < 0 or args.warmup_requests < 0:
        _parser().error("--num-prompts must be >= 1; --max-concurrency and --warmup-requests >= 0")
    if not args.request_rate > 0 or (args.arrival_interval is not None and args.arrival_interval < 0):
        _parser().error("--request-rate must be > 0 and --arrival-interval >= 0")
    if args.warmup_steps is not None and args.warmup_steps < 1 or not args.timeout > 0:
        _parser().error("--warmup-steps must be >= 1 and --timeout > 0")
    command = shlex.join(sys.orig_argv if argv is None else [sys.executable, "-m", "client.bench", *argv])
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        records, gpu_memory_mb = run_benchmark(args)
    except KeyboardInterrupt:
        return 130
    except WarmupFailed as error:
        print(f"{error}; no measured requests were sent", file=sys.stderr)
        return 1
    summary = summarize(records, gpu_memory_mb)
    timeline = render_timeline(records, summary["wall_s"])
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    served = next((r.server_info for r in records if r.server_info), None)
    shown = dict(config)
    if served:  # what the server used where the command line left the server's default
        for key, info_key in (("height", "height"), ("width", "width"), ("num_frames", "num_frames"),
                              ("steps", "num_inference_steps")):
            shown[key] = shown[key] or served.get(info_key)
    print(format_report(summary, shown, timeline), flush=True)
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        document = {"label": args.label, "date": date, "command": command,
                    "config": {**config, "request_rate": None if math.isinf(args.request_rate) else args.request_rate},
                    "summary": summary, "timeline": timeline, "requests": [asdict(r) for r in records]}
        args.output_json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.output_json}")
    if args.output_png:
        save_png(args.output_png, records, summary["wall_s"], args.label)
        print(f"wrote {args.output_png}")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
