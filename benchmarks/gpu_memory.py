"""GPU memory as nvidia-smi reports it, for the served benchmarks (full_model_bench, clip768_bench):
the whole device's use (gpu_memory_mib), each process's (gpu_processes_mib) and their peaks while
a block runs (PeakMemory, sampled in a thread). Units: MiB unless a name says GiB.
"""

from __future__ import annotations

import subprocess
import threading

MIB, GIB = 2**20, 2**30
SAMPLE_INTERVAL_S = 0.5


def gpu_memory_mib(field: str = "memory.used") -> float | None:
    """nvidia-smi's `field` (memory.used, memory.total) of GPU 0 in MiB: the whole device, every
    process and the caching allocators' reserve included; None without nvidia-smi or a GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return float(done.stdout.split()[0]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def gib(mib: float | None) -> float | None:
    """MiB as GiB; None stays None."""
    return None if mib is None else mib * MIB / GIB


def gpu_processes_mib() -> dict[int, float]:
    """Used GPU memory (MiB) of each process by pid (nvidia-smi --query-compute-apps; its CUDA
    context included); {} when nvidia-smi answers nothing (no GPU; in some containers it lists no
    process)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        try:
            pid, mib = (part.strip() for part in line.split(","))
            used[int(pid)] = float(mib)
        except ValueError:  # "[N/A]" or an unexpected line
            continue
    return used


class PeakMemory:
    """The largest gpu_memory_mib() sampled every SAMPLE_INTERVAL_S seconds in a thread while the
    `with` block runs (also once at its start and its end), and each process's largest
    gpu_processes_mib(); peak_mib stays None and per_process_peak_mib() {} when disabled (the CPU
    smoke) or nvidia-smi answers nothing."""

    def __init__(self, enabled: bool):
        self.enabled, self.peak_mib, self.samples = enabled, None, 0
        self.process_peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """Take one sample of the device's and each process's memory."""
        value = gpu_memory_mib()
        if value is not None:
            self.peak_mib, self.samples = max(self.peak_mib or 0.0, value), self.samples + 1
        for pid, mib in gpu_processes_mib().items():
            self.process_peaks[pid] = max(self.process_peaks.get(pid, 0.0), mib)

    def per_process_peak_mib(self, names: dict[int, str]) -> dict[str, float]:
        """The per-process peaks keyed by names[pid] (a Triton model instance such as h3_dit_0_0,
        tritonserver, ...), else "pid N"."""
        return {names.get(pid, f"pid {pid}"): mib for pid, mib in sorted(self.process_peaks.items())}

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def __enter__(self) -> PeakMemory:
        if self.enabled:
            self.sample()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join(10.0)
            self.sample()
