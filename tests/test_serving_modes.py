"""End-to-end: request execution mode, native cancellation on h3_dit, cancel by id when every place
is taken (the CLI's Ctrl-C: tests/test_cli_ctrl_c.py)."""

import json
import queue
import re
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.api import H3Client
from server.process import TritonServer

from .serving import generate_in_thread, idle_metrics, model_repository_copy
from .test_serving_control import metric

REQUEST = dict(
    prompt="a red ball rolls to the left",
    height=64,
    width=96,
    num_frames=22,
    num_inference_steps=5,
    seed=12,
    return_frames=True,
    return_audio=True,
)


def test_request_mode_outputs_equal_step_mode(client, tmp_path):
    step_mode = client.generate(**REQUEST)[0]
    repo = model_repository_copy(tmp_path / "repo", execution_mode="request", scheduling_policy="request")
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        request_mode = H3Client(server.grpc_url, idle_timeout_s=120).generate(**REQUEST, progress_every=1)[0]
    assert request_mode.frames.tobytes() == step_mode.frames.tobytes()
    assert request_mode.audio.tobytes() == step_mode.audio.tobytes()
    assert [step for step, _, _ in request_mode.progress] == [1, 2, 3, 4, 5]


def dit_executions(server) -> float:
    """Triton's count of h3_dit executions (nv_inference_exec_count)."""
    text = urllib.request.urlopen(f"http://{server.metrics_url.split('//')[-1]}", timeout=10).read().decode()
    return float(re.search(r'^nv_inference_exec_count\{model="h3_dit",version="1"\} (\S+)$', text, re.MULTILINE)[1])


def test_a_lone_request_takes_all_its_steps_in_the_execute_that_admits_it(client, budget_server):
    # execute_budget_s 20: the 5 steps of a few ms each fit one execute (one h3_dit execution:
    # h3_encoder's announcement of the request is matched by its arrival); progress still streams
    # after every step; the outputs equal the shipped server's (0.03 s)
    shipped = client.generate(**REQUEST)[0]
    server, budget_client = budget_server
    idle_metrics(server)
    before = dit_executions(server)
    result = budget_client.generate(**REQUEST, progress_every=1)[0]
    idle_metrics(server)
    assert dit_executions(server) == before + 1
    assert [step for step, _, _ in result.progress] == [1, 2, 3, 4, 5]
    assert result.frames.tobytes() == shipped.frames.tobytes()
    assert result.audio.tobytes() == shipped.audio.tobytes()


def test_an_announced_newcomer_ends_a_long_execute_after_the_step_in_flight(budget_server):
    # execute_budget_s 20: alone, a 400-step request (a few ms a step) runs to its end in the
    # execute that admits it. h3_encoder announces a newcomer (h3_core.serving.shared.registry), so that execute
    # ends at its next step boundary and the newcomer is packed beside the long request: it
    # finishes while the long one still runs, with a pack of 2
    server, client = budget_server
    seen, outcome = [], {}
    long = generate_in_thread(
        client,
        outcome,
        "long",
        **{**REQUEST, "num_inference_steps": 400, "return_frames": False, "return_audio": False},
        progress_every=1,
        on_progress=lambda step, total, position: seen.append(step),
    )
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    (newcomer,) = client.generate(**{**REQUEST, "num_inference_steps": 2, "seed": 13})
    long_step_then = max(seen)
    long.join(120)
    assert outcome["long"][0].info["num_inference_steps"] == 400
    assert long_step_then < 400 and newcomer.info["largest_pack"] == 2


def test_native_grpc_cancel_on_h3_dit(server, client):
    # Called directly, h3_dit sees the gRPC cancellation at the next step boundary; when it
    # lands while Triton 2.51 reschedules the request, Triton drops the request instead, and
    # h3_dit forgets the job after VANISHED_EXECUTES executes without it (driven here by a
    # second request). Either way it counts one cancellation and holds no packing place.
    before = metric(server, "h3_cancellations_total") or 0
    responses = queue.Queue()
    dit = grpcclient.InferenceServerClient(server.grpc_url)
    dit.start_stream(callback=lambda result, error: responses.put((result, error)))
    text = grpcclient.InferInput("TEXT_EMBEDS", [1, 3, 384], "FP32")
    text.set_data_from_numpy(np.zeros((1, 3, 384), dtype=np.float32))
    conditions = grpcclient.InferInput("CONDITION_LATENTS", [1, 0], "FP32")
    conditions.set_data_from_numpy(np.zeros((1, 0), dtype=np.float32))
    fields = grpcclient.InferInput("REQUEST", [1, 1], "BYTES")
    fields.set_data_from_numpy(np.array([[json.dumps({"num_inference_steps": 400, "seed": 1}).encode()]], dtype=object))
    dit.async_stream_infer(
        "h3_dit", [text, conditions, fields], parameters={"progress_every": 1}, enable_empty_final_response=True
    )
    responses.get(timeout=60)  # the first progress response: the request is running
    dit.stop_stream(cancel_requests=True)
    dit.close()
    deadline = time.monotonic() + 120
    while True:  # each request drives h3_dit executes, in which it notices the cancellation or the vanished job
        client.generate("after the cancel", num_inference_steps=5, seed=1)
        if (metric(server, "h3_cancellations_total") or 0) > before or time.monotonic() > deadline:
            break
    assert metric(server, "h3_cancellations_total") == before + 1
    assert idle_metrics(server)["h3_active_requests"] == 0


def test_cancel_works_when_every_place_is_taken(tmp_path):
    # one packing place, one waiting place: both taken; the control request still gets through
    repo = model_repository_copy(tmp_path / "repo", max_num_seqs="1", max_waiting="1", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        client = H3Client(server.grpc_url, idle_timeout_s=120)
        outcome = {}

        def run(key, **kwargs):
            try:
                outcome[key] = client.generate("busy", num_inference_steps=400, **kwargs)
            except Exception as error:  # noqa: BLE001 - recorded and asserted below
                outcome[key] = error

        running = threading.Thread(target=run, args=("running",), kwargs=dict(request_id="run-1", seed=1))
        running.start()
        deadline = time.monotonic() + 60
        while (metric(server, "h3_active_requests") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = threading.Thread(target=run, args=("waiting",), kwargs=dict(request_id="wait-1", seed=2))
        waiting.start()
        while (metric(server, "h3_waiting_requests") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(Exception) as refused:
            client.generate("one too many", num_inference_steps=2)
        assert refused.value.code == "UNAVAILABLE"
        assert client.cancel("wait-1") == "cancelled"
        assert client.cancel("run-1") == "cancelled"
        running.join(60)
        waiting.join(60)
        assert outcome["waiting"].code == "CANCELLED" and outcome["waiting"].message.startswith(
            "request wait-1 cancelled"
        )
        assert outcome["running"].code == "CANCELLED"
        metrics = idle_metrics(server)
        assert metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0


def test_request_mode_refuses_at_load_an_idle_timeout_its_longest_generation_outlasts(tmp_path):
    # a repository edited by hand (the writer sizes the idle timeout: 120 s here, and refuses a
    # shorter one): 400 steps of 4,096 rows take up to 80 s in one execute, and the requests
    # waiting behind it were reaped at 60 s, each without any response
    from server.environment import LaunchError

    repo = model_repository_copy(tmp_path / "repo", execution_mode="request", max_steps="400")
    config = repo / "h3_dit" / "config.pbtxt"
    text = config.read_text()
    assert "max_sequence_idle_microseconds: 120000000" in text
    config.write_text(
        text.replace("max_sequence_idle_microseconds: 120000000", "max_sequence_idle_microseconds: 60000000")
    )
    with pytest.raises(LaunchError) as info:
        TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log").start()
    assert (
        "h3_dit max_sequence_idle_microseconds (60 s) is below the longest generation of execution mode 'request' "
        "(one execute): max_steps 400 x 0.200 s (a step of 4,096 rows on cpu, estimated) x 1.5 = 120 s"
    ) in str(info.value)
