"""The DiT's step loop: diffusion continuous batching over live requests, Triton-free.

The Triton model h3_dit (model_repository/h3_dit/1/model.py) is an adapter: at every execute() it
turns each live Triton request into an `Arrival` (plain data) and calls `StepLoop.iterate`, which
hands it the `Event`s to send, in order, as they happen, and returns the requests to reschedule. Everything else lives
here, and tests drive it without a server:

1. Arrivals, once per execute. A new request (Triton's START flag) is validated (`parse`) and
   handed to the scheduler (admission; refused with INVALID_ARG or UNAVAILABLE at once); a control
   request {"cancel_request_id": ID} is answered at once (`cancel_by_id`, CANCEL_STATES in
   h3_core.protocol); a known request refreshes its job's handle. Cancels that reached another
   DiT instance are read from the registry; jobs Triton stopped delivering (`drop_vanished`) are
   forgotten.
2. Step boundary (`end_cancelled`): jobs cancelled by id, natively cancelled by their client, past
   their deadline, or all of them while the server drains, end with a final `Ended` (CANCELLED).
3. The pack: `Scheduler.schedule()` (h3_core/scheduler.py) picks the jobs this step advances.
4. ONE packed forward for them, launched with each state's Euler update queued after it
   (`launch`; a forward that raises is retried one job at a time so only the offending job fails,
   INTERNAL), then settled (`settle`: its finiteness flags are read, a job with a non-finite
   velocity fails alone, progress, previews and each output's final latents (`Result`) are
   sent). Nothing in `launch` waits for its own forward on a GPU, so while steps are short
   (OVERLAP_MAX_STEP_S) a step settles only after the next one is launched, and the host's work
   of one step (settling, Triton's calls, packing) overlaps the device's forward of the next
   (`advance`). The step launched last
   settles before the execute ends, so every execute's events are complete when it returns. In
   execution mode "request" the first job of the pack instead runs to completion within the
   execute.
5. After each settled step (and at a boundary without one), a waiting job whose queue position
   changed gets a progress event (when it asked for progress); a job that got no event since
   the last such pass gets a `Heartbeat` (h3_vae uses it to notice a client that is gone and
   cancel its request).
6. In step mode the execute repeats 2-5 while nothing new is headed for the DiT and its budget
   allows (`another_step`, DitSettings.execute_budget_s), so the Triton round trip and the work
   of 1 are paid once for several steps. Newcomers and control requests reach the DiT only
   between executes, so the ones that are announced (h3_core.serving.registry: h3_encoder announces each
   request it passes on, h3_vae each cancel for a gone client, the registry each cancel of a
   request on another instance) end the execute at the next step boundary and wait at most the
   step in flight (`note_announcements`; while steps overlap, also the one launched behind it,
   OVERLAP_MAX_STEP_S); unannounced ones (a client's own cancel by id, a
   direct call of h3_dit) wait at most the budget plus one step. Then every job still live is
   rescheduled.

A job's lifecycle is `Status`: WAITING (admitted, no step yet or preempted) -> RUNNING -> FINISHED,
CANCELLED or FAILED. All per-request state lives in the Job and its RequestStates; the loop keeps
only the map of live jobs, two bounded memories of ids (ids cancelled before their request
arrived; ids that finished recently), its count of the registry's announcements and the step in
flight (`InFlight`, between its launch and its settling).
"""

import json
import logging
import math
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch

from ..diffusion import layout as L
from ..diffusion.engine import Engine, preview_frame
from ..diffusion.request import GenerationRequest
from ..media import MP4_AVAILABLE
from ..protocol import (
    CANCEL_FIELD,
    EARLY_CANCEL_SECONDS,
    INT_INPUTS,
    MAX_PRIORITY,
    MAX_REQUEST_ID_CHARS,
    REQUEST_FIELDS,
    check_request_parameters,
)
from . import scheduler
from .registry import IDS_REMEMBERED, Registry
from .scheduler import DitLoad, Overloaded, Scheduler
from .settings import DitSettings

log = logging.getLogger("h3_dit")

VANISHED_EXECUTES = 3  # a job missing from this many executes in a row was dropped by Triton
# Seconds an announced request may take from its announcement (h3_core.serving.registry) to Triton's queue
# for h3_dit: the ensemble's hand-over from h3_encoder (2.6 ms for 4 MB of text embeddings on the
# 2-core CPU, docs/triton_2.51_notes.md), or h3_vae's call with a cancel; with a wide margin.
ANNOUNCED_TRANSIT_S = 0.1
# Steps overlap (the next one is launched before the previous one settles) while the last settled
# step took less than this. The overlap hides the host's work of a step (about 1.7 ms on the H200
# host at 128 rows: packing, Triton's calls; docs/benchmarks.md, issue 16), 3 % or more of a step
# below 50 ms; in exchange an announced newcomer or cancel may wait for the step launched behind
# the one in flight too. Longer steps settle before their boundary ends (lockstep), so after a
# long step no one waits a step more.
OVERLAP_MAX_STEP_S = 0.05
WORKER_FAULTS = ("worker_exit", "worker_hang", "worker_raise")  # inject_fault for sequence-parallel workers
JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


# -- inputs and events (plain data) ------------------------------------------------------------


@dataclass
class Arrival:
    """One live Triton request as h3_dit's execute() sees it.

    handle: the adapter's object for the request (opaque here; events carry it back).
    key: Triton's correlation (sequence) id; 0 or "" marks a filler request (skipped).
    request_id: Triton's request id ("" when the client sent none).
    new: the START flag (first delivery); sequence_end: the END flag (refused).
    request_json: REQUEST's elements (bytes); text_embeds: TEXT_EMBEDS float32 [1, L, text_dim];
    parameters_json: Triton's JSON text of the request parameters.
    is_cancelled: whether the client cancelled the request natively (gRPC cancellation of a
    direct call); called only for the request of a live job at its step boundary, never after
    the request's final response (asking Triton 2.51 then crashes the server)."""

    handle: Any
    key: object
    request_id: str = ""
    new: bool = False
    sequence_end: bool = False
    request_json: list = field(default_factory=list)
    text_embeds: np.ndarray | None = None
    parameters_json: str = "{}"
    is_cancelled: Callable[[], bool] = lambda: False


@dataclass
class Progress:
    """A progress response: step of total after this step, queue_position (0 = in the
    pack), preview uint8 [Hl, Wl, 3] when one is due."""

    handle: Any
    request_id: str
    step: int
    total: int
    queue_position: int
    preview: torch.Tensor | None = None


@dataclass
class Result:
    """One output's final latents: video float32 [24, T_lat, Hl, Wl], audio float32 [2, 32, T_a],
    on the CPU (copied there once, from the engine's device, when the result is sent); info is
    the INFO JSON; final marks the request's last response."""

    handle: Any
    request_id: str
    video_latent: torch.Tensor
    audio_latent: torch.Tensor
    info: dict
    final: bool


@dataclass
class Ended:
    """The final response of a started request that ends early (code CANCELLED or INTERNAL) at
    step of total: sent as a normal response with INFO {"kind": "error"} (see h3_dit)."""

    handle: Any
    request_id: str
    code: str
    message: str
    step: int = 0
    total: int = 0


@dataclass
class Refused:
    """An error response (code INVALID_ARG, UNAVAILABLE or INTERNAL) to a request that never
    started; final."""

    handle: Any
    code: str
    message: str


@dataclass
class CancelAnswer:
    """The final answer to a cancel-by-id control request: state is one of CANCEL_STATES."""

    handle: Any
    request_id: str
    state: str


@dataclass
class Heartbeat:
    """Sent at every step to each live request that got no other event: through the
    ensemble it reaches h3_vae, which swallows it (the client sees nothing) and, when Triton
    marks that request cancelled (its client is gone), cancels the request by id. Without it a
    request that asked for no progress sends nothing until its result, and a gone client would
    be noticed only then (Triton 2.51 tells h3_dit nothing; docs/reliability.md)."""

    handle: Any
    request_id: str


Event = Progress | Result | Ended | Refused | CancelAnswer | Heartbeat
Send = Callable[[Event], None]  # what iterate() hands each event to


# -- the job ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Job(scheduler.Job):
    """A request in the step loop: the scheduler's Job (key, request_id, states, priority,
    arrival_s, first_step_s) plus its lifecycle. Times are seconds on the loop's clock."""

    handle: Any = None  # the adapter's request object, refreshed every execute
    is_cancelled: Callable[[], bool] = lambda: False  # its Arrival's, refreshed every execute
    status: Status = Status.WAITING
    progress_every: int = 0
    preview_every: int = 0
    deadline_s: float | None = None
    deadline_at: float | None = None  # clock time after which the job is cancelled
    encode_s: float = 0.0
    fault: str | None = None  # inject_fault (tests only)
    last_step_s: float | None = None
    largest_pack: int = 0  # most request outputs in one of its forwards
    queue_position: int | None = None  # last reported position (progress events)
    absent: int = 0  # executes in a row without delivery
    cancel_reason: str | None = None


@dataclass
class InFlight:
    """A packed step launched and not yet settled (StepLoop.launch, StepLoop.settle).

    jobs: the jobs it advances, in pack order; steps: job -> the step it takes (1-based);
    finite: bool [states of jobs, in order] on the CPU, whether each state's velocity is
    finite; on a GPU it is filled by a copy queued right after the forward, and `copied` (a
    CUDA event recorded after that copy) tells when it may be read: waiting for the event
    waits for this step only, not for the next one queued behind it (reading a device tensor
    would). previews: job -> uint8 [Hl, Wl, 3] on the CPU, due with the step's progress; start:
    clock seconds when it was launched."""

    jobs: list[Job]
    steps: dict[Job, int]
    finite: torch.Tensor | None
    copied: torch.cuda.Event | None
    previews: dict[Job, torch.Tensor]
    start: float


# -- metrics ------------------------------------------------------------------------------------

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


# -- validation helpers -------------------------------------------------------------------------


def check_fault(fault: str) -> None:
    """Validate request parameter inject_fault (tests only), acting at the request's first step:
    "raise" makes the forward raise, "nan" makes it return NaN video velocities for the request,
    "slow:S" makes the step S seconds slower (0 < S <= 600); with sp_degree > 1, the last
    sequence-parallel rank exits ("worker_exit", once), hangs ("worker_hang", once) or raises
    ("worker_raise", at every try of that step) at its first all-to-all
    (SequenceParallelDiT.inject_fault). Raises ValueError naming it."""
    if fault in ("raise", "nan", *WORKER_FAULTS):
        return
    try:
        seconds = float(fault[5:]) if fault.startswith("slow:") else None
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= 600:
        raise ValueError(
            f"inject_fault={fault!r} is not one of 'raise', 'nan', 'slow:S' (0 < S <= 600 seconds), "
            "'worker_exit', 'worker_hang', 'worker_raise'"
        )


def read_request_json(elements: list) -> dict:
    """REQUEST's elements -> one JSON object with the allowed keys: a generation request holds
    only REQUEST_FIELDS, a cancel request CANCEL_FIELD alone, a non-empty string. Raises
    ValueError naming the input or the key."""
    if len(elements) != 1:
        raise ValueError(f"REQUEST must hold one JSON object, got {len(elements)} elements")
    try:
        fields = json.loads(elements[0])
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"REQUEST is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError("REQUEST is not valid JSON: nested too deeply") from None
    if not isinstance(fields, dict):
        raise ValueError(f"REQUEST must hold one JSON object, got {type(fields).__name__}")
    if CANCEL_FIELD in fields:
        extra = sorted(key for key in fields if key != CANCEL_FIELD)
        if extra:
            raise ValueError(
                f"REQUEST field {extra[0]!r} is not allowed beside {CANCEL_FIELD!r}: a cancel request "
                "holds that field alone"
            )
        target = fields[CANCEL_FIELD]
        if type(target) is str and len(target) > MAX_REQUEST_ID_CHARS:
            raise ValueError(f"{CANCEL_FIELD} has {len(target)} characters: allowed 1..{MAX_REQUEST_ID_CHARS}")
        if type(target) is not str or not target:
            got = (
                "null"
                if target is None
                else "an empty string"
                if target == ""
                else f"{JSON_TYPES.get(type(target), type(target).__name__)} {json.dumps(target)}"
            )
            raise ValueError(f"{CANCEL_FIELD} must be a non-empty string, got {got}")
        return fields
    unknown = sorted(key for key in fields if key not in REQUEST_FIELDS)
    if unknown:
        raise ValueError(
            f"REQUEST field {unknown[0]!r} is unknown; allowed: {sorted(REQUEST_FIELDS)}, or "
            f"{CANCEL_FIELD!r} alone (a cancel request)"
        )
    return fields


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


def admission_failure(error: Exception) -> str:
    """The client's message for an unexpected exception while a request is admitted: the
    exception's type and the first line of its text, no traceback."""
    text = str(error).strip().splitlines()
    cause = f"{type(error).__name__}: {text[0] if text else 'no detail'}"
    return f"the request could not be admitted ({cause}); see the server log"


class BoundedMemory(OrderedDict):
    """key -> (clock time, value), forgetting entries older than EARLY_CANCEL_SECONDS and the
    oldest beyond IDS_REMEMBERED."""

    def remember(self, key, value, now: float) -> None:
        self.pop(key, None)
        self[key] = (now, value)
        while self and (len(self) > IDS_REMEMBERED or now - next(iter(self.values()))[0] >= EARLY_CANCEL_SECONDS):
            self.popitem(last=False)

    def recall(self, key, now: float, pop: bool = False):
        """The value remembered for key (None if none or expired)."""
        entry = self.pop(key, None) if pop else self.get(key)
        return entry[1] if entry is not None and now - entry[0] < EARLY_CANCEL_SECONDS else None


# -- the loop -----------------------------------------------------------------------------------


class StepLoop:
    """The DiT's step loop over an Engine (see the module docstring).

    Args:
        engine: the Engine (DiT only; decoding happens in h3_vae).
        settings: h3_dit's DitSettings (policy, capacity, execution mode, fault injection).
        registry: the Registry shared by the server's DiT instances (request ids, cancels, loads).
        metrics: MetricsRecord or an object with its three methods.
        clock: monotonic seconds (tests pass a fake one).
    Raises ValueError when settings.max_batch_rows exceeds the rows the DiT's compiled blocks
    take (H3DiT.max_compiled_rows).
    """

    def __init__(
        self,
        engine: Engine,
        settings: DitSettings,
        registry: Registry,
        metrics=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        compiled_rows = getattr(engine.dit, "max_compiled_rows", None)  # a sequence-parallel DiT has none
        if compiled_rows is not None and settings.max_batch_rows > compiled_rows:
            raise ValueError(
                f"h3_dit parameter max_batch_rows={settings.max_batch_rows} is out of range: the compiled DiT "
                f"takes at most {compiled_rows} rows a step"
            )
        self.engine, self.settings, self.registry = engine, settings, registry
        self.metrics = metrics if metrics is not None else MetricsRecord()
        self.clock = clock
        self.scheduler = Scheduler(
            settings.max_num_seqs,
            settings.max_batch_rows,
            settings.max_waiting,
            settings.scheduling_policy,
            settings.row_budget,
            settings.aging_s,
        )
        self.jobs: dict[object, Job] = {}  # live jobs by correlation id
        self.in_flight: InFlight | None = None  # the step launched last, until it settles
        self.settled_at = -math.inf  # clock seconds when the last step settled
        self.last_step_s = math.inf  # seconds of the last settled step (OVERLAP_MAX_STEP_S)
        self.answered: set[int] = set()  # ids of the handles that got an event since the last `answer`
        self.dropped = BoundedMemory()  # correlation id -> (request id, cause): forgotten without an answer
        self.draining = False
        # announcements (h3_core.serving.registry): how many are accounted for (arrived here, or written
        # off), the count when this execute started, and whether one may still be on its way
        self.announced = registry.announcements()
        self.execute_announcements = self.announced
        self.announced_in_transit = False

    def load(self, leaving: int = 0) -> DitLoad:
        """The requests held now against the capacity, less `leaving` (published in the
        registry)."""
        return DitLoad(len(self.jobs) - leaving, self.settings.max_num_seqs, self.settings.max_waiting)

    def start_draining(self) -> None:
        """From the next step boundary every job ends with CANCELLED and newcomers are refused
        with UNAVAILABLE (a graceful stop leaves nothing in flight)."""
        self.draining = True

    # -- one execute -------------------------------------------------------------------------

    def iterate(self, arrivals: list[Arrival], send: Send) -> list:
        """One execute() over every live request: the announcements so far
        (`note_announcements`), the arrivals (step 1 of the module docstring) and the cancels
        other instances took (`Registry.boundary`), then step boundaries and steps (steps 2-5)
        while `another_step` allows, then the settling of the step launched last. Events are
        passed to `send` as they happen (progress streams while the execute runs). Returns the
        handles of the requests to reschedule (still live)."""
        self.metrics.set("h3_heartbeat_timestamp_seconds", time.time())
        self.metrics.set("h3_execute_in_progress", 1)

        def send_and_note(event: Event) -> None:
            self.answered.add(id(event.handle))
            send(event)

        try:
            start = self.clock()
            # a step left in flight by an execute that raised: its events are not sent (its jobs'
            # handles may be gone); its jobs go on, and one whose last step it was gets its
            # results at its next step boundary (end_cancelled)
            self.in_flight = None
            self.note_announcements(arrivals)
            present = [job for arrival in arrivals if (job := self.arrive(arrival, send)) is not None]
            for request_id in self.registry.boundary([job.request_id for job in self.jobs.values()], self.load()):
                job = next(job for job in self.jobs.values() if job.request_id == request_id)
                job.cancel_reason = job.cancel_reason or "cancelled by request"
            self.drop_vanished(present)
            while True:
                boundary = self.clock()
                stepped = self.boundary_and_step(present, send_and_note)
                present = [job for job in present if job.key in self.jobs]
                if not (stepped and present and self.another_step(start, boundary, present)):
                    break
            if self.settle_in_flight(send_and_note):
                self.answer(present, send_and_note)
            present = [job for job in present if job.key in self.jobs]
            self.metrics.set("h3_waiting_requests", len(self.scheduler.line))
            self.metrics.set("h3_active_requests", len(self.scheduler.pack))
            self.metrics.set("h3_device_memory_bytes", device_memory_bytes(self.engine.device))
        finally:
            self.metrics.set("h3_execute_in_progress", 0)
        return [job.handle for job in present]

    def boundary_and_step(self, present: list[Job], send: Send) -> bool:
        """One step boundary over the jobs Triton delivered in this execute: end the cancelled
        ones (`end_cancelled`), let the policy pick the pack and `advance` it (launch its step;
        settle the one in flight), then `answer` the jobs after a settled step. In execution
        mode "request" the pack's first job runs to completion and the jobs are answered once.
        Returns whether a forward was launched."""
        self.end_cancelled(present, send)
        pack = [job for job in self.scheduler.schedule(self.clock()) if job in present]
        if pack and self.settings.execution_mode == "request":
            running = pack[:1]
            while running:
                flight, _ = self.advance(running, send)
                running = [job for job in flight.jobs if not job.finished and self.jobs.get(job.key) is job]
            self.settle_in_flight(send)
            self.answer(present, send)
            return True
        settled = self.advance(pack, send)[1] if pack else self.settle_in_flight(send)
        if settled or not pack:
            self.answer(present, send)
        return bool(pack)

    def advance(self, pack: list[Job], send: Send) -> tuple[InFlight, bool]:
        """Launch `pack`'s step, then settle the previous one if it is still in flight (the two
        overlap while steps are short, OVERLAP_MAX_STEP_S); after a long step, settle this one
        too. Returns the launched step and whether a step was settled."""
        flight = self.launch(pack, send)
        previous, self.in_flight = self.in_flight, flight
        settled = self.settle(previous, send)
        if self.last_step_s >= OVERLAP_MAX_STEP_S:
            settled = self.settle_in_flight(send) or settled
        return flight, settled

    def settle_in_flight(self, send: Send) -> bool:
        """Settle the step in flight, if any (`settle`). Returns whether there was one."""
        flight, self.in_flight = self.in_flight, None
        return self.settle(flight, send)

    def answer(self, present: list[Job], send: Send) -> None:
        """After a step settled, or at a boundary without a step: send each present job that
        waits its new queue position (if it asked for progress) and a `Heartbeat` to each live
        one that got no event since the last answer (ids in self.answered, which `send` adds to
        and this clears)."""
        for job in present:
            if self.jobs.get(job.key) is not job:
                continue  # answered with its final event
            if not job.finished:  # a job whose last step is in flight has left the scheduler
                position = self.scheduler.queue_position(job)
                if job.progress_every and position > 0 and position != job.queue_position:
                    send(Progress(job.handle, job.request_id, job.step_index, job.total_steps, position))
                job.queue_position = position
            if id(job.handle) not in self.answered:
                send(Heartbeat(job.handle, job.request_id))
        self.answered.clear()

    def note_announcements(self, arrivals: list[Arrival]) -> None:
        """At the start of an execute: record the registry's count of announcements (requests
        headed for the DiT, h3_core.serving.registry), which `another_step` compares with, and whether
        an announced request may still be on its way. Triton hands an execute the requests it
        holds when the execute starts; one announced just before that may reach Triton just
        after, and then waits for the next execute: this one takes one step only. Announcements
        are matched with this execute's newcomers and control requests; those left unmatched
        ANNOUNCED_TRANSIT_S after the last announcement went to another DiT instance or never
        came (refused on the way, a cancel flag another instance set in the registry) and are
        written off."""
        count = self.registry.announcements()
        arrived = sum(
            1 for arrival in arrivals if arrival.key not in (0, "") and (arrival.new or arrival.key not in self.jobs)
        )
        self.execute_announcements = count
        self.announced_in_transit = (
            count - self.announced > arrived and self.registry.seconds_since_announcement() < ANNOUNCED_TRANSIT_S
        )
        self.announced = self.announced + arrived if self.announced_in_transit else count

    def another_step(self, start: float, boundary: float, present: list[Job]) -> bool:
        """Whether the execute that began at `start` takes another step after the one whose
        boundary was at `boundary` (clock seconds). Only in step mode, only while every live job
        is among the `present` ones (a job Triton withholds is counted absent once per execute,
        drop_vanished, so it is dropped after as many steps as before), only if the execute
        would still end within settings.execute_budget_s, judging by the last step's time, and
        only while nothing is headed for the DiT: no announced request may still be on its way
        to this execute's successor, and no announcement came since the execute started (one
        pread, Registry.announcements). So an announced newcomer or control request waits at
        most the step in flight (and the next one, if it reached Triton only as this execute
        began, or if it was launched behind a short step: `advance`); an unannounced one waits
        at most the budget, or one step where a step alone is longer. The Triton round trip
        between executes and the per-execute work (arrivals, the registry) are paid once per
        execute."""
        now = self.clock()
        elapsed, last_step = now - start, now - boundary
        return (
            self.settings.execution_mode == "step"
            and len(present) == len(self.jobs)
            and elapsed + last_step < self.settings.execute_budget_s
            and not self.announced_in_transit
            and self.registry.announcements() == self.execute_announcements
        )

    def arrive(self, arrival: Arrival, send: Send) -> Job | None:
        """The live job this arrival belongs to (admitting a new one), or None when the arrival
        was answered (refused, control request, dropped job) or is a filler."""
        if arrival.key in (0, ""):
            return None  # filler request inserted by Triton's `direct` strategy
        try:
            fields = read_request_json(arrival.request_json)
        except ValueError as error:
            self.refuse(send, arrival, "INVALID_ARG", str(error))
            return None
        if CANCEL_FIELD in fields:
            send(self.cancel_by_id(arrival.handle, fields[CANCEL_FIELD]))
            return None
        now = self.clock()
        job = self.jobs.get(arrival.key)
        if job is not None and arrival.new:
            self.refuse_reused_key(arrival, job, send)
            return None
        if job is None and not arrival.new:  # a rescheduled request whose job was dropped: end it
            dropped = self.dropped.recall(arrival.key, now, pop=True)
            if dropped is None:
                self.metrics.increment("h3_cancellations_total")  # else counted when it was dropped
            request_id, cause = dropped or (arrival.request_id, None)
            named = request_id or f"with sequence id {arrival.key}"
            cause = cause or f"its sequence id was reused or Triton withheld it for {VANISHED_EXECUTES} steps"
            send(
                Ended(
                    arrival.handle, request_id or str(arrival.key), "CANCELLED", f"request {named} was dropped: {cause}"
                )
            )
            return None
        if job is None:
            self.dropped.pop(arrival.key, None)  # a new sequence with the id of a dropped one
            job = self.admit(arrival, fields, now, send)
        if job is not None:
            job.handle = arrival.handle
            job.absent = 0
            job.is_cancelled = arrival.is_cancelled
        return job

    def refuse(self, send: Send, arrival: Arrival, code: str, message: str) -> None:
        """Answer a request that never started with an error (counted and logged)."""
        self.metrics.increment("h3_failures_total" if code == "INTERNAL" else "h3_refusals_total")
        log.info("request %s refused: %s: %s", arrival.request_id or "(no id)", code, message)
        send(Refused(arrival.handle, code, message))

    # -- admission ---------------------------------------------------------------------------

    def admit(self, arrival: Arrival, fields: dict, now: float, send: Send) -> Job | None:
        """Validate a new request and queue it; on failure refuse it at once."""
        try:
            if self.draining:
                raise Overloaded("the server is shutting down")
            job = self.parse(arrival, fields, now)
            if self.registry.admit(job.request_id):
                self.metrics.increment("h3_cancellations_total")
                send(
                    Ended(
                        arrival.handle,
                        job.request_id,
                        "CANCELLED",
                        f"request {job.request_id} was cancelled before it started (step 0 of {job.total_steps})",
                        0,
                        job.total_steps,
                    )
                )
                return None
            self.scheduler.add(job)
        except ValueError as error:
            self.refuse(send, arrival, "INVALID_ARG", str(error))
            return None
        except Overloaded as error:
            self.refuse(send, arrival, "UNAVAILABLE", str(error))
            return None
        except Exception as error:  # noqa: BLE001 - a validation gap must not fail the other requests
            log.exception("request %s could not be admitted", arrival.request_id or arrival.key)
            self.refuse(send, arrival, "INTERNAL", admission_failure(error))
            return None
        self.jobs[job.key] = job
        return job

    def parse(self, arrival: Arrival, fields: dict, now: float) -> Job:
        """Inputs, REQUEST fields and request parameters -> Job (its states prepared). Raises
        ValueError naming the bad field."""
        if arrival.sequence_end:
            raise ValueError(
                "sequence_end must not be set: a request runs over many iterations and Triton 2.51 "
                "would drop it after the first (perf_analyzer: --request-parameter sequence_end:false:bool)"
            )
        parameters = check_request_parameters(arrival.parameters_json)
        if parameters.get("return_mp4", True) and not MP4_AVAILABLE:
            raise ValueError(
                "return_mp4=true needs PyAV, which this server does not have: send return_mp4=false (with "
                "return_frames / return_audio for raw outputs) or install av"
            )
        fault = parameters.get("inject_fault")
        if fault is not None:
            if not self.settings.allow_fault_injection:
                raise ValueError(
                    "request parameter 'inject_fault' is refused: h3_dit parameter allow_fault_injection is not 'true'"
                )
            check_fault(fault)
            if fault in WORKER_FAULTS and self.settings.sp_degree == 1:
                raise ValueError(f"inject_fault={fault!r} needs h3_dit parameter sp_degree > 1")
        deadline_s = parameters.get("deadline_s")  # its range: check_request_parameters
        cfg = self.engine.dit.cfg
        values = dict(
            height=cfg.default_height,
            width=cfg.default_width,
            num_frames=cfg.default_num_frames,
            num_inference_steps=cfg.default_steps,
            seed=None,
            num_outputs=1,
        )
        for name in INT_INPUTS.values():
            if name in fields:
                if type(fields[name]) is not int:
                    raise ValueError(f"{name} must be an integer, got {fields[name]!r}")
                values[name] = fields[name]
        embeds = arrival.text_embeds
        if (
            embeds is None
            or embeds.ndim != 3
            or embeds.shape[0] != 1
            or embeds.shape[1] < 1
            or embeds.shape[2] != cfg.text_dim
        ):
            shape = (
                None
                if embeds is None
                else embeds.shape[1:]
                if embeds.ndim == 3 and embeds.shape[0] == 1
                else embeds.shape
            )
            raise ValueError(
                f"text_embeds has shape {None if shape is None else tuple(shape)}; expected [L >= 1, {cfg.text_dim}]"
            )
        text = torch.from_numpy(np.array(embeds[0], dtype=np.float32))  # [L, text_dim], a copy
        if not torch.isfinite(text).all():
            raise ValueError("TEXT_EMBEDS holds non-finite values")
        encode_s, received = fields.get("encode_seconds", 0.0), fields.get("received_unix_s")
        for name, value in (("encode_seconds", encode_s), ("received_unix_s", received)):
            if value is not None and type(value) not in (int, float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value} is out of range: allowed finite >= 0 seconds")
        # deadline_s counts from the request's arrival at the server (h3_encoder), else at the DiT
        since_received = 0.0 if received is None else max(0.0, time.time() - received)
        if len(arrival.request_id) > MAX_REQUEST_ID_CHARS:
            raise ValueError(f"request id has {len(arrival.request_id)} characters: allowed 1..{MAX_REQUEST_ID_CHARS}")
        priority = parameters.get("request_priority", 0)
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise ValueError(f"request_priority={priority} is out of range: allowed {-MAX_PRIORITY}..{MAX_PRIORITY}")
        request_id = arrival.request_id or f"h3-{secrets.token_hex(8)}"
        generation = GenerationRequest(prompt="(encoded)", request_id=request_id, **values)
        states = self.engine.prepare(generation, text)
        return Job(
            key=arrival.key,
            request_id=request_id,
            states=states,
            arrival_s=now,
            progress_every=parameters.get("progress_every", 0),
            preview_every=parameters.get("preview_every", 0),
            deadline_s=deadline_s,
            deadline_at=None if deadline_s is None else now + deadline_s - since_received,
            encode_s=encode_s,
            priority=priority,
            fault=fault,
        )

    def refuse_reused_key(self, arrival: Arrival, job: Job, send: Send) -> None:
        """A new request (START) came with the sequence id of a live job: a client sent a
        sequence_id in use. Triton 2.51 ends the job's sequence ("conflict ... terminated
        early") and may free its request, so the job is dropped without an event (answering its
        old handle crashed the server); if Triton delivers its request once more, arrive() ends
        it with CANCELLED naming its request id. The newcomer is refused: admitting it routed its
        responses to the job's client."""
        self.metrics.increment("h3_cancellations_total")
        self.forget(job, Status.CANCELLED, dropped=f"another request reused its sequence id {job.key}")
        self.refuse(
            send,
            arrival,
            "INVALID_ARG",
            f"sequence id {job.key} belongs to request {job.request_id}, "
            "which Triton has now ended; do not send sequence_id",
        )

    # -- cancellation ------------------------------------------------------------------------

    def cancel_by_id(self, handle, target: str) -> CancelAnswer:
        """A cancel-by-id control request, answered through the registry (whichever instance
        holds the target): "cancelled", "finished" or "unknown" (h3_core.serving.registry). A target on
        this instance leaves at this execute's next step boundary."""
        state = self.registry.cancel(target)
        for job in self.jobs.values():
            if job.request_id == target:
                job.cancel_reason = job.cancel_reason or "cancelled by request"
        return CancelAnswer(handle, target, state)

    def drop_vanished(self, present: list[Job]) -> None:
        """Forget jobs Triton stopped delivering: every live sequence comes back in each
        execute(), but Triton 2.51 drops a natively cancelled iterative request when it is
        rescheduled instead of delivering it again. After VANISHED_EXECUTES absences the job is
        dropped (counted as a cancellation) so it holds no state or packing place."""
        for job in list(self.jobs.values()):
            job.absent = 0 if job in present else job.absent + 1
            if job.absent >= VANISHED_EXECUTES:
                self.metrics.increment("h3_cancellations_total")
                self.forget(
                    job,
                    Status.CANCELLED,
                    dropped=f"Triton withheld it for {VANISHED_EXECUTES} steps (sequence id {job.key})",
                )

    def end_cancelled(self, present: list[Job], send: Send) -> None:
        """Step boundary: end jobs cancelled by id or by their client, past their deadline, or
        all of them once the server drains."""
        now = self.clock()
        for job in present:
            if job.key not in self.jobs:
                continue
            if job.finished:  # its last step is in flight (its results follow when it settles) or
                if self.in_flight is None or job not in self.in_flight.steps:  # was lost with an execute
                    self.results(job, send)
                continue
            reason = "cancelled because the server is shutting down" if self.draining else job.cancel_reason
            if reason is None and job.is_cancelled():
                reason = "cancelled by the client"
            if reason is None and job.deadline_at is not None and now > job.deadline_at:
                reason = f"deadline of {job.deadline_s} s expired"
                self.metrics.increment("h3_deadline_expiries_total")
            if reason is not None:
                self.metrics.increment("h3_cancellations_total")
                self.end(
                    job,
                    send,
                    Status.CANCELLED,
                    "CANCELLED",
                    f"request {job.request_id} {reason} at step {job.step_index} of {job.total_steps}",
                )

    # -- the step ----------------------------------------------------------------------------

    def launch(self, pack: list[Job], send: Send) -> InFlight:
        """Launch one packed forward for `pack` and queue each state's Euler update after it. On
        a GPU nothing here waits for this step's forward (a preview due at this step is the
        exception); the pack's small host-to-device copies wait for the step queued before, so
        what runs beside a forward is the previous step's settling, the answer pass, the next
        boundary and the packing. A forward that raises is retried one job at a time, so only
        the offending job fails (INTERNAL). A state's velocity that is not finite is applied as
        zero, so no non-finite latent enters a later forward before `settle` fails its job
        (with flex attention a masked NaN would reach the other documents). A job whose last
        step this is leaves the scheduler now; its result follows when the step settles.
        Returns the step in flight, for `settle`."""
        start, pack = self.clock(), list(pack)
        outputs = sum(len(job.states) for job in pack)
        for job in pack:
            job.status = Status.RUNNING
            job.first_step_s = job.first_step_s or start
            job.largest_pack = max(job.largest_pack, outputs)
        try:
            velocities = self.forward(pack)
        except Exception:  # noqa: BLE001 - retried one job at a time below
            velocities = []
            for job in list(pack):
                try:
                    velocities += self.forward([job])
                except Exception as error:  # noqa: BLE001 - the offender fails alone
                    self.metrics.increment("h3_failures_total")
                    self.end(job, send, Status.FAILED, "INTERNAL", f"denoise step {job.step_index + 1} failed: {error}")
                    pack.remove(job)
        finite, copied = None, None
        if velocities:
            flags = torch.stack(
                [torch.isfinite(video).all() & torch.isfinite(audio).all() for video, audio in velocities]
            )
            finite = flags.to("cpu", non_blocking=True)  # into pinned memory on a GPU
            if flags.is_cuda:
                copied = torch.cuda.Event()
                copied.record(torch.cuda.current_stream(flags.device))
            velocities = [
                (torch.where(ok, video, 0.0), torch.where(ok, audio, 0.0))
                for ok, (video, audio) in zip(flags, velocities, strict=True)
            ]
        flight = InFlight(
            pack,
            {job: job.step_index + 1 for job in pack},
            finite,
            copied,
            {},
            start,
        )
        velocity_of = iter(velocities)
        for job in pack:
            for state in job.states:
                velocity = next(velocity_of)
                if job.preview_every and state.output_index == 0 and (state.step_index + 1) % job.preview_every == 0:
                    flight.previews[job] = preview_frame(state, velocity[0])
                self.engine.update(state, velocity)
            if job.finished:
                self.scheduler.remove(job)
        return flight

    def settle(self, flight: InFlight | None, send: Send) -> bool:
        """Settle `flight` (None: nothing to do): read its finiteness flags (on a GPU this waits
        for its forward, InFlight.copied), end each job with a non-finite velocity (INTERNAL;
        the step is undone in its step count), then send progress, previews and the results of
        jobs whose last step it was (a result's copy to the CPU waits for the step queued
        behind, if any). Jobs that ended while it was in flight are skipped. Returns whether a
        step was settled."""
        if flight is None:
            return False
        try:
            if flight.copied is not None:
                flight.copied.synchronize()
            finite = flight.finite.tolist() if flight.finite is not None else []
        except Exception as error:  # noqa: BLE001 - a device error surfaces here; the pack fails
            finite = [False] * sum(len(job.states) for job in flight.jobs)
            failure = f"{type(error).__name__}: {error}"
        else:
            failure = None
        end = self.clock()
        self.last_step_s = end - max(flight.start, self.settled_at)
        self.metrics.observe("h3_step_seconds", self.last_step_s)
        self.metrics.observe("h3_pack_requests", len(finite))
        self.metrics.observe("h3_pack_rows", sum(state.rows for job in flight.jobs for state in job.states))
        self.settled_at = end
        flags = iter(finite)
        for job in flight.jobs:
            ok, step = all([next(flags) for _ in job.states]), flight.steps[job]
            if self.jobs.get(job.key) is not job:
                continue  # ended while in flight (cancelled, past its deadline, draining)
            if not ok:
                for state in job.states:
                    state.step_index = step - 1
                self.metrics.increment("h3_failures_total")
                cause = failure or f"non-finite velocity for request {job.request_id}"
                self.end(job, send, Status.FAILED, "INTERNAL", f"denoise step {step} failed: {cause}")
                continue
            if step == 1:
                self.metrics.observe("h3_time_to_first_step_seconds", end - job.arrival_s)
            job.last_step_s = end
            preview = flight.previews.get(job)
            if (
                job.progress_every and (step % job.progress_every == 0 or step == job.total_steps)
            ) or preview is not None:
                send(Progress(job.handle, job.request_id, step, job.total_steps, 0, preview))
            if step == job.total_steps:
                self.results(job, send)
        return True

    def forward(self, jobs: list[Job]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """engine.denoise_step for the jobs' states: velocities on the engine's device (on a GPU
        the forward may still run when this returns). Injected faults (see check_fault) act
        here, at a job's first step: "nan" makes its velocities non-finite (found by `settle`)."""
        for job in jobs:
            fault = job.fault if job.step_index == 0 else None
            if fault == "raise":
                raise RuntimeError(f"injected fault in the forward of request {job.request_id}")
            if fault in WORKER_FAULTS:
                self.engine.dit.inject_fault(fault.removeprefix("worker_"))
                if fault != "worker_raise":
                    job.fault = None  # exit and hang act once
            if fault is not None and fault.startswith("slow:"):
                job.fault = None  # slowed once
                time.sleep(float(fault[5:]))
        states = [state for job in jobs for state in job.states]
        velocities = self.engine.denoise_step(states)
        nan = {id(state) for job in jobs if job.fault == "nan" and job.step_index == 0 for state in job.states}
        return [
            (torch.full_like(video, float("nan")), audio) if id(state) in nan else (video, audio)
            for state, (video, audio) in zip(states, velocities, strict=True)
        ]

    # -- endings -----------------------------------------------------------------------------

    def results(self, job: Job, send: Send) -> None:
        """One Result per output, with its final latents; the last one is final. A cancel that
        reached the registry during the last step wins: the request ends with CANCELLED (its
        canceller was told "cancelled")."""
        if self.registry.finish(job.request_id, self.load(leaving=1)):
            self.metrics.increment("h3_cancellations_total")
            self.end(
                job,
                send,
                Status.CANCELLED,
                "CANCELLED",
                f"request {job.request_id} cancelled by request at step {job.step_index} of {job.total_steps}",
            )
            return
        for state in job.states:
            info = {
                "kind": "result",
                "request_id": job.request_id,
                "output_index": state.output_index,
                "num_outputs": len(job.states),
                "seed": state.seed,
                "height": state.height,
                "width": state.width,
                "num_frames": state.num_frames,
                "num_inference_steps": state.total_steps,
                "largest_pack": job.largest_pack,
                "stage_seconds": {
                    "queue": job.first_step_s - job.arrival_s,
                    "encode": job.encode_s,
                    "denoise": job.last_step_s - job.first_step_s,
                },
            }
            send(
                Result(
                    job.handle,
                    job.request_id,
                    L.unpatchify_video(state.video_latents, state.layout).cpu(),
                    L.audio_rows_to_latent(state.audio_latents, state.layout).cpu(),
                    info,
                    final=state is job.states[-1],
                )
            )
            self.metrics.increment("h3_completions_total")
        self.drop(job, Status.FINISHED)

    def end(self, job: Job, send: Send, status: Status, code: str, message: str) -> None:
        send(Ended(job.handle, job.request_id, code, message, job.step_index, job.total_steps))
        now, state = self.clock(), job.states[0]
        seconds = {
            "queue": (job.first_step_s or now) - job.arrival_s,
            "encode": job.encode_s,
            "denoise": job.last_step_s - job.first_step_s if job.last_step_s is not None else 0.0,
        }
        log.info(
            end_line(
                job.request_id,
                f"ended {code}: {message}",
                state.height,
                state.width,
                state.num_frames,
                job.step_index,
                job.total_steps,
                seconds,
            )
        )
        self.forget(job, status)

    def forget(self, job: Job, status: Status, dropped: str | None = None) -> None:
        """Remove the job and tell the registry it left. `dropped`: why it was dropped without a
        final event; if Triton delivers its request again, arrive() ends it with CANCELLED
        naming its request id and this cause. The registry gets this instance's load without
        the job at once (the encoder's refusal need not wait for the next execute)."""
        self.registry.finish(job.request_id, self.load(leaving=1))
        self.drop(job, status)
        if dropped is not None:
            self.dropped.remember(job.key, (job.request_id, dropped), self.clock())

    def drop(self, job: Job, status: Status) -> None:
        """Remove the job from this loop (the registry already knows it left)."""
        job.status = status
        self.scheduler.remove(job)
        del self.jobs[job.key]
