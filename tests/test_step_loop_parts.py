"""The step loop's parts, each built and driven alone, with plain inputs and no StepLoop:
Announcements (the registry's count of requests headed for the DiT), Admission (arrivals: jobs,
refusals, cancels by id, dropped ids) and PackedStep (launch and settle of one packed step, the
step in flight, step times, results). The loop composes them (h3_core.serving.dit.step_loop)."""

import json

import numpy as np
import pytest
import torch

from h3_core.serving.dit.admission import Admission, ReusedKey, parse
from h3_core.serving.dit.announcements import ANNOUNCED_TRANSIT_S, Announcements
from h3_core.serving.dit.events import Arrival, CancelAnswer, Ended, Progress, Refused
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.packed_step import PackedStep, Settled, result_events
from h3_core.serving.dit.scheduler import Scheduler
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings
from tests.step_loop_harness import Clock, fields, live_ids, solo_latents, text, tiny_engine


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


def arrival(key: int, request_id: str, steps: int = 2, seed: int = 1, parameters: dict | None = None) -> Arrival:
    """A new request of the harness's shape (64x32x5), its handle its key."""
    return Arrival(
        handle=key,
        key=key,
        request_id=request_id,
        new=True,
        request_json=fields(steps, seed),
        text_embeds=text(seed),
        parameters_json=json.dumps(parameters or {}),
    )


def prepared(key: int, request_id: str, settings: DitSettings, engine, **arguments):
    """The job `parse` makes of arrival(key, request_id, **arguments) at clock 100, its handle set."""
    new = arrival(key, request_id, **arguments)
    job = parse(new, json.loads(new.request_json[0]), 100.0, engine, settings)
    job.handle = key
    return job


def test_announcements_alone_match_newcomers_and_write_off_the_rest(tmp_path):
    """An announcement unmatched by a newcomer holds the execute (in transit) until it is
    ANNOUNCED_TRANSIT_S old; a newcomer matches it; a filler or a known job's delivery does not."""
    clock = Clock()
    dit, encoder = Registry(tmp_path, "h3_dit_0", clock), Registry(tmp_path, "", clock)
    announcements = Announcements(dit)
    assert (announcements.accounted, announcements.in_transit, announcements.quiet()) == (0, False, True)
    encoder.announce()
    assert announcements.quiet() is False  # one came since the execute started
    known = Arrival(handle=5, key=5)  # a live job's delivery: not a newcomer
    announcements.note([Arrival(handle=0, key=0), known], live_keys={5})
    assert (announcements.at_execute_start, announcements.accounted, announcements.in_transit) == (1, 0, True)
    assert announcements.quiet() is False
    announcements.note([Arrival(handle=1, key=1, new=True)], live_keys={5})
    assert (announcements.at_execute_start, announcements.accounted, announcements.in_transit) == (1, 1, False)
    assert announcements.quiet() is True
    encoder.announce(2)
    clock.now += 2 * ANNOUNCED_TRANSIT_S
    announcements.note([], live_keys={5})
    assert (announcements.at_execute_start, announcements.accounted, announcements.in_transit) == (3, 3, False)
    assert announcements.quiet() is True


def test_admission_alone_admits_refuses_answers_cancels_and_ends_dropped_ids(engine, tmp_path):
    clock, registry, sent = Clock(), Registry(tmp_path, "h3_dit_0"), []
    scheduler, metrics = Scheduler(4, 4096, 8), MetricsRecord()
    admission = Admission(engine, DitSettings(max_steps=20), registry, scheduler, metrics, clock)
    jobs = {}
    job = admission.arrive(arrival(1, "a"), jobs, sent.append)
    assert (job.key, job.request_id, job.handle, job.total_steps, job.arrival_s) == (1, "a", 1, 2, 100.0)
    assert scheduler.jobs == [job] and live_ids(registry) == ["a"] and sent == []
    jobs[job.key] = job
    bad = Arrival(handle=2, key=2, request_id="bad", new=True, request_json=[b"{bad"])
    assert admission.arrive(bad, jobs, sent.append) is None
    cancel = Arrival(handle=3, key=3, new=True, request_json=[json.dumps({"cancel_request_id": "a"}).encode()])
    assert admission.arrive(cancel, jobs, sent.append) is None
    assert admission.arrive(arrival(4, "late"), jobs, sent.append, draining=True) is None
    admission.remember_dropped(9, "gone", "Triton withheld it")
    assert (
        admission.arrive(Arrival(handle=9, key=9, request_id="gone", request_json=fields(2, 1)), jobs, sent.append)
        is None
    )
    assert sent == [
        Refused(
            2,
            "INVALID_ARG",
            "REQUEST is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        CancelAnswer(3, "a", "cancelled"),
        Refused(4, "UNAVAILABLE", "the server is shutting down"),
        Ended(9, "gone", "CANCELLED", "request gone was dropped: Triton withheld it"),
    ]
    assert job.cancel_reason == "cancelled by request"
    reused = admission.arrive(arrival(1, "intruder"), jobs, sent.append)
    assert reused == ReusedKey(job) and len(sent) == 4
    assert reused.message == ("sequence id 1 belongs to request a, which Triton has now ended; do not send sequence_id")
    assert metrics.values == {"h3_refusals_total": 2, "h3_cancellations_total": 1}
    assert scheduler.jobs == [job] and live_ids(registry) == ["a"]


def test_packed_step_alone_launches_settles_and_gives_the_solo_results(engine):
    """Two steps of one job: the step in flight is held and taken back, each settle says what
    is due (progress every step, the last step marked), step times come from the clock, and the
    results equal the request's solo run bit for bit."""
    clock, scheduler, metrics = Clock(), Scheduler(4, 4096, 8), MetricsRecord()
    step = PackedStep(engine, scheduler, metrics, clock)
    settings = DitSettings(max_steps=20)
    job = prepared(1, "a", settings, engine, steps=2, seed=3, parameters={"progress_every": 1})
    scheduler.add(job)
    flight, failures = step.launch([job])
    assert (flight.jobs, flight.steps, failures, flight.computed[0]) == ([job], {job: 1}, [], 1)
    assert step.hold(flight) is None and step.in_flight is flight
    assert step.take() is flight and step.in_flight is None
    clock.now = 100.5
    assert step.settle(flight, {1: job}) == [Settled(job, 1, progress=Progress(1, "a", 1, 2, 0))]
    assert (step.last_step_s, step.settled_at, step.overlaps) == (0.5, 100.5, False)
    clock.now = 101.0
    flight, failures = step.launch([job])
    assert scheduler.jobs == [] and failures == []  # its last step: it left the scheduler at launch
    clock.now = 101.03125
    assert step.settle(flight, {1: job}) == [Settled(job, 2, progress=Progress(1, "a", 2, 2, 0), last=True)]
    assert (step.last_step_s, step.overlaps) == (0.03125, True)
    assert metrics.observed["h3_step_seconds"] == [0.5, 0.03125] and step.settle(None, {}) is None
    (result,) = result_events(job, "bf16", silent_s=0.25)
    video, audio = solo_latents(engine, 2, 3)
    assert torch.equal(result.video_latent, video) and torch.equal(result.audio_latent, audio)
    assert (result.final, result.info["quantization"], result.info["silent_s"]) == (True, "bf16", 0.25)
    assert result.info["stage_seconds"] == {"queue": 0.0, "encode": 0.0, "denoise": 1.03125}


def test_packed_step_alone_reports_a_failed_forward_and_a_non_finite_velocity(engine):
    """A forward that raises fails only its job (retried alone) and is returned, not ended; a NaN
    velocity is found at settle, its step undone; a job that ended meanwhile is skipped."""
    clock, scheduler, metrics = Clock(), Scheduler(4, 4096, 8), MetricsRecord()
    step = PackedStep(engine, scheduler, metrics, clock)
    settings = DitSettings(max_steps=20, allow_fault_injection=True)
    jobs = {
        key: prepared(key, name, settings, engine, parameters={"inject_fault": fault} if fault else {})
        for key, name, fault in ((1, "raises", "raise"), (2, "nan", "nan"), (3, "good", None), (4, "gone", None))
    }
    flight, failures = step.launch(list(jobs.values()))
    assert failures == [(jobs[1], "denoise step 1 failed: injected fault in the forward of request raises")]
    assert flight.jobs == [jobs[2], jobs[3], jobs[4]]
    live = {key: job for key, job in jobs.items() if key in (2, 3)}
    assert step.settle(flight, live) == [
        Settled(jobs[2], 1, failure="denoise step 1 failed: non-finite velocity for request nan"),
        Settled(jobs[3], 1),
    ]
    assert [jobs[2].step_index, jobs[3].step_index, jobs[4].step_index] == [0, 1, 1]
    assert metrics.values == {"h3_failures_total": 2}
    assert np.isfinite(jobs[2].states[0].video_latents.numpy()).all()  # applied as zero
