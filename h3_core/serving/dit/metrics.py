"""The step loop's metrics, h3_dit publishes them on Triton's /metrics (the h3_* catalogue,
METRICS), their in-memory record, and the one log line of a request at its end (end_line)."""

import os

import torch

# name -> (kind, description, histogram buckets); the adapter publishes these on Triton's /metrics.
METRICS = {
    "h3_waiting_requests": ("gauge", "requests waiting for admission", None),
    "h3_active_requests": ("gauge", "requests admitted to the pack", None),
    "h3_pack_requests": ("histogram", "request outputs per packed forward", [1, 2, 3, 4, 6, 8, 16]),
    "h3_pack_rows": ("histogram", "packed rows per forward", [128, 512, 2048, 8192, 16384, 32768, 65536]),
    "h3_step_seconds": ("histogram", "seconds per packed step", [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5]),
    "h3_time_to_first_step_seconds": ("histogram", "arrival at the DiT to first step end", [0.01, 0.1, 0.5, 1, 5, 30]),
    "h3_cancellations_total": ("counter", "requests cancelled", None),
    "h3_deadline_expiries_total": ("counter", "requests whose deadline_s expired", None),
    "h3_refusals_total": ("counter", "requests refused (INVALID_ARG or UNAVAILABLE)", None),
    "h3_completions_total": ("counter", "request outputs completed", None),
    "h3_cached_steps_total": ("counter", "request output steps taken with the cached velocity (no forward)", None),
    "h3_failures_total": ("counter", "requests failed with INTERNAL", None),
    "h3_heartbeat_timestamp_seconds": ("gauge", "unix time of the step loop's last iteration", None),
    "h3_execute_in_progress": ("gauge", "1 while an iteration runs (with an old heartbeat: a stalled step)", None),
    "h3_device_memory_bytes": (
        "gauge",
        "bytes the DiT holds on its device: torch.cuda.memory_allocated on CUDA, the process's resident set on the CPU",
        None,
    ),
}


def device_memory_bytes(device: torch.device) -> int:
    """Bytes the DiT holds on `device`: torch.cuda.memory_allocated on CUDA, else the resident set
    size of this process (/proc/self/statm, pages x page size; Linux)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MetricsRecord:
    """In-memory metrics (the in-process loop and the tests): counters and gauges by name, and
    every observed value of each histogram. h3_dit passes an object with the same three methods
    that publishes to Triton."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self.observed: dict[str, list[float]] = {}

    def increment(self, name: str, amount: float = 1) -> None:
        self.values[name] = self.values.get(name, 0) + amount

    def set(self, name: str, value: float) -> None:
        self.values[name] = value

    def observe(self, name: str, value: float) -> None:
        self.observed.setdefault(name, []).append(value)


def end_line(
    request_id: str,
    outcome: str,
    height: int,
    width: int,
    num_frames: int,
    steps: int,
    total_steps: int,
    seconds: dict[str, float],
) -> str:
    """The one log line of a request at its end (h3_dit for requests that end in the DiT,
    h3_vae for completed ones): id, outcome, shape, steps, and each stage's seconds."""
    stages = ", ".join(f"{stage} {value:.3f} s" for stage, value in seconds.items())
    return (
        f"request {request_id} {outcome}: {width}x{height}x{num_frames} frames, step {steps} of {total_steps}, {stages}"
    )
