"""End to end (issue 17 on the CPU): h3_dit with sp_degree 2, its packed steps run by 2 worker
processes over gloo (tiny config, h3_core.parallel), against the session server's one.

Outputs (FRAMES, AUDIO) of co-batched requests equal those of the same requests served alone by
the one-process DiT, byte for byte; a worker that exits mid-step is replaced and the step
retried (every request completes, unchanged); a rank whose computation raises fails only the
request it raised for (today's retry rule, h3_core/serving/dit/step_loop.py); the server stays ready."""

import json
import threading
import urllib.request

import numpy as np
import pytest

from client.api import H3Client, H3Error
from h3_core.factory import load_engine
from h3_core.serving.dit.events import Arrival, Refused
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings
from server.process import TritonServer

from .serving import generate_in_thread as start
from .serving import model_repository_copy

NEIGHBOURS = [
    dict(prompt="a red ball rolls to the left", height=64, width=96, num_frames=22, seed=1, num_inference_steps=40),
    dict(prompt="a blue square slides up", height=96, width=64, num_frames=9, seed=2, num_inference_steps=40),
]
OFFENDER = dict(prompt="the third one", height=64, width=64, num_frames=9, seed=3, num_inference_steps=3)
RAW = dict(return_frames=True, return_audio=True, return_mp4=False)
RESTART = "restarting the 2 sequence-parallel workers and retrying the step"


@pytest.fixture(scope="module")
def sp_server(tmp_path_factory):
    """(server, client) of a repository copy with sp_degree 2 and allow_fault_injection "true"."""
    tmp = tmp_path_factory.mktemp("sp")
    repo = model_repository_copy(tmp / "repo", sp_degree="2", allow_fault_injection="true", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log") as server:
        yield server, H3Client(server.grpc_url, idle_timeout_s=120)


@pytest.fixture(scope="module")
def alone(server):
    """Each request's output served alone by the session server's one-process DiT (sp_degree 1)."""
    client = H3Client(server.grpc_url, idle_timeout_s=120)
    return [client.generate(**request, **RAW)[0] for request in (*NEIGHBOURS, OFFENDER)]


def three_at_once(client, fault: str | None) -> dict:
    """Both NEIGHBOURS, then OFFENDER (with inject_fault `fault`) once both are denoising, so its
    first step is one forward with theirs; every outcome (keys 0, 1, 2)."""
    outcome, running = {}, [threading.Event(), threading.Event()]
    threads = [
        start(
            client, outcome, i, **NEIGHBOURS[i], **RAW, progress_every=1, on_progress=lambda *_, i=i: running[i].set()
        )
        for i in range(2)
    ]
    assert all(event.wait(60) for event in running)
    extra = {} if fault is None else {"inject_fault": fault, "request_id": f"offender-{fault}"}
    threads.append(start(client, outcome, 2, **OFFENDER, **RAW, **extra))
    for thread in threads:
        thread.join(120)
    return outcome


def assert_same(result, expected) -> None:
    assert result.frames.tobytes() == expected.frames.tobytes()
    assert result.audio.tobytes() == expected.audio.tobytes()


def assert_ready(server) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as answer:
        assert answer.status == 200


def test_two_ranks_equal_one_process_byte_for_byte(sp_server, alone):
    server, client = sp_server
    outcome = three_at_once(client, None)
    assert outcome[2][0].info["largest_pack"] == 3  # its step was packed with both neighbours
    for i in range(3):
        assert_same(outcome[i][0], alone[i])
    assert "over 2 sequence-parallel workers" in server.log_text()


def test_a_worker_that_exits_mid_step_is_replaced_and_every_request_completes(sp_server, alone):
    server, client = sp_server
    outcome = three_at_once(client, "worker_exit")
    assert outcome[2][0].info["largest_pack"] == 3
    for i in range(3):
        assert_same(outcome[i][0], alone[i])
    log = server.log_text()
    assert f"sequence-parallel rank 1 (cpu) exited with code 3 during a step; {RESTART}" in log
    assert_ready(server)


def test_a_rank_that_raises_fails_only_the_request_it_raised_for(sp_server, alone):
    server, client = sp_server
    outcome = three_at_once(client, "worker_raise")
    error = outcome[2]
    assert isinstance(error, H3Error) and error.code == "INTERNAL"
    assert error.message == (
        "denoise step 1 failed: sequence-parallel rank 1: RuntimeError: injected fault in sequence-parallel rank 1"
    )
    for i in range(2):
        assert outcome[i][0].info["largest_pack"] == 3  # the failed step was packed with the offender
        assert_same(outcome[i][0], alone[i])
    assert_ready(server)
    assert_same(client.generate(**OFFENDER, **RAW)[0], alone[2])  # the workers serve on


def test_worker_faults_need_sp_degree_above_one(tmp_path):
    engine = load_engine("tiny", "random:0", with_encoder=False, with_vaes=False)
    loop = StepLoop(engine, DitSettings(allow_fault_injection=True), Registry(tmp_path, "h3_dit_0"))
    events = []
    arrival = Arrival(
        handle="h",
        key=1,
        request_id="r",
        new=True,
        request_json=[json.dumps({"num_inference_steps": 2}).encode()],
        text_embeds=np.zeros((1, 3, 384), dtype=np.float32),
        parameters_json=json.dumps({"inject_fault": "worker_hang"}),
    )
    assert loop.iterate([arrival], events.append) == []
    assert events == [Refused("h", "INVALID_ARG", "inject_fault='worker_hang' needs h3_dit parameter sp_degree > 1")]
