"""End-to-end: cancellation by id, deadlines, previews and metrics (tiny config, CPU)."""

import threading
import urllib.request

import numpy as np
import pytest

from client.api import H3Error

from .serving import generate_in_thread as run_in_thread
from .serving import idle_metrics, raw_stream, tensor

LONG = dict(prompt="a long clip", height=64, width=96, num_frames=22, num_inference_steps=400, seed=9)


def metric(server, name):
    text = urllib.request.urlopen(f"http://{server.metrics_url.split('//')[-1]}", timeout=10).read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{")]
    return values[0] if values else None


def test_cancel_by_id_mid_denoise_leaves_the_neighbour_bit_identical(client, server):
    outcome, started = {}, threading.Event()
    long = run_in_thread(
        client,
        outcome,
        "long",
        **LONG,
        request_id="victim-1",
        progress_every=1,
        on_progress=lambda step, *_: step >= 3 and started.set(),
    )
    neighbour = dict(
        prompt="a neighbour",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=30,
        seed=4,
        return_frames=True,
        return_audio=True,
    )
    assert started.wait(60)
    other = run_in_thread(client, outcome, "other", **neighbour)
    assert client.cancel("victim-1") == "cancelled"
    long.join(60)
    other.join(60)
    error = outcome["long"]
    assert isinstance(error, H3Error) and error.code == "CANCELLED"
    assert error.message.startswith("request victim-1 cancelled by request at step ")
    assert error.message.endswith(" of 400")
    alone = client.generate(**neighbour)[0]
    assert outcome["other"][0].frames.tobytes() == alone.frames.tobytes()
    assert outcome["other"][0].audio.tobytes() == alone.audio.tobytes()


def test_cancel_unknown_id_touches_nothing(client):
    assert client.cancel("never-seen-7") == "unknown"
    (result,) = client.generate("fine", num_inference_steps=2, seed=1)
    assert result.info["num_inference_steps"] == 2


def test_cancel_before_arrival_is_honoured(client):
    assert client.cancel("early-1") == "unknown"  # remembered: the request has not reached the DiT yet
    with pytest.raises(H3Error) as info:
        client.generate("too late", num_inference_steps=3, request_id="early-1")
    assert info.value.code == "CANCELLED"
    assert info.value.message == "request early-1 was cancelled before it started (step 0 of 3)"


def test_deadline_expires_and_frees_the_request(client, server):
    before = metric(server, "h3_deadline_expiries_total") or 0
    with pytest.raises(H3Error) as info:
        client.generate(**LONG, deadline_s=0.3)
    assert info.value.code == "CANCELLED" and "deadline of 0.3 s expired at step" in info.value.message
    assert metric(server, "h3_deadline_expiries_total") == before + 1
    assert idle_metrics(server)["h3_active_requests"] == 0


def test_previews_are_latent_resolution_images(client):
    (result,) = client.generate(
        "preview", height=64, width=96, num_frames=22, num_inference_steps=6, preview_every=2, seed=3
    )
    assert [step for step, _ in result.previews] == [2, 4, 6]
    assert all(image.shape == (4, 6, 3) and image.dtype.name == "uint8" for _, image in result.previews)


def test_metrics_are_published(client, server):
    done = metric(server, "h3_completions_total") or 0
    client.generate("metrics", num_inference_steps=2, seed=1, num_outputs=2)
    assert metric(server, "h3_completions_total") == done + 2
    assert metric(server, "h3_heartbeat_timestamp_seconds") > 1.7e9
    assert metric(server, "h3_waiting_requests") == 0


def test_unknown_request_parameter_is_refused_before_encoding(server):
    prompt = tensor("PROMPT", np.array([[b"x"]], dtype=object), "BYTES")
    responses, error = raw_stream(server.grpc_url, [prompt], parameters={"colour": "red"})
    assert responses == [] and error.code == "INVALID_ARG"
    assert error.message.startswith("request parameter 'colour' is unknown; allowed: ")
