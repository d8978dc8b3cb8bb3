"""CPU time per call of the registry's step-boundary operations (h3_core.serving.shared.registry, issue 26), for
this checkout's registry and, with --old, another version of registry.py side by side.

    python benchmarks/registry_bench.py --out benchmarks/results/registry_cpu.json [--calls 1000]
        [--old /tmp/registry_old.py]

--old: a registry.py of another commit (`git show f642d9d:h3_core/registry.py > /tmp/registry_old.py`,
the JSON file under one flock), imported as the module h3_core.registry_old so that its relative
imports resolve. Each implementation is measured in each state of a fresh store in the temporary
folder (tempfile.gettempdir(), where servers keep theirs), by one DiT instance with its own clock:
  empty:          nothing else stored; the clock moves EARLY_CANCEL_SECONDS a round, so what a
                  round remembers is forgotten by the next;
  full_memories:  IDS_REMEMBERED early cancels and IDS_REMEMBERED finished ids remembered (the
                  clock moves 1 ms a round; each finish replaces the oldest finished id);
  live_2000:      2,000 ids live on the measured instance, which publish_and_read_cancels() is
                  asked about; the clock moves EARLY_CANCEL_SECONDS a round.
A round is admit(new id), publish_and_read_cancels(the instance's live ids, its load; named
"boundary" in the results), finish(the new id, its load), so the state is the same at every
round. Per call: the CPU time of this process (time.process_time_ns, user + system; SQLite runs
in the process), median and p99 (statistics.quantiles, n=100) over --calls rounds, in
milliseconds. Writes --out: date, command, hardware, python and sqlite versions, the per-call
figures and a summary (per state and call: the medians and p99s, and old / current medians
when --old is given). Prints the summary table.
"""

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from h3_core.protocol import EARLY_CANCEL_SECONDS

STATES = ("empty", "full_memories", "live_2000")
CALLS = ("admit", "boundary", "finish")
LIVE_IDS = 2000


class Clock:
    """The registry clock of the measured instance, moved by the benchmark (seconds)."""

    now = 1000.0

    def __call__(self) -> float:
        return self.now


def load_registry(path: Path | None) -> ModuleType:
    """This checkout's h3_core.serving.shared.registry (path None), or the registry.py at `path` as
    h3_core.registry_old."""
    if path is None:
        return importlib.import_module("h3_core.serving.shared.registry")
    spec = importlib.util.spec_from_file_location("h3_core.registry_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(module: ModuleType, state: str, calls: int) -> dict:
    """{call: {"median_ms", "p99_ms"}} over `calls` rounds in `state` (see the module docstring)."""
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="h3-registry-bench.") as folder:
        registry = module.Registry(Path(folder), "h3_dit_0", clock)
        live = []
        if state == "full_memories":
            for k in range(module.IDS_REMEMBERED):
                clock.now += 0.001
                registry.cancel(f"early-{k}")
                registry.finish(f"done-{k}")
        elif state == "live_2000":
            live = [f"live-{k}" for k in range(LIVE_IDS)]
            for request_id in live:
                registry.admit(request_id)
        step = 0.001 if state == "full_memories" else EARLY_CANCEL_SECONDS
        load = module.DitLoad(len(live), 4096, 0)
        samples = {call: [] for call in CALLS}
        for k in range(calls):
            clock.now += step
            request_id = f"round-{k}"
            start = time.process_time_ns()
            registry.admit(request_id)
            admitted = time.process_time_ns()
            registry.publish_and_read_cancels(live, load)
            stepped = time.process_time_ns()
            registry.finish(request_id, load)
            finished = time.process_time_ns()
            for call, nanoseconds in zip(
                CALLS, (admitted - start, stepped - admitted, finished - stepped), strict=True
            ):
                samples[call].append(nanoseconds / 1e6)
    return {
        call: {"median_ms": statistics.median(values), "p99_ms": statistics.quantiles(values, n=100)[98]}
        for call, values in samples.items()
    }


def cpu_model() -> str:
    """The `model name` of /proc/cpuinfo ("" where there is none)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--calls", type=int, default=1000, help="rounds per state (default 1000)")
    parser.add_argument("--old", type=Path, help="another registry.py to measure beside this checkout's")
    args = parser.parse_args()
    implementations = {"current": load_registry(None)} | ({"old": load_registry(args.old)} if args.old else {})
    results = {name: {} for name in implementations}
    for state in STATES:
        for name, module in implementations.items():
            results[name][state] = measure(module, state, args.calls)
            print(f"{name} {state}: {results[name][state]}", flush=True)
    summary = {}
    for state in STATES:
        for call in CALLS:
            row = {
                f"{name}_{key}": results[name][state][call][key] for name in results for key in ("median_ms", "p99_ms")
            }
            if args.old:
                row["old_over_current_median"] = row["old_median_ms"] / row["current_median_ms"]
            summary[f"{call}_{state}"] = row
    document = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "hardware": {
            "machine": f"{os.cpu_count()}-core {platform.machine()} dev box",
            "processor": platform.processor(),
            "cpu_model": cpu_model(),
        },
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "calls": args.calls,
        "old": str(args.old) if args.old else None,
        "results": results,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"{'call':<24} " + " ".join(f"{key:>22}" for key in next(iter(summary.values()))))
    for key, row in summary.items():
        print(f"{key:<24} " + " ".join(f"{value:>22.4f}" for value in row.values()))


if __name__ == "__main__":
    main()
