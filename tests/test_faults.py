"""Fault isolation, overload, a slow step, the memory budget and the graceful stop, end to end
(tiny config, CPU).

The faults server is a repository copy with allow_fault_injection "true" (the test-only
request parameter inject_fault, see model_repository/h3_dit/1/model.py), max_waiting 1 and
max_request_mb 512.
"""

import threading
import time

import pytest

from client.api import H3Client, H3Error
from server.process import TritonServer
from server.repository import plan, write_repository

from .serving import generate_in_thread as start
from .serving import idle_metrics, model_repository_copy

NEIGHBOURS = [
    dict(prompt="a red ball rolls to the left", height=64, width=96, num_frames=22, seed=1),
    dict(prompt="a blue square slides up", height=96, width=64, num_frames=9, seed=2),
]
# the neighbours' steps: enough that both still denoise when the offender, sent once both run, has
# passed h3_encoder (150 was not, once, with one core of the 2 busy and two pytest processes)
NEIGHBOUR_STEPS = 300


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """(server, client) on a copy with allow_fault_injection "true" (h3_encoder, h3_dit and
    h3_vae), max_waiting 1, max_steps 400 and max_request_mb 512."""
    tmp = tmp_path_factory.mktemp("faults")
    dit = dict(allow_fault_injection="true", max_waiting="1", max_steps="400", max_request_mb="512")
    allowed = {"allow_fault_injection": "true"}
    repo = write_repository(tmp / "repo", plan(overrides={"h3_dit": dit, "h3_encoder": allowed, "h3_vae": allowed}))
    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log") as server:
        yield server, H3Client(server.grpc_url, idle_timeout_s=120)


def run_neighbours_around(client, offender: dict, steps: int) -> dict:
    """Start both NEIGHBOURS (steps steps each), send `offender` once both are denoising, and
    return every outcome (keys 0, 1 and "offender")."""
    outcome, running = {}, [threading.Event(), threading.Event()]
    threads = [
        start(
            client,
            outcome,
            i,
            **NEIGHBOURS[i],
            num_inference_steps=steps,
            return_frames=True,
            return_audio=True,
            progress_every=1,
            on_progress=lambda *_, i=i: running[i].set(),
        )
        for i in range(2)
    ]
    assert all(event.wait(60) for event in running)
    threads.append(start(client, outcome, "offender", **offender))
    for thread in threads:
        thread.join(120)
    return outcome


@pytest.mark.parametrize(
    "fault,cause",
    [
        ("raise", "injected fault in the forward of request offender-raise"),
        ("nan", "non-finite velocity for request offender-nan"),
    ],
)
def test_a_failing_forward_fails_only_its_request(faults, fault, cause):
    _, client = faults
    offender = dict(prompt="the offender", num_inference_steps=5, request_id=f"offender-{fault}", inject_fault=fault)
    outcome = run_neighbours_around(client, offender, steps=NEIGHBOUR_STEPS)
    error = outcome["offender"]
    assert isinstance(error, H3Error) and error.code == "INTERNAL"
    assert error.message == f"denoise step 1 failed: {cause}"
    for i, request in enumerate(NEIGHBOURS):
        packed = outcome[i][0]
        assert packed.info["largest_pack"] == 3  # the offender's failed step was packed with both
        alone = client.generate(**request, num_inference_steps=NEIGHBOUR_STEPS, return_frames=True, return_audio=True)[
            0
        ]
        assert alone.info["largest_pack"] == 1
        assert packed.frames.tobytes() == alone.frames.tobytes()
        assert packed.audio.tobytes() == alone.audio.tobytes()


@pytest.mark.parametrize(
    "fault,code,message",
    [
        # h3_encoder: a failure other than a refusal (a VAE out of memory, PyAV, the registry's
        # database) escaped execute() and failed every request of the execute with Triton's text
        (
            "encode_raise",
            "INTERNAL",
            "encoding request {id} failed (RuntimeError: injected fault in the encoder); see the server log",
        ),
        # h3_encoder: a failed announcement failed the requests that encoded fine
        ("announce_raise", None, None),
        # h3_vae: a failure as the decode starts (before its try) left the request without its final
        # flag while keep-alives went on
        ("decode_start_raise", "INTERNAL", "decode of request {id} failed (RuntimeError); see the server log"),
    ],
)
def test_every_model_ends_a_failing_request_once_with_a_code_word(faults, fault, code, message):
    server, client = faults
    request_id = f"fault-{fault}"
    request = dict(prompt="a red ball", num_inference_steps=2, seed=5, return_frames=True)
    if code is None:
        (result,) = client.generate(**request, request_id=request_id, inject_fault=fault)
        assert result.frames.tobytes() == client.generate(**request)[0].frames.tobytes()
    else:
        with pytest.raises(H3Error) as info:
            client.generate(**request, request_id=request_id, inject_fault=fault)
        assert (info.value.code, info.value.message) == (code, message.format(id=request_id))
    held = ("h3_active_requests", "h3_waiting_requests", "h3_vae_decodes")
    deadline = time.monotonic() + 60  # h3_vae closes a decode just after its final response
    while any(idle_metrics(server).get(name) for name in held) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [idle_metrics(server)[name] for name in held] == [0, 0, 0]
    assert client.generate(**request)[0].info["num_inference_steps"] == 2  # the next request is served


def test_field_case_c8_a_step_slower_than_tritons_default_idle_timeout_loses_no_request(faults):
    # Triton's default max_sequence_idle_microseconds is 1 s; the configured 60 s keeps every
    # live sequence (the slow one and its neighbours) through a 1.5 s step.
    _, client = faults
    slow = dict(
        prompt="a slow one",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=4,
        seed=7,
        return_frames=True,
        return_audio=True,
    )
    outcome = run_neighbours_around(client, dict(slow, inject_fault="slow:1.5"), steps=NEIGHBOUR_STEPS)
    assert outcome["offender"][0].info["largest_pack"] == 3
    assert outcome["offender"][0].info["stage_seconds"]["denoise"] > 1.5
    assert outcome["offender"][0].frames.tobytes() == client.generate(**slow)[0].frames.tobytes()
    for i, request in enumerate(NEIGHBOURS):
        alone = client.generate(**request, num_inference_steps=NEIGHBOUR_STEPS, return_frames=True, return_audio=True)[
            0
        ]
        assert outcome[i][0].frames.tobytes() == alone.frames.tobytes()


def test_a_newcomer_finding_the_dit_at_capacity_is_refused_at_once(faults):
    server, client = faults
    outcome, running = {}, threading.Event()
    # the DiT holds max_num_seqs + max_waiting = 4 + 1 requests, wherever the policy puts them:
    # with these five (eight outputs, four per pack) the newcomer is the sixth
    threads = [
        start(
            client,
            outcome,
            "four",
            prompt="four outputs",
            num_inference_steps=400,
            num_outputs=4,
            request_id="full-4",
            progress_every=1,
            on_progress=lambda *_: running.set(),
        )
    ]
    assert running.wait(60)
    threads += [
        start(client, outcome, k, prompt=f"one more {k}", num_inference_steps=400, request_id=f"full-{k}")
        for k in range(4)
    ]
    deadline = time.monotonic() + 60
    while (
        sum(server.h3_metrics().get(name, 0) for name in ("h3_active_requests", "h3_waiting_requests")) != 5
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    dit_refusals = server.h3_metrics().get("h3_refusals_total", 0)
    with pytest.raises(H3Error) as info:
        client.generate("the newcomer", num_inference_steps=2)
    # refused by h3_encoder before encoding (h3_core.serving.shared.registry): the DiT never saw it
    assert server.h3_metrics().get("h3_refusals_total", 0) == dit_refusals
    assert [client.cancel(f"full-{k}") for k in (4, 0, 1, 2, 3)] == ["cancelled"] * 5
    for thread in threads:
        thread.join(60)
    assert info.value.code == "UNAVAILABLE"
    assert (
        info.value.message == "the DiT holds 5 requests, its capacity max_num_seqs + max_waiting = 4 + 1; retry later"
    )
    assert [outcome[k].code for k in ("four", 0, 1, 2, 3)] == ["CANCELLED"] * 5


def test_bad_input_request_over_the_memory_budget(faults):
    _, client = faults
    with pytest.raises(H3Error) as info:
        client.generate("too big", height=256, width=256, num_frames=121, num_inference_steps=2)
    assert info.value.code == "INVALID_ARG"
    assert info.value.message == "memory=1265 MiB is out of range: allowed up to 512 MiB (max_request_mb)"
    assert client.generate("fits", height=128, width=128, num_frames=39, num_inference_steps=2)[0].info["height"] == 128


def test_stopping_the_launcher_cancels_in_flight_requests_and_exits_promptly(tmp_path):
    repo = model_repository_copy(tmp_path / "repo", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        client, outcome = H3Client(server.grpc_url, idle_timeout_s=120), {}
        running = [threading.Event() for _ in range(3)]
        threads = [
            start(
                client,
                outcome,
                i,
                prompt=f"in flight {i}",
                height=128,
                width=128,
                num_frames=39,
                num_inference_steps=400,
                request_id=f"stop-{i}",
                progress_every=1,
                on_progress=lambda *_, i=i: running[i].set(),
            )
            for i in range(3)
        ]
        assert all(event.wait(60) for event in running)
        code = server.stop()
    for thread in threads:
        thread.join(30)
    for i in range(3):
        error = outcome[i]
        assert isinstance(error, H3Error) and error.code == "CANCELLED"
        assert error.message.startswith(f"request stop-{i} cancelled because the server is shutting down at step ")
    assert "Found 0 model versions that have in-flight inferences" in server.log_text(), server.log_text()
    # Triton found nothing in flight and exited by itself (0; 1 where unloading the models outlasted
    # its exit timeout on a loaded machine), not by the launcher's SIGKILL after stop_grace (-9)
    assert code in (0, 1)


def test_a_stop_delivers_every_clip_denoised_before_it(tmp_path):
    # Three results wait for h3_vae's one decode worker, each decode 2 s slower (decode_slow):
    # 4 s and more of decodes at the stop (two whole ones still queued), against the drain's 1 s
    # (drain_timeout_s, 5 s by default) and Triton's 1 s for requests in flight. The drain waited
    # drain_timeout_s and the stop cut the clips still queued (and tritonserver crashed while
    # h3_vae sent, docs/reliability.md); it now waits for every decode while they progress.
    allowed = {"allow_fault_injection": "true"}
    vae = {**allowed, "decode_workers": "1"}
    repo = write_repository(tmp_path / "repo", plan(overrides={"h3_dit": allowed, "h3_vae": vae}))
    log_file = tmp_path / "server.log"
    with TritonServer(repo, free_ports=True, log_file=log_file, exit_timeout_secs=1, drain_timeout_s=1) as server:
        client, outcome = H3Client(server.grpc_url, idle_timeout_s=120), {}
        threads = [
            start(client, outcome, i, prompt=f"clip {i}", num_inference_steps=2, seed=i, inject_fault="decode_slow:2")
            for i in range(3)
        ]
        deadline = time.monotonic() + 60
        while server.h3_metrics().get("h3_vae_decodes") != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.h3_metrics()["h3_active_requests"] == 0  # the DiT is done with all three
        code = server.stop()
        for thread in threads:
            thread.join(60)
        log = server.log_text()
    assert [type(outcome[i]) for i in range(3)] == [list] * 3, outcome  # before: the last clip(s) lost
    assert [outcome[i][0].info["seed"] for i in range(3)] == [0, 1, 2]
    assert all(outcome[i][0].video_mp4[4:8] == b"ftyp" for i in range(3))
    assert "drain:" not in log and "Found 0 model versions that have in-flight inferences" in log
    # no signal (the abort on heap corruption was -6); 1: unloading the models outlasts Triton's
    # exit_timeout_secs 1, as in test_field_case_a_stop_delivers_the_results_h3_vae_holds
    assert code in (0, 1)
