"""A fault in the step loop costs only its own request (h3_core.serving.dit.step_loop): a
non-finite step found after the next launch, a send or a registry call that raises, a refused
request; and max_batch_rows beyond what the compiled DiT indexes is refused. Neighbours' results
are compared with their solo runs (torch.equal)."""

import logging

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion.engine import Engine
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.serving.dit.events import Ended, Progress, Refused, Result
from h3_core.serving.shared.registry import Registry
from tests.step_loop_harness import (
    Client,
    Clock,
    assert_solo,
    live_ids,
    make_loop,
    timed_forwards,
    tiny_engine,
)


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


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
    finish, boundary = loop.registry.finish, loop.registry.publish_and_read_cancels
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
    monkeypatch.setattr(loop.registry, "publish_and_read_cancels", boundary_or_raise)
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
