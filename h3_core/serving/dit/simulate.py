"""Discrete-event simulation of the serving pipeline under each scheduling policy.

The simulation drives the server's own Scheduler (h3_core.serving.dit.scheduler) with simulated time; its
jobs are Jobs whose states are SimStates (row and step counters, no tensors). Per request:
encoder (one instance, first come first served, encode_s) -> DiT (at every step boundary the
policy picks the pack; a step of a pack of R rows takes c0 + c1 x R seconds) -> VAE (one
instance, in the order the DiT finishes, decode_s). Encoder and VAE run beside the DiT without
slowing it (separate Triton model instances; sharing one GPU is not modelled).

Metrics per policy (seconds):
- latency: VAE done - submission; p95 by nearest rank (percentile: the ceil(0.95 n)-th smallest);
- time to first step: start of the first DiT step - arrival at the DiT (the server's `queue`
  stage; encoding takes the same time under every policy and is not counted), mean and p95;
- throughput_per_min: completed x 60 / (last completion - first submission).

Several replicas (servers, e.g. Kubernetes pods, each with its own encoder, DiT and VAE): a
router sends each request at its submission to one of them, `round_robin` (in turn, as the
client's gRPC round_robin channel does) or `least_rows` (the replica with the fewest rows of
requests it was sent and has not completed, lowest index on ties). Capacity planning
(`capacity`) finds for an arrival rate the fewest replicas that keep p95 time to first step and
p95 latency under bounds (docs/scaling.md).

Step caching (h3_core.diffusion.step_cache): --hit-rate F makes each request skip the fraction F of
its steps (evenly spread, first and last computed), which cost no rows.

Run `python -m h3_core.serving.dit.simulate --workload reference|mixed|burst [--json]`; --c0, --c1 set a
calibrated step cost (--step-costs fits them to a benchmark's measured steps), --row-budget srpt's
row budget, --replicas and --routing the servers, --rate / --requests / --mix the mixed workload,
--capacity RATES the capacity table.
"""

import argparse
import json
import math
import random
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from h3_core.serving.dit.scheduler import DEFAULT_POLICY, POLICIES, Job, Scheduler

ROOT_RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"  # benchmark results files
LARGE_ROWS = 16_384  # 672x384, 4 s at 24 fps (docs/model.md §4.4)
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


# The reference's 4 x H100 rate: 0.26 s per step of one 16,384-row request (docs/model.md §5.11: 20 steps,
# 5.27 s of denoising per request). c0 = 0.01 s makes 4 co-batched requests 2.8% cheaper per
# request than 4 solo ones, as measured upstream (-2.4%, docs/model.md §5.11).
REFERENCE_COST = CostModel(c0=0.0, c1=0.26 / LARGE_ROWS, encode_s=0.1, decode_s=0.52)
LOADED_COST = replace(REFERENCE_COST, c0=0.01)
WORKLOADS = ("reference", "mixed", "burst")
ROUTINGS = ("round_robin", "least_rows")
MIXED_MIX = ((0.7, SMALL_ROWS, 20), (0.3, LARGE_ROWS, 30))  # (weight, rows, steps) of the mixed workload


def fit_step_cost(points: Sequence[tuple[int, float]], cost: CostModel = LOADED_COST) -> CostModel:
    """`cost` with c0, c1 of the least-squares line t = c0 + c1 x rows through measured
    (rows, seconds) step points (at least two distinct row counts); encode_s and decode_s kept.
    Raises ValueError for fewer."""
    if len({rows for rows, _ in points}) < 2:
        raise ValueError(f"a step cost fit needs steps of at least two row counts, got {list(points)}")
    n = len(points)
    mean_rows = sum(rows for rows, _ in points) / n
    mean_s = sum(seconds for _, seconds in points) / n
    c1 = sum((rows - mean_rows) * (seconds - mean_s) for rows, seconds in points) / sum(
        (rows - mean_rows) ** 2 for rows, _ in points
    )
    return replace(cost, c0=mean_s - c1 * mean_rows, c1=c1)


def measured_steps(path: Path) -> list[tuple[int, float]]:
    """(rows, seconds) of the steps an engine benchmark results file records (benchmarks/results/
    h200.json, benchmarks/engine_bench.py): measurements.engine_bench.a_step (1-4 packed
    16,384-row requests) and e_packing_curve's one-request steps (128-16,384 rows). Raises
    KeyError when the file has neither."""
    bench = json.loads(Path(path).read_text())["measurements"]["engine_bench"]
    packed = [(int(step["rows"]), float(step["seconds"])) for step in bench["a_step"].values()]
    return packed + [(int(rows), float(point["one_s"])) for rows, point in bench["e_packing_curve"].items()]


def parse_mix(text: str) -> tuple[tuple[float, int, int], ...]:
    """--mix "WEIGHT:ROWS:STEPS,..." -> ((weight, rows, steps), ...). Raises ValueError naming the
    entry that is not of that form or has a weight, rows or steps not > 0."""
    mix = []
    for entry in text.split(","):
        try:
            weight, rows, steps = entry.split(":")
            mix.append((float(weight), int(rows), int(steps)))
        except ValueError:
            raise ValueError(f"--mix entry {entry!r} is not WEIGHT:ROWS:STEPS (e.g. 0.3:16384:30)") from None
        if not (mix[-1][0] > 0 and mix[-1][1] > 0 and mix[-1][2] > 0):
            raise ValueError(f"--mix entry {entry!r}: weight, rows and steps must be > 0")
    return tuple(mix)


@dataclass(frozen=True)
class SimRequest:
    submit_s: float
    rows: int
    steps: int


@dataclass(frozen=True)
class Workload:
    """requests in submission order; hit_rate: the fraction of each request's steps its step
    cache skips (round(hit_rate x steps), at most steps - 2; benchmarks/cache_quality.py measures
    it), which cost no rows."""

    name: str
    requests: list[SimRequest]
    cost: CostModel
    hit_rate: float = 0.0


@dataclass
class SimState:
    """The part of a RequestState the scheduler reads. skipped_steps: steps its step cache skips
    (at most total_steps - 2: the first and last are computed), spread evenly over the others."""

    rows: int
    total_steps: int
    step_index: int = 0
    skipped_steps: int = 0

    @property
    def finished(self) -> bool:
        return self.step_index >= self.total_steps

    @property
    def step_rows(self) -> int:
        """Rows its next step occupies: 0 when it is one of the skipped ones (step k of the middle
        steps 1..n, n = total_steps - 2, is skipped when floor(k s / n) > floor((k - 1) s / n),
        s = skipped_steps), else rows."""
        k, n, s = self.step_index, self.total_steps - 2, self.skipped_steps
        skipped = 1 <= k <= n and (k * s) // n > ((k - 1) * s) // n
        return 0 if skipped else self.rows


@dataclass(frozen=True)
class Completion:
    """One request's final response; times in simulated seconds."""

    request: int  # index into Workload.requests
    submit_s: float
    dit_arrival_s: float
    first_step_s: float
    done_s: float
    replica: int = 0  # the replica that served it


def make_workload(
    name: str,
    seed: int = 0,
    cost: CostModel | None = None,
    rate_per_min: float | None = None,
    count: int = 200,
    mix: Sequence[tuple[float, int, int]] = MIXED_MIX,
    hit_rate: float = 0.0,
) -> Workload:
    """The named workload (issue 5); `cost` replaces its cost model; hit_rate: its step cache's
    (Workload; the arrivals do not depend on it, so runs with and without caching compare).

    reference: 10 requests, one every 5 s, 20 steps, 16,384 rows, REFERENCE_COST.
    mixed: `count` requests (200), Poisson arrivals at `rate_per_min` requests a minute, by default
    at 80% utilisation of one DiT (0.8 / mean solo denoise time), sizes drawn from `mix`
    ((weight, rows, steps), ...; default MIXED_MIX: 70% 1,280 rows x 20 steps, 30% 16,384 rows x
    30 steps), LOADED_COST; random.Random(seed) draws sizes and gaps.
    burst: 4 large requests (16,384 rows, 30 steps) at t = 0, LOADED_COST.
    Raises ValueError for an unknown name, a rate or count not > 0, or a hit_rate outside [0, 1).
    """
    if not 0 <= hit_rate < 1:
        raise ValueError(f"hit_rate={hit_rate} is out of range: allowed 0 <= hit_rate < 1")
    if name == "reference":
        requests, default_cost = [SimRequest(5.0 * i, LARGE_ROWS, 20) for i in range(10)], REFERENCE_COST
    elif name == "burst":
        requests, default_cost = [SimRequest(0.0, LARGE_ROWS, 30) for _ in range(4)], LOADED_COST
    elif name == "mixed":
        if not (count > 0 and (rate_per_min is None or rate_per_min > 0)):
            raise ValueError(f"the mixed workload needs count > 0 and rate > 0, got {count} and {rate_per_min}")
        default_cost = LOADED_COST
        step = (cost or default_cost).step_s
        weights = [weight for weight, _, _ in mix]
        mean_denoise_s = sum(weight * steps * step(rows) for weight, rows, steps in mix) / sum(weights)
        rate_per_s = 0.8 / mean_denoise_s if rate_per_min is None else rate_per_min / 60
        rng, t, requests = random.Random(seed), 0.0, []
        for _ in range(count):
            _, rows, steps = _draw(rng, mix, weights)
            requests.append(SimRequest(t, rows, steps))
            t += rng.expovariate(rate_per_s)
    else:
        raise ValueError(f"workload={name!r} is not one of {', '.join(WORKLOADS)}")
    return Workload(name, requests, cost or default_cost, hit_rate)


def _draw(rng: random.Random, mix: Sequence[tuple[float, int, int]], weights: list[float]) -> tuple[float, int, int]:
    """One entry of the mix, by one rng.random() draw against the cumulative weights."""
    point, total = rng.random() * sum(weights), 0.0
    for entry, weight in zip(mix, weights, strict=True):
        total += weight
        if point < total:
            return entry
    return mix[-1]


class Replica:
    """One server of the simulation: an encoder (first come first served), a DiT (the
    server's Scheduler with `policy`: max_num_seqs 4, max_batch_rows 4 x 16,384, `row_budget`,
    room for every request to wait) and a VAE (in finishing order), each one instance."""

    def __init__(self, index: int, workload: Workload, policy: str, row_budget: int):
        self.index, self.workload = index, workload
        self.scheduler = Scheduler(
            max_num_seqs=4,
            max_batch_rows=4 * LARGE_ROWS,
            max_waiting=len(workload.requests),
            policy=policy,
            row_budget=row_budget,
        )
        self.pending: deque[Job] = deque()  # encoded, not yet at the DiT, in arrival order
        self.encoder_free = self.vae_free = self.now = 0.0  # self.now: the DiT's next step boundary
        self.rows: dict[int, int] = {}  # request index -> rows, of the requests sent here and not known done
        self.done_s: dict[int, float] = {}  # request index -> when its VAE finished
        self.completions: list[Completion] = []

    def submit(self, index: int) -> None:
        """Send request `index` of the workload here at its submission time."""
        request = self.workload.requests[index]
        self.encoder_free = max(request.submit_s, self.encoder_free) + self.workload.cost.encode_s
        self.pending.append(
            Job(
                key=index,
                request_id=str(index),
                arrival_s=self.encoder_free,
                states=[SimState(request.rows, request.steps, skipped_steps=self.skipped_steps(request.steps))],
            )
        )
        self.rows[index] = request.rows

    def skipped_steps(self, steps: int) -> int:
        """Steps of a `steps`-step request the step cache skips at the workload's hit rate."""
        return min(round(self.workload.hit_rate * steps), max(steps - 2, 0))

    def outstanding_rows(self, now: float) -> int:
        """Rows of the requests sent here that are not completed at `now` (never earlier than a
        previous call's `now`: requests done by then are forgotten)."""
        for index in [index for index in self.rows if self.done_s.get(index, math.inf) <= now]:
            del self.rows[index]
        return sum(self.rows.values())

    def run(self, until: float = math.inf) -> None:
        """Run the DiT's step boundaries and steps that start before `until` (every one by default):
        nothing it decides then depends on a request submitted at `until` or later."""
        cost = self.workload.cost
        while self.now < until:
            while self.pending and self.pending[0].arrival_s <= self.now:
                self.scheduler.add(self.pending.popleft())
            pack = self.scheduler.schedule(self.now)
            if not pack:
                if not self.pending:
                    return
                self.now = self.pending[0].arrival_s
                continue
            for job in pack:
                job.first_step_s = self.now if job.first_step_s is None else job.first_step_s
            self.now += cost.step_s(sum(job.step_rows for job in pack))
            for job in pack:
                for state in job.states:
                    state.step_index += 1
                if job.finished:
                    self.scheduler.remove(job)
                    self.vae_free = max(self.now, self.vae_free) + cost.decode_s
                    submit_s = self.workload.requests[job.key].submit_s
                    self.completions.append(
                        Completion(job.key, submit_s, job.arrival_s, job.first_step_s, self.vae_free, self.index)
                    )
                    self.done_s[job.key] = self.vae_free


def simulate(
    workload: Workload,
    policy: str,
    row_budget: int = LARGE_ROWS,
    replicas: int = 1,
    routing: str = "round_robin",
) -> list[Completion]:
    """Run the workload through `replicas` Replicas with `policy` and `row_budget` (default
    16,384: a step of one 16k-row request is already compute-bound, co-batching 4 saves only 2.4%
    per request, docs/model.md §5.11), each request sent at its submission by `routing` (ROUTINGS, the
    module docstring). Returns the completions in finishing order (VAE done). Raises ValueError
    for replicas < 1 or an unknown routing."""
    if replicas < 1 or routing not in ROUTINGS:
        raise ValueError(f"replicas={replicas} routing={routing!r}: need replicas >= 1 and one of {ROUTINGS}")
    servers = [Replica(index, workload, policy, row_budget) for index in range(replicas)]
    for index, request in enumerate(workload.requests):
        for server in servers:
            server.run(until=request.submit_s)
        if routing == "round_robin":
            target = servers[index % replicas]
        else:
            target = min(servers, key=lambda server: server.outstanding_rows(request.submit_s))
        target.submit(index)
    for server in servers:
        server.run()
    return sorted((c for server in servers for c in server.completions), key=lambda c: c.done_s)


def summarize(workload: Workload, completions: list[Completion]) -> dict:
    """The metrics of one policy's run (see the module docstring), rounded to 0.1 ms."""
    latencies = [c.done_s - c.submit_s for c in completions]
    waits = [c.first_step_s - c.dit_arrival_s for c in completions]
    span = max(c.done_s for c in completions) - workload.requests[0].submit_s
    return {
        "mean_latency_s": round(sum(latencies) / len(latencies), 4),
        "p95_latency_s": round(percentile(latencies, 95), 4),
        "mean_time_to_first_step_s": round(sum(waits) / len(waits), 4),
        "p95_time_to_first_step_s": round(percentile(waits, 95), 4),
        "throughput_per_min": round(len(completions) * 60 / span, 4),
        "completed": len(completions),
        "submitted": len(workload.requests),
    }


def compare(workload: Workload, row_budget: int = LARGE_ROWS, replicas: int = 1, routing: str = "round_robin") -> dict:
    """{policy: summary} for every policy, plus "default": the default policy's name."""
    return {
        **{
            policy: summarize(workload, simulate(workload, policy, row_budget, replicas, routing))
            for policy in POLICIES
        },
        "default": DEFAULT_POLICY,
    }


def replicas_needed(
    workload: Workload,
    routing: str,
    max_ttfs_s: float,
    max_p95_s: float,
    policy: str = DEFAULT_POLICY,
    row_budget: int = LARGE_ROWS,
    first: int = 1,
    max_replicas: int = 64,
) -> tuple[int | None, dict]:
    """The fewest replicas (first..max_replicas) under `routing` whose p95 time to first step is
    at most max_ttfs_s and p95 latency at most max_p95_s seconds on `workload`, with that run's
    summary; (None, the max_replicas run's summary) when none keeps both bounds."""
    for replicas in range(first, max_replicas + 1):
        summary = summarize(workload, simulate(workload, policy, row_budget, replicas, routing))
        if summary["p95_time_to_first_step_s"] <= max_ttfs_s and summary["p95_latency_s"] <= max_p95_s:
            return replicas, summary
    return None, summary


def capacity(
    rates_per_min: Sequence[float],
    cost: CostModel,
    max_ttfs_s: float,
    max_p95_s: float,
    seed: int = 0,
    count: int = 200,
    mix: Sequence[tuple[float, int, int]] = MIXED_MIX,
    policy: str = DEFAULT_POLICY,
    row_budget: int = LARGE_ROWS,
    max_replicas: int = 64,
) -> list[dict]:
    """For each arrival rate (requests a minute) of the mixed workload (make_workload with seed,
    count, mix, cost): its load, the DiT seconds a second its requests need at the least (full
    packs: c1 x rows per step and c0 shared by 4 requests; 1.0 = one replica busy all the time),
    and per routing replicas_needed's answer and the p95 time to first step and p95 latency of
    that run (seconds). Fewer replicas than the load are overloaded (their queue grows without
    bound) and not tried."""
    rows = []
    for rate in rates_per_min:
        workload = make_workload("mixed", seed, cost, rate, count, mix)
        work = [r.steps * (cost.c1 * r.rows + cost.c0 / 4) for r in workload.requests]
        load = rate / 60 * sum(work) / len(work)
        row = {"rate_per_min": rate, "load": round(load, 4)}
        for routing in ROUTINGS:
            first = max(1, math.ceil(load))
            replicas, summary = replicas_needed(
                workload, routing, max_ttfs_s, max_p95_s, policy, row_budget, first, max_replicas
            )
            row[routing] = {
                "replicas": replicas,
                "p95_time_to_first_step_s": summary["p95_time_to_first_step_s"],
                "p95_latency_s": summary["p95_latency_s"],
            }
        rows.append(row)
    return rows


def table(workload: Workload, row_budget: int, results: dict, replicas: int = 1, routing: str = "round_robin") -> str:
    """compare()'s results as a readable table, headed by the workload and its cost model."""
    cost = workload.cost
    servers = f", {replicas} replicas ({routing})" if replicas > 1 else ""
    lines = [
        f"workload {workload.name}: {len(workload.requests)} requests; simulated, step cost "
        f"{cost.c0:g} s + {cost.c1:.4g} s/row, encode {cost.encode_s:g} s, decode {cost.decode_s:g} s, "
        f"srpt row budget {row_budget}{servers}",
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


def capacity_table(rows: list[dict], cost: CostModel, max_ttfs_s: float, max_p95_s: float, policy: str) -> str:
    """capacity()'s rows as a Markdown table, headed by the bounds and the cost model."""
    lines = [
        f"replicas keeping p95 time to first step <= {max_ttfs_s:g} s and p95 latency <= {max_p95_s:g} s "
        f"({policy}; step cost {cost.c0:.4g} s + {cost.c1:.4g} s/row, encode {cost.encode_s:g} s, "
        f"decode {cost.decode_s:g} s)",
        "",
        "| req/min | load | round_robin: replicas | p95 TTFS s | p95 latency s "
        "| least_rows: replicas | p95 TTFS s | p95 latency s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"{row['rate_per_min']:g}", f"{row['load']:.2f}"]
        for routing in ROUTINGS:
            r = row[routing]
            cells += [
                "none" if r["replicas"] is None else str(r["replicas"]),
                f"{r['p95_time_to_first_step_s']:.2f}",
                f"{r['p95_latency_s']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m h3_core.serving.dit.simulate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--seed", type=int, default=0, help="random seed of the mixed workload")
    parser.add_argument("--c0", type=float, help="step cost seconds per step (replaces the workload's)")
    parser.add_argument("--c1", type=float, help="step cost seconds per packed row (replaces the workload's)")
    parser.add_argument(
        "--step-costs",
        type=Path,
        metavar="RESULTS_JSON",
        help="fit c0 and c1 to the packed steps a benchmark measured (benchmarks/results/h200.json)",
    )
    parser.add_argument("--row-budget", type=int, default=LARGE_ROWS, help="srpt's row budget (rows)")
    parser.add_argument("--replicas", type=int, default=1, help="servers the requests are spread over (default 1)")
    parser.add_argument("--routing", choices=ROUTINGS, default="round_robin", help="how (default: %(default)s)")
    parser.add_argument("--rate", type=float, help="mixed: requests a minute (default: 80%% of one DiT)")
    parser.add_argument("--requests", type=int, default=200, help="mixed: how many requests (default 200)")
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default=MIXED_MIX,
        help="mixed: sizes, WEIGHT:ROWS:STEPS,... (default 0.7:1280:20,0.3:16384:30)",
    )
    parser.add_argument(
        "--capacity",
        type=lambda text: [float(rate) for rate in text.split(",")],
        metavar="RATES",
        help="mixed: print the capacity table for these requests a minute (comma list) instead",
    )
    parser.add_argument("--max-ttfs", type=float, default=1.0, help="--capacity: p95 time to first step bound, s")
    parser.add_argument("--max-p95", type=float, default=60.0, help="--capacity: p95 latency bound, s")
    parser.add_argument("--max-replicas", type=int, default=64, help="--capacity: the most replicas tried")
    parser.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY, help="--capacity: the DiT's policy")
    parser.add_argument(
        "--hit-rate",
        type=float,
        default=0.0,
        help="fraction of each request's steps the step cache skips (benchmarks/cache_quality.py)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    if args.capacity and args.workload != "mixed":
        parser.error("--capacity takes the mixed workload")
    cost = make_workload(args.workload).cost
    if args.step_costs:
        cost = fit_step_cost(measured_steps(args.step_costs), cost)
    cost = replace(cost, c0=cost.c0 if args.c0 is None else args.c0, c1=cost.c1 if args.c1 is None else args.c1)
    if args.capacity:
        rows = capacity(
            args.capacity,
            cost,
            args.max_ttfs,
            args.max_p95,
            args.seed,
            args.requests,
            args.mix,
            args.policy,
            args.row_budget,
            args.max_replicas,
        )
        out = json.dumps(rows) if args.json else capacity_table(rows, cost, args.max_ttfs, args.max_p95, args.policy)
    else:
        workload = make_workload(args.workload, args.seed, cost, args.rate, args.requests, args.mix, args.hit_rate)
        results = compare(workload, args.row_budget, args.replicas, args.routing)
        out = (
            json.dumps(results) if args.json else table(workload, args.row_budget, results, args.replicas, args.routing)
        )
    sys.stdout.write(out + "\n")


if __name__ == "__main__":
    main()
