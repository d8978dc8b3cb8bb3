"""The client without a server: argument checks, error classification, the command line's flags,
and what the client sends and reads, against FakeTriton (a stand-in for tritonclient's gRPC client
that plays scripted responses)."""

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from client import api
from client import generate as client_generate
from client.api import H3Client, H3Error
from h3_core import protocol

from .serving import ROOT


def test_unreachable_server_is_unavailable():
    with pytest.raises(H3Error) as info:
        H3Client("127.0.0.1:1", idle_timeout_s=30).generate("x", num_inference_steps=1)
    assert info.value.code == "UNAVAILABLE"  # whichever of gRPC's two reports arrives first


def test_seed_outside_int64_is_refused_before_sending():
    with pytest.raises(H3Error) as info:
        H3Client("127.0.0.1:1").generate("x", seed=2**64)
    assert info.value.code == "INVALID_ARG"
    assert info.value.message == (
        "SEED=18446744073709551616 does not fit INT64 (-9223372036854775808..9223372036854775807)"
    )


@pytest.mark.parametrize(
    "text,code",
    [
        ("in ensemble 'h3_pipeline', INVALID_ARG: height=33 is out of range", "INVALID_ARG"),
        ("Stream removed (Socket closed)", "UNAVAILABLE"),
        ("something else", "UNKNOWN"),
    ],
)
def test_server_messages_are_classified(text, code):
    assert H3Error.from_server(InferenceServerException(msg=text)).code == code


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=None), "prompt must be str or bytes, got NoneType None"),
        (dict(num_inference_steps=2.9), "num_inference_steps must be int or None, got float 2.9"),
        (dict(seed=True), "seed must be int or None, got bool True"),
        (dict(height="64"), "height must be int or None, got str '64'"),
        (dict(return_mp4="false"), "return_mp4 must be bool, got str 'false'"),
        (dict(return_frames=1), "return_frames must be bool, got int 1"),
        (dict(progress_every=None), "progress_every must be int, got NoneType None"),
        (dict(deadline_s="5"), "deadline_s must be number or None, got str '5'"),
        (dict(request_priority=1.5), "request_priority must be int, got float 1.5"),
        (dict(request_id=7), "request_id must be str, got int 7"),
    ],
)
def test_wrong_python_types_are_refused_before_sending(kwargs, message):
    """tritonclient would send 2.9 as 2 steps and "false" as true; the client refuses first (the
    url is unreachable, so anything sent would end in UNAVAILABLE instead)."""
    kwargs = {"prompt": "a", **kwargs}
    with pytest.raises(TypeError) as raised:
        H3Client("127.0.0.1:1", idle_timeout_s=5).generate(kwargs.pop("prompt"), **kwargs)
    assert str(raised.value) == message


def test_deadline_must_be_positive():
    with pytest.raises(ValueError, match=r"^deadline_s must be > 0 seconds, got 0$"):
        H3Client("127.0.0.1:1").generate("a", deadline_s=0)


def test_numpy_integers_pass_the_type_checks():
    with pytest.raises(H3Error) as raised:  # checks passed: the request reached the transport
        H3Client("127.0.0.1:1", idle_timeout_s=5).generate(
            "a", num_inference_steps=np.int64(2), progress_every=np.int32(1)
        )
    assert raised.value.code == "UNAVAILABLE"


def test_client_settings_are_checked():
    with pytest.raises(ValueError, match=r"^url must be host:port without a scheme, got 'http://127.0.0.1:8001'$"):
        H3Client("http://127.0.0.1:8001")
    with pytest.raises(ValueError, match=r"^idle_timeout_s must be > 0 seconds, got 0$"):
        H3Client(idle_timeout_s=0)
    with pytest.raises(TypeError, match=r"^idle_timeout_s must be number, got str '5'$"):
        H3Client(idle_timeout_s="5")
    with pytest.raises(ValueError, match=r"^total_timeout_s must be > 0 seconds, got -1$"):
        H3Client(total_timeout_s=-1)


def test_protocol_media_constants_match_the_model():
    from h3_core import config

    assert (protocol.AUDIO_SAMPLE_RATE, protocol.AUDIO_CHANNELS, protocol.VIDEO_FPS) == (
        config.AUDIO_SAMPLE_RATE,
        config.AUDIO_CHANNELS,
        config.FPS,
    )


def test_the_one_wav_writer_serves_the_client_and_the_videos_api_without_torch():
    """h3_core.media.encode_wav is the one WAV writer (issue 46 item 4): client.generate and the
    Videos API's jobs write with it, and it loads with client.generate in a fresh interpreter
    without torch (the client installs without it)."""
    from h3_core import media
    from videos_api import jobs

    assert client_generate.encode_wav is media.encode_wav and jobs.encode_wav is media.encode_wav
    code = (
        "import json, sys, numpy; import client.generate, h3_core.media; "
        "print(json.dumps(['torch' in sys.modules, len(h3_core.media.encode_wav(numpy.zeros((2, 4), 'f4')))]))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout.strip()) == (0, "[false, 60]"), run.stderr  # 44-byte header + 4 x 2 x 2


# ---- against FakeTriton ------------------------------------------------------------------------


def tensor(value, dtype) -> np.ndarray:
    return np.array([value], dtype=dtype)  # the batch dimension every h3_pipeline output has


def response(kind: str, final: bool = False, step: int = 0, total: int = 2, preview=None, **fields):
    """A FakeResult like h3_pipeline's: INFO {"kind": kind, **fields}, PROGRESS, PREVIEW, and for a
    result (fields hold output_index) VIDEO_MP4 b"mp4-<k>" and AUDIO of value k."""
    outputs = {
        protocol.INFO: tensor([json.dumps({"kind": kind, **fields}).encode()], object),
        protocol.PROGRESS: tensor([step, total, 0], np.int32),
        protocol.PREVIEW: tensor(np.zeros((0, 0, 3)) if preview is None else preview, np.uint8),
    }
    if kind == "result":
        k = fields["output_index"]
        outputs[protocol.VIDEO_MP4] = tensor([f"mp4-{k}".encode()], object)
        outputs[protocol.AUDIO] = tensor(np.full((2, 640), k / 4), np.float32)
    return FakeResult(outputs, final)


class FakeResult:
    """What tritonclient's stream callback receives: outputs by name and the final-response flag."""

    def __init__(self, outputs: dict, final: bool):
        self.outputs, self.final = outputs, final

    def as_numpy(self, name):
        return self.outputs.get(name)

    def get_response(self):
        return SimpleNamespace(parameters={"triton_final_response": SimpleNamespace(bool_param=self.final)})


FINAL = FakeResult({}, final=True)  # the empty final response that closes a stream


class FakeTriton:
    """Stands in for tritonclient.grpc.InferenceServerClient (install(monkeypatch) puts it in
    client.api). An h3_pipeline stream plays `script`, a list of (seconds to wait, FakeResult, or
    a threading.Event that it sets then: a Ctrl-C); a cancel sent to h3_dit answers INFO
    {"kind": "cancel", "state": cancel_state} (no "state" when None), ends the wait in progress
    and, when cancel_state is "cancelled", ends the running script with a CANCELLED final response.
    Records each request (`requests`: its input names, and `tensors`: each input as sent_tensor
    reads it), each stop_stream's cancel_requests (`stopped`) and the number of clients made and
    closed (`made`, `closed`)."""

    def __init__(self, script, cancel_state: str | None = "cancelled"):
        self.script, self.cancel_state = script, cancel_state
        self.requests, self.stopped, self.cancelled = [], [], threading.Event()
        self.made = self.closed = 0

    def install(self, monkeypatch) -> "FakeTriton":
        monkeypatch.setattr(api.grpcclient, "InferenceServerClient", lambda url, channel_args: FakeStream(self))
        return self


def sent_tensor(infer_input) -> tuple[str, list[int], list]:
    """(datatype, shape, flat values) of a tritonclient InferInput, read back from the raw bytes it
    sends: BYTES elements as bytes, INT64 (the client's only other datatype) as ints."""
    raw = infer_input._get_content()
    if infer_input.datatype() == "BYTES":
        values = [bytes(element) for element in deserialize_bytes_tensor(raw)]
    else:
        assert infer_input.datatype() == "INT64"
        values = np.frombuffer(raw, "<i8").tolist()
    return infer_input.datatype(), list(infer_input.shape()), values


class FakeStream:
    def __init__(self, triton: FakeTriton):
        self.triton, self.stop = triton, threading.Event()
        triton.made += 1

    def start_stream(self, callback):
        self.callback, self.stop = callback, threading.Event()  # a kept client streams again

    def async_stream_infer(self, model, inputs, outputs, request_id, parameters, enable_empty_final_response):
        assert enable_empty_final_response
        self.triton.requests.append(
            SimpleNamespace(
                model=model,
                request_id=request_id,
                parameters=parameters,
                inputs=[i.name() for i in inputs],
                tensors={i.name(): sent_tensor(i) for i in inputs},
                outputs=[o.name() for o in outputs],
            )
        )
        if model == protocol.CANCEL_MODEL:
            answer = {"kind": "cancel", "request_id": "?"}
            if self.triton.cancel_state is not None:
                answer["state"] = self.triton.cancel_state
            self.triton.cancelled.set()
            self.callback(FakeResult({protocol.INFO: tensor([json.dumps(answer).encode()], object)}, True), None)
        else:
            threading.Thread(target=self.play, args=(request_id,), daemon=True).start()

    def play(self, request_id: str) -> None:
        stops = self.triton.cancel_state == "cancelled"
        for delay, result in self.triton.script:
            if self.triton.cancelled.wait(delay) and stops or self.stop.is_set():
                break
            if isinstance(result, threading.Event):
                result.set()
            else:
                self.callback(result, None)
        if self.triton.cancelled.is_set() and stops and not self.stop.is_set():
            self.callback(
                response(
                    "error",
                    final=True,
                    request_id=request_id,
                    code="CANCELLED",
                    message=f"request {request_id} cancelled by request at step 1 of 2",
                ),
                None,
            )

    def stop_stream(self, cancel_requests):
        self.triton.stopped.append(cancel_requests)
        self.stop.set()

    def close(self):
        self.triton.closed += 1


def results_script(num_outputs: int = 1, preview=None) -> list:
    """Progress after steps 1 and 2 (a preview after step 1), num_outputs results (seeds 7, 8, ...),
    the empty final response."""
    script = [
        (0, response("progress", step=1, preview=preview, request_id="r")),
        (0, response("progress", step=2, request_id="r")),
    ]
    script += [
        (
            0,
            response(
                "result", step=2, output_index=k, seed=7 + k, num_frames=22, height=64, width=96, num_inference_steps=2
            ),
        )
        for k in range(num_outputs)
    ]
    return script + [(0, FINAL)]


def test_generate_sends_the_contract_names_and_reads_every_output(monkeypatch):
    preview = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    fake = FakeTriton(results_script(2, preview)).install(monkeypatch)
    seen = []
    results = H3Client("fake:1").generate(
        "a",
        num_outputs=2,
        progress_every=1,
        preview_every=1,
        deadline_s=5,
        request_priority=3,
        return_audio=True,
        request_id="job-1",
        on_progress=lambda *args: seen.append(args),
        on_preview=lambda step, image: seen.append(("preview", step, image.tolist())),
    )
    (request,) = fake.requests
    assert (request.model, request.request_id) == (protocol.PIPELINE_MODEL, "job-1")
    assert request.parameters == {
        "progress_every": 1,
        "preview_every": 1,
        "deadline_s": 5,
        "request_priority": 3,
        "return_audio": True,
    }
    assert protocol.check_request_parameters(json.dumps(request.parameters)) == request.parameters
    assert request.inputs == ["PROMPT", "NUM_OUTPUTS"]
    assert request.outputs == ["VIDEO_MP4", "AUDIO", "PROGRESS", "PREVIEW", "INFO"]
    assert seen == [("preview", 1, preview.tolist()), (1, 2, 0), (2, 2, 0)]
    assert [(r.video_mp4, r.info["seed"], float(r.audio[0, 0])) for r in results] == [
        (b"mp4-0", 7, 0.0),
        (b"mp4-1", 8, 0.25),
    ]
    assert [step for step, _ in results[0].previews] == [1] and np.array_equal(results[0].previews[0][1], preview)
    assert fake.stopped == [False]


# Encoded image files as the client sends them: never decoded, so any bytes do (NUL, 0xff and a
# trailing NUL included, which a str-based BYTES encoding would lose).
FIRST_IMAGE = b"\x89PNG\r\n\x1a\n\x00first\xff\x00"
LAST_IMAGE = b"\xff\xd8\xff\xe0\x00last\x00"


@pytest.mark.parametrize(
    "keyframes, images, indices",
    [
        (dict(first_frame="first.png"), [FIRST_IMAGE], [0]),
        (dict(last_frame=LAST_IMAGE), [LAST_IMAGE], [-1]),
        (dict(last_frame="last.jpg", first_frame=FIRST_IMAGE), [FIRST_IMAGE, LAST_IMAGE], [0, -1]),
    ],
)
def test_generate_sends_the_keyframe_files_first_then_last(monkeypatch, tmp_path, keyframes, images, indices):
    (tmp_path / "first.png").write_bytes(FIRST_IMAGE)
    (tmp_path / "last.jpg").write_bytes(LAST_IMAGE)
    monkeypatch.chdir(tmp_path)  # str paths relative to it; a pathlib.Path works the same
    fake = FakeTriton(results_script()).install(monkeypatch)
    H3Client("fake:1").generate("a", seed=3, **keyframes)
    (request,) = fake.requests
    assert request.inputs == ["PROMPT", "SEED", "KEYFRAMES", "KEYFRAME_INDICES"]
    assert request.tensors["KEYFRAMES"] == ("BYTES", [1, len(images)], images)
    assert request.tensors["KEYFRAME_INDICES"] == ("INT64", [1, len(images)], indices)
    assert request.parameters == {"progress_every": 0}  # fit, flow shifts and task only when given


def test_generate_sends_fit_flow_shifts_and_task_only_when_given(monkeypatch, tmp_path):
    (tmp_path / "first.png").write_bytes(FIRST_IMAGE)
    fake = FakeTriton(results_script() * 2).install(monkeypatch)
    with H3Client("fake:1") as client:
        client.generate("a")
        client.generate(
            "a",
            first_frame=tmp_path / "first.png",
            fit="pad",
            flow_shift=np.float32(2.5),
            audio_flow_shift=3,
            cache_threshold=0.1,
            task="fl2va",
        )
    plain, conditioned = fake.requests
    assert (plain.inputs, plain.parameters) == (["PROMPT"], {"progress_every": 0})
    assert conditioned.inputs == ["PROMPT", "KEYFRAMES", "KEYFRAME_INDICES", "TASK"]
    assert conditioned.tensors["TASK"] == ("BYTES", [1, 1], [b"fl2va"])
    assert conditioned.parameters == {
        "progress_every": 0,
        "fit": "pad",
        "flow_shift": 2.5,
        "audio_flow_shift": 3,
        "cache_threshold": 0.1,
    }
    assert type(conditioned.parameters["flow_shift"]) is float  # numpy's float32 is not JSON
    assert protocol.check_request_parameters(json.dumps(conditioned.parameters)) == conditioned.parameters


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(first_frame="missing.png"), ValueError, "first_frame missing.png: no such file"),
        (dict(last_frame="folder"), ValueError, "last_frame folder is not a file; give an image file's path"),
        (dict(first_frame=b""), ValueError, "first_frame is empty: give a PNG, JPEG or WebP file"),
        (dict(last_frame="empty.png"), ValueError, "last_frame empty.png is empty: give a PNG, JPEG or WebP file"),
        (dict(first_frame=3), TypeError, "first_frame must be a path or bytes, got int 3"),
        (dict(fit=1), TypeError, "fit must be str or None, got int 1"),
        (dict(flow_shift="5"), TypeError, "flow_shift must be number or None, got str '5'"),
        (dict(audio_flow_shift=True), TypeError, "audio_flow_shift must be number or None, got bool True"),
        (dict(task=b"fl2va"), TypeError, "task must be str or None, got bytes b'fl2va'"),
        (
            dict(request_id="a\0b"),
            ValueError,
            "request_id holds a NUL character at index 1: not allowed in a request id",
        ),
        (dict(request_id="x" * 257), ValueError, "request_id has 257 characters: allowed 1..256"),
    ],
)
def test_bad_keyframes_and_conditioning_arguments_are_refused_before_sending(
    monkeypatch, tmp_path, kwargs, error, message
):
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.png").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    fake = FakeTriton(results_script()).install(monkeypatch)
    with pytest.raises(error) as raised:
        H3Client("fake:1").generate("a", **kwargs)
    assert str(raised.value) == message
    assert (fake.requests, fake.made) == ([], 0)


@pytest.mark.parametrize("state", protocol.CANCEL_STATES)
def test_cancel_returns_the_server_state(monkeypatch, state):
    fake = FakeTriton([], cancel_state=state).install(monkeypatch)
    assert H3Client("fake:1").cancel("job-1") == state
    (request,) = fake.requests
    assert (request.model, request.inputs, request.outputs) == (protocol.CANCEL_MODEL, ["REQUEST"], ["INFO"])


def test_a_cancel_answer_without_a_state_is_refused(monkeypatch):
    FakeTriton([], cancel_state=None).install(monkeypatch)
    with pytest.raises(H3Error) as raised:
        H3Client("fake:1").cancel("job-1")
    assert raised.value.code == "UNKNOWN"
    assert raised.value.message == (
        "the cancel answer has no state in ('cancelled', 'finished', 'unknown'): {'kind': 'cancel', 'request_id': '?'}"
    )


def timed_out(monkeypatch, script, client: H3Client, **kwargs) -> tuple[H3Error, FakeTriton]:
    fake = FakeTriton(script).install(monkeypatch)
    with pytest.raises(H3Error) as raised:
        client.generate("a", request_id="job-1", **kwargs)
    return raised.value, fake


def test_idle_timeout_bounds_the_gap_between_responses_then_cancels(monkeypatch):
    script = [(0, response("progress", step=1, request_id="job-1")), (60, FINAL)]
    error, fake = timed_out(monkeypatch, script, H3Client("fake:1", idle_timeout_s=0.3), progress_every=1)
    assert (error.code, error.message) == ("TIMEOUT", "no response from fake:1 for 0.3 s (idle_timeout_s)")
    assert [(r.model, r.request_id) for r in fake.requests] == [
        (protocol.PIPELINE_MODEL, "job-1"),
        (protocol.CANCEL_MODEL, ""),
    ]
    assert fake.stopped == [False, False]  # the cancel's stream, then the request's: both ended normally


def test_total_timeout_bounds_the_whole_request_although_responses_keep_coming(monkeypatch):
    script = [(0.02, response("progress", step=1, request_id="job-1"))] * 3000
    error, fake = timed_out(
        monkeypatch, script, H3Client("fake:1", idle_timeout_s=5, total_timeout_s=0.3), progress_every=1
    )
    assert (error.code, error.message) == (
        "TIMEOUT",
        "no final response from fake:1 within 0.3 s of sending (total_timeout_s)",
    )
    assert [r.model for r in fake.requests] == [protocol.PIPELINE_MODEL, protocol.CANCEL_MODEL]


def test_deadline_sets_the_total_timeout_with_a_margin(monkeypatch):
    monkeypatch.setattr(api, "DEADLINE_MARGIN_S", 0.2)
    script = [(0.02, response("progress", step=1, request_id="job-1"))] * 3000
    error, fake = timed_out(monkeypatch, script, H3Client("fake:1", idle_timeout_s=5), deadline_s=0.1, progress_every=1)
    assert (error.code, error.message) == (
        "TIMEOUT",
        "no final response from fake:1 within 0.3 s of sending (deadline_s 0.1 + 0.2 s margin)",
    )
    assert fake.requests[0].parameters == {"progress_every": 1, "deadline_s": 0.1}


class Interrupt(BaseException):
    """Stands in for KeyboardInterrupt (which pytest would take as the user stopping it)."""


@pytest.mark.parametrize("raised", [Interrupt, KeyboardInterrupt, ValueError])
def test_a_callback_that_raises_leaves_no_stream_open(monkeypatch, raised):
    # the exception leaves generate() with the stream stopped (cancel_requests=True) and the client
    # closed, before the call returns: nothing left for the garbage collector
    fake = FakeTriton(results_script()).install(monkeypatch)

    def on_progress(step, total, position):
        raise raised("from on_progress" if raised is not KeyboardInterrupt else None)

    with pytest.raises(raised):
        H3Client("fake:1").generate("a", progress_every=1, on_progress=on_progress)
    assert (fake.stopped, fake.made, fake.closed) == ([True], 1, 1)


def test_the_client_as_a_context_manager_closes_its_kept_channels(monkeypatch):
    fake = FakeTriton(results_script()).install(monkeypatch)
    with H3Client("fake:1") as client:
        client.generate("a")
        client.generate("a")  # on the kept channel
        assert (fake.stopped, fake.made, fake.closed) == ([False, False], 1, 0)
    assert fake.closed == 1
