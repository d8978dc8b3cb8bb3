"""h3_core.serving.dit.step_loop without a server: plain Arrivals in, events out, a fake clock.

Every request's final latents are compared with torch.equal to the same request run alone
(Engine.prepare + denoise_step + update), so co-batching, cancellation, failures and deadlines
are shown to cost a neighbour nothing."""

import json
import logging
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.serving.dit import admission
from h3_core.serving.dit.admission import VANISHED_EXECUTES
from h3_core.serving.dit.events import Arrival, CancelAnswer, Ended, Heartbeat, Progress, Refused, Result
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.step_loop import ANNOUNCED_TRANSIT_S, StepLoop
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings

TEXT_LEN = 3
TEXT_DIM = get_config("tiny").text_dim


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    return Engine(dit.eval(), None, None)


def text(seed: int) -> np.ndarray:
    """TEXT_EMBEDS float32 [1, TEXT_LEN, TEXT_DIM], seeded."""
    return torch.randn(1, TEXT_LEN, TEXT_DIM, generator=torch.Generator().manual_seed(seed)).numpy()


def fields(steps: int, seed: int, **extra) -> list[bytes]:
    return [
        json.dumps(
            {"height": 32, "width": 64, "num_frames": 5, "num_inference_steps": steps, "seed": seed, **extra}
        ).encode()
    ]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Client:
    """Stands for Triton: keeps every live request's Arrival, delivers them all each iteration
    (as the iterative sequence batcher does), collects events per request id."""

    def __init__(self, loop: StepLoop):
        self.loop, self.live, self.events, self.keys = loop, {}, [], iter(range(1, 10**6))

    def send(
        self,
        request_id: str,
        steps: int = 3,
        seed: int = 1,
        parameters: dict | None = None,
        text_embeds: np.ndarray | None = None,
        condition_latents: np.ndarray | None = None,
        **extra,
    ) -> str:
        """Queue a new request: REQUEST fields 64x32x5 unless extra overrides them (conditions=[...]
        with condition_latents float32 [1, N] for fl2va / ref2va), TEXT_EMBEDS float32
        [1, L, text_dim] (text(seed) unless given)."""
        key = next(self.keys)
        self.live[key] = Arrival(
            handle=key,
            key=key,
            request_id=request_id,
            new=True,
            request_json=fields(steps, seed, **extra),
            text_embeds=text(seed) if text_embeds is None else text_embeds,
            condition_latents=condition_latents,
            parameters_json=json.dumps(parameters or {}),
        )
        return request_id

    def cancel(self, target: str) -> None:
        key = next(self.keys)
        self.live[key] = Arrival(
            handle=key,
            key=key,
            request_json=[json.dumps({"cancel_request_id": target}).encode()],
            text_embeds=np.zeros((1, 0, 0), np.float32),
        )

    def iterate(self, withhold: tuple = ()) -> list:
        sent = []
        arrivals = [arrival for key, arrival in self.live.items() if key not in withhold]
        reschedule = self.loop.iterate(arrivals, sent.append)
        for key in list(self.live):
            if key in withhold:
                continue
            if key in reschedule:
                self.live[key].new = False
            else:
                del self.live[key]
        self.events += sent
        return sent

    def run(self, limit: int = 50) -> None:
        for _ in range(limit):
            if not self.live:
                return
            self.iterate()
        raise AssertionError("requests still live")

    def of(self, request_id: str, kind=object) -> list:
        return [
            event
            for event in self.events
            if isinstance(event, kind) and getattr(event, "request_id", None) == request_id
        ]


def live_ids(registry: Registry) -> list[str]:
    """The request ids the registry holds live, on any instance."""
    with registry._thread_lock:
        return [row[0] for row in registry._db.execute("SELECT request_id FROM live ORDER BY request_id")]


def make_loop(engine, clock=None, registry=None, **settings) -> StepLoop:
    """A loop with its own registry folder unless one is given (instances of one server share one).
    One step per iterate unless execute_budget_s is given: the fake clock stands still, so any
    budget would let an execute run its requests to completion."""
    registry = registry or Registry(Path(tempfile.mkdtemp()), "i0")
    settings = {"max_steps": 20, "execute_budget_s": 0.0, **settings}
    return StepLoop(engine, DitSettings(**settings), registry, MetricsRecord(), clock or Clock())


def solo_latents(engine, steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    (state,) = engine.prepare(GenerationRequest("-", 32, 64, 5, steps, seed=seed), torch.from_numpy(text(seed)[0]))
    while not state.finished:
        engine.update(state, engine.denoise_step([state])[0])
    return L.unpatchify_video(state.video_latents, state.layout), L.audio_rows_to_latent(
        state.audio_latents, state.layout
    )


def assert_solo(engine, result: Result, steps: int, seed: int) -> None:
    video, audio = solo_latents(engine, steps, seed)
    assert torch.equal(result.video_latent, video) and torch.equal(result.audio_latent, audio)


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
            "REQUEST field 'colour' is unknown; allowed: ['conditions', 'encode_seconds', 'geometry', 'height', "
            "'num_frames', 'num_inference_steps', 'num_outputs', 'outside_training', 'received_unix_s', 'seed', "
            "'task', 'vision_spans', 'width'], or "
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


# -- several steps per execute (execute_budget_s) ----------------------------------------------


def timed_forwards(monkeypatch, loop: StepLoop, clock: Clock, before=None, seconds: float = 1.0) -> list:
    """Make every packed forward of `loop` take `seconds` (1 s: steps in lockstep,
    OVERLAP_MAX_STEP_S) on the fake clock. Returns the log of forwards, (clock at its start,
    request ids of its pack) each; before(n), if given, runs at the start of the n-th forward
    (n from 0)."""
    forward, log = loop.forward, []

    def timed(jobs):
        if before is not None:
            before(len(log))
        log.append((clock.now, [job.request_id for job in jobs]))
        clock.now += seconds
        return forward(jobs)

    monkeypatch.setattr(loop, "forward", timed)
    return log


def test_an_execute_takes_steps_while_they_fit_its_budget(engine, monkeypatch):
    """1 s steps, execute_budget_s 2.5: another step starts while the time since the execute
    began plus the last step's stays below 2.5 s, so an execute takes 2 steps: 3 executes for
    5 steps, progress after each step as it happens, the solo result."""
    clock = Clock()
    client = Client(make_loop(engine, clock, execute_budget_s=2.5))
    timed_forwards(monkeypatch, client.loop, clock)
    client.send("lone", steps=5, seed=1, parameters={"progress_every": 1})
    per_execute = []
    while client.live:
        per_execute.append([(type(e).__name__, getattr(e, "step", None)) for e in client.iterate()])
    assert per_execute == [
        [("Progress", 1), ("Progress", 2)],
        [("Progress", 3), ("Progress", 4)],
        [("Progress", 5), ("Result", None)],
    ]
    assert client.loop.metrics.observed["h3_step_seconds"] == [1.0] * 5
    assert_solo(engine, client.of("lone", Result)[0], 5, 1)


def test_short_steps_overlap_long_steps_run_in_lockstep(engine, monkeypatch):
    """10 ms steps (below OVERLAP_MAX_STEP_S), 25 ms budget: 2 steps an execute. After the first
    step (in lockstep: no step time is known yet), each step is launched before the previous one
    settles, and the step launched last settles before the execute returns. Events are those
    of lockstep: one progress per settled step for the watched job (the quiet one gets no
    heartbeat: heartbeat_s is far off), then the solo results."""
    clock = Clock()
    loop = make_loop(engine, clock, execute_budget_s=0.025)
    client, order = Client(loop), []
    timed_forwards(monkeypatch, loop, clock, before=lambda n: order.append(f"launch {n + 1}"), seconds=0.01)
    settle = loop.settle
    monkeypatch.setattr(
        loop, "settle", lambda flight, send: (flight and order.append("settle")) or settle(flight, send)
    )
    client.send("watched", steps=4, seed=1, parameters={"progress_every": 1})
    client.send("quiet", steps=4, seed=2)
    per_execute = []
    while client.live:
        sent = client.iterate()
        order.append("returns")
        per_execute.append([(type(e).__name__, e.request_id, getattr(e, "step", None)) for e in sent])
    assert order == ["launch 1", "settle", "launch 2", "settle", "returns"] + [
        "launch 3",
        "launch 4",
        "settle",
        "settle",
        "returns",
    ]
    assert per_execute == [
        [("Progress", "watched", 1), ("Progress", "watched", 2)],
        [
            ("Progress", "watched", 3),
            ("Progress", "watched", 4),
            ("Result", "watched", None),
            ("Result", "quiet", None),
        ],
    ]
    # a step's seconds run from its launch, or the previous settling if later, to its settling;
    # the fake forward spends its 10 ms on the host while launching, so step 3 settles after
    # step 4's launch (20 ms) and step 4 at once: the sum is the time spent stepping
    assert loop.metrics.observed["h3_step_seconds"] == pytest.approx([0.01, 0.01, 0.02, 0.0], abs=1e-9)
    assert_solo(engine, client.of("watched", Result)[0], 4, 1)
    assert_solo(engine, client.of("quiet", Result)[0], 4, 2)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_a_non_finite_step_found_after_the_next_launch_fails_only_its_request(engine, monkeypatch, attention):
    """Steps overlap: the "nan" fault's step 1 settles after step 2 was launched with the
    offender in the pack. The offender ends at step 1 (its later launch is discarded); its
    non-finite velocity was applied as zero, so nothing non-finite entered step 2, where flex
    attention's masked softmax would have carried it into the neighbour's rows. The neighbour
    keeps its solo result."""
    if attention == "flex":
        dit = H3DiT(get_config("tiny"), row_tile=64, attention_backend="flex")
        init_weights(dit, 0)
        engine = Engine(dit.eval(), None, None)
    clock = Clock()
    client = Client(make_loop(engine, clock, execute_budget_s=0.025, allow_fault_injection=True))
    log = timed_forwards(monkeypatch, client.loop, clock, seconds=0.01)
    client.send("good", steps=5, seed=8)
    client.iterate()  # 2 steps: the step time is known, steps overlap from here
    client.send("bad", steps=3, seed=9, parameters={"inject_fault": "nan"})
    client.run()
    assert [sorted(ids) for _, ids in log] == [["good"]] * 2 + [["bad", "good"]] * 2 + [["good"]]
    (ended,) = client.of("bad", Ended)
    assert (ended.code, ended.message, ended.step) == (
        "INTERNAL",
        "denoise step 1 failed: non-finite velocity for request bad",
        0,
    )
    assert_solo(engine, client.of("good", Result)[0], 5, 8)
    assert client.loop.metrics.values["h3_failures_total"] == 1


def test_a_send_that_raises_fails_only_its_request(engine, monkeypatch, caplog):
    """Sending y's step-2 progress raises (as Triton may for a response it refuses) while x's
    last step is in flight behind it: y alone ends, with a final INTERNAL response naming the
    cause (logged); the execute goes on, the step in flight settles in it and x gets its solo
    result; nothing is left in the loop or the registry."""
    clock = Clock()
    loop = make_loop(engine, clock, execute_budget_s=100.0)
    client = Client(loop)
    log = timed_forwards(monkeypatch, loop, clock, seconds=0.01)
    client.send("x", steps=3, seed=1)
    client.send("y", steps=5, seed=2, parameters={"progress_every": 1})
    iterate = loop.iterate

    def refusing_y_at_step_2(arrivals, send):
        def send_or_raise(event):
            if isinstance(event, Progress) and (event.request_id, event.step) == ("y", 2):
                raise RuntimeError("response refused")
            send(event)

        return iterate(arrivals, send_or_raise)

    monkeypatch.setattr(loop, "iterate", refusing_y_at_step_2)
    with caplog.at_level(logging.ERROR, logger="h3_dit"):
        client.run()
    assert [ids for _, ids in log] == [["x", "y"]] * 3  # y's third step was discarded
    assert loop.in_flight is None and not loop.jobs and live_ids(loop.registry) == []
    (ended,) = client.of("y", Ended)
    assert (ended.code, ended.message, ended.step) == (
        "INTERNAL",
        "the progress response of request y could not be sent: RuntimeError: response refused",
        3,
    )
    assert "request y: the progress response of request y could not be sent" in caplog.text
    assert [e.step for e in client.of("y", Progress)] == [1]
    assert_solo(engine, client.of("x", Result)[0], 3, 1)
    assert loop.metrics.values["h3_failures_total"] == 1


def test_a_registry_call_that_raises_fails_only_its_request(engine, monkeypatch, caplog):
    """The registry raises when b's end is recorded, when a cancel is recorded, and once when
    an execute reads the cancels: b ends with INTERNAL, the cancel request is refused with
    INTERNAL, the execute whose read failed steps on; a runs to its solo result."""
    loop = make_loop(engine)
    client = Client(loop)
    finish, boundary = loop.registry.finish, loop.registry.boundary
    boundary_failures = [RuntimeError("database is locked")]

    def finish_or_raise(request_id, load=None):
        if request_id == "b":
            raise RuntimeError("disk I/O error")
        return finish(request_id, load)

    def boundary_or_raise(request_ids, load):
        if boundary_failures:
            raise boundary_failures.pop()
        return boundary(request_ids, load)

    def cancel_or_raise(request_id):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(loop.registry, "finish", finish_or_raise)
    monkeypatch.setattr(loop.registry, "boundary", boundary_or_raise)
    monkeypatch.setattr(loop.registry, "cancel", cancel_or_raise)
    client.send("a", steps=3, seed=1)
    client.send("b", steps=2, seed=2)
    client.cancel("a")
    with caplog.at_level(logging.ERROR, logger="h3_dit"):
        client.run()
    assert not boundary_failures and len(loop.metrics.observed["h3_step_seconds"]) == 3
    (refused,) = [e for e in client.events if isinstance(e, Refused)]
    assert (refused.code, refused.message) == (
        "INTERNAL",
        "the cancel of request a could not be recorded (RuntimeError: database is locked); see the server log",
    )
    (ended,) = client.of("b", Ended)
    assert (ended.code, ended.message, ended.step) == (
        "INTERNAL",
        "request b could not be recorded as finished: RuntimeError: disk I/O error",
        2,
    )
    assert not client.of("b", Result) and not loop.jobs
    assert_solo(engine, client.of("a", Result)[0], 3, 1)
    for line in (
        "the registry's cancels could not be read",
        "the cancel of request a could not be recorded",
        "request b: the registry could not record its end",
    ):
        assert line in caplog.text


def test_a_newcomer_joins_at_the_first_step_of_the_next_execute(engine, monkeypatch):
    """A newcomer that reaches Triton while an execute runs (here 100-102 s) is delivered with
    the next one and packed at its first step boundary (102 s): unannounced (a direct call of
    h3_dit; h3_encoder announces those it passes on, see below) it waited at most that execute's
    2 s, within the 2.5 s budget. Both equal their solo runs."""
    clock = Clock()
    client = Client(make_loop(engine, clock, execute_budget_s=2.5))
    log = timed_forwards(monkeypatch, client.loop, clock)
    client.send("first", steps=6, seed=1)
    client.iterate()
    client.send("newcomer", steps=3, seed=2)  # Triton queued it while the execute ran
    client.run()
    assert log == [
        (100.0, ["first"]),
        (101.0, ["first"]),
        (102.0, ["newcomer", "first"]),
        (103.0, ["newcomer", "first"]),
        (104.0, ["newcomer", "first"]),
        (105.0, ["first"]),
    ]
    (newcomer,) = client.of("newcomer", Result)
    assert newcomer.info["largest_pack"] == 2
    assert_solo(engine, newcomer, 3, 2)
    assert_solo(engine, client.of("first", Result)[0], 6, 1)


def test_deadlines_native_cancels_and_draining_act_at_every_step_boundary_of_an_execute(engine, monkeypatch):
    clock = Clock()
    client = Client(make_loop(engine, clock, execute_budget_s=100.0))
    timed_forwards(monkeypatch, client.loop, clock, before=lambda n: n == 2 and client.loop.start_draining())
    client.send("late", steps=10, seed=1, parameters={"deadline_s": 1.5})
    native = client.send("native", steps=10, seed=2)
    client.send("drained", steps=10, seed=3)
    asked = []
    next(a for a in client.live.values() if a.request_id == native).is_cancelled = lambda: (
        asked.append(clock.now) or clock.now >= 102.0
    )
    client.iterate()  # one execute ends all three
    assert not client.live and asked == [100.0, 101.0, 102.0]
    assert [(e.request_id, e.message) for e in client.events if isinstance(e, Ended)] == [
        ("late", "request late deadline of 1.5 s expired at step 2 of 10"),
        ("native", "request native cancelled by the client at step 2 of 10"),
        ("drained", "request drained cancelled because the server is shutting down at step 3 of 10"),
    ]


def test_cancels_by_id_take_effect_at_the_first_step_boundary_of_the_next_execute(engine, monkeypatch, tmp_path):
    """A control request reaches the DiT only between executes (Triton delivers it with the
    next one), and a cancel that landed on another instance is read from the registry once per
    execute. A control request sent straight to h3_dit, queued during an execute, is not
    announced: its target runs the execute's second step (2.5 s budget) and leaves at the first
    boundary of the next one. A cancel recorded elsewhere (another instance; h3_cancel and h3_vae
    record theirs the same way) is announced: the execute ends after the step in flight, and its
    target leaves at the first boundary of the next one."""
    clock = Clock()
    client = Client(make_loop(engine, clock, registry=Registry(tmp_path, "h3_dit_0"), execute_budget_s=2.5))
    other = Registry(tmp_path, "h3_dit_1")
    log = timed_forwards(monkeypatch, client.loop, clock, before=lambda n: n == 2 and other.cancel("elsewhere"))
    client.send("here", steps=10, seed=1)
    client.iterate()
    assert len(log) == 2 and not client.of("here", Ended)
    client.cancel("here")  # Triton queued it while the execute ran
    client.iterate()
    assert not client.live and len(log) == 2
    client.send("elsewhere", steps=10, seed=2)
    client.iterate()
    assert len(log) == 3 and not client.of("elsewhere", Ended)  # the other instance's cancel ended it
    client.iterate()
    assert not client.live and len(log) == 3
    assert [(e.request_id, e.state) for e in client.events if isinstance(e, CancelAnswer)] == [("here", "cancelled")]
    assert [(e.request_id, e.message) for e in client.events if isinstance(e, Ended)] == [
        ("here", "request here cancelled by request at step 2 of 10"),
        ("elsewhere", "request elsewhere cancelled by request at step 1 of 10"),
    ]


def test_an_execute_takes_one_step_while_triton_withholds_a_live_job(engine, monkeypatch):
    """Absences are counted per execute, so while a job is withheld every execute takes one
    step and the job is dropped after VANISHED_EXECUTES steps, as with one step per execute."""
    clock = Clock()
    client = Client(make_loop(engine, clock, execute_budget_s=2.5))
    log = timed_forwards(monkeypatch, client.loop, clock)
    client.send("kept", steps=10, seed=1)
    client.send("gone", steps=10, seed=2)
    gone = next(key for key, arrival in client.live.items() if arrival.request_id == "gone")
    client.iterate()
    steps_per_execute = [len(log)]
    while client.live.keys() - {gone}:
        before = len(log)
        client.iterate(withhold=(gone,))
        steps_per_execute.append(len(log) - before)
    assert steps_per_execute == [2, 1, 1, 2, 2, 2] and gone not in {job.key for job in client.loop.jobs.values()}
    assert_solo(engine, client.of("kept", Result)[0], 10, 1)


# -- several steps per execute while nothing is announced (h3_core.serving.shared.registry) -------------------


def steps_per_execute(client: Client, log: list, executes: int) -> list[int]:
    """Run `executes` iterates; the forwards each took."""
    counts = []
    for _ in range(executes):
        before = len(log)
        client.iterate()
        counts.append(len(log) - before)
    return counts


def test_an_announcement_ends_the_execute_after_the_step_in_flight(engine, monkeypatch, tmp_path):
    """1 s steps, a 100 s budget. With nothing announced one execute runs a lone request to its
    end (5 steps). An announcement made during the third step of the next request's execute
    (h3_encoder passing a request on) ends it after that step; the announced newcomer arrives
    with the next execute, which packs it at its first step and, with nothing more announced,
    runs on to the end. Results equal the solo runs."""
    clock = Clock()
    registry, encoder = Registry(tmp_path, "h3_dit_0", clock), Registry(tmp_path, "", clock)
    client = Client(make_loop(engine, clock, registry=registry, execute_budget_s=100.0))
    log = timed_forwards(monkeypatch, client.loop, clock, before=lambda n: n == 7 and encoder.announce())
    client.send("lone", steps=5, seed=3)
    assert steps_per_execute(client, log, 1) == [5] and client.of("lone", Result)
    client.send("first", steps=10, seed=1)
    assert steps_per_execute(client, log, 1) == [3]  # steps 1-3 of first; the announcement came in step 3
    client.send("newcomer", steps=2, seed=2)  # Triton queued it while that execute ran
    assert steps_per_execute(client, log, 1) == [7] and not client.live
    assert log[5:] == [
        (105.0, ["first"]),
        (106.0, ["first"]),
        (107.0, ["first"]),  # the announcement: the execute ends after this step
        (108.0, ["newcomer", "first"]),
        (109.0, ["newcomer", "first"]),
        (110.0, ["first"]),
        (111.0, ["first"]),
        (112.0, ["first"]),
        (113.0, ["first"]),
        (114.0, ["first"]),
    ]
    assert_solo(engine, client.of("lone", Result)[0], 5, 3)
    assert_solo(engine, client.of("first", Result)[0], 10, 1)
    assert_solo(engine, client.of("newcomer", Result)[0], 2, 2)


def test_an_announced_request_still_on_its_way_holds_executes_to_one_step(engine, monkeypatch, tmp_path):
    """A request announced just before an execute starts may reach Triton just after it handed
    the execute its requests: while an announcement is unmatched by a newcomer and younger than
    ANNOUNCED_TRANSIT_S (the registry's clock stands still here), every execute takes one step;
    once it is that old it is written off (it went to another instance, or never came) and the
    execute runs on within its budget."""
    clock, registry_clock = Clock(), Clock()
    registry, encoder = Registry(tmp_path, "h3_dit_0", registry_clock), Registry(tmp_path, "", registry_clock)
    client = Client(make_loop(engine, clock, registry=registry, execute_budget_s=100.0))
    log = timed_forwards(monkeypatch, client.loop, clock, before=lambda n: n == 1 and encoder.announce())
    client.send("first", steps=20, seed=1)
    assert steps_per_execute(client, log, 3) == [2, 1, 1]
    registry_clock.now += 2 * ANNOUNCED_TRANSIT_S
    assert steps_per_execute(client, log, 1) == [16] and not client.live
    assert_solo(engine, client.of("first", Result)[0], 20, 1)


def test_max_batch_rows_beyond_the_compiled_dit_is_refused(monkeypatch):
    # compile_blocks bounds a pack by the int32 index range of its widest intermediate
    dit = H3DiT(get_config("tiny"), row_tile=0)
    dit.compile_blocks()
    cfg = get_config("tiny")
    assert dit.max_compiled_rows == (2**31 - 1) // max(2 * cfg.ffn_size, 3 * cfg.attn_width)
    monkeypatch.setattr(dit, "max_compiled_rows", 4096)
    engine = Engine(dit, None, None)
    make_loop(engine, max_batch_rows=4096)  # at the bound: accepted
    with pytest.raises(
        ValueError,
        match=r"^h3_dit parameter max_batch_rows=4160 is out of range: "
        r"the compiled DiT takes at most 4096 rows a step$",
    ):
        make_loop(engine, max_batch_rows=4160)
    x = torch.zeros(4160, cfg.hidden_size)
    with pytest.raises(ValueError, match=r"^a pack of 4,160 rows exceeds the compiled blocks' 4,096 rows \(int32"):
        dit.transformer(x, None, None, None, None, None, None)


# -- reliability round 3 ------------------------------------------------------------------------


def test_a_refused_request_leaves_no_id_behind(engine, tmp_path):
    """The scheduler is full (one place): newcomers are refused with UNAVAILABLE and leave no id
    in the registry or the loop. A cancel of one answers "unknown" (so a request with that id
    that arrives within EARLY_CANCEL_SECONDS ends before it starts); the other, retried once the
    place is free, is admitted and runs to its solo result."""
    registry = Registry(tmp_path, "h3_dit_0")
    client = Client(make_loop(engine, registry=registry, max_num_seqs=1, max_waiting=0))
    client.send("holder", steps=5, seed=1)
    client.iterate()
    client.send("retried", steps=2, seed=2)
    client.send("cancelled-later", steps=2, seed=3)
    refusals = [(event.code, event.message) for event in client.iterate() if isinstance(event, Refused)]
    full = "the DiT holds 1 requests, its capacity max_num_seqs + max_waiting = 1 + 0; retry later"
    assert refusals == [("UNAVAILABLE", full)] * 2
    assert live_ids(registry) == ["holder"] and [job.request_id for job in client.loop.jobs.values()] == ["holder"]
    assert [job.request_id for job in client.loop.scheduler.jobs] == ["holder"]
    assert Registry(tmp_path, "h3_dit_1").cancel("cancelled-later") == "unknown"
    client.run()  # the holder finishes
    client.send("retried", steps=2, seed=2)
    client.run()
    client.send("cancelled-later", steps=2, seed=3)
    client.run()
    assert_solo(engine, client.of("retried", Result)[0], 2, 2)
    (ended,) = client.of("cancelled-later", Ended)
    assert ended.message == "request cancelled-later was cancelled before it started (step 0 of 2)"
    assert live_ids(registry) == [] and not client.loop.jobs and not client.loop.scheduler.jobs


def test_a_silent_job_gets_a_heartbeat_after_heartbeat_s_of_silence_not_every_step(engine, monkeypatch):
    """heartbeat_s 10, 4 s steps on the fake clock, one step per execute. A job that asked for
    no progress hears nothing at its first two steps, then a heartbeat at the first answer pass
    10 s or more after its arrival (112 s: 12 s, within heartbeat_s plus one step) and again 12 s
    after that; a job with progress every step gets no heartbeat; a job waiting behind a full
    pack gets them too (h3_vae notices its gone client the same way)."""
    clock = Clock()
    client = Client(make_loop(engine, clock, heartbeat_s=10.0, max_num_seqs=2))
    timed_forwards(monkeypatch, client.loop, clock, seconds=4.0)
    client.send("silent", steps=8, seed=1)
    client.send("chatty", steps=8, seed=2, parameters={"progress_every": 1})
    client.send("waiting", steps=1, seed=3, parameters={"request_priority": -1})
    heard = []
    while client.live:
        heard += [(clock.now, type(e).__name__, e.request_id) for e in client.iterate() if hasattr(e, "request_id")]
    assert [(now, request_id) for now, kind, request_id in heard if kind == "Heartbeat"] == [
        (112.0, "silent"),
        (112.0, "waiting"),
        (124.0, "silent"),
        (124.0, "waiting"),
    ]
    assert [now for now, kind, request_id in heard if request_id == "chatty"] == [104.0 + 4 * i for i in range(8)] + [
        132.0
    ]
    assert [(now, kind) for now, kind, request_id in heard if request_id != "chatty" and kind == "Result"] == [
        (132.0, "Result"),
        (136.0, "Result"),
    ]


def test_steps_longer_than_the_budget_still_take_two_per_execute(engine, monkeypatch, tmp_path):
    """execute_budget_s 0.5 s, 1 s steps: with nothing announced an execute takes
    MIN_EXECUTE_STEPS (2) steps, not one, so the Triton round trip is paid once for two. The
    cancel latency it costs, in steps the target starts after its cancel reached Triton: a
    control request sent straight to h3_dit (unannounced) that comes during an execute's first
    step is delivered with the next execute, so the target takes the step in flight and one more
    (with one step an execute it took only the one in flight); a cancel recorded elsewhere (another
    instance, h3_cancel, h3_vae) is announced and ends the execute after the step in flight."""
    clock = Clock()
    client = Client(make_loop(engine, clock, registry=Registry(tmp_path, "h3_dit_0"), execute_budget_s=0.5))
    other, cancels = Registry(tmp_path, "h3_dit_1"), {}

    def before(n):
        if n == 2:  # during the first step of the second execute: a client's cancel reaches Triton
            cancels["here"] = clock.now
        if n == 6:  # during the first step of another execute: another instance takes a cancel
            cancels["elsewhere"] = clock.now
            other.cancel("elsewhere")

    log = timed_forwards(monkeypatch, client.loop, clock, before=before)
    client.send("here", steps=10, seed=1)
    assert steps_per_execute(client, log, 2) == [2, 2]
    client.cancel("here")  # delivered with the next execute
    assert steps_per_execute(client, log, 1) == [0] and not client.live
    client.send("elsewhere", steps=10, seed=2)
    assert steps_per_execute(client, log, 3) == [2, 1, 0] and not client.live
    started_since = {rid: sum(1 for t, ids in log if rid in ids and t >= at) for rid, at in cancels.items()}
    assert started_since == {"here": 2, "elsewhere": 1}
    assert [(e.request_id, e.message) for e in client.events if isinstance(e, Ended)] == [
        ("here", "request here cancelled by request at step 4 of 10"),
        ("elsewhere", "request elsewhere cancelled by request at step 3 of 10"),
    ]


@pytest.mark.parametrize(
    "stop, message",
    [
        ("cancel", "request r cancelled by request at step 3 of 10"),
        ("native", "request r cancelled by the client at step 3 of 10"),
        ("deadline", "request r deadline of 2.5 s expired at step 3 of 10"),
        ("drain", "request r cancelled because the server is shutting down at step 3 of 10"),
    ],
)
def test_request_mode_stops_at_the_step_boundary_after_a_cancel_deadline_or_drain(
    engine, monkeypatch, tmp_path, stop, message
):
    """Execution mode "request" runs a request to completion inside one execute, where no
    control request can reach it; each of its step boundaries is checked as in step mode. A
    cancel recorded in the registry during step 3 (by another DiT instance, the only way one
    reaches a busy instance), the client's native cancel, a 2.5 s deadline (1 s steps), or a
    drain begun during step 3 ends it at the boundary after step 3: CANCELLED, no result. Both
    it and the request waiting behind it get a heartbeat meanwhile (after step 2: heartbeat_s
    1.5), so h3_vae can notice their gone clients; then the waiting one runs."""
    clock = Clock()
    loop = make_loop(engine, clock, registry=Registry(tmp_path, "h3_dit_0"), execution_mode="request", heartbeat_s=1.5)
    client, other = Client(loop), Registry(tmp_path, "h3_dit_1")

    def before(n):
        if n == 2:
            if stop == "cancel":
                assert other.cancel("r") == "cancelled"
            elif stop == "drain":
                loop.start_draining()

    log = timed_forwards(monkeypatch, loop, clock, before=before)
    client.send("r", steps=10, seed=1, parameters={"deadline_s": 2.5} if stop == "deadline" else {})
    client.send("next", steps=2, seed=2, parameters={"request_priority": -1})
    arrival = next(a for a in client.live.values() if a.request_id == "r")
    arrival.is_cancelled = lambda: stop == "native" and clock.now >= 103.0
    client.iterate()
    assert [ids for _, ids in log] == [["r"]] * 3
    (ended,) = client.of("r", Ended)
    assert (ended.code, ended.message) == ("CANCELLED", message) and not client.of("r", Result)
    assert [e.request_id for e in client.events if isinstance(e, Heartbeat)] == ["r", "next"]
    client.run()
    if stop == "drain":
        assert client.of("next", Ended)[0].message.startswith("request next cancelled because the server is shutting")
    else:
        assert_solo(engine, client.of("next", Result)[0], 2, 2)


def test_planning_covers_only_the_jobs_triton_delivered_in_the_execute(engine, monkeypatch):
    # A planning failure of a withheld job answered its old handle (Triton has it no more; seen
    # to crash the server), and a withheld job's planning is GPU work for a job not stepped here.
    client = Client(make_loop(engine))
    client.send("delivered", steps=5, seed=1)
    client.send("withheld", steps=5, seed=2)
    client.iterate()
    withheld = next(key for key, arrival in client.live.items() if arrival.request_id == "withheld")
    job, planned, original = client.loop.jobs[withheld], [], engine.plan_step

    def plan_step(states):
        planned.append(list(states))
        if states is job.states:
            raise RuntimeError("planning failed")
        return original(states)

    monkeypatch.setattr(engine, "plan_step", plan_step)
    sent = client.iterate(withhold=(withheld,))
    assert [event.handle for event in sent] == [event.handle for event in sent if event.handle != withheld]
    withheld_states = {id(state) for state in job.states}
    assert planned and not any(id(state) in withheld_states for states in planned for state in states)
    sent = client.iterate()  # delivered again: its planning fails on its own handle
    (ended,) = [event for event in sent if event.handle == withheld]
    assert isinstance(ended, Ended) and (ended.code, ended.message) == (
        "INTERNAL",
        "planning step 2 failed: RuntimeError: planning failed",
    )
    assert withheld not in client.loop.jobs
