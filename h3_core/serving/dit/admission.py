"""Admission to the step loop (`Admission`: each Arrival becomes a live job or an answer), a
request's inputs and request
parameters (parse, which prepares its states), fault injection (check_fault, tests only), the
client's message for an unexpected failure (admission_failure), and the bounded memory of ids
(BoundedMemory)."""

import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest
from h3_core.diffusion.sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, check_sigmas
from h3_core.media import MP4_AVAILABLE
from h3_core.model.training_metadata import TrainingMetadata
from h3_core.protocol import (
    CANCEL_FIELD,
    CONDITION_ECHO,
    CONDITION_FIELDS,
    CONDITION_KINDS,
    CONDITION_LATENTS,
    EARLY_CANCEL_SECONDS,
    ENCODER_FAULTS,
    INT_INPUTS,
    MAX_REFERENCES,
    MAX_REQUEST_ID_CHARS,
    SIGMA_INPUTS,
    VAE_FAULTS,
    InvalidRequest,
    check_request_id,
    check_request_parameters,
    check_task,
    fault_seconds,
    implied_task,
    lora_entries,
    lora_list,
    read_request_json,
)
from h3_core.rules import InvalidValue, check_in_range, check_integer, check_number
from h3_core.serving.dit.events import Arrival, CancelAnswer, Ended, LiveJob, Refused, Send
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.scheduler import Overloaded, Scheduler
from h3_core.serving.shared.registry import IDS_REMEMBERED, CancelNotRecorded, Registry, record_cancel
from h3_core.serving.shared.settings import DitSettings, check_served

log = logging.getLogger("h3_dit")

MAX_CONDITIONS = MAX_REFERENCES + 2  # condition blocks a REQUEST may describe (a video_audio block is one)
MAX_SOURCE_CHARS = 64  # a REQUEST condition's "input" ("REFERENCE_IMAGES[8]")
VANISHED_EXECUTES = 3  # a job missing from this many executes in a row was dropped by Triton
WORKER_FAULTS = ("worker_exit", "worker_hang", "worker_raise")  # inject_fault for sequence-parallel workers


def check_fault(fault: str) -> None:
    """Validate request parameter inject_fault (tests only). In h3_dit it acts at the request's
    first step: "raise" makes the forward raise, "nan" makes it return NaN video velocities for
    the request, "slow:S" makes the step S seconds slower (0 < S <= 600); with sp_degree > 1,
    the last sequence-parallel rank exits ("worker_exit", once), hangs ("worker_hang", once) or
    raises ("worker_raise", at every try of that step) at its first all-to-all
    (SequenceParallelDiT.inject_fault). ENCODER_FAULTS act in h3_encoder, VAE_FAULTS and
    "decode_slow:S" in h3_vae, each where that model allows fault injection. Raises ValueError
    naming it."""
    if fault in ("raise", "nan", *WORKER_FAULTS, *ENCODER_FAULTS, *VAE_FAULTS):
        return
    if fault_seconds(fault, "slow:") is None and fault_seconds(fault, "decode_slow:") is None:
        raise ValueError(
            f"inject_fault={fault!r} is not one of 'raise', 'nan', 'slow:S' (0 < S <= 600 seconds), "
            f"'worker_exit', 'worker_hang', 'worker_raise', {', '.join(map(repr, ENCODER_FAULTS + VAE_FAULTS))}, "
            "'decode_slow:S'"
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


def _checked(rule, field: str, value, **options):
    """rule(field, value, **options), an h3_core.rules field rule whose refusal is worded for
    REQUEST's fields: ValueError "FIELD REASON, got VALUE" (InvalidValue.got), the rule's error its
    cause."""
    try:
        return rule(field, value, **options)
    except InvalidValue as error:
        raise ValueError(error.got()) from error


def _is_int(value) -> bool:
    return type(value) is int


def _shape(value, rank: int) -> bool:
    return type(value) is list and len(value) == rank and all(_is_int(v) and v >= 1 for v in value)


def read_conditions(arrival: Arrival, fields: dict) -> tuple[str, list[Condition], tuple]:
    """REQUEST's task, conditions and vision_spans and the CONDITION_LATENTS input of a request ->
    (task, the Conditions with their latents, vision spans). The task defaults to the one its
    conditions' kinds imply (fl2va for keyframes, ref2va for guides or references, t2va without);
    Engine.prepare checks the values against the task and the canvas. Raises ValueError naming
    the field or input for a wrong type or shape, or latents that do not add up."""
    entries = fields.get("conditions", [])
    if type(entries) is not list or len(entries) > MAX_CONDITIONS:
        raise ValueError(
            f"REQUEST field 'conditions' must be a list of at most {MAX_CONDITIONS} objects, got {entries!r}"
        )
    shapes = []
    for index, entry in enumerate(entries):
        where = f"REQUEST field 'conditions'[{index}]"
        if type(entry) is not dict or entry.get("kind") not in CONDITION_KINDS:
            raise ValueError(f"{where} must be an object with a kind in {list(CONDITION_KINDS)}, got {entry!r}")
        unknown = sorted(set(entry) - set(CONDITION_FIELDS))
        if unknown:
            raise ValueError(f"{where} has unknown key {unknown[0]!r}; allowed: {list(CONDITION_FIELDS)}")
        _checked(check_integer, f"{where} frame", entry.get("frame", 0))
        for key, rank in (("video", 4), ("audio", 3)):
            if key in entry and not _shape(entry[key], rank):
                raise ValueError(f"{where} {key} must be a shape of {rank} positive integers, got {entry[key]!r}")
        source, start = entry.get("input", ""), entry.get("start_time_seconds", 0.0)
        if type(source) is not str or len(source) > MAX_SOURCE_CHARS:
            raise ValueError(f"{where} input must be a string of at most {MAX_SOURCE_CHARS} characters, got {source!r}")
        _checked(check_number, f"{where} start_time_seconds", start, low=0)
        shapes.append((entry.get("video"), entry.get("audio")))
    spans = fields.get("vision_spans", [])
    if type(spans) is not list or not all(
        type(span) is list and len(span) == 2 and all(map(_is_int, span)) for span in spans
    ):
        raise ValueError(f"REQUEST field 'vision_spans' must be a list of [start, end] integer pairs, got {spans!r}")
    raw = arrival.condition_latents
    flat = np.zeros((1, 0), dtype=np.float32) if raw is None else np.asarray(raw, dtype=np.float32)
    if flat.ndim != 2 or flat.shape[0] != 1:
        raise ValueError(f"{CONDITION_LATENTS} has shape {list(flat.shape)}; expected [1, N]")
    flat = torch.from_numpy(np.array(flat[0]))
    sizes = [math.prod(shape) for pair in shapes for shape in pair if shape is not None]
    if sum(sizes) != flat.numel():
        raise ValueError(
            f"{CONDITION_LATENTS} holds {flat.numel()} values but REQUEST field 'conditions' describes {sum(sizes)}"
        )
    pieces = iter(flat.split(sizes))
    conditions = []
    for entry, (video, audio) in zip(entries, shapes, strict=True):
        conditions.append(
            Condition(
                entry["kind"],
                entry.get("frame", 0),
                None if video is None else next(pieces).reshape(video),
                None if audio is None else next(pieces).reshape(audio),
            )
        )
    kinds = [condition.kind for condition in conditions]
    task = fields.get("task", implied_task("keyframe" in kinds, any(kind != "keyframe" for kind in kinds)))
    if type(task) is not str:
        raise ValueError(f"REQUEST field 'task' must be a string, got {task!r}")
    return task, conditions, tuple(tuple(span) for span in spans)


def conditions_info(conditions: list[Condition], entries: list[dict] = ()) -> list[dict]:
    """What a result's INFO says of its conditions, in the request's order: kind, the frame of
    keyframes and guides, and from REQUEST's `entries` (read_conditions checked them) a
    reference's "input" and a video's "start_time_seconds" (protocol.CONDITION_ECHO)."""
    info = []
    for index, c in enumerate(conditions):
        echo = {"kind": c.kind, "frame": c.frame} if c.kind in ("keyframe", "guide") else {"kind": c.kind}
        entry = entries[index] if index < len(entries) else {}
        info.append({**echo, **{key: entry[key] for key in CONDITION_ECHO[2:] if key in entry}})
    return info


def parse(
    arrival: Arrival,
    fields: dict,
    now: float,
    engine: Engine,
    settings: DitSettings,
    training: TrainingMetadata | None = None,
) -> LiveJob:
    """Inputs, REQUEST fields and request parameters of a new request -> LiveJob (its states prepared
    with engine.prepare; `now`: its arrival, seconds on the step loop's clock). `settings`: h3_dit's
    (fault injection, sp_degree, priority_max). `training`: the weights' training.json, or None;
    the sizes outside it and REQUEST's "outside_training" (h3_encoder's unknown words) go to the
    results' INFO "outside_training" when there are any. REQUEST's "video_sigmas" / "audio_sigmas"
    (VIDEO_SIGMAS / AUDIO_SIGMAS) are checked naming the input (sampling.check_sigmas, at most
    max_steps + 1 points); without "num_inference_steps" the request takes a list's length - 1
    steps; the results' INFO echoes them. REQUEST's "lora" (rules.lora_list; each adapter loaded,
    Engine.prepare) is echoed in INFO "lora" when not empty. Raises ValueError naming the bad field."""
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
        if not settings.allow_fault_injection:
            raise ValueError(
                "request parameter 'inject_fault' is refused: h3_dit parameter allow_fault_injection is not 'true'"
            )
        check_fault(fault)
        if fault in WORKER_FAULTS and settings.sp_degree == 1:
            raise ValueError(f"inject_fault={fault!r} needs h3_dit parameter sp_degree > 1")
    deadline_s = parameters.get("deadline_s")  # its range: check_request_parameters
    cfg = engine.dit.cfg
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
            values[name] = _checked(check_integer, name, fields[name])  # its range: validate_request
    sigmas = {}
    for name, field in SIGMA_INPUTS.items():
        if field in fields:
            check_sigmas(name, fields[field], engine.limits.max_steps)
            sigmas[field] = tuple(fields[field])
            if "num_inference_steps" not in fields:  # a list without NUM_INFERENCE_STEPS: its forwards
                values["num_inference_steps"] = len(sigmas[field]) - 1
    embeds = arrival.text_embeds
    if (
        embeds is None
        or embeds.ndim != 3
        or embeds.shape[0] != 1
        or embeds.shape[1] < 1
        or embeds.shape[2] != cfg.text_dim
    ):
        shape = (
            None if embeds is None else embeds.shape[1:] if embeds.ndim == 3 and embeds.shape[0] == 1 else embeds.shape
        )
        raise ValueError(
            f"text_embeds has shape {None if shape is None else tuple(shape)}; expected [L >= 1, {cfg.text_dim}]"
        )
    text = torch.from_numpy(np.array(embeds[0], dtype=np.float32))  # [L, text_dim], a copy
    if not torch.isfinite(text).all():
        raise ValueError("TEXT_EMBEDS holds non-finite values")
    encode_s, received = fields.get("encode_seconds", 0.0), fields.get("received_unix_s")
    for name, value in (("encode_seconds", encode_s), ("received_unix_s", received)):
        if value is not None:
            _checked(check_number, name, value)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value} is out of range: allowed finite >= 0 seconds")
    # deadline_s counts from the request's arrival at the server (h3_encoder), else at the DiT
    since_received = 0.0 if received is None else max(0.0, time.time() - received)
    check_request_id("request id", arrival.request_id)
    priority, limit = parameters.get("request_priority", 0), settings.priority_max
    check_in_range("request_priority", priority, -limit, limit, " (priority_max)")
    geometry = fields.get("geometry")
    if geometry is not None and type(geometry) is not dict:
        raise ValueError(f"REQUEST field 'geometry' must be an object, got {geometry!r}")
    words = fields.get("outside_training", [])
    if type(words) is not list or not all(type(entry) is str for entry in words):
        raise ValueError(f"REQUEST field 'outside_training' must be a list of strings, got {words!r}")
    cache_threshold = parameters.get("cache_threshold", settings.cache_threshold)
    if cache_threshold > 0 and settings.sp_degree > 1:
        raise ValueError(
            f"cache_threshold={cache_threshold} is out of range: allowed 0 with h3_dit parameter "
            f"sp_degree={settings.sp_degree} (step caching needs sp_degree 1)"
        )
    lora = lora_list(fields.get("lora"))  # the encoder's entries; a direct caller's are checked alike
    task, conditions, vision_spans = read_conditions(arrival, fields)
    check_served(task, settings.served_tasks())
    request_id = arrival.request_id or f"h3-{secrets.token_hex(8)}"
    generation = GenerationRequest(
        prompt="(encoded)",
        request_id=request_id,
        task=task,
        video_shift=parameters.get("flow_shift", DEFAULT_VIDEO_SHIFT),
        audio_shift=parameters.get("audio_flow_shift", DEFAULT_AUDIO_SHIFT),
        cache_threshold=cache_threshold,
        lora=lora,
        **sigmas,
        ref_kv_refresh=parameters.get("ref_kv_refresh", settings.ref_kv_refresh),
        **values,
    )
    try:
        states = engine.prepare(generation, text, conditions, vision_spans)
    except InvalidRequest as error:  # the core's words; the task rule's refusal in the wire's (TASK, KEYFRAMES)
        if error.field == "task":
            check_task(task, [condition.kind for condition in conditions])
        raise
    conditioning = {"task": task, "flow_shift": generation.video_shift, "audio_flow_shift": generation.audio_shift}
    conditioning.update({field: list(values) for field, values in sigmas.items()})  # the lists used, when given
    if lora:
        conditioning["lora"] = lora_entries(lora)
    if conditions:
        conditioning.update(conditions=conditions_info(conditions, fields["conditions"]), geometry=geometry)
    outside = [] if training is None else training.outside_size(values["height"], values["width"], states[0].num_frames)
    if outside + words:
        conditioning["outside_training"] = outside + words
    return LiveJob(
        key=arrival.key,
        request_id=request_id,
        states=states,
        arrival_s=now,
        responded_s=now,
        progress_every=parameters.get("progress_every", 0),
        preview_every=parameters.get("preview_every", 0),
        deadline_s=deadline_s,
        deadline_at=None if deadline_s is None else now + deadline_s - since_received,
        encode_s=encode_s,
        priority=priority,
        fault=fault,
        conditioning=conditioning,
    )


@dataclass
class ReusedKey:
    """A new request (START) came with the sequence id of the live `job`: a client sent a
    sequence_id in use. Triton 2.51 ends the job's sequence ("conflict ... terminated early") and
    may free its request, so the step loop drops the job without an event (answering its old
    handle crashed the server; if Triton delivers its request once more, `Admission.arrive` ends
    it with CANCELLED naming its request id and `cause`) and refuses the newcomer with `message`
    (admitting it routed its responses to the job's client)."""

    job: LiveJob

    @property
    def cause(self) -> str:
        return f"another request reused its sequence id {self.job.key}"

    @property
    def message(self) -> str:
        return (
            f"sequence id {self.job.key} belongs to request {self.job.request_id}, "
            "which Triton has now ended; do not send sequence_id"
        )


class Admission:
    """Arrivals to the step loop: each Arrival becomes its live job (a new one admitted with
    `parse` and queued in the scheduler) or is answered at once (refused, a cancel control
    request, a dropped job's end, a filler skipped).

    Owns `dropped`: correlation id -> (request id, cause) of the jobs the loop dropped without an
    answer (`remember_dropped`), so a request Triton delivers again is ended naming its id and
    cause. The map of live jobs is the loop's, passed to `arrive` and `cancel_by_id`.

    Args:
        engine: the Engine whose prepare a new request's states come from.
        settings: h3_dit's DitSettings.
        registry: the Registry (ids admitted, cancels by id recorded).
        scheduler: the Scheduler a new job is queued in.
        metrics: MetricsRecord or an object with its three methods (h3_refusals_total,
            h3_failures_total, h3_cancellations_total).
        clock: monotonic seconds.
        training: what the weights were trained on, or None (see `parse`).
    """

    def __init__(
        self,
        engine: Engine,
        settings: DitSettings,
        registry: Registry,
        scheduler: Scheduler,
        metrics: MetricsRecord,
        clock: Callable[[], float],
        training: TrainingMetadata | None = None,
    ):
        self.engine, self.settings, self.registry, self.scheduler = engine, settings, registry, scheduler
        self.metrics, self.clock, self.training = metrics, clock, training
        self.dropped = BoundedMemory()

    def remember_dropped(self, key, request_id: str, cause: str) -> None:
        """The loop dropped the job of sequence id `key` without an answer, because of `cause`."""
        self.dropped.remember(key, (request_id, cause), self.clock())

    def arrive(
        self, arrival: Arrival, jobs: Mapping[object, LiveJob], send: Send, draining: bool = False
    ) -> LiveJob | ReusedKey | None:
        """The live job this arrival belongs to (`jobs`: the loop's live jobs by key; a new one is
        admitted, and the caller adds it to them), None when the arrival was answered (refused,
        control request, dropped job) or is a filler, or ReusedKey for a newcomer with a live
        job's key (the caller drops the job and refuses the newcomer). `draining`: newcomers are
        refused with UNAVAILABLE."""
        if arrival.key in (0, ""):
            return None  # filler request inserted by Triton's `direct` strategy
        try:
            fields = read_request_json(arrival.request_json)
        except ValueError as error:
            self.refuse(send, arrival, "INVALID_ARG", str(error))
            return None
        if CANCEL_FIELD in fields:
            try:
                answer = self.cancel_by_id(arrival.handle, fields[CANCEL_FIELD], jobs)
            except CancelNotRecorded as error:  # the registry failed: this control request fails alone
                log.exception("the cancel of request %s could not be recorded", fields[CANCEL_FIELD])
                self.refuse(send, arrival, "INTERNAL", str(error))
                return None
            send(answer)
            return None
        now = self.clock()
        job = jobs.get(arrival.key)
        if job is not None and arrival.new:
            self.metrics.increment("h3_cancellations_total")
            return ReusedKey(job)
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
            job = self.admit(arrival, fields, now, send, draining)
        if job is not None:
            job.handle = arrival.handle
            job.absent = 0
            job.is_cancelled = arrival.is_cancelled
        return job

    def refuse(self, send: Send, arrival: Arrival, code: str, message: str) -> None:
        """Answer a request that never started with an error (counted and logged)."""
        self.metrics.increment("h3_failures_total" if code == "INTERNAL" else "h3_refusals_total")
        named = arrival.request_id[:MAX_REQUEST_ID_CHARS] or "(no id)"  # a forged id may be megabytes long
        log.info("request %s refused: %s: %s", named, code, message)
        send(Refused(arrival.handle, code, message))

    def cancel_by_id(self, handle, target: str, jobs: Mapping[object, LiveJob]) -> CancelAnswer:
        """A cancel-by-id control request sent to h3_dit directly, answered as h3_cancel answers
        it (registry.record_cancel, whichever instance holds the target): "cancelled",
        "finished" or "unknown". A target among `jobs` (this instance's) gets its cancel_reason
        and leaves at the loop's next step boundary. Raises CancelNotRecorded when the registry
        fails."""
        state = record_cancel(self.registry, target)
        for job in jobs.values():
            if job.request_id == target:
                job.cancel_reason = job.cancel_reason or "cancelled by request"
        return CancelAnswer(handle, target, state)

    def admit(self, arrival: Arrival, fields: dict, now: float, send: Send, draining: bool = False) -> LiveJob | None:
        """Validate a new request and queue it; on failure refuse it at once. A refused request
        leaves nothing behind: the scheduler takes it first (Overloaded, or ValueError for a
        request that never fits one forward) and the registry only then (ValueError for an id
        live on some instance); when the registry refuses it, or raises, or an early cancel was
        waiting for its id, the scheduler forgets it again. So a retry with the same id is
        admitted and a cancel of it answers as for an unknown id. Returns the queued job."""
        try:
            if draining:
                raise Overloaded("the server is shutting down")
            job = parse(arrival, fields, now, self.engine, self.settings, self.training)
            self.scheduler.add(job)
            try:
                cancelled_early = self.registry.admit(job.request_id)
            except BaseException:
                self.scheduler.remove(job)
                raise
            if cancelled_early:
                self.scheduler.remove(job)
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
        return job
