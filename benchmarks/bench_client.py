"""Serving benchmark for h3_pipeline over gRPC streaming (random prompts, open or closed loop).

    python benchmarks/bench_client.py --num-prompts 10 --max-concurrency 4 --steps 20 \\
        --arrival-interval 5 --output-json out/bench.json --output-png out/bench.png

Every request is "Random prompt {i} for benchmarking diffusion models" with the same shape and
step count (seed: --seed + i), or, with --mix, a shape and step count drawn per request.
Request i is due at its arrival time: all at t = 0 by default
(--request-rate inf), Poisson arrivals with --request-rate R (exponential gaps, seeded by
--seed), or one every --arrival-interval seconds. A due request waits for a --max-concurrency
slot (0 = no limit; default 1 like the upstream client), is then submitted from its own thread
through client.api.H3Client, and the slot is freed when its stream ends. --warmup-requests run
one at a time before the measured phase and are not recorded; warm-up request i has measured
request i's prompt and the command line's shape, so without --mix the measured requests' packed
layouts (on a GPU the DiT captures a CUDA graph per layout at first use) are warm. Nothing is sent unless the server
at --url answers ready first; stderr then shows a progress bar of the measured requests.

Per request the client records (seconds from the first measured submit): submit, first step
and completion, success or the error's code word, and the server's INFO stage_seconds
(queue, encode, denoise, decode) and largest_pack. The first step is the arrival of the first
progress response with step >= 1, i.e. the END of the request's first DiT forward as the client
sees it; every request asks for progress_every=1, and a progress response costs about 0.15 ms
on the server (one per request per step), negligible against a step.

Peak GPU memory is only printed when the server reports it: a `peak_memory_mb` field in the
result INFO, or else the maximum per-GPU `nv_gpu_memory_used_bytes` sampled from Triton's
metrics endpoint (--metrics-url, default $H3_METRICS_URL; a device-level figure like
nvidia-smi's, caching-allocator reserve included). Otherwise it is "n/a".

The statistics, the printed report and the PNG are benchmarks/bench_report.py's. --output-json
saves every per-request record, the summary, the exact command line, the date and --label;
--output-png draws the timeline (matplotlib). Exit status: 0 when every measured request
succeeded, 1 otherwise (also when the server does not answer ready or a warm-up request fails:
nothing is measured then), 2 for bad flags, 130 on Ctrl-C (in-flight requests are cancelled on
the server by id).
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
import uuid
from dataclasses import asdict
from pathlib import Path

import tritonclient.grpc as grpcclient
from tqdm import tqdm
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import (  # noqa: E402 - after the sys.path set-up above
    GPU_MEMORY_METRIC,
    RequestRecord,
    format_report,
    render_timeline,
    save_png,
    summarize,
)

from client.api import H3Client, H3Error  # noqa: E402 - after the sys.path set-up above
from server.process import metric_samples, read_metrics  # noqa: E402 - after the sys.path set-up above

PROG = "python benchmarks/bench_client.py"
PROMPT_TEMPLATE = "Random prompt {i} for benchmarking diffusion models"
READY_TIMEOUT_S = 10.0


def arrival_offsets(
    n: int, request_rate: float = math.inf, arrival_interval: float | None = None, seed: int = 0
) -> list[float]:
    """Due times of n requests in seconds: the first at 0, then fixed gaps of arrival_interval,
    else exponential gaps with mean 1/request_rate (random.Random(seed)), else all at 0."""
    if arrival_interval is not None:
        return [i * arrival_interval for i in range(n)]
    if math.isinf(request_rate):
        return [0.0] * n
    rng, offsets, t = random.Random(seed), [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(request_rate)
    return offsets


class GpuMemorySampler:
    """Polls Triton's metrics endpoint (url; None: no polling) every interval_s seconds for the
    largest per-GPU nv_gpu_memory_used_bytes while the benchmark runs; `peak_mb` (MB, 10^6
    bytes) stays None when the server publishes no GPU metric."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url, self.interval_s, self.peak_mb = url, interval_s, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuMemorySampler:
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
        """Read the endpoint once and raise peak_mb to its largest GPU; no-op when it does not
        answer."""
        text = read_metrics(self.url)
        values = [s.value / 1e6 for s in metric_samples(text, GPU_MEMORY_METRIC)] if text is not None else []
        if values:
            self.peak_mb = max([self.peak_mb or 0.0, *values])


class ServerNotReady(Exception):
    """No ready Triton server answers at the benchmark's --url: nothing is sent."""


def check_ready(url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Raise ServerNotReady unless the Triton server at url (gRPC host:port) answers ready
    within timeout_s seconds."""
    client = grpcclient.InferenceServerClient(url)
    try:
        ready = client.is_server_ready(client_timeout=timeout_s)
    except InferenceServerException as error:
        raise ServerNotReady(
            f"cannot reach Triton at {url}: {error.message()}; start the server first "
            "(python -m server.launch) or give its gRPC address with --url"
        ) from None
    finally:
        client.close()
    if not ready:
        raise ServerNotReady(f"the Triton server at {url} is not ready (its models are still loading or failed)")


def parse_mix(text: str) -> list[tuple[float, int, int, int, int]]:
    """--mix "WEIGHT:HxWxF:STEPS,..." -> [(weight, height, width, num_frames, steps)]. Raises
    ValueError naming the bad entry."""
    mix = []
    for entry in text.split(","):
        try:
            weight, shape, steps = entry.split(":")
            height, width, frames = (int(v) for v in shape.split("x"))
            mix.append((float(weight), height, width, frames, int(steps)))
        except ValueError:
            raise ValueError(f"--mix entry {entry!r} is not WEIGHT:HxWxF:STEPS (e.g. 0.3:384x672x209:20)") from None
        if not mix[-1][0] > 0:
            raise ValueError(f"--mix entry {entry!r}: the weight must be > 0")
    return mix


def _generate_kwargs(args, index: int, steps: int | None) -> dict:
    """The shape, steps and seed of measured request `index` (warm-up requests pass their steps
    and use the command line's shape): with --mix, drawn from the mix by random.Random(seed,
    index), so every run of the same command sends the same sequence."""
    height, width, frames = args.height, args.width, args.num_frames
    if args.mix and steps is None:
        rng = random.Random(f"{args.seed}-{index}")
        _, height, width, frames, steps = rng.choices(args.mix, weights=[m[0] for m in args.mix])[0]
    return dict(
        height=height,
        width=width,
        num_frames=frames,
        num_inference_steps=steps,
        seed=args.seed + index,
        return_mp4=not args.no_mp4,
    )


def run_request(client: H3Client, args, record: RequestRecord, origin: float, steps: int | None) -> None:
    """Submit one request of `steps` steps and fill `record` (times relative to `origin`, a
    time.perf_counter() value); a failure is recorded, never raised."""
    first_step: list[float] = []
    last_step: list[float] = []

    def on_progress(step: int, total: int, position: int) -> None:
        if step >= 1 and not first_step:
            first_step.append(time.perf_counter())
        if step >= 1 and step == total:
            last_step.append(time.perf_counter())

    record.submit_s = time.perf_counter() - origin
    try:
        result = client.generate(
            record.prompt,
            progress_every=1,
            request_id=record.request_id,
            on_progress=on_progress,
            **_generate_kwargs(args, record.index, steps),
        )[0]
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
    """Readiness check, warm-up, then the measured phase with a progress bar on stderr. Returns
    the records (times from the first measured submit) and the metrics endpoint's peak GPU memory
    (MB) or None. Raises ServerNotReady or WarmupFailed before anything is measured."""
    check_ready(args.url)
    client = H3Client(args.url, idle_timeout_s=args.timeout)
    run_id = uuid.uuid4().hex[:8]
    if args.warmup_requests:
        print(f"warm-up: {args.warmup_requests} request(s), not measured", file=sys.stderr, flush=True)
    for i in range(args.warmup_requests):
        warm = RequestRecord(
            index=i,
            request_id=f"bench-{run_id}-warmup-{i}",
            prompt=PROMPT_TEMPLATE.format(i=i),  # the measured prompts' lengths: their layouts (and graphs) warm
        )
        run_request(
            client, args, warm, time.perf_counter(), args.steps if args.warmup_steps is None else args.warmup_steps
        )
        if not warm.success:
            raise WarmupFailed(f"warm-up request {i} failed: {warm.error_code}: {warm.error}")
    offsets = arrival_offsets(args.num_prompts, args.request_rate, args.arrival_interval, args.seed)
    records = [
        RequestRecord(
            index=i, request_id=f"bench-{run_id}-{i}", prompt=PROMPT_TEMPLATE.format(i=i), arrival_s=offsets[i]
        )
        for i in range(args.num_prompts)
    ]
    slots = threading.BoundedSemaphore(args.max_concurrency) if args.max_concurrency > 0 else None
    threads: list[threading.Thread] = []
    progress = tqdm(total=len(records), desc="requests", unit="req", file=sys.stderr)
    progress_lock, failures = threading.Lock(), 0

    def worker(record: RequestRecord) -> None:
        nonlocal failures
        try:
            run_request(client, args, record, origin, args.steps)
        finally:
            with progress_lock:
                if not record.success:
                    failures += 1
                    progress.set_postfix(failed=failures, refresh=False)
                progress.update(1)
            if slots is not None:
                slots.release()

    origin = time.perf_counter()
    try:
        with progress, GpuMemorySampler(args.metrics_url) as sampler:
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
        running = [r for r, t in zip(records, threads, strict=False) if t.is_alive()]  # threads: those started
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--url", default=os.environ.get("H3_GRPC_URL", "127.0.0.1:8001"), help="Triton gRPC host:port")
    p.add_argument(
        "--metrics-url",
        default=os.environ.get("H3_METRICS_URL"),
        help="Triton metrics URL, polled for nv_gpu_memory_used_bytes (none: not polled)",
    )
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-concurrency", type=int, default=1, help="requests in flight at most (0 = no limit)")
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Poisson arrivals at this many req/s (seeded by --seed); inf = all at t=0",
    )
    arrivals.add_argument("--arrival-interval", type=float, help="fixed seconds between arrivals")
    p.add_argument("--height", type=int, help="server default when omitted")
    p.add_argument("--width", type=int, help="server default when omitted")
    p.add_argument("--num-frames", type=int, help="server default when omitted")
    p.add_argument("--steps", type=int, help="denoise steps per request (server default when omitted)")
    p.add_argument(
        "--mix",
        type=parse_mix,
        help="a mixed workload instead of one shape: WEIGHT:HxWxF:STEPS,... "
        "(each measured request draws one, seeded by --seed and its index)",
    )
    p.add_argument("--seed", type=int, default=0, help="request i uses seed + i; also seeds the arrivals")
    p.add_argument("--warmup-requests", type=int, default=1, help="sequential requests before the measured phase")
    p.add_argument("--warmup-steps", type=int, help="steps of each warm-up request (default: --steps)")
    p.add_argument(
        "--no-mp4",
        action="store_true",
        help="send return_mp4=false: the VAE decodes, no MP4 is encoded (servers without PyAV)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each response")
    p.add_argument("--output-json", type=Path, help="save records, summary, command line, date, label")
    p.add_argument("--output-png", type=Path, help="save the timeline as a PNG")
    p.add_argument("--label", default="", help="a name for this run, printed and saved")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with argv (default: sys.argv[1:]), print the report to stdout; returns
    the exit status of the module docstring."""
    args = _parser().parse_args(argv)
    if args.num_prompts < 1 or args.max_concurrency < 0 or args.warmup_requests < 0:
        _parser().error("--num-prompts must be >= 1; --max-concurrency and --warmup-requests >= 0")
    if not args.request_rate > 0 or (args.arrival_interval is not None and args.arrival_interval < 0):
        _parser().error("--request-rate must be > 0 and --arrival-interval >= 0")
    if args.warmup_steps is not None and args.warmup_steps < 1 or not args.timeout > 0:
        _parser().error("--warmup-steps must be >= 1 and --timeout > 0")
    if args.mix and args.steps is not None:
        _parser().error("--mix gives each request its steps: leave out --steps")
    command = shlex.join(sys.orig_argv if argv is None else [sys.executable, "benchmarks/bench_client.py", *argv])
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        records, gpu_memory_mb = run_benchmark(args)
    except KeyboardInterrupt:
        return 130
    except ServerNotReady as error:
        print(error, file=sys.stderr)
        return 1
    except WarmupFailed as error:
        print(f"{error}; no measured requests were sent", file=sys.stderr)
        return 1
    summary = summarize(records, gpu_memory_mb)
    timeline = render_timeline(records, summary["wall_s"])
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    served = next((r.server_info for r in records if r.server_info), None)
    shown = dict(config)
    if served:  # what the server used where the command line left the server's default
        for key, info_key in (
            ("height", "height"),
            ("width", "width"),
            ("num_frames", "num_frames"),
            ("steps", "num_inference_steps"),
        ):
            shown[key] = shown[key] or served.get(info_key)
    print(format_report(summary, shown, timeline), flush=True)
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "label": args.label,
            "date": date,
            "command": command,
            "config": {**config, "request_rate": None if math.isinf(args.request_rate) else args.request_rate},
            "summary": summary,
            "timeline": timeline,
            "requests": [asdict(r) for r in records],
        }
        args.output_json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.output_json}")
    if args.output_png:
        save_png(args.output_png, records, summary["wall_s"], args.label)
        print(f"wrote {args.output_png}")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
