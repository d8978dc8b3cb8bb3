"""End-to-end tests against a real tritonserver (tiny config, CPU)."""

import io
import json
import subprocess
import sys
import threading

import av
import numpy as np
import pytest

from client.api import H3Error
from h3_core.config import align_num_frames

from .serving import ROOT, raw_stream, tensor


def test_one_prompt_returns_a_playable_mp4(client):
    (result,) = client.generate(
        "a red ball rolls to the left", height=64, width=96, num_frames=20, num_inference_steps=3, seed=3
    )
    container = av.open(io.BytesIO(result.video_mp4))
    video = container.streams.video[0]
    audio = container.streams.audio[0]
    frames = list(container.decode(video=0))
    assert len(frames) == 22  # 20 asked: the clip is aligned up to 17n+5 frames
    assert (video.width, video.height, video.average_rate) == (96, 64, 24)
    assert audio.channels == 2 and audio.sample_rate == 32000
    container = av.open(io.BytesIO(result.video_mp4))
    samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - 22 * 32000 // 24) <= 1024  # AAC pads by at most one frame
    assert (result.info["seed"], result.info["num_frames_requested"], result.info["num_frames"]) == (3, 20, 22)
    assert set(result.info["stage_seconds"]) == {"queue", "encode", "denoise", "decode"}


def test_generate_cli_passes_the_shape_and_seed(server, client, tmp_path):
    """python -m client.generate: --height/--width/--num-frames/--steps/--seed reach the server
    (the MP4 has that shape) and the file equals the API's MP4 for the same request."""
    out = tmp_path / "cli.mp4"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "client.generate",
            "--prompt",
            "a red ball",
            "--height",
            "96",
            "--width",
            "64",
            "--num-frames",
            "9",
            "--steps",
            "2",
            "--seed",
            "4",
            "--out",
            str(out),
            "--url",
            server.grpc_url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    container = av.open(str(out))
    video = container.streams.video[0]
    assert (video.width, video.height) == (64, 96) and len(list(container.decode(video=0))) == 22  # 9 asked
    (api,) = client.generate("a red ball", height=96, width=64, num_frames=9, num_inference_steps=2, seed=4)
    assert out.read_bytes() == api.video_mp4


REQUESTS = [
    dict(prompt="a red ball rolls to the left", height=128, width=128, num_frames=39, seed=1),
    dict(prompt="a blue square moves up while a high tone plays", height=64, width=96, num_frames=22, seed=2),
    dict(prompt="green", height=96, width=64, num_frames=9),  # no SEED: a different input set
]


STEPS = [400, 40, 40]


def test_three_concurrent_requests_are_cobatched_and_equal_their_solo_runs(client):
    # The first request is long; the other two start together once it has taken its first
    # step, so all three share packs however slow the machine is.
    results, started = [None] * 3, threading.Event()

    def run(i):
        results[i] = client.generate(
            **REQUESTS[i],
            num_inference_steps=STEPS[i],
            return_frames=True,
            return_audio=True,
            progress_every=1 if i == 0 else 0,
            on_progress=lambda *_: started.set(),
        )[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    threads[0].start()
    assert started.wait(60)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.info["largest_pack"] for r in results] == [3, 3, 3]
    for request, steps, packed in zip(REQUESTS, STEPS, results, strict=True):
        request = {**request, "seed": packed.info["seed"]}
        alone = client.generate(**request, num_inference_steps=steps, return_frames=True, return_audio=True)[0]
        assert alone.info["largest_pack"] == 1
        assert alone.frames.tobytes() == packed.frames.tobytes()
        assert alone.audio.tobytes() == packed.audio.tobytes()
        served = align_num_frames(request["num_frames"])
        assert alone.frames.shape == (served, request["height"], request["width"], 3)


def test_return_mp4_false_sends_no_mp4_and_the_same_frames_and_audio(client, server):
    request = dict(
        prompt="a red ball rolls to the left",
        height=64,
        width=96,
        num_frames=22,
        num_inference_steps=3,
        seed=8,
        return_frames=True,
        return_audio=True,
    )
    (with_mp4,) = client.generate(**request)
    (without,) = client.generate(**request, return_mp4=False)
    assert len(with_mp4.video_mp4) > 1000 and without.video_mp4 == b""
    assert without.frames.shape == (22, 64, 96, 3) and without.audio.shape == with_mp4.audio.shape
    assert np.array_equal(without.frames, with_mp4.frames) and np.array_equal(without.audio, with_mp4.audio)
    assert without.info["seed"] == 8 and without.info["stage_seconds"]["decode"] > 0
    # the raw response: VIDEO_MP4 is an empty BYTES tensor of shape [1, 0], like on progress responses
    inputs = [tensor("PROMPT", np.array([[request["prompt"].encode()]], dtype=object), "BYTES")]
    inputs += [
        tensor(name, np.array([[request[key]]], dtype=np.int64), "INT64")
        for name, key in (
            ("HEIGHT", "height"),
            ("WIDTH", "width"),
            ("NUM_FRAMES", "num_frames"),
            ("NUM_INFERENCE_STEPS", "num_inference_steps"),
            ("SEED", "seed"),
        )
    ]
    responses, error = raw_stream(server.grpc_url, inputs, parameters={"return_mp4": False, "return_frames": True})
    assert error is None
    # (the stream ends with an empty final response, which has no INFO)
    (result,) = [
        r
        for r in responses
        if r.as_numpy("INFO") is not None and json.loads(r.as_numpy("INFO")[0, 0])["kind"] == "result"
    ]
    assert result.as_numpy("VIDEO_MP4").shape == (1, 0)
    assert np.array_equal(result.as_numpy("FRAMES")[0], with_mp4.frames)
    assert result.as_numpy("AUDIO").shape == (1, 2, 0)


def test_progress_every_step_on_an_idle_server(client):
    (result,) = client.generate("progress", num_inference_steps=7, progress_every=1, seed=1)
    steps = [step for step, total, position in result.progress]
    assert steps == [1, 2, 3, 4, 5, 6, 7]
    assert all(total == 7 and position == 0 for _, total, position in result.progress)


def test_progress_every_k_reports_multiples_and_the_last_step(client):
    (result,) = client.generate("progress", num_inference_steps=7, progress_every=3, seed=1)
    assert [step for step, _, _ in result.progress] == [3, 6, 7]


def test_two_outputs_have_consecutive_seeds(client):
    results = client.generate("two clips", num_inference_steps=2, seed=41, num_outputs=2)
    assert [r.info["seed"] for r in results] == [41, 42]
    assert [r.info["output_index"] for r in results] == [0, 1]
    assert results[0].video_mp4 != results[1].video_mp4


def test_missing_seed_is_reported(client):
    (result,) = client.generate("no seed", num_inference_steps=1, request_id="my-id-1")
    assert isinstance(result.info["seed"], int) and result.info["request_id"] == "my-id-1"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(height=33), "height=33 is out of range: allowed multiples of 32 in 32..256"),
        (dict(num_inference_steps=0), "num_inference_steps=0 is out of range: allowed 1..400"),
        (
            dict(num_frames=500),
            "num_frames=500 is out of range: allowed 1..124 (NUM_FRAMES; the clip is aligned up to 17n+5 frames, at "
            "most max_num_frames=124)",
        ),
    ],
)
def test_bad_fields_get_invalid_arg(client, kwargs, message):
    with pytest.raises(H3Error) as info:
        client.generate("bad", **kwargs)
    assert info.value.code == "INVALID_ARG" and info.value.message == message


def test_empty_prompt_gets_invalid_arg(client):
    with pytest.raises(H3Error) as info:
        client.generate("  ")
    assert (info.value.code, info.value.message) == ("INVALID_ARG", "prompt must contain visible characters, got '  '")


def test_perf_analyzer_at_concurrency_2(server, tmp_path):
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"PROMPT": ["a red ball"], "NUM_INFERENCE_STEPS": [2]}]}))
    command = [
        str(ROOT / "scripts" / "perf_analyzer.sh"),
        "-m",
        "h3_pipeline",
        "-i",
        "grpc",
        "-u",
        server.grpc_url,
        "--streaming",
        "--input-data",
        str(data),
        "--request-parameter",
        "sequence_end:false:bool",
        "--sequence-id-range",
        "100000:200000",
        "--concurrency-range",
        "2",
        "--request-count",
        "6",
    ]
    run = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Concurrency: 2, throughput:" in run.stdout
    assert "Successful request count: 6" in run.stdout and "rror" not in run.stdout
