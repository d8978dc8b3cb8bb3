"""Admission and step-boundary scheduling for diffusion continuous batching (Triton-free).

A Job is one client request inside the DiT: its states (one per output) plus serving
bookkeeping. The Scheduler holds the live jobs, refuses a job that can never fit one forward or
that finds it at capacity (Admission, below), and at every step boundary lets its policy pick the
jobs this step advances (the pack). A job left out of the pack is preempted: its state stays in
the job and it resumes at the same step later. The policies (docs/scheduling.md compares them):

- `request`: the oldest job alone until it finishes (run to completion, equal to request mode).
- `fifo`: the reference (docs/model.md §5.7): admit in arrival order while the pack fits max_num_seqs
  and max_batch_rows, stopping at the first job that does not fit; every admitted job advances
  every step (processor sharing). The admitted jobs are always the oldest ones, so the pack is
  recomputed from arrival order at every boundary.
- `srpt`: shortest remaining processing time with preemption at step boundaries. Jobs are ranked
  by (higher priority, newcomer before started job, less remaining work = remaining steps x
  rows, earlier arrival). The first-ranked job always runs; the others join in rank order
  while the pack stays within row_budget rows.

A pack's documents and rows count only the outputs that compute at this step: a step the
request's step cache skips (planned before the boundary, Engine.plan_step; h3_core.diffusion.step_cache)
runs no forward, so a job whose outputs all skip joins any pack (Job.step_rows, step_outputs).

The longest wait (every policy): a job that has waited max_wait_s seconds or more for a step
(since its arrival, or since the last schedule() that packed it, so preempted jobs count too)
is overdue. Overdue jobs rank before every other job whatever their priority, the longest
waiting first (then earlier arrival); the policy orders the rest as above. The first-ranked job
always runs (add() refuses a job that cannot fit one forward alone) and a packed job's wait
restarts, which puts it behind every job already overdue, so a job is packed at most k + 1
boundaries after it becomes overdue, k being the jobs overdue before it (at most max_num_seqs +
max_waiting - 1). Bound: from its arrival to its first step, and between two of its steps, a
job waits at most max_wait_s plus k + 1 steps; with one overdue job at a time, as under a
stream of higher-priority newcomers, max_wait_s plus one step. So no priority holds a job back
for longer, and a large job passed over by smaller ones still advances. Under `request` and
`fifo` overdue jobs interleave single steps with the policy's order.

Admission (every policy): the scheduler holds at most max_num_seqs + max_waiting live jobs (one
full pack of single-output jobs plus max_waiting waiting); a newcomer finding that many is refused
with Overloaded, whose message counts the jobs held. The bound counts every live job wherever the
policy puts it: packed, not started yet, or started and preempted. Only add() raises that count
(schedule() moves jobs between the pack and the line but adds none), so it never passes the bound.
Counting only the jobs outside the current pack could: srpt's pack shrinks when a newcomer
outranks started jobs or a multi-output job ranks first, and the jobs it leaves out join the
line. Counting only the jobs not started yet would leave the total unbounded under srpt, which
starts every newcomer at the next boundary and preempts started jobs. The bound is h3_dit's
max_batch_size (max_num_seqs + max_waiting + 2 sequence slots) less its 2 control slots, so
cancel requests always find a slot and a newcomer gets one and its UNAVAILABLE answer instead of
waiting in Triton's backlog. The line (jobs outside the pack, h3_dit's h3_waiting_requests gauge)
is longer than max_waiting when the pack holds fewer than max_num_seqs jobs (multi-output jobs,
max_batch_rows, row_budget).

Policies never read the clock: schedule() takes `now`, so the simulator (h3_core.serving.dit.simulate) drives
the same code with simulated time.
"""

import math
import time
from dataclasses import dataclass, field

from h3_core.serving.shared.registry import DitLoad
from h3_core.serving.shared.settings import DEFAULT_MAX_WAIT_S, DEFAULT_POLICY, POLICIES


class Overloaded(Exception):
    """The scheduler is at capacity (max_num_seqs + max_waiting jobs); the request is refused
    (Triton: UNAVAILABLE)."""


@dataclass(eq=False)  # a job is itself: compared by identity
class Job:
    """One client request as the scheduler sees it. Times are seconds on one clock
    (time.monotonic() in the server, simulated seconds in h3_core.serving.dit.simulate). The scheduler reads
    only rows, step_rows, step_index, total_steps, len(states), arrival_s and priority; the step loop's Job
    (h3_core.serving.dit.step_loop) adds the serving lifecycle."""

    key: object  # Triton correlation id
    request_id: str
    states: list  # one per output: engine.RequestState, or simulate.SimState (rows, step_rows, step_index, ...)
    priority: int = 0  # request parameter request_priority; higher runs first (srpt)
    arrival_s: float = field(default_factory=time.monotonic)
    first_step_s: float | None = None

    @property
    def rows(self) -> int:
        """Packed rows the job occupies in one forward (all its outputs)."""
        return sum(state.rows for state in self.states)

    @property
    def step_rows(self) -> int:
        """Packed rows its next step occupies in a forward: its outputs' step_rows (0 for an
        output whose step the step cache skips)."""
        return sum(state.step_rows for state in self.states)

    @property
    def step_outputs(self) -> int:
        """Documents its next step adds to a forward: its outputs that compute."""
        return sum(1 for state in self.states if state.step_rows)

    @property
    def step_index(self) -> int:
        return self.states[0].step_index

    @property
    def total_steps(self) -> int:
        return self.states[0].total_steps

    @property
    def finished(self) -> bool:
        return all(state.finished for state in self.states)

    @property
    def remaining_work(self) -> int:
        """Row-steps still to run: (total_steps - step_index) x rows."""
        return (self.total_steps - self.step_index) * self.rows


class Scheduler:
    """Capacity limits plus a step-boundary policy.

    Args:
        max_num_seqs: documents (request outputs) per packed forward.
        max_batch_rows: packed rows per forward; a job with more rows is refused.
        max_waiting: live jobs beyond max_num_seqs: a newcomer finding max_num_seqs +
            max_waiting live jobs is refused with Overloaded (Admission in the module docstring).
        policy: one of POLICIES (Triton model parameter `scheduling_policy`).
        row_budget: `srpt` only: rows a pack may reach when jobs join the first-ranked one;
            None means max_batch_rows. Set it where the measured step cost stops being flat
            (docs/scheduling.md).
        max_wait_s: every policy: seconds a job may wait for a step before it ranks before
            every job that has not waited that long (the longest wait, module docstring).
    Raises ValueError for an unknown policy, a row_budget outside 1..max_batch_rows or a
    max_wait_s that is not finite > 0.
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_batch_rows: int,
        max_waiting: int,
        policy: str = DEFAULT_POLICY,
        row_budget: int | None = None,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
    ):
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy={policy!r} is not one of {', '.join(POLICIES)}")
        row_budget = max_batch_rows if row_budget is None else row_budget
        if not 1 <= row_budget <= max_batch_rows:
            raise ValueError(f"row_budget={row_budget} is out of range: allowed 1..{max_batch_rows} (max_batch_rows)")
        if not 0 < max_wait_s < math.inf:
            raise ValueError(f"max_wait_s={max_wait_s} is out of range: allowed finite > 0 seconds")
        self.max_num_seqs, self.max_batch_rows, self.max_waiting = max_num_seqs, max_batch_rows, max_waiting
        self.policy, self.row_budget, self.max_wait_s = policy, row_budget, max_wait_s
        self.jobs: list[Job] = []  # live jobs in arrival order
        self.waiting_since: dict[Job, float] = {}  # live job -> its arrival_s, then the last schedule() packing it
        self.pack: list[Job] = []  # the jobs the last schedule() returned
        self.line: list[Job] = []  # the other live jobs, next in line first

    def add(self, job: Job) -> None:
        """Queue a new job. Raises ValueError if it can never fit one forward, Overloaded if
        max_num_seqs + max_waiting jobs are live."""
        if len(job.states) > self.max_num_seqs:
            raise ValueError(
                f"num_outputs={len(job.states)} is out of range: allowed 1..{self.max_num_seqs} (max_num_seqs)"
            )
        if job.rows > self.max_batch_rows:
            raise ValueError(f"rows={job.rows} is out of range: allowed 1..{self.max_batch_rows} (max_batch_rows)")
        if len(self.jobs) >= self.max_num_seqs + self.max_waiting:
            raise Overloaded(DitLoad(len(self.jobs), self.max_num_seqs, self.max_waiting).message())
        self.jobs.append(job)
        self.waiting_since[job] = job.arrival_s
        self.line.append(job)

    def schedule(self, now: float | None = None) -> list[Job]:
        """The jobs this step advances (at most max_num_seqs documents and max_batch_rows rows),
        chosen at time `now` (seconds, the jobs' arrival_s clock; None reads time.monotonic()):
        the overdue jobs first (the longest wait, module docstring), then the policy's order.
        Jobs left out keep their state and wait; the packed ones' wait restarts at `now`."""
        now = time.monotonic() if now is None else now
        overdue = sorted(
            (job for job in self.jobs if now - self.waiting_since[job] >= self.max_wait_s),
            key=lambda job: (self.waiting_since[job], job.arrival_s),
        )
        rest = [job for job in self.jobs if job not in overdue]  # arrival order
        if self.policy == "srpt":
            rest.sort(key=self._rank)
        ranked = overdue + rest
        if self.policy == "request":
            self.pack = ranked[:1]
        elif self.policy == "fifo":
            self.pack = self._fill(ranked, self.max_batch_rows, stop_at_misfit=True)
        else:
            self.pack = self._fill(ranked, self.row_budget, stop_at_misfit=False)
        for job in self.pack:
            self.waiting_since[job] = now
        self.line = [job for job in ranked if job not in self.pack]
        return list(self.pack)

    @staticmethod
    def _rank(job: Job) -> tuple:
        """srpt sort key: smaller runs first."""
        return (-job.priority, job.step_index > 0, job.remaining_work, job.arrival_s)

    def _fill(self, ranked: list[Job], row_limit: int, stop_at_misfit: bool) -> list[Job]:
        """The first job, then later ones in order while the pack stays within max_num_seqs
        documents and row_limit rows of the outputs that compute (step_outputs, step_rows); a
        job that does not fit stops the fill (stop_at_misfit, head-of-line blocking) or is
        skipped."""
        pack = ranked[:1]
        seqs, rows = sum(job.step_outputs for job in pack), sum(job.step_rows for job in pack)
        for job in ranked[1:]:
            if seqs + job.step_outputs > self.max_num_seqs or rows + job.step_rows > row_limit:
                if stop_at_misfit:
                    break
                continue
            pack.append(job)
            seqs, rows = seqs + job.step_outputs, rows + job.step_rows
        return pack

    def remove(self, job: Job) -> None:
        """Forget a finished, failed or cancelled job."""
        for queue in (self.jobs, self.pack, self.line):
            if job in queue:
                queue.remove(job)
        self.waiting_since.pop(job, None)

    def queue_position(self, job: Job) -> int:
        """0 for a job in the current pack, else k for the k-th job in line (policy order as of
        the last schedule(); jobs added since then follow in arrival order)."""
        return 0 if job in self.pack else self.line.index(job) + 1
