"""The DiT's step loop: diffusion continuous batching over live requests, Triton-free.

The Triton model h3_dit (model_repository/h3_dit/1/model.py) is an adapter: at every execute() it
turns each live Triton request into an `Arrival` (plain data, h3_core.serving.dit.events) and calls
`StepLoop.iterate`, which hands it the `Event`s to send, in order, as they happen, and returns the
requests to reschedule. The loop is composed of parts that own their state and are built and
tested alone (tests/test_step_loop_parts.py): `Admission` (h3_core.serving.dit.admission: arrivals,
the memory of dropped ids), `Announcements` (.announcements: the registry's count of requests
headed for the DiT), `PackedStep` (.packed_step: launch and settle of one packed step, the step in
flight, step times; it returns what is due as plain data, `Settled`) and the `Scheduler`
(.scheduler: the waiting line and the pack); the plain data is in .events, the metrics in
.metrics. Tests drive the loop without a server:

1. Arrivals, once per execute. A new request (Triton's START flag) is validated (`parse`) and
   handed to the scheduler (admission; refused with INVALID_ARG or UNAVAILABLE at once); a control
   request {"cancel_request_id": ID} is answered at once (`Admission.cancel_by_id`, CANCEL_STATES in
   h3_core.protocol); a known request refreshes its job's handle. Cancels recorded in the
   registry (by h3_cancel, where clients send them, or by another instance) are read from it;
   jobs Triton stopped delivering (`drop_vanished`) are forgotten.
2. Step boundary (`end_cancelled`): jobs cancelled by id, natively cancelled by their client, past
   their deadline, or all of them while the server drains, end with a final `Ended` (CANCELLED).
3. The pack: each live job's step cache plans its next step (`plan`, Engine.plan_step: whether it
   computes or takes its cached velocity), then `Scheduler.schedule()`
   (h3_core/serving/dit/scheduler.py) picks the jobs this step advances, counting only the outputs
   that compute against its limits.
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
   execute, its step boundaries checked as step mode's are (`run_to_completion`).
5. After each settled step (and at a boundary without one), a waiting job whose queue position
   changed gets a progress event (when it asked for progress); a job that got no response for
   DitSettings.heartbeat_s gets a `Heartbeat` (h3_vae uses it to notice a client that is gone
   and cancel its request), so a silent job hears from the DiT at least every heartbeat_s plus
   one step, and not every step.
6. In step mode the execute repeats 2-5 while nothing new is headed for the DiT and its budget
   allows, at least MIN_EXECUTE_STEPS steps with a budget above 0 (`another_step`,
   DitSettings.execute_budget_s), so the Triton round trip and the work of 1 are paid once for
   several steps. Newcomers and control requests reach the DiT only
   between executes, so the ones that are announced (h3_core.serving.shared.registry: h3_encoder announces each
   request it passes on, the registry each cancel it flags for another instance: h3_cancel's
   (clients'), h3_vae's for gone clients) end the execute at the next step boundary and wait at
   most the step in flight (`Announcements.note`; while steps overlap, also the one launched
   behind it, OVERLAP_MAX_STEP_S); unannounced ones (a direct call of h3_dit, a control
   request sent to it included) wait at most the budget plus one step, or MIN_EXECUTE_STEPS
   steps where those are longer. Then every job still live is rescheduled.

A job's lifecycle is `Status`: WAITING (admitted, no step yet or preempted) -> RUNNING -> FINISHED,
CANCELLED or FAILED. All per-request state lives in the LiveJob and its RequestStates; the loop
itself keeps only the map of live jobs and whether the server drains, and ends jobs (`end`,
`forget`, `results`); the memory of dropped ids is the Admission's, the announcements' count the
Announcements', the step in flight (`InFlight`, between its launch and its settling) the
PackedStep's.
"""

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext

from h3_core.diffusion.engine import Engine
from h3_core.model.training_metadata import TrainingMetadata
from h3_core.serving.dit.admission import VANISHED_EXECUTES, Admission, ReusedKey
from h3_core.serving.dit.announcements import Announcements
from h3_core.serving.dit.events import (
    EVENT_NAMES,
    Arrival,
    CancelAnswer,
    Ended,
    Event,
    Heartbeat,
    LiveJob,
    Progress,
    Refused,
    Send,
    Status,
)
from h3_core.serving.dit.metrics import MetricsRecord, device_memory_bytes, end_line
from h3_core.serving.dit.packed_step import InFlight, PackedStep, Velocities, result_events
from h3_core.serving.dit.scheduler import Scheduler
from h3_core.serving.shared.gpu_turns import GpuTurns
from h3_core.serving.shared.registry import DitLoad, Registry
from h3_core.serving.shared.settings import MIN_EXECUTE_STEPS, DitSettings

log = logging.getLogger("h3_dit")

# -- the loop -----------------------------------------------------------------------------------


class StepLoop:
    """The DiT's step loop over an Engine (see the module docstring), composed of parts that own
    their state: `admission` (Admission: arrivals, the memory of dropped ids), `announcements`
    (Announcements: the registry's count of requests headed for the DiT), `step` (PackedStep:
    launch and settle of one packed step, the step in flight, step times) and `scheduler`
    (Scheduler: the waiting line and the pack). The loop owns the map of live jobs and their
    endings, and talks to each part through arguments and return values.

    Args:
        engine: the Engine (DiT only; decoding happens in h3_vae).
        settings: h3_dit's DitSettings (policy, capacity, execution mode, fault injection).
        registry: the Registry shared by the server's DiT instances (request ids, cancels, loads).
        metrics: MetricsRecord or an object with its three methods.
        clock: monotonic seconds (tests pass a fake one).
        training: what the weights were trained on (their training.json), or None: a request
            outside it gets "outside_training" in its results' INFO.
        turns: the GPU's turns (h3_core.serving.shared.gpu_turns, settings.gpu_turns), or None: each
            step is taken inside `turns.step()` and settled before the next is launched.
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
        training: TrainingMetadata | None = None,
        turns: GpuTurns | None = None,
    ):
        compiled_rows = getattr(engine.dit, "max_compiled_rows", None)  # a sequence-parallel DiT has none
        if compiled_rows is not None and settings.max_batch_rows > compiled_rows:
            raise ValueError(
                f"h3_dit parameter max_batch_rows={settings.max_batch_rows} is out of range: the compiled DiT "
                f"takes at most {compiled_rows} rows a step"
            )
        self.engine, self.settings, self.registry = engine, settings, registry
        self.metrics = metrics if metrics is not None else MetricsRecord()
        self.clock, self.turns = clock, turns
        self.scheduler = Scheduler(
            settings.max_num_seqs,
            settings.max_batch_rows,
            settings.max_waiting,
            settings.scheduling_policy,
            settings.row_budget,
            settings.max_wait_s,
        )
        self.jobs: dict[object, LiveJob] = {}  # live jobs by correlation id
        self.draining = False
        self.admission = Admission(engine, settings, registry, self.scheduler, self.metrics, clock, training)
        self.announcements = Announcements(registry)
        self.step = PackedStep(engine, self.scheduler, self.metrics, clock)

    @property
    def in_flight(self) -> InFlight | None:
        """The step launched last, until it settles (PackedStep.in_flight)."""
        return self.step.in_flight

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
        (`Announcements.note`), the arrivals (step 1 of the module docstring) and the cancels
        other instances took (`Registry.publish_and_read_cancels`), then step boundaries and steps (steps 2-5)
        while `another_step` allows, then the settling of the step launched last. Events are
        passed to `send` as they happen (progress streams while the execute runs). Returns the
        handles of the requests to reschedule (still live)."""
        self.metrics.set("h3_heartbeat_timestamp_seconds", time.time())
        self.metrics.set("h3_execute_in_progress", 1)
        failed: set[int] = set()  # ids of the handles whose request ended after a failed send
        owners: dict[int, LiveJob] = {}  # id of a live job's handle -> the job

        def deliver(event: Event) -> None:
            if id(event.handle) in failed:
                return  # its request already ended with INTERNAL (send_failed)
            owner = owners.get(id(event.handle))
            if owner is not None:
                owner.responded_s = self.clock()
            try:
                send(event)
            except Exception as error:  # noqa: BLE001 - the request fails alone
                failed.add(id(event.handle))
                self.send_failed(event, error, send)

        present: list[LiveJob] = []
        try:
            start = self.clock()
            self.announcements.note(arrivals, self.jobs)
            present = [job for arrival in arrivals if (job := self.arrive(arrival, deliver)) is not None]
            owners.update((id(job.handle), job) for job in present)
            self.read_cancels()
            self.drop_vanished(present)
            steps = 0
            while True:
                boundary = self.clock()
                stepped = self.boundary_and_step(present, deliver)
                steps += stepped
                present = [job for job in present if job.key in self.jobs]
                if not (stepped and present and self.another_step(start, boundary, steps, present)):
                    break
            if self.settle_in_flight(deliver):
                self.answer(present, deliver)
            present = [job for job in present if job.key in self.jobs]
            self.metrics.set("h3_waiting_requests", len(self.scheduler.line))
            self.metrics.set("h3_active_requests", len(self.scheduler.pack))
            self.metrics.set("h3_device_memory_bytes", device_memory_bytes(self.engine.device))
        except Exception as error:  # noqa: BLE001 - a fault of the loop itself: see fail_execute
            present = self.fail_execute(arrivals, error, deliver)
        finally:
            self.metrics.set("h3_execute_in_progress", 0)
        return [job.handle for job in present]

    def arrive(self, arrival: Arrival, send: Send) -> LiveJob | None:
        """The live job `arrival` belongs to (Admission.arrive; a new one joins the live jobs), or
        None when it was answered or is a filler. A newcomer with a live job's sequence id
        (ReusedKey) drops that job without an event and is refused with INVALID_ARG."""
        arrived = self.admission.arrive(arrival, self.jobs, send, self.draining)
        if isinstance(arrived, ReusedKey):
            self.forget(arrived.job, Status.CANCELLED, dropped=arrived.cause)
            self.admission.refuse(send, arrival, "INVALID_ARG", arrived.message)
            return None
        if arrived is not None:
            self.jobs.setdefault(arrived.key, arrived)
        return arrived

    def read_cancels(self) -> None:
        """Once an execute: publish this instance's load and mark the jobs whose cancel another
        instance took (Registry.publish_and_read_cancels). A registry that fails is logged and read again at the
        next execute."""
        try:
            cancelled = self.registry.publish_and_read_cancels(
                [job.request_id for job in self.jobs.values()], self.load()
            )
        except Exception:  # noqa: BLE001 - read again at the next execute
            log.exception("the registry's cancels could not be read; read again at the next execute")
            return
        for job in self.jobs.values():
            if job.request_id in cancelled:
                job.cancel_reason = job.cancel_reason or "cancelled by request"

    def send_failed(self, event: Event, error: Exception, send: Send) -> None:
        """`send(event)` raised (Triton refused the response, its tensors could not be made, ...):
        the request fails alone. It gets a final INTERNAL response in place of what was due
        (`Refused` for a request that never started or a cancel request, else `Ended`), sent
        once, and its job leaves the loop (status FAILED); both are logged. The caller's
        `deliver` sends nothing more for the request in this execute."""
        request_id = getattr(event, "request_id", "") or "(no id)"
        cause = f"{type(error).__name__}: {error}"
        message = f"the {EVENT_NAMES[type(event)]} of request {request_id} could not be sent: {cause}"
        log.error("request %s: %s", request_id, message, exc_info=error)
        self.metrics.increment("h3_failures_total")
        job = next((job for job in self.jobs.values() if job.handle is event.handle), None)
        if isinstance(event, (Refused, CancelAnswer)):
            final: Event = Refused(event.handle, "INTERNAL", message)
        else:
            step, total = (job.step_index, job.total_steps) if job is not None else (0, 0)
            final = Ended(event.handle, request_id, "INTERNAL", message, step, total)
        try:
            send(final)
        except Exception:  # noqa: BLE001 - nothing more can be sent for it
            log.exception("request %s: its final INTERNAL response could not be sent either", request_id)
        if job is not None:
            self.forget(job, Status.FAILED)

    def fail_execute(self, arrivals: list[Arrival], error: Exception, send: Send) -> list[LiveJob]:
        """A fault of the loop itself (not of one request's send or registry call, which fail
        that request alone) ended the execute: log it, discard the step in flight and end every
        live job of this execute's requests with INTERNAL, so each gets its final response
        (raising to Triton would fail them with no state cleaned up). Returns [] (nothing to
        reschedule)."""
        log.error("the step loop failed; this execute's requests end with INTERNAL", exc_info=error)
        self.step.take()  # discarded
        handles = {id(arrival.handle) for arrival in arrivals}
        for job in [job for job in self.jobs.values() if id(job.handle) in handles]:
            self.metrics.increment("h3_failures_total")
            self.end(
                job,
                send,
                Status.FAILED,
                "INTERNAL",
                f"request {job.request_id} failed at step {job.step_index} of {job.total_steps}: "
                f"{type(error).__name__}: {error}; see the server log",
            )
        return []

    def boundary_and_step(self, present: list[LiveJob], send: Send) -> bool:
        """One step boundary over the jobs Triton delivered in this execute: end the cancelled
        ones (`end_cancelled`), let the policy pick the pack and `advance` it (launch its step;
        settle the one in flight), then `answer` the jobs after a settled step. In execution
        mode "request" the pack's first job runs to completion (`run_to_completion`).
        Returns whether a forward was launched."""
        self.end_cancelled(present, send)
        self.plan(present, send)
        pack = [job for job in self.scheduler.schedule(self.clock()) if job in present]
        if pack and self.settings.execution_mode == "request":
            self.run_to_completion(pack[0], present, send)
            return True
        settled = self.advance(pack, send)[1] if pack else self.settle_in_flight(send)
        if settled or not pack:
            self.answer(present, send)
        return bool(pack)

    def plan(self, present: list[LiveJob], send: Send) -> None:
        """Plan the next step of every live job Triton delivered in this execute (`present`; only
        they can be packed, and only their handles may be answered) that has steps left
        (Engine.plan_step: its step cache decides whether it computes; a job without caching costs
        nothing here), so the scheduler packs by the rows that compute. A job whose planning
        raises fails alone (INTERNAL). With GPU turns, the plan's device work (the modulated
        inputs) takes a turn of its own when some job caches."""
        jobs = [job for job in present if self.jobs.get(job.key) is job and not job.finished]
        caching = self.turns is not None and any(state.cache.threshold > 0 for job in jobs for state in job.states)
        with self.turns.step(timed=False) if caching else nullcontext():
            for job in jobs:
                try:
                    self.engine.plan_step(job.states)
                except Exception as error:  # noqa: BLE001 - the job fails alone
                    self.metrics.increment("h3_failures_total")
                    message = f"planning step {job.step_index + 1} failed: {type(error).__name__}: {error}"
                    self.end(job, send, Status.FAILED, "INTERNAL", message)

    def run_to_completion(self, job: LiveJob, present: list[LiveJob], send: Send) -> None:
        """Execution mode "request": take `job`'s steps within this execute until it finishes or
        ends early. Every step boundary in it is a step boundary of step mode for the job: the
        cancels recorded elsewhere are read from the registry (`read_cancels`: with this
        instance busy here, a cancel by id arrives that way, from h3_cancel, h3_vae or another
        DiT instance), and `end_cancelled` ends it when cancelled by id
        or by its client, past its deadline or draining; the present jobs are answered after
        each settled step (heartbeats, queue positions)."""
        while self.jobs.get(job.key) is job and not job.finished:
            if self.advance([job], send)[1]:
                self.answer(present, send)
            if self.jobs.get(job.key) is job and not job.finished:
                self.read_cancels()
                self.end_cancelled([job], send)
        if self.settle_in_flight(send):
            self.answer(present, send)

    def advance(self, pack: list[LiveJob], send: Send) -> tuple[InFlight, bool]:
        """Launch `pack`'s step, then settle the previous one if it is still in flight (the two
        overlap while steps are short, OVERLAP_MAX_STEP_S); after a long step, settle this one
        too. With GPU turns each step holds the turn from its launch until the device has done
        it and is settled at once. Returns the launched step and whether a step was settled."""
        if self.turns is not None:  # nothing is in flight here: every step settled in its advance
            with self.turns.step():
                flight = self.launch(pack, send)
            return flight, self.settle(flight, send)
        flight = self.launch(pack, send)
        settled = self.settle(self.step.hold(flight), send)
        if not self.step.overlaps:
            settled = self.settle_in_flight(send) or settled
        return flight, settled

    def settle_in_flight(self, send: Send) -> bool:
        """Settle the step in flight, if any (`settle`). Returns whether there was one."""
        return self.settle(self.step.take(), send)

    def launch(self, pack: list[LiveJob], send: Send) -> InFlight:
        """Launch `pack`'s step (PackedStep.launch, through `forward`); a job whose forward failed
        ends alone with INTERNAL. Returns the step in flight."""
        flight, failures = self.step.launch(pack, self.forward)
        for job, message in failures:
            self.end(job, send, Status.FAILED, "INTERNAL", message)
        return flight

    def forward(self, jobs: list[LiveJob]) -> Velocities:
        """The packed forward of `jobs` (PackedStep.forward; tests replace it)."""
        return self.step.forward(jobs)

    def settle(self, flight: InFlight | None, send: Send) -> bool:
        """Settle `flight` (PackedStep.settle) and act on it in pack order: a job whose velocity
        was not finite ends with INTERNAL, the others get their progress and previews, and the
        results of those whose last step it was (`results`). Returns whether a step was
        settled."""
        settled = self.step.settle(flight, self.jobs)
        if settled is None:
            return False
        for outcome in settled:
            job = outcome.job
            if outcome.failure is not None:
                self.end(job, send, Status.FAILED, "INTERNAL", outcome.failure)
                continue
            if outcome.progress is not None:
                send(outcome.progress)
            if outcome.last and self.jobs.get(job.key) is job:
                self.results(job, send)
        return True

    def answer(self, present: list[LiveJob], send: Send) -> None:
        """After a step settled, or at a boundary without a step: send each present job that
        waits its new queue position (if it asked for progress) and a `Heartbeat` to each live
        one that got no response for settings.heartbeat_s seconds (LiveJob.responded_s, which
        `iterate`'s send stamps). Answer passes come at least once a step, so a silent job gets
        one at most heartbeat_s plus one step after its last response."""
        now = self.clock()
        for job in present:
            if self.jobs.get(job.key) is not job:
                continue  # answered with its final event
            if not job.finished:  # a job whose last step is in flight has left the scheduler
                position = self.scheduler.queue_position(job)
                if job.progress_every and position > 0 and position != job.queue_position:
                    send(Progress(job.handle, job.request_id, job.step_index, job.total_steps, position))
                job.queue_position = position
            if now - job.responded_s >= self.settings.heartbeat_s:
                send(Heartbeat(job.handle, job.request_id))

    def another_step(self, start: float, boundary: float, steps: int, present: list[LiveJob]) -> bool:
        """Whether the execute that began at `start` and has taken `steps` steps takes another
        after the one whose boundary was at `boundary` (clock seconds). Only in step mode, only
        while every live job is among the `present` ones (a job Triton withholds is counted
        absent once per execute, drop_vanished, so it is dropped after as many steps as before),
        only if the execute would still end within settings.execute_budget_s, judging by the
        last step's time, or has taken fewer than MIN_EXECUTE_STEPS (with a budget above 0: a
        step longer than the budget no longer pays a Triton round trip each), and only while
        nothing is headed for the DiT: no announced request may still be on its way to this
        execute's successor, and no announcement came since the execute started (one pread,
        Announcements.quiet). So an announced newcomer or control request waits at most the
        step in flight (and the next one, if it reached Triton only as this execute began, or
        if it was launched behind a short step: `advance`); an unannounced one waits at most the
        budget, or MIN_EXECUTE_STEPS steps where those are longer. The Triton round trip between
        executes and the per-execute work (arrivals, the registry) are paid once per execute."""
        now = self.clock()
        elapsed, last_step = now - start, now - boundary
        budget = self.settings.execute_budget_s
        return (
            self.settings.execution_mode == "step"
            and len(present) == len(self.jobs)
            and (elapsed + last_step < budget or (budget > 0 and steps < MIN_EXECUTE_STEPS))
            and self.announcements.quiet()
        )

    # -- endings ----------------------------------------------------------------------------

    def drop_vanished(self, present: list[LiveJob]) -> None:
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

    def end_cancelled(self, present: list[LiveJob], send: Send) -> None:
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

    def results(self, job: LiveJob, send: Send) -> None:
        """Send a finished job's results (packed_step.result_events; the last one is final) and
        drop it. A cancel that reached the registry during the last step wins: the request ends
        with CANCELLED (its canceller was told "cancelled"). A registry that fails fails the
        request alone (INTERNAL)."""
        try:
            cancelled = self.registry.finish(job.request_id, self.load(leaving=1))
        except Exception as error:  # noqa: BLE001 - the request fails alone
            log.exception("request %s: the registry could not record its end", job.request_id)
            self.metrics.increment("h3_failures_total")
            self.end(
                job,
                send,
                Status.FAILED,
                "INTERNAL",
                f"request {job.request_id} could not be recorded as finished: {type(error).__name__}: {error}",
            )
            return
        if cancelled:
            self.metrics.increment("h3_cancellations_total")
            self.end(
                job,
                send,
                Status.CANCELLED,
                "CANCELLED",
                f"request {job.request_id} cancelled by request at step {job.step_index} of {job.total_steps}",
            )
            return
        silent_s = self.clock() - job.responded_s  # since the client's last response (h3_vae's keep-alives)
        for result in result_events(job, self.settings.quantization, silent_s):
            send(result)
            if self.jobs.get(job.key) is not job:
                return  # its send failed: the request ended with INTERNAL (send_failed)
            self.metrics.increment("h3_completions_total")
        self.drop(job, Status.FINISHED)

    def end(self, job: LiveJob, send: Send, status: Status, code: str, message: str) -> None:
        """End a live job early with a final `Ended` (code CANCELLED or INTERNAL), one log line,
        and `forget` it."""
        send(Ended(job.handle, job.request_id, code, message, job.step_index, job.total_steps))
        if self.jobs.get(job.key) is not job:
            return  # its send failed: the request ended with INTERNAL (send_failed)
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

    def forget(self, job: LiveJob, status: Status, dropped: str | None = None) -> None:
        """Remove the job and tell the registry it left. `dropped`: why it was dropped without a
        final event; if Triton delivers its request again, Admission.arrive ends it with CANCELLED
        naming its request id and this cause. The registry gets this instance's load without
        the job at once (the encoder's refusal need not wait for the next execute). A job already
        gone is left alone; a registry that fails is logged (the id may then stay live there)."""
        if self.jobs.get(job.key) is not job:
            return
        try:
            self.registry.finish(job.request_id, self.load(leaving=1))
        except Exception:  # noqa: BLE001 - the job leaves this loop all the same
            log.exception("request %s: the registry could not record its end", job.request_id)
        self.drop(job, status)
        if dropped is not None:
            self.admission.remember_dropped(job.key, job.request_id, dropped)

    def drop(self, job: LiveJob, status: Status) -> None:
        """Remove the job from this loop (the registry already knows it left) and free its states'
        reference key / value caches (h3_core.model.reference_kv)."""
        job.status = status
        for state in job.states:
            state.reference_kv.clear()
        self.scheduler.remove(job)
        del self.jobs[job.key]
