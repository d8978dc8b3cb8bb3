"""h3_dit's executes without a server (h3_core.serving.dit.step_loop): how many steps an execute
takes (execute_budget_s, lockstep, announcements), when newcomers, cancels, deadlines and drains
act, heartbeats, and request mode's stop at a step boundary; on a fake clock, every result
compared with its solo run (torch.equal)."""

import pytest

from h3_core.serving.dit.announcements import ANNOUNCED_TRANSIT_S
from h3_core.serving.dit.events import CancelAnswer, Ended, Heartbeat, Result
from h3_core.serving.shared.registry import Registry
from tests.step_loop_harness import (
    Client,
    Clock,
    assert_solo,
    make_loop,
    timed_forwards,
    tiny_engine,
)


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


# -- several steps per execute (execute_budget_s) ----------------------------------------------


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
