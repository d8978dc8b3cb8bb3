"""h3_core.serving.dit.step_loop without a server: plain Arrivals in, events out, a fake clock.

Every request's final latents are compared with torch.equal to the same request run alone
(Engine.prepare + denoise_step + update), so co-batching, cancellation, failures and deadlines
are shown to cost a neighbour nothing."""

import json
import logging
import re
import time

import pytest

from h3_core.serving.dit import admission
from h3_core.serving.dit.admission import VANISHED_EXECUTES
from h3_core.serving.dit.events import Arrival, CancelAnswer, Ended, Progress, Refused, Result
from h3_core.serving.shared.registry import Registry
from tests.step_loop_harness import (
    Client,
    Clock,
    assert_solo,
    fields,
    make_loop,
    text,
    tiny_engine,
)


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


def test_co_batched_requests_equal_their_solo_runs_and_end_in_order(engine):
    client = Client(make_loop(engine))
    client.send("a", steps=3, seed=1)
    client.send("b", steps=5, seed=2, parameters={"progress_every": 2})
    client.run()
    (a,) = client.of("a", Result)
    (b,) = client.of("b", Result)
    assert a.final and b.final and a.info["largest_pack"] == 2
    assert_solo(engine, a, 3, 1)
    assert_solo(engine, b, 5, 2)
    assert [(e.step, e.total, e.queue_position) for e in client.of("b", Progress)] == [(2, 5, 0), (4, 5, 0), (5, 5, 0)]
    assert tuple(a.video_latent.shape) == (24, 2, 2, 4) and tuple(a.audio_latent.shape) == (2, 32, 8)
    assert client.loop.metrics.values["h3_completions_total"] == 2


def test_cancel_states_running_finished_unknown(engine):
    client = Client(make_loop(engine))
    client.send("job-1", steps=2, seed=3)
    client.send("job-2", steps=6, seed=4)
    client.iterate()
    client.iterate()  # job-1 finished; job-2 runs on
    client.cancel("job-1")
    client.cancel("job-2")
    client.cancel("job-3")
    client.iterate()
    answers = [(e.request_id, e.state) for e in client.events if isinstance(e, CancelAnswer)]
    assert answers == [("job-1", "finished"), ("job-2", "cancelled"), ("job-3", "unknown")]
    (ended,) = client.of("job-2", Ended)
    assert (ended.code, ended.message) == ("CANCELLED", "request job-2 cancelled by request at step 2 of 6")
    # a finished id planted nothing: a new request with it runs to completion
    client.send("job-1", steps=2, seed=3)
    # an unknown id was remembered: its request ends before it starts
    client.send("job-3", steps=2, seed=5)
    client.run()
    assert len(client.of("job-1", Result)) == 2
    (ended,) = client.of("job-3", Ended)
    assert ended.message == "request job-3 was cancelled before it started (step 0 of 2)"


def test_a_cancel_racing_the_final_step_leaves_the_neighbour_its_solo_output(engine):
    client = Client(make_loop(engine))
    client.send("a", steps=3, seed=6)
    client.send("b", steps=3, seed=7)
    client.iterate()
    client.iterate()
    client.cancel("a")  # arrives in the iteration of the last step: a ends before it
    client.run()
    (ended,) = client.of("a", Ended)
    assert (ended.step, ended.total) == (2, 3) and not client.of("a", Result)
    (b,) = client.of("b", Result)
    assert_solo(engine, b, 3, 7)


@pytest.mark.parametrize(
    "fault, message",
    [
        ("raise", "denoise step 1 failed: injected fault in the forward of request bad"),
        ("nan", "denoise step 1 failed: non-finite velocity for request bad"),
    ],
)
def test_a_failing_forward_fails_only_its_request(engine, fault, message):
    client = Client(make_loop(engine, allow_fault_injection=True))
    client.send("good", steps=3, seed=8)
    client.send("bad", steps=3, seed=9, parameters={"inject_fault": fault})
    client.run()
    (ended,) = client.of("bad", Ended)
    assert (ended.code, ended.message) == ("INTERNAL", message)
    assert_solo(engine, client.of("good", Result)[0], 3, 8)
    assert client.loop.metrics.values["h3_failures_total"] == 1


def test_a_deadline_ends_the_request_at_the_next_step_boundary_with_one_log_line(engine, caplog):
    clock = Clock()
    client = Client(make_loop(engine, clock))
    client.send("late", steps=10, seed=1, parameters={"deadline_s": 1.5})
    with caplog.at_level(logging.INFO, logger="h3_dit"):
        client.iterate()
        clock.now += 1.0
        client.iterate()
        clock.now += 1.0
        client.iterate()
    (ended,) = client.of("late", Ended)
    assert ended.message == "request late deadline of 1.5 s expired at step 2 of 10"
    assert client.loop.metrics.values["h3_deadline_expiries_total"] == 1 and not client.live
    assert caplog.messages == [
        "request late ended CANCELLED: request late deadline of 1.5 s expired at step 2 of 10: "
        "64x32x5 frames, step 2 of 10, queue 0.000 s, encode 0.000 s, denoise 1.000 s"
    ]


def test_a_deadline_counts_from_the_arrival_at_the_encoder(engine):
    """received_unix_s (written by h3_encoder, wall-clock) 1 s ago: a 30 s deadline leaves 29 s at
    the DiT, so it has expired 29.5 s after the arrival there (29 s of margin for the real time
    between send and parse)."""
    clock = Clock()
    client = Client(make_loop(engine, clock))
    client.send("queued", steps=10, seed=1, parameters={"deadline_s": 30}, received_unix_s=time.time() - 1.0)
    client.iterate()
    clock.now += 29.5
    client.iterate()
    assert client.of("queued", Ended)[0].message == "request queued deadline of 30 s expired at step 1 of 10"


def test_a_request_triton_withholds_is_dropped_and_ended_if_it_comes_back(engine):
    client = Client(make_loop(engine))
    client.send("gone", steps=10, seed=1)
    client.iterate()
    key = next(iter(client.live))
    for _ in range(VANISHED_EXECUTES):
        client.iterate(withhold=(key,))
    assert not client.loop.jobs
    client.iterate()  # Triton delivers it once more
    (ended,) = client.of("gone", Ended)
    assert (
        ended.message
        == f"request gone was dropped: Triton withheld it for {VANISHED_EXECUTES} steps (sequence id {key})"
    )


def test_draining_cancels_running_requests_and_refuses_newcomers(engine):
    client = Client(make_loop(engine))
    client.send("running", steps=10, seed=1)
    client.iterate()
    client.loop.start_draining()
    client.send("newcomer", steps=2, seed=2)
    client.iterate()
    assert client.of("running", Ended)[0].message == (
        "request running cancelled because the server is shutting down at step 1 of 10"
    )
    (refused,) = [event for event in client.events if isinstance(event, Refused)]
    assert (refused.code, refused.message) == ("UNAVAILABLE", "the server is shutting down")


def test_request_mode_streams_progress_while_it_runs(engine):
    """Execution mode "request": the job runs to completion within one iteration, and each
    progress event is handed over right after its step (not collected until the end)."""
    loop = make_loop(engine, execution_mode="request")
    steps_when_sent = []
    arrival = Arrival(
        handle=1,
        key=1,
        request_id="r",
        new=True,
        request_json=fields(3, 1),
        text_embeds=text(1),
        parameters_json='{"progress_every": 1}',
    )
    reschedule = loop.iterate(
        [arrival],
        lambda event: steps_when_sent.append((type(event).__name__, len(loop.metrics.observed["h3_step_seconds"]))),
    )
    assert reschedule == [] and steps_when_sent == [("Progress", 1), ("Progress", 2), ("Progress", 3), ("Result", 3)]


def test_assigned_request_ids_are_unguessable(engine):
    client = Client(make_loop(engine))
    client.send("", steps=1, seed=1)
    client.send("", steps=1, seed=2)
    client.run()
    ids = [event.request_id for event in client.events if isinstance(event, Result)]
    assert len(set(ids)) == 2 and all(re.fullmatch(r"h3-[0-9a-f]{16}", request_id) for request_id in ids)


def test_an_unexpected_admission_error_refuses_only_that_request(engine, caplog, monkeypatch):
    loop = make_loop(engine)
    client = Client(loop)
    original = admission.parse

    def parse(arrival, fields, now, engine, settings, training):
        if arrival.request_id == "odd":
            raise IndexError("tuple index out of range\nsecond line")
        return original(arrival, fields, now, engine, settings, training)

    monkeypatch.setattr(admission, "parse", parse)
    client.send("odd", steps=1, seed=1)
    client.send("fine", steps=1, seed=2)
    with caplog.at_level(logging.ERROR, logger="h3_dit"):
        client.run()
    (refused,) = [event for event in client.events if isinstance(event, Refused)]
    assert (refused.code, refused.message) == (
        "INTERNAL",
        "the request could not be admitted (IndexError: tuple index out of range); see the server log",
    )
    assert "Traceback" in caplog.text and "request odd could not be admitted" in caplog.text
    assert_solo(engine, client.of("fine", Result)[0], 1, 2)


@pytest.mark.parametrize(
    "request_json, message",
    [
        (
            [b"{"],
            "REQUEST is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (
            [b'{"colour": 1}'],
            "REQUEST field 'colour' is unknown; allowed: ['audio_sigmas', 'conditions', 'encode_seconds', 'geometry', "
            "'height', 'lora', 'num_frames', 'num_inference_steps', 'num_outputs', 'outside_training', "
            "'received_unix_s', 'seed', 'task', 'video_sigmas', 'vision_spans', 'width'], or "
            "'cancel_request_id' alone (a cancel request)",
        ),
        ([b'{"received_unix_s": -1}'], "received_unix_s=-1 is out of range: allowed finite >= 0 seconds"),
        (
            [b'{"outside_training": "dragon"}'],
            "REQUEST field 'outside_training' must be a list of strings, got 'dragon'",
        ),
        ([b'{"cancel_request_id": 7}'], "cancel_request_id must be a non-empty string, got number 7"),
        ([b"{}", b"{}"], "REQUEST must hold one JSON object, got 2 elements"),
        ([b"[" * 100000 + b"]" * 100000], "REQUEST is not valid JSON: nested too deeply"),
        (
            [json.dumps({"cancel_request_id": "x" * 257}).encode()],
            "cancel_request_id has 257 characters: allowed 1..256",
        ),
    ],
)
def test_malformed_request_json_is_refused(engine, request_json, message):
    loop = make_loop(engine)
    sent = []
    assert (
        loop.iterate([Arrival(handle=1, key=1, new=True, request_json=request_json, text_embeds=text(1))], sent.append)
        == []
    )
    assert [(event.code, event.message) for event in sent] == [("INVALID_ARG", message)]


def test_a_cancel_reaches_the_request_on_whichever_instance_holds_it(engine, tmp_path):
    """Two DiT instances share one registry: a cancel landing on either instance finds the
    request on the other; finished and unknown ids are told apart as with one instance."""
    first = Client(make_loop(engine, registry=Registry(tmp_path, "h3_dit_0")))
    second = Client(make_loop(engine, registry=Registry(tmp_path, "h3_dit_1")))
    first.send("on-first", steps=6, seed=1)
    first.send("done-first", steps=1, seed=2)
    second.send("on-second", steps=6, seed=3)
    first.iterate()
    second.iterate()
    second.cancel("on-first")
    second.cancel("done-first")
    first.cancel("on-second")
    first.cancel("nowhere")
    second.iterate()  # on-second takes its step 2 before first answers the cancel for it
    first.iterate()
    second.iterate()
    answers = [(e.request_id, e.state) for e in first.events + second.events if isinstance(e, CancelAnswer)]
    assert sorted(answers) == [
        ("done-first", "finished"),
        ("nowhere", "unknown"),
        ("on-first", "cancelled"),
        ("on-second", "cancelled"),
    ]
    assert first.of("on-first", Ended)[0].message == "request on-first cancelled by request at step 1 of 6"
    assert second.of("on-second", Ended)[0].message == "request on-second cancelled by request at step 2 of 6"
    second.send("nowhere", steps=1, seed=4)  # remembered by the registry, honoured on the other instance
    second.iterate()
    assert second.of("nowhere", Ended)[0].message == "request nowhere was cancelled before it started (step 0 of 1)"


def test_an_id_running_on_one_instance_is_refused_on_the_other(engine, tmp_path):
    first = Client(make_loop(engine, registry=Registry(tmp_path, "h3_dit_0")))
    second = Client(make_loop(engine, registry=Registry(tmp_path, "h3_dit_1")))
    first.send("twice", steps=3, seed=1)
    first.iterate()
    second.send("twice", steps=3, seed=1)
    (refused,) = second.iterate()
    assert (refused.code, refused.message) == (
        "INVALID_ARG",
        "request id 'twice' is already running; ids must be unique",
    )


def test_a_cancel_landing_during_the_last_step_wins_over_the_result(engine, tmp_path, monkeypatch):
    """The canceller is told "cancelled", so the request ends CANCELLED, not with its result;
    its co-batched neighbour still gets its solo output."""
    first = Client(make_loop(engine, registry=Registry(tmp_path, "h3_dit_0")))
    second = Registry(tmp_path, "h3_dit_1")
    first.send("racer", steps=2, seed=5)
    first.send("neighbour", steps=2, seed=6)
    first.iterate()
    forward, answers = first.loop.forward, []

    def forward_with_a_cancel(jobs):
        answers.append(second.cancel("racer"))  # lands after the step boundary, during the step
        return forward(jobs)

    monkeypatch.setattr(first.loop, "forward", forward_with_a_cancel)
    first.iterate()
    assert answers == ["cancelled"] and not first.of("racer", Result)
    assert first.of("racer", Ended)[0].message == "request racer cancelled by request at step 2 of 2"
    assert_solo(engine, first.of("neighbour", Result)[0], 2, 6)
    assert second.cancel("racer") == "finished"


@pytest.mark.parametrize(
    "request_id, parameters, settings, message",
    [
        ("x" * 257, {}, {}, "request id has 257 characters: allowed 1..256"),
        (
            "prio",
            {"request_priority": 101},
            {},
            "request_priority=101 is out of range: allowed -100..100 (priority_max)",
        ),
        (
            "prio",
            {"request_priority": -3},
            {"priority_max": 2},
            "request_priority=-3 is out of range: allowed -2..2 (priority_max)",
        ),
    ],
)
def test_ids_and_priorities_are_bounded(engine, request_id, parameters, settings, message):
    client = Client(make_loop(engine, **settings))
    client.send(request_id, steps=1, parameters=parameters)
    (refused,) = client.iterate()
    assert (refused.code, refused.message) == ("INVALID_ARG", message)


def test_native_cancellation_is_asked_only_of_live_jobs_at_their_step_boundary(engine):
    """Asking Triton 2.51 whether a request is cancelled after its final response crashes the
    server, so the loop asks only for the requests of live jobs, before their step."""
    client, asked = Client(make_loop(engine)), []
    client.send("native", steps=5, seed=1)
    client.iterate()
    arrival = next(iter(client.live.values()))
    arrival.is_cancelled = lambda: asked.append("native") or True
    client.cancel("someone")  # a control request: never asked
    client.iterate()
    assert asked == ["native"] and not client.live
    (ended,) = client.of("native", Ended)
    assert ended.message == "request native cancelled by the client at step 1 of 5"
