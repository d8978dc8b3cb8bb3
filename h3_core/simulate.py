"""Discrete-event simulation of the serving pipeline under each scheduling policy.

The simulation drives the server's own Scheduler (h3_core.scheduler) with simulated time; its
jobs are Jobs whose states are SimStates (row and step counters, no tensors). Per request:
encoder (one instance, first come first served, encode_s) -> DiT (at every step boundary the
policy picks the pack; a step of a pack of R rows takes c0 + c1 x R seconds) -> VAE (one
instance, in the order the DiT finishes, decode_s). Encoder and VAE run beside the DiT without
slowing it (separate Triton model instances; sharing one GPU is not modelled).

Metrics per policy (seconds):
- latency: VAE done - submission; p95 by nearest rank (percentile: the ceil(0.95 n)-th smallest);
- time to first step: start of the first DiT step - arrival at the DiT (the server's `queue`
  stage; encoding takes the same time under every policy and is not counted);
- throughput_per_min: completed x 60 / (last completion - first submission).

Run `python -m h3_core.simulate --workload reference|mixed|burst [--json]`; --c0, --c1 set a
calibrated step cost, --row-budget srpt's row budget.
"""

import argparse
import json
import math
import random
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .scheduler import DEFAULT_POLICY, POLICIES, Job, Scheduler

LARGE_ROWS = 16_384  # 672x384, 4 s at 24 fps (h3_spec §4.4)
SMALL_ROWS = 1_280


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0 <= p <= 100) by nearest rank: the ceil(p n / 100)-th smallest of the
    n values (the smallest for p = 0), always one of the values; None for no values. The one
    definition of the simulator and the serving benchmark (benchmarks/bench_report.py).
    Raises ValueError for p outside 0..100."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p={p} is out of range: allowed 0..100")
    if not values:
        return None
    rank = math.ceil(p * len(values) / 100)  # not 0.95 * n: 0.07 * 100 = 7.000000000000001 would lift 7 to 8
    return sorted(values)[max(rank, 1) - 1]


@dataclass(frozen=True)
class CostModel:
    """Step cost t(pack) = c0 + c1 x rows (c0 seconds, c1 seconds per packed row); encode_s and
    decode_s are per request. Calibrate c0, c1 by fitting a line through measured step seconds
    against packed rows."""

    c0: float
    c1: float
    encode_s: float
    decode_s: float

    def step_s(self, rows: int) -> float:
        return self.c0 + self.c1 * rows


# The reference's 4 x H100 rate: 0.26 s per step of one 16,384-row request (h3_spec §5.11: 20 steps,
# 5.27 s of denoising per request). c0 = 0.01 s makes 4 co-batched requests 2.8% cheaper per
# request than 4 solo ones, as measured upstream (-2.4%, h3_spec §5.11).
REFERENCE_COST = CostModel(c0=0.0, c1=0.26 / LARGE_ROWS, encode_s=0.1, decode_s=0.52)
LOADED_COST = replace(REFERENCE_COST, c0=0.01)
WORKLOADS = ("reference", "mixed", "burst")


@dataclass(frozen=True)
class SimRequest:
    submit_s: float
    rows: int
    steps: int


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[SimRequest]  # in submission order
    cost: CostModel


@dataclass
class SimState:
    """The part of a RequestState the scheduler reads."""

    rows: int
    total_steps: int
    step_index: int = 0

    @property
    def finished(self) -> bool:
        return self.step_index >= self.total_steps


@dataclass(frozen=True)
class Completion:
    """One request's final response; times in simulated seconds."""

    request: int  # index into Workload.requests
    submit_s: float
    dit_arrival_s: float
    first_step_s: float
    done_s: float


def make_workload(name: str, seed: int = 0, cost: CostModel | None = None) -> Workload:
    """The named workload (issue 5); `cost` replaces its cost model.

    reference: 10 requests, one every 5 s, 20 steps, 16,384 rows, REFERENCE_COST.
    mixed: 200 requests, Poisson arrivals at 80% DiT utilisation (rate = 0.8 / mean solo denoise
    time), 70% small (1,280 rows, 20 steps), 30% large (16,384 rows, 30 steps), LOADED_COST;
    random.Random(seed) draws sizes and gaps.
    burst: 4 large requests (16,384 rows, 30 steps) at t = 0, LOADED_COST.
    Raises ValueError for an unknown name.
    """
    if name == "reference":
        requests, default_cost = [SimRequest(5.0 * i, LARGE_ROWS, 20) for i in range(10)], REFERENCE_COST
    elif name == "burst":
        requests, default_cost = [SimRequest(0.0, LARGE_ROWS, 30) for _ in range(4)], LOADED_COST
    elif name == "mixed":
        default_cost = LOADED_COST
        step = (cost or default_cost).step_s
        mean_denoise_s = 0.7 * 20 * step(SMALL_ROWS) + 0.3 * 30 * step(LARGE_ROWS)
        rng, t, requests = random.Random(seed), 0.0, []
        for _ in range(200):
            small = rng.random() < 0.7
            requests.append(SimRequest(t, SMALL_ROWS if small else LARGE_ROWS, 20 if small else 30))
            t += rng.expovariate(0.8 / mean_denoise_s)
    else:
        raise ValueError(f"workload={name!r} is not one of {', '.join(WORKLOADS)}")
    return Workload(name, requests, cost or default_cost)


def simulate(workload: Workload, policy: str, row_budget: int = LARGE_ROWS) -> list[Completion]:
    """Run the workload through a Scheduler with `policy`: max_num_seqs 4 and max_batch_rows
    4 x 16,384 (the reference's packs), `row_budget` (default 16,384: a step of one 16k-row
    request is already compute-bound, co-batching 4 saves only 2.4% per request, h3_spec §5.11),
    room for every request to wait. Returns the completions in finishing order."""
    cost = workload.cost
    scheduler = Scheduler(
        max_num_seqs=4,
        max_batch_rows=4 * LARGE_ROWS,
        max_waiting=len(workload.requests),
        policy=policy,
        row_budget=row_budget,
    )
    pending, encoder_free = deque(), 0.0
    for index, request in enumerate(workload.requests):
        encoder_free = max(request.submit_s, encoder_free) + cost.encode_s
        pending.append(
            Job(
                key=index, request_id=str(index), arrival_s=encoder_free, states=[SimState(request.rows, request.steps)]
            )
        )
    now, vae_free, completions = 0.0, 0.0, []
    while pending or scheduler.jobs:
        while pending and pending[0].arrival_s <= now:
            scheduler.add(pending.popleft())
        pack = scheduler.schedule(now)
        if not pack:
            now = pending[0].arrival_s
            continue
        for job in pack:
            job.first_step_s = now if job.first_step_s is None else job.first_step_s
        now += cost.step_s(sum(job.rows for job in pack))
        for job in pack:
            for state in job.states:
                state.step_index += 1
            if job.finished:
                scheduler.remove(job)
                vae_free = max(now, vae_free) + cost.decode_s
                completions.append(
                    Completion(job.key, workload.requests[job.key].submit_s, job.arrival_s, job.first_step_s, vae_free)
                )
    return completions


def summarize(workload: Workload, completions: list[Completion]) -> dict:
    """The metrics of one policy's run (see the module docstring), rounded to 0.1 ms."""
    latencies = [c.done_s - c.submit_s for c in completions]
    waits = [c.first_step_s - c.dit_arrival_s for c in completions]
    span = max(c.done_s for c in completions) - workload.requests[0].submit_s
    return {
        "mean_latency_s": round(sum(latencies) / len(latencies), 4),
        "p95_latency_s": round(percentile(latencies, 95), 4),
        "mean_time_to_first_step_s": round(sum(waits) / len(waits), 4),
        "throughput_per_min": round(len(completions) * 60 / span, 4),
        "completed": len(completions),
        "submitted": len(workload.requests),
    }


def compare(workload: Workload, row_budget: int = LARGE_ROWS) -> dict:
    """{policy: summary} for every policy, plus "default": the default policy's name."""
    return {
        **{policy: summarize(workload, simulate(workload, policy, row_budget)) for policy in POLICIES},
        "default": DEFAULT_POLICY,
    }


def table(workload: Workload, row_budget: int, results: dict) -> str:
    """compare()'s results as a readable table, headed by the workload and its cost model."""
    cost = workload.cost
    lines = [
        f"workload {workload.name}: {len(workload.requests)} requests; simulated, step cost "
        f"{cost.c0:g} s + {cost.c1:.4g} s/row, encode {cost.encode_s:g} s, decode {cost.decode_s:g} s, "
        f"srpt row budget {row_budget}",
        f"{'policy':<16}{'mean latency s':>16}{'p95 latency s':>15}{'mean TTFS s':>13}{'req/min':>9}{'completed':>11}",
    ]
    for policy in POLICIES:
        r = results[policy]
        name = f"{policy} (default)" if policy == results["default"] else policy
        lines.append(
            f"{name:<16}{r['mean_latency_s']:>16.2f}{r['p95_latency_s']:>15.2f}"
            f"{r['mean_time_to_first_step_s']:>13.2f}{r['throughput_per_min']:>9.2f}"
            f"{r['completed']:>6}/{r['submitted']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m h3_core.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--seed", type=int, default=0, help="random seed of the mixed workload")
    parser.add_argument("--c0", type=float, help="step cost seconds per step (replaces the workload's)")
    parser.add_argument("--c1", type=float, help="step cost seconds per packed row (replaces the workload's)")
    parser.add_argument("--row-budget", type=int, default=LARGE_ROWS, help="srpt's row budget (rows)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    cost = make_workload(args.workload).cost
    cost = replace(cost, c0=cost.c0 if args.c0 is None else args.c0, c1=cost.c1 if args.c1 is None else args.c1)
    workload = make_workload(args.workload, args.seed, cost)
    results = compare(workload, args.row_budget)
    sys.stdout.write((json.dumps(results) if args.json else table(workload, args.row_budget, results)) + "\n")


if __name__ == "__main__":
    main()
