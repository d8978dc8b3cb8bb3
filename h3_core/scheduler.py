"""Admission and packing for diffusion continuous batching (Triton-free).

A Job is one client request inside the DiT: its RequestStates (one per output) plus serving
bookkeeping. The Scheduler keeps the waiting queue (bounded by max_waiting) and the active set,
and decides at every step boundary which jobs this step advances: first-in-first-out admission
while the pack stays within max_num_seqs documents and max_batch_rows rows; every admitted job
advances every step.
"""
import time
from dataclasses import dataclass, field

from .engine import RequestState


class Overloaded(Exception):
    """The waiting queue is full; the request is refused (Triton: UNAVAILABLE)."""


@dataclass
class Job:
    """One client request in the DiT. Times are time.monotonic() seconds."""

    key: object  # Triton correlation id
    request_id: str
    states: list[RequestState]
    progress_every: int = 0
    encode_s: float = 0.0
    arrival_s: float = field(default_factory=time.monotonic)
    first_step_s: float | None = None
    last_step_s: float | None = None
    largest_pack: int = 0
    queue_position: int | None = None  # last reported position (progress responses)
    extra: dict = field(default_factory=dict)  # adapter bookkeeping (Triton request object)

    @property
    def rows(self) -> int:
        """Packed rows the job occupies in one forward (all its outputs)."""
        return sum(state.rows for state in self.states)

    @property
    def step_index(self) -> int:
        return self.states[0].step_index

    @property
    def total_steps(self) -> int:
        return self.states[0].total_steps

    @property
    def finished(self) -> bool:
        return all(state.finished for state in self.states)


class Scheduler:
    """FIFO admission with capacity limits.

    Args:
        max_num_seqs: documents (request outputs) per packed forward.
        max_batch_rows: packed rows per forward.
        max_waiting: jobs that may wait for admission; one more is refused.
    """

    def __init__(self, max_num_seqs: int, max_batch_rows: int, max_waiting: int):
        self.max_num_seqs, self.max_batch_rows, self.max_waiting = max_num_seqs, max_batch_rows, max_waiting
        self.waiting: list[Job] = []
        self.active: list[Job] = []

    def add(self, job: Job) -> None:
        """Queue a new job. Raises ValueError if it can never fit one forward, Overloaded if
        max_waiting jobs are already waiting."""
        if len(job.states) > self.max_num_seqs:
            raise ValueError(f"num_outputs={len(job.states)} is out of range: allowed 1..{self.max_num_seqs} (max_num_seqs)")
        if job.rows > self.max_batch_rows:
            raise ValueError(f"rows={job.rows} is out of range: allowed 1..{self.max_batch_rows} (max_batch_rows)")
        if len(self.waiting) >= self.max_waiting:
            raise Overloaded(f"{len(self.waiting)} requests are waiting (max_waiting={self.max_waiting}); retry later")
        self.waiting.append(job)

    def schedule(self) -> list[Job]:
        """Admit waiting jobs in arrival order while the pack fits, then return the jobs this
        step advances (all active jobs). Head-of-line: a job that does not fit stops admission."""
        seqs = sum(len(job.states) for job in self.active)
        rows = sum(job.rows for job in self.active)
        while self.waiting:
            job = self.waiting[0]
            if seqs + len(job.states) > self.max_num_seqs or rows + job.rows > self.max_batch_rows:
                break
            self.active.append(self.waiting.pop(0))
            seqs, rows = seqs + len(job.states), rows + job.rows
        return list(self.active)

    def remove(self, job: Job) -> None:
        """Forget a finished, failed or cancelled job."""
        for queue in (self.waiting, self.active):
            if job in queue:
                queue.remove(job)

    def queue_position(self, job: Job) -> int:
        """0 for an active job, else 1 + the number of jobs ahead of it in the waiting queue."""
        return 0 if job in self.active else self.waiting.index(job) + 1
