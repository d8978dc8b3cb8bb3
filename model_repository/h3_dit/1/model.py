"""h3_dit: the decoupled iterative DiT model (thin adapter over h3_core.engine / scheduler).

Every execute() receives all live sequences. New ones (START flag) are validated and queued;
control requests (REQUEST {"cancel_request_id": ID}) cancel a job by request id and are
answered at once.
At the step boundary cancelled, natively cancelled and expired jobs leave with a final
response whose INFO says CANCELLED (see `ending`); the scheduler picks the jobs this step
advances; ONE packed forward runs for them; progress, previews and finished latents are sent;
every unfinished request is rescheduled before returning. In `request` execution mode the
chosen job instead runs to completion inside one execute().

SIGUSR1 (sent by server.launch before it stops the server) starts draining: at the next step
boundary every job ends with CANCELLED and newcomers are refused with UNAVAILABLE:, so no
ensemble request is left in flight when Triton shuts down.
"""
import itertools
import json
import math
import signal
import time
import traceback

import numpy as np
import torch

from h3_core.engine import load_engine, preview_frame
from h3_core.media import MP4_AVAILABLE
from h3_core.request import GenerationRequest, RequestLimits
from h3_core.scheduler import Job, Overloaded, Scheduler
from server.adapter import (error_response, json_tensor, model_parameters, read_json, request_parameters,
                            resolve_path)

import triton_python_backend_utils as pb_utils

FIELDS = ("height", "width", "num_frames", "num_inference_steps", "seed", "num_outputs")
REQUEST_FIELDS = FIELDS + ("encode_seconds",)  # exactly the keys h3_encoder writes into REQUEST
JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
EMPTY_LATENT = np.zeros((1, 0), dtype=np.float32)
EMPTY_PREVIEW = np.zeros((1, 0, 0, 3), dtype=np.uint8)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
EARLY_CANCEL_SECONDS = 600.0  # how long an id cancelled before its request arrived is remembered
VANISHED_EXECUTES = 3  # a job missing from this many execute() calls in a row was dropped by Triton


def check_fault(fault: str) -> None:
    """Validate a request parameter inject_fault (tests only; needs allow_fault_injection
    "true"), acting at the request's first step: "raise" makes the forward raise, "nan" makes
    it return NaN video velocities for the request, "slow:S" makes the step S seconds slower
    (0 < S <= 600). Raises ValueError naming inject_fault."""
    if fault in ("raise", "nan"):
        return
    try:
        seconds = float(fault[5:]) if fault.startswith("slow:") else None
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= 600:
        raise ValueError(f"inject_fault={fault!r} is not one of 'raise', 'nan', 'slow:S' (0 < S <= 600 seconds)")


def check_fields(fields: dict) -> None:
    """REQUEST's keys: a generation request holds only REQUEST_FIELDS, a cancel request
    "cancel_request_id" alone, a non-empty string. Raises ValueError naming the key."""
    if "cancel_request_id" in fields:
        extra = sorted(key for key in fields if key != "cancel_request_id")
        if extra:
            raise ValueError(f"REQUEST field {extra[0]!r} is not allowed beside 'cancel_request_id': a cancel request "
                             "holds that field alone")
        target = fields["cancel_request_id"]
        if type(target) is not str or not target:
            got = ("null" if target is None else "an empty string" if target == ""
                   else f"{JSON_TYPES.get(type(target), type(target).__name__)} {json.dumps(target)}")
            raise ValueError(f"cancel_request_id must be a non-empty string, got {got}")
        return
    unknown = sorted(key for key in fields if key not in REQUEST_FIELDS)
    if unknown:
        raise ValueError(f"REQUEST field {unknown[0]!r} is unknown; allowed: {sorted(REQUEST_FIELDS)}, or "
                         "'cancel_request_id' alone (a cancel request)")


def admission_failure(error: Exception) -> str:
    """The client's message for an unexpected exception while a request is admitted: the
    exception's type and the first line of its text, no traceback."""
    text = str(error).strip().splitlines()
    return f"the request could not be admitted ({type(error).__name__}: {text[0] if text else 'no detail'}); see the server log"


def ending(request_id: str, code: str, message: str, step: int = 0, total: int = 0) -> "pb_utils.InferenceResponse":
    """The final response of a request that ends early with CANCELLED or INTERNAL: a normal
    response (empty LATENT, PROGRESS (step, total, 0), INFO {"kind": "error", "request_id",
    "code", "message"}), not an error response. Through the ensemble, an error response that
    arrives while h3_vae still handles one of the request's progress responses leaves Triton
    2.51 counting the ensemble request in flight for good (measured: 11 of 100 soak requests;
    shutdown then waits its exit timeout); this one passes h3_vae like a progress response.
    Refusals before any response (INVALID_ARG, UNAVAILABLE) stay error responses."""
    info = {"kind": "error", "request_id": request_id, "code": code, "message": message}
    return pb_utils.InferenceResponse([pb_utils.Tensor("LATENT", EMPTY_LATENT),
                                       pb_utils.Tensor("PROGRESS", np.array([[step, total, 0]], dtype=np.int32)),
                                       pb_utils.Tensor("PREVIEW", EMPTY_PREVIEW), json_tensor("INFO", info)])


class Metrics:
    """The DiT's Prometheus metrics (h3_*), published on Triton's /metrics endpoint."""

    def __init__(self):
        labels = {"model": "h3_dit"}

        def family(name, kind, description, buckets=None):
            self.families.append(pb_utils.MetricFamily(name=name, description=description, kind=kind))
            metric = self.families[-1].Metric(labels=labels, buckets=buckets) if buckets else self.families[-1].Metric(labels=labels)
            return metric

        gauge, counter, histogram = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
        self.families = []  # Triton requires the families to stay referenced
        self.waiting = family("h3_waiting_requests", gauge, "requests waiting for admission")
        self.active = family("h3_active_requests", gauge, "requests admitted to the pack")
        self.pack_requests = family("h3_pack_requests", histogram, "request outputs per packed forward", [1, 2, 3, 4, 6, 8, 16])
        self.pack_rows = family("h3_pack_rows", histogram, "packed rows per forward", [128, 512, 2048, 8192, 16384, 32768, 65536])
        self.step_seconds = family("h3_step_seconds", histogram, "seconds per packed step", [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5])
        self.first_step = family("h3_time_to_first_step_seconds", histogram, "arrival at the DiT to first step end", [0.01, 0.1, 0.5, 1, 5, 30])
        self.cancellations = family("h3_cancellations_total", counter, "requests cancelled")
        self.expiries = family("h3_deadline_expiries_total", counter, "requests whose deadline_s expired")
        self.refusals = family("h3_refusals_total", counter, "requests refused (INVALID_ARG or UNAVAILABLE)")
        self.completions = family("h3_completions_total", counter, "request outputs completed")
        self.failures = family("h3_failures_total", counter, "requests failed with INTERNAL")
        self.heartbeat = family("h3_heartbeat_timestamp_seconds", gauge, "unix time of the step loop's last iteration")
        self.busy = family("h3_execute_in_progress", gauge, "1 while execute() runs (with an old heartbeat: a stalled step)")


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        torch.set_num_threads(int(params["cpu_threads"]))
        self.limits = RequestLimits(
            max_height=int(params["max_height"]), max_width=int(params["max_width"]),
            max_num_frames=int(params["max_num_frames"]), max_steps=int(params["max_steps"]),
            max_outputs=int(params["max_outputs"]), max_rows=int(params["max_batch_rows"]),
            max_request_mb=int(params["max_request_mb"]),
        )
        self.engine = load_engine(params["config_name"], resolve_path(args, params["checkpoint_dir"]),
                                  params["device"], params["attention_backend"], with_encoder=False,
                                  with_vaes=False, limits=self.limits)
        self.engine.warm_up()
        self.mode = params["execution_mode"]
        if self.mode not in ("step", "request"):
            raise ValueError(f"execution_mode {self.mode!r} must be 'step' or 'request'")
        self.scheduler = Scheduler(int(params["max_num_seqs"]), int(params["max_batch_rows"]),
                                   int(params["max_waiting"]), params["scheduling_policy"],
                                   int(params["row_budget"]), float(params["aging_s"]))
        self.jobs: dict[object, Job] = {}
        self.early_cancels: dict[str, float] = {}  # request id -> monotonic time of the cancel
        self.dropped: dict[object, tuple] = {}  # key -> (request id, cause, monotonic time) of a dropped job
        self.ids = itertools.count(1)
        self.metrics = Metrics()
        if params["allow_fault_injection"] not in ("true", "false"):
            raise ValueError(f"allow_fault_injection {params['allow_fault_injection']!r} must be 'true' or 'false'")
        self.allow_fault_injection = params["allow_fault_injection"] == "true"
        self.draining = False
        signal.signal(signal.SIGUSR1, self.start_draining)

    def start_draining(self, signum, frame) -> None:
        """SIGUSR1 handler (runs between two Python instructions of the stub's main thread)."""
        self.draining = True

    def execute(self, requests):
        self.metrics.heartbeat.set(time.time())
        self.metrics.busy.set(1)
        try:
            self.iterate(requests)
        finally:
            self.metrics.busy.set(0)
        return None

    def iterate(self, requests) -> None:
        """One step-loop iteration over all live requests (see the module docstring)."""
        present = []
        for request in requests:
            key = request.correlation_id()
            if key in (0, ""):
                continue  # filler request inserted by the `direct` strategy
            try:
                fields = read_json(request, "REQUEST")
                check_fields(fields)
            except ValueError as error:
                self.metrics.refusals.increment(1)
                request.get_response_sender().send(error_response("INVALID_ARG", str(error)), flags=FINAL)
                continue
            if "cancel_request_id" in fields:
                self.control(request, fields["cancel_request_id"])
                continue
            job = self.jobs.get(key)
            new = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if job is not None and new:
                self.refuse_reused_id(request, job)
                continue
            if job is None and not new:  # a rescheduled request whose job was dropped: end it
                if key not in self.dropped:
                    self.metrics.cancellations.increment(1)  # else counted when it was dropped
                request_id, cause, _ = self.dropped.pop(key, (request.request_id(), None, None))
                named = request_id or f"with sequence id {key}"
                cause = cause or f"its sequence id was reused or Triton withheld it for {VANISHED_EXECUTES} steps"
                request.get_response_sender().send(ending(request_id or str(key), "CANCELLED",
                                                          f"request {named} was dropped: {cause}"), flags=FINAL)
                continue
            if new:
                self.dropped.pop(key, None)  # a new sequence with the id of a dropped one
            job = job or self.admit(request, key, fields)
            if job is not None:
                job.extra["request"] = request
                job.extra["sender"] = request.get_response_sender()
                present.append(job)
        self.drop_vanished(present)
        self.end_cancelled(present)
        pack = [job for job in self.scheduler.schedule() if job in present]
        if pack:
            if self.mode == "request":
                pack = pack[:1]
                while pack and not pack[0].finished:
                    pack = self.step(pack)
            else:
                self.step(pack)
        for job in present:
            if job.key not in self.jobs:
                continue  # answered with its final response this step
            position = self.scheduler.queue_position(job)
            if job.progress_every and position > 0 and position != job.queue_position:
                self.send_progress(job, position)
            job.queue_position = position
            job.extra["request"].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        self.metrics.waiting.set(len(self.scheduler.line))
        self.metrics.active.set(len(self.scheduler.pack))

    # -- new requests and control requests ---------------------------------------------------

    def admit(self, request, key, fields: dict):
        """Validate a new request and queue it; on failure answer with an error at once."""
        sender = request.get_response_sender()
        try:
            if self.draining:
                raise Overloaded("the server is shutting down")
            job = self.parse(request, key, fields)
            if self.early_cancels.pop(job.request_id, None) is not None:
                self.metrics.cancellations.increment(1)
                sender.send(ending(job.request_id, "CANCELLED", f"request {job.request_id} was cancelled before it started "
                                                                f"(step 0 of {job.total_steps})", 0, job.total_steps), flags=FINAL)
                return None
            self.scheduler.add(job)
        except ValueError as error:
            self.metrics.refusals.increment(1)
            sender.send(error_response("INVALID_ARG", str(error)), flags=FINAL)
            return None
        except Overloaded as error:
            self.metrics.refusals.increment(1)
            sender.send(error_response("UNAVAILABLE", str(error)), flags=FINAL)
            return None
        except Exception as error:  # noqa: BLE001 - a validation gap must not escape execute()
            # Escaping, it would fail every request of this execute() with a traceback naming
            # server paths. The client gets a code word and one line; the log the traceback.
            self.metrics.failures.increment(1)
            try:
                pb_utils.Logger.log_error(f"h3_dit: request {request.request_id() or key} could not be admitted:\n"
                                          f"{traceback.format_exc()}")
            except Exception:  # noqa: BLE001 - logging must not undo the catch
                pass
            sender.send(error_response("INTERNAL", admission_failure(error)), flags=FINAL)
            return None
        self.jobs[key] = job
        return job

    def refuse_reused_id(self, request, job: Job) -> None:
        """A new request (START) came with the sequence id of a live job: a client sent a
        sequence_id in use. Triton 2.51 ends the job's sequence ("conflict ... terminated
        early") and may free its request, so the job is dropped without a response (sending on
        its stored sender crashed the server); if Triton delivers the request once more (it did
        in every direct-call test) it is ended there (iterate) with CANCELLED naming its request
        id and the sequence id, else its client waits for its own timeout. The newcomer is
        refused: admitting it routed its responses to the job's client."""
        self.metrics.cancellations.increment(1)
        self.forget(job, f"another request reused its sequence id {job.key}")
        self.metrics.refusals.increment(1)
        request.get_response_sender().send(error_response(
            "INVALID_ARG", f"sequence id {job.key} belongs to request {job.request_id}, which Triton has now ended; "
                           "do not send sequence_id"), flags=FINAL)

    def parse(self, request, key, fields: dict) -> Job:
        """Inputs, REQUEST fields and control parameters -> Job. Raises ValueError naming the
        bad field."""
        if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            raise ValueError("sequence_end must not be set: a request runs over many iterations and Triton 2.51 "
                             "would drop it after the first (perf_analyzer: --request-parameter sequence_end:false:bool)")
        parameters = request_parameters(request)
        if parameters.get("return_mp4", True) and not MP4_AVAILABLE:
            raise ValueError("return_mp4=true needs PyAV, which this server does not have: send return_mp4=false (with "
                             "return_frames / return_audio for raw outputs) or install av")
        fault = parameters.get("inject_fault")
        if fault is not None:
            if not self.allow_fault_injection:
                raise ValueError("request parameter 'inject_fault' is refused: h3_dit parameter allow_fault_injection is not 'true'")
            check_fault(fault)
        progress_every = parameters.get("progress_every", 0)
        preview_every = parameters.get("preview_every", 0)
        deadline_s = parameters.get("deadline_s")
        for name, value in (("progress_every", progress_every), ("preview_every", preview_every)):
            if value < 0:
                raise ValueError(f"{name}={value} is out of range: allowed >= 0")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s={deadline_s} is out of range: allowed > 0 seconds")
        cfg = self.engine.dit.cfg
        values = dict(height=cfg.default_height, width=cfg.default_width, num_frames=cfg.default_num_frames,
                      num_inference_steps=cfg.default_steps, seed=None, num_outputs=1)
        for name in FIELDS:
            if name in fields:
                if type(fields[name]) is not int:
                    raise ValueError(f"{name} must be an integer, got {fields[name]!r}")
                values[name] = fields[name]
        embeds = pb_utils.get_input_tensor_by_name(request, "TEXT_EMBEDS").as_numpy()
        text_dim = self.engine.dit.cfg.text_dim
        if embeds.ndim != 3 or embeds.shape[0] != 1 or embeds.shape[1] < 1 or embeds.shape[2] != text_dim:
            shape = embeds.shape[1:] if embeds.ndim == 3 and embeds.shape[0] == 1 else embeds.shape
            raise ValueError(f"text_embeds has shape {tuple(shape)}; expected [L >= 1, {text_dim}]")
        text = torch.from_numpy(embeds[0].copy())  # [L, text_dim]
        if not torch.isfinite(text).all():
            raise ValueError("TEXT_EMBEDS holds non-finite values")
        encode_s = fields.get("encode_seconds", 0.0)
        if type(encode_s) not in (int, float):
            raise ValueError(f"encode_seconds must be a number, got {encode_s!r}")
        if not (math.isfinite(encode_s) and encode_s >= 0):
            raise ValueError(f"encode_seconds={encode_s} is out of range: allowed finite >= 0 seconds")
        request_id = request.request_id() or f"h3-{next(self.ids)}"
        if any(job.request_id == request_id for job in self.jobs.values()):
            raise ValueError(f"request id {request_id!r} is already running; ids must be unique")
        generation = GenerationRequest(prompt="(encoded)", request_id=request_id, **values)
        states = self.engine.prepare(generation, text)
        job = Job(key=key, request_id=request_id, states=states, progress_every=progress_every, encode_s=encode_s,
                  priority=parameters.get("request_priority", 0))
        job.extra.update(preview_every=preview_every, deadline_s=deadline_s)
        for state in states:
            state.extra["fault"] = fault
        return job

    def control(self, request, target: str) -> None:
        """Cancel-by-id control request: the target leaves at the next step boundary (the
        same execute() when it is only waiting); an id not seen yet is remembered for EARLY_CANCEL_SECONDS in
        case its request is still in the encoder. Answered with one final response."""
        now = time.monotonic()
        self.early_cancels = {k: t for k, t in self.early_cancels.items() if now - t < EARLY_CANCEL_SECONDS}
        matches = [job for job in self.jobs.values() if job.request_id == target]
        for job in matches:
            job.extra["cancelled"] = "cancelled by request"
        if not matches:
            self.early_cancels[target] = now
        info = {"kind": "cancel", "request_id": target, "found": bool(matches)}
        request.get_response_sender().send(pb_utils.InferenceResponse([
            pb_utils.Tensor("LATENT", EMPTY_LATENT), pb_utils.Tensor("PROGRESS", np.zeros((1, 3), dtype=np.int32)),
            pb_utils.Tensor("PREVIEW", EMPTY_PREVIEW), json_tensor("INFO", info)]), flags=FINAL)

    def drop_vanished(self, present: list[Job]) -> None:
        """Forget jobs Triton stopped delivering: every live sequence comes back in each
        execute(), but Triton 2.51 drops a natively cancelled iterative request when it is
        rescheduled instead of delivering it again. After VANISHED_EXECUTES absences the job
        is dropped (counted as a cancellation) so it holds no state or packing place."""
        for job in list(self.jobs.values()):
            job.extra["absent"] = 0 if job in present else job.extra.get("absent", 0) + 1
            if job.extra["absent"] >= VANISHED_EXECUTES:
                self.metrics.cancellations.increment(1)
                self.forget(job, f"Triton withheld it for {VANISHED_EXECUTES} steps (sequence id {job.key})")

    def end_cancelled(self, present: list[Job]) -> None:
        """Step boundary: end jobs cancelled by id, natively cancelled, past their deadline, or
        all of them once the server drains."""
        now = time.monotonic()
        for job in present:
            if job.key not in self.jobs:
                continue
            reason = "cancelled because the server is shutting down" if self.draining else job.extra.get("cancelled")
            if reason is None and (job.extra["request"].is_cancelled() or job.extra["sender"].is_cancelled()):
                reason = "cancelled by the client"
            deadline = job.extra["deadline_s"]
            if reason is None and deadline is not None and now - job.arrival_s > deadline:
                reason = f"deadline of {deadline} s expired"
                self.metrics.expiries.increment(1)
            if reason is not None:
                self.cancel(job, reason)

    def cancel(self, job: Job, reason: str) -> None:
        self.metrics.cancellations.increment(1)
        self.finish(job, ending(job.request_id, "CANCELLED", f"request {job.request_id} {reason} at step {job.step_index} of "
                                                             f"{job.total_steps}", job.step_index, job.total_steps))

    # -- the step -------------------------------------------------------------------------------

    def step(self, pack: list[Job]) -> list[Job]:
        """One packed forward for `pack`, then progress, previews and final responses. If the
        forward raises or returns non-finite values, it is retried one job at a time so only
        the offending job fails (INTERNAL:). Returns the jobs still running."""
        states = [state for job in pack for state in job.states]
        start = time.monotonic()
        for job in pack:
            job.first_step_s = job.first_step_s or start
            job.largest_pack = max(job.largest_pack, len(states))
        try:
            velocities = self.forward(states)
        except Exception:
            velocities = []
            for job in list(pack):
                try:
                    velocities += self.forward(job.states)
                except Exception as error:
                    self.metrics.failures.increment(1)
                    self.finish(job, ending(job.request_id, "INTERNAL", f"denoise step {job.step_index + 1} failed: {error}",
                                            job.step_index, job.total_steps))
                    pack.remove(job)
            states = [state for job in pack for state in job.states]
        end = time.monotonic()
        self.metrics.step_seconds.observe(end - start)
        self.metrics.pack_requests.observe(len(states))
        self.metrics.pack_rows.observe(sum(state.rows for state in states))
        for state, velocity in zip(states, velocities):
            job = next(j for j in pack if state in j.states)
            every = job.extra["preview_every"]
            if every and state.output_index == 0 and (state.step_index + 1) % every == 0:
                job.extra["preview"] = preview_frame(state, velocity[0])
            self.engine.update(state, velocity)
        for job in pack:
            if job.step_index == 1:
                self.metrics.first_step.observe(end - job.arrival_s)
            job.last_step_s = end
            step = job.step_index
            if (job.progress_every and (step % job.progress_every == 0 or step == job.total_steps)) or "preview" in job.extra:
                self.send_progress(job, 0)
            if job.finished:
                self.send_results(job)
        return [job for job in pack if job.key in self.jobs]

    def forward(self, states):
        """engine.denoise_step, raising ValueError on non-finite velocities. Injected faults
        (request parameter inject_fault, see check_fault) act here, at a state's first step."""
        for state in states:
            fault = state.extra["fault"] if state.step_index == 0 else None
            if fault == "raise":
                raise RuntimeError(f"injected fault in the forward of request {state.request_id}")
            if fault is not None and fault.startswith("slow:") and not state.extra.get("slowed"):
                state.extra["slowed"] = True
                time.sleep(float(fault[5:]))
        velocities = self.engine.denoise_step(states)
        velocities = [(torch.full_like(video, float("nan")), audio) if state.extra["fault"] == "nan" and state.step_index == 0
                      else (video, audio) for state, (video, audio) in zip(states, velocities)]
        for state, (video, audio) in zip(states, velocities):
            if not (torch.isfinite(video).all() and torch.isfinite(audio).all()):
                raise ValueError(f"non-finite velocity for request {state.request_id}")
        return velocities

    # -- responses ------------------------------------------------------------------------------

    def progress_tensor(self, job: Job, position: int):
        return pb_utils.Tensor("PROGRESS", np.array([[job.step_index, job.total_steps, position]], dtype=np.int32))

    def send_progress(self, job: Job, position: int) -> None:
        preview = job.extra.pop("preview", None)
        info = {"kind": "progress", "request_id": job.request_id}
        job.extra["sender"].send(pb_utils.InferenceResponse([
            pb_utils.Tensor("LATENT", EMPTY_LATENT), self.progress_tensor(job, position),
            pb_utils.Tensor("PREVIEW", EMPTY_PREVIEW if preview is None else preview[None].numpy()), json_tensor("INFO", info)]))

    def send_results(self, job: Job) -> None:
        """One response per output with its final latent rows (video then audio, flattened)."""
        for state in job.states:
            latent = torch.cat([state.video_latents.reshape(-1), state.audio_latents.reshape(-1)])[None]
            info = {
                "kind": "result", "request_id": job.request_id, "output_index": state.output_index,
                "num_outputs": len(job.states), "seed": state.seed, "height": state.height,
                "width": state.width, "num_frames": state.num_frames,
                "num_inference_steps": state.total_steps, "largest_pack": job.largest_pack,
                "stage_seconds": {"queue": job.first_step_s - job.arrival_s, "encode": job.encode_s,
                                  "denoise": job.last_step_s - job.first_step_s},
            }
            response = pb_utils.InferenceResponse([pb_utils.Tensor("LATENT", latent.numpy()), self.progress_tensor(job, 0),
                                                   pb_utils.Tensor("PREVIEW", EMPTY_PREVIEW), json_tensor("INFO", info)])
            job.extra["sender"].send(response, flags=FINAL if state is job.states[-1] else 0)
            self.metrics.completions.increment(1)
        self.forget(job)

    def finish(self, job: Job, response) -> None:
        job.extra["sender"].send(response, flags=FINAL)
        self.forget(job)

    def forget(self, job: Job, dropped: str | None = None) -> None:
        """Remove the job. `dropped`: why it was dropped without a final response; if Triton
        delivers its request again, iterate() ends it with CANCELLED naming its request id and
        this cause (remembered for EARLY_CANCEL_SECONDS)."""
        self.scheduler.remove(job)
        del self.jobs[job.key]
        if dropped is not None:
            now = time.monotonic()
            self.dropped = {k: v for k, v in self.dropped.items() if now - v[2] < EARLY_CANCEL_SECONDS}
            self.dropped[job.key] = (job.request_id, dropped, now)
