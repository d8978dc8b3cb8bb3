"""Field bug cases of docs/failure_classes.md at h3_vae, end to end: keep-alives carry a silent
stream through a proxy's idle timeout, a full decode backlog refuses a result at once, a stop
delivers the results h3_vae holds, and a direct h3_vae caller cannot forge a larger canvas."""

import json

import numpy as np
import pytest

from client.api import H3Client, H3Error
from server.drain import held_requests
from server.process import TritonServer
from server.repository import plan, write_repository

from .serving import IdleProxy, raw_stream, tensor
from .serving import generate_in_thread as start
from .test_bad_input import int64, prompt
from .test_field_cases import metrics_text, sample, wait_until

HEARTBEAT_S = 0.5  # keep-alive timing of the `decoding` server
PROXY_IDLE_S = 6 * HEARTBEAT_S  # room for a late keep-alive on a loaded machine; the decode alone is longer
# A request whose decode takes 1.5 x PROXY_IDLE_S more than it would (h3_vae's injected fault
# decode_slow:S, on any host) after a short DiT part (2 steps), with progress off: nothing but
# keep-alives reaches its client during the decode.
LONG_DECODE = dict(num_inference_steps=2, inject_fault=f"decode_slow:{1.5 * PROXY_IDLE_S:g}")


@pytest.fixture(scope="module")
def decoding(tmp_path_factory):
    """A server whose h3_vae sends keep-alives after HEARTBEAT_S seconds of silence and holds at
    most two decodes (one worker, one queued); tritonserver waits 1 s for requests in flight when
    it stops. test_field_case_a_stop_delivers_the_results_h3_vae_holds stops it: keep it last."""
    tmp = tmp_path_factory.mktemp("decoding")
    vae = {"heartbeat_s": str(HEARTBEAT_S), "decode_workers": "1", "max_queued_decodes": "1"}
    dit = {"max_steps": "400", "heartbeat_s": str(HEARTBEAT_S)}
    for model in (dit, vae):
        model["allow_fault_injection"] = "true"  # decode_slow:S: a decode as long as a test needs, on any host
    repo = write_repository(tmp / "repo", plan(overrides={"h3_dit": dit, "h3_vae": vae}))
    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log", exit_timeout_secs=1) as server:
        yield server


def test_field_case_keepalives_carry_a_silent_stream_through_a_proxy_idle_timeout(decoding):
    """Issue 27 item 5: a proxy cuts a stream without DATA frames for its idle timeout (nginx's
    gRPC default: 60 s; here PROXY_IDLE_S), and HTTP/2 pings never count. With progress off, the
    keep-alives h3_vae sends (for the DiT's heartbeats during the steps, on its own timer during
    the decode) carry the stream; H3Client skips them and returns the clip. The same request
    with keepalive=false is cut."""
    with IdleProxy(decoding.grpc_url, PROXY_IDLE_S) as proxy:
        with H3Client(proxy.url, idle_timeout_s=120) as client:  # closed after: its kept channel would idle
            (decoded,) = client.generate("a long decode", **LONG_DECODE, seed=1)
            (stepped,) = client.generate("many steps", num_inference_steps=400, seed=2)
        assert proxy.cut == 0
        inputs = [prompt("a long decode"), int64("NUM_INFERENCE_STEPS", 2), int64("SEED", 1)]
        slow = {"inject_fault": LONG_DECODE["inject_fault"]}
        responses, error = raw_stream(proxy.url, inputs, parameters=slow, request_id="kept-alive", timeout_s=120)
        cut_responses, cut = raw_stream(
            proxy.url, inputs, parameters={"keepalive": False, **slow}, request_id="not-kept-alive", timeout_s=120
        )
        assert proxy.cut == 1
    assert (decoded.info["num_frames"], len(decoded.video_mp4) > 0) == (22, True)
    assert stepped.info["num_inference_steps"] == 400
    infos = [r.as_numpy("INFO") for r in responses]
    kinds = [json.loads(info.reshape(-1)[0])["kind"] if info is not None else "" for info in infos]
    assert error is None and kinds[-2:] == ["result", ""]  # the clip, then the empty final response
    assert len(kinds) >= 4 and set(kinds[:-2]) == {"keepalive"}
    assert json.loads(infos[0].reshape(-1)[0]) == {"kind": "keepalive", "request_id": "kept-alive"}
    assert responses[0].as_numpy("PROGRESS").tolist() == [[0, 0, 0]]
    assert [responses[0].as_numpy(name).size for name in ("VIDEO_MP4", "FRAMES", "AUDIO", "PREVIEW")] == [0] * 4
    assert cut.code == "UNAVAILABLE" and cut_responses == []


# each of its decodes lasts 2 s more (decode_slow:S): still running while the next result arrives, on any
# host, and within the 5 s drain of a stop
MEDIUM_DECODE = dict(num_inference_steps=2, inject_fault="decode_slow:2")


def test_field_case_a_full_decode_backlog_refuses_the_result_at_once(decoding):
    """Issue 27 item 8a: three outputs reach h3_vae together; one decodes, one waits, the third
    finds decode_workers + max_queued_decodes = 1 + 1 decodes open and its client is told."""
    client = H3Client(decoding.grpc_url, idle_timeout_s=120)
    with pytest.raises(H3Error) as refused:
        client.generate("three at once", **MEDIUM_DECODE, num_outputs=3, request_id="backlog")
    assert refused.value.code == "UNAVAILABLE"
    assert refused.value.message == (
        "output 2 of request backlog was not decoded: the decode backlog is full: 2 decodes open, "
        "decode_workers + max_queued_decodes = 1 + 1; retry later"
    )

    def open_decodes() -> list[float]:  # h3_vae closes a decode just after its final response
        text = metrics_text(decoding.metrics_url)
        return [sample(text, "h3_vae_decodes", state=state) for state in ("queued", "running")]

    assert wait_until(lambda: open_decodes() == [0, 0], 30), open_decodes()
    (result,) = client.generate("after the refusal", num_inference_steps=2)
    assert result.info["num_frames"] == 22


def test_field_case_a_stop_delivers_the_results_h3_vae_holds(decoding):
    """Issue 27 item 8c: the DiT is done with a request whose clip is decoding; the preStop hook
    (server.drain) counts it, and a stop (TritonServer.stop: the launcher's SIGTERM drain) waits
    for it, where tritonserver alone would wait 1 s (exit_timeout_secs) and cut the stream. Stops
    the module's server."""
    client, outcome = H3Client(decoding.grpc_url, idle_timeout_s=120), {}
    pending = start(client, outcome, "decoding", prompt="decoded at the stop", **MEDIUM_DECODE)
    assert wait_until(lambda: sample(metrics_text(decoding.metrics_url), "h3_vae_decodes", state="running") == 1, 60)
    text = metrics_text(decoding.metrics_url)
    assert sample(text, "h3_active_requests") == 0 and held_requests(text) == 1
    decoding.stop()  # tritonserver's own exit code is 1 here: unloading the models outlasts exit_timeout_secs 1
    pending.join(60)
    (result,) = outcome["decoding"]
    assert result.info["num_frames"] == 22 and len(result.video_mp4) > 0
    assert "Timeout 1: Found 0 model versions that have in-flight inferences" in decoding.log_text()


def direct_vae_inputs(info: dict, video_shape: tuple, audio_shape: tuple) -> list:
    """The inputs of a direct h3_vae request: zero latents of these shapes and `info` as INFO."""
    return [
        tensor("VIDEO_LATENT", np.zeros(video_shape, dtype=np.float32), "FP32"),
        tensor("AUDIO_LATENT", np.zeros(audio_shape, dtype=np.float32), "FP32"),
        tensor("PROGRESS", np.zeros((1, 3), dtype=np.int32), "INT32"),
        tensor("PREVIEW", np.zeros((1, 0, 0, 3), dtype=np.uint8), "UINT8"),
        tensor("INFO", np.array([[json.dumps(info).encode()]], dtype=object), "BYTES"),
    ]


@pytest.mark.parametrize(
    "info, video, message",
    [
        (
            {"kind": "result", "height": 4096, "width": 64, "num_frames": 1},
            (1, 24, 1, 256, 4),
            "height=4096 is out of range: allowed multiples of 32 in 32..256",
        ),
        (
            {"kind": "result", "height": 64, "width": 96, "num_frames": 1},
            (1, 24, 2, 40, 40),
            "VIDEO_LATENT is [1, 24, 2, 40, 40]; height=64, width=96, num_frames=1 need [1, 24, 2, 4, 6]",
        ),
    ],
)
def test_field_case_a_direct_h3_vae_caller_cannot_forge_a_larger_canvas(server, info, video, message):
    """Issue 27 item 8b: INFO comes from the caller; h3_vae checks it against its own limits."""
    responses, error = raw_stream(server.grpc_url, direct_vae_inputs(info, video, (1, 2, 32, 2)), model="h3_vae")
    assert responses == [] and (error.code, error.message) == ("INVALID_ARG", message)
