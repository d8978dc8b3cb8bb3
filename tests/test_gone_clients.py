"""End-to-end (issue 13, part 3): work for a client that is gone stops within a bounded number of
steps. Triton 2.51 never tells h3_dit that an ensemble request's client left; h3_vae sees every
later response of that request marked cancelled (h3_dit sends each live request a response every
iteration: progress, result or heartbeat) and cancels it by id (docs/reliability.md).

Three client processes stream a long request each (raw tritonclient, progress every step, the
step printed as it arrives) and are killed; each request's one log line at its end names the
step it reached. Bound: GONE_BOUND_STEPS steps after the last step its client saw. The clips are
128 x 128 x 121 frames, so that a packed step of the three (about 0.1 s or more on the CPU) is
long against the way back from h3_vae to h3_dit (a few ms); with much faster steps the bound
holds in time (a few of those round trips), not in steps. With h3_dit's executes allowed to take
steps for 20 s (execute_budget_s), h3_vae records each cancel in the registry
(h3_core.serving.shared.registry.record_cancel), which announces it and so ends the execute in flight
after its step; the clients are killed one after another and each is noticed at a later
response of its request, so each cancel may end an execute of its own and every other client's
cancel before this one may hold it back one more step: the bound is GONE_BOUND_STEPS plus the
number of clients (a missing announcement would leave the requests running for the whole 20 s,
a hundred steps and more). Request mode: tests/test_field_cases.py."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from .serving import ROOT, idle_metrics

# the step in flight to the client, the one running at detection, one more before the cancel lands,
# and one launched ahead while steps are short (h3_core.serving.dit.step_loop.OVERLAP_MAX_STEP_S)
GONE_BOUND_STEPS = 4
CLIENT = """
import sys, time, numpy as np, tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
def callback(result, error):
    if result is not None:
        print(int(result.as_numpy("PROGRESS").reshape(-1)[0]), flush=True)
c.start_stream(callback=callback)
inputs = []
for name, value, kind in (("PROMPT", np.array([[b"gone"]], dtype=object), "BYTES"),
                          ("NUM_INFERENCE_STEPS", np.array([[400]], dtype=np.int64), "INT64"),
                          ("HEIGHT", np.array([[128]], dtype=np.int64), "INT64"),
                          ("WIDTH", np.array([[128]], dtype=np.int64), "INT64"),
                          ("NUM_FRAMES", np.array([[121]], dtype=np.int64), "INT64")):
    tensor = g.InferInput(name, [1, 1], kind)
    tensor.set_data_from_numpy(value)
    inputs.append(tensor)
c.async_stream_infer("h3_pipeline", inputs, request_id=sys.argv[2], parameters={"progress_every": 1},
                     enable_empty_final_response=True)
time.sleep(600)
"""
ENDED = re.compile(r"request (gone-\d) ended CANCELLED: request \1 cancelled by request at step (\d+) of 400")


@pytest.fixture(params=["shipped", "execute_budget_s 20"])
def served(request):
    """(server, client, long_executes): the session's server, or the session's one whose h3_dit
    executes may take steps for 20 s (conftest's budget_server)."""
    if request.param == "shipped":
        return request.getfixturevalue("server"), request.getfixturevalue("client"), False
    return *request.getfixturevalue("budget_server"), True


def test_killed_clients_requests_leave_the_pack_within_the_bound(served):
    server, client, long_executes = served
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, server.grpc_url, f"gone-{i}"], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    seen = {}  # request id -> the last step its client saw
    for i, proc in enumerate(procs):
        while seen.get(f"gone-{i}", 0) < 3:  # wait for its third step
            seen[f"gone-{i}"] = int(proc.stdout.readline())
    for i, proc in enumerate(procs):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        seen[f"gone-{i}"] = max([seen[f"gone-{i}"]] + [int(line) for line in proc.stdout.read().split()])
    metrics = idle_metrics(server, timeout_s=60)
    assert (metrics["h3_active_requests"], metrics["h3_waiting_requests"]) == (0, 0)
    ended = {request_id: int(step) for request_id, step in ENDED.findall(server.log_text())}
    assert sorted(ended) == sorted(seen)
    bound = GONE_BOUND_STEPS + (len(procs) if long_executes else 0)
    for request_id, step in ended.items():
        assert step <= seen[request_id] + bound, (request_id, step, seen[request_id])
    (result,) = client.generate("after the gone ones", num_inference_steps=2, seed=1)  # the server is fine
    assert result.info["num_inference_steps"] == 2


class Cancels:
    """Stands in for the Registry: records each cancel, answers "cancelled", raises for "first"."""

    def __init__(self):
        self.ids = []

    def cancel(self, request_id: str) -> str:
        if request_id == "first":
            raise RuntimeError("database is locked")
        self.ids.append(request_id)
        return "cancelled"


def test_a_failing_cancel_is_logged_and_the_later_ones_are_still_made_with_logging_under_the_lock():
    from h3_core.serving.vae.gone_clients import GoneClients

    lock, lines, registry = threading.Lock(), [], Cancels()

    def log_line(text: str) -> None:
        assert lock.locked()  # every stub call runs under stub_lock
        lines.append(text)

    gone = GoneClients(registry, log_line, lock)
    for request_id in ("first", "second", "first", "", "third"):
        gone.cancel(request_id)
    gone.close()
    assert not gone.thread.is_alive()
    assert registry.ids == ["second", "third"]  # each id once
    assert lines[0].startswith("h3_vae: cancel of request first (client gone) failed:\nTraceback")
    assert lines[0].endswith(
        "CancelNotRecorded: the cancel of request first could not be recorded (RuntimeError: database is locked); "
        "see the server log\n"
    )
    assert lines[1:] == [
        "h3_vae: request second: its client is gone; cancel by id: cancelled",
        "h3_vae: request third: its client is gone; cancel by id: cancelled",
    ]


def test_forgotten_ids_are_cancelled_again():
    from h3_core.serving.vae.gone_clients import GoneClients

    lock, registry = threading.Lock(), Cancels()
    gone = GoneClients(registry, lambda text: None, lock)
    gone.cancel("again")
    gone.cancel("again")  # the same request seen gone twice: one cancel
    gone.forget("again")  # its request ended
    gone.cancel("again")  # a new request with the id, abandoned too
    gone.close()
    assert registry.ids == ["again", "again"]


def abandon(url: str, request_id: str) -> int:
    """Stream a 400-step request with progress every step, close the stream (cancel_requests) after
    its third step; returns the last step seen."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    from .serving import tensor

    client, steps = grpcclient.InferenceServerClient(url), queue.Queue()
    client.start_stream(callback=lambda result, error: result is not None and steps.put(progress_step(result)))
    client.async_stream_infer(
        "h3_pipeline",
        [
            tensor("PROMPT", np.array([[b"abandoned"]], dtype=object), "BYTES"),
            tensor("NUM_INFERENCE_STEPS", np.array([[400]], dtype=np.int64), "INT64"),
        ],
        request_id=request_id,
        parameters={"progress_every": 1},
        enable_empty_final_response=True,
    )
    while (last := steps.get(timeout=60)) < 3:
        pass
    client.stop_stream(cancel_requests=True)
    client.close()
    return last


def progress_step(result) -> int:
    return int(result.as_numpy("PROGRESS").reshape(-1)[0])


def test_an_id_abandoned_a_second_time_is_cancelled_again(server, client):
    # h3_vae cancels each gone client's id once; it remembered the id forever, so a later
    # request with the same id whose client left ran to its end for nobody
    ended = re.compile(
        r"request twice-gone ended CANCELLED: request twice-gone cancelled by request at step \d+ of 400"
    )
    for count in (1, 2):
        abandon(server.grpc_url, "twice-gone")
        deadline = time.monotonic() + 60
        while len(ended.findall(server.log_text())) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ended.findall(server.log_text())) == count
        assert "request twice-gone completed" not in server.log_text()
    assert client.generate("after", num_inference_steps=2)[0].info["num_inference_steps"] == 2
