"""A small Python API over tritonclient.grpc streaming for the h3_pipeline model.

    client = H3Client("127.0.0.1:8001")
    results = client.generate("a red ball rolls to the left", num_inference_steps=4, seed=7)
    open("clip.mp4", "wb").write(results[0].video_mp4)

Every stream has a timeout: a response that does not arrive within `timeout_s` seconds raises
H3Error("TIMEOUT", ...) after the request was cancelled on the server (by its id) and the
stream closed.
"""
import json
import numbers
import queue
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "h3_pipeline"
DIT_MODEL = "h3_dit"  # control requests (cancel) go to the DiT itself
INT_INPUTS = {"height": "HEIGHT", "width": "WIDTH", "num_frames": "NUM_FRAMES",
              "num_inference_steps": "NUM_INFERENCE_STEPS", "seed": "SEED", "num_outputs": "NUM_OUTPUTS"}
ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")
REQUEST_ID_PREFIX = re.compile(r"^\[request id: [^\]]*\] ")
CODE = re.compile(r"^(INVALID_ARG|UNAVAILABLE|CANCELLED|INTERNAL): ")
# Triton's own errors, raised before or around the models, carry no code word: a malformed
# request (wrong data type, shape, batch size, input or output name; a sequence id without
# START) is INVALID_ARG; a dead model process (python backend stub), a lost connection and a
# full /dev/shm (the python backend could not grow its shared memory) are UNAVAILABLE.
TRITON_ERRORS = (
    (re.compile(r"^(inference input '[^']*' data-type is |unexpected shape for input |inference request batch-size must be "
                r"|unexpected inference (input|output) |inference request for sequence .* must specify the START flag"
                r"|input '[^']*' batch size does not match other inputs |inference request to model '[^']*' must specify batch-size 1 )"),
     "INVALID_ARG"),
    (re.compile(r"^(Stub process '[^']*' is not healthy|failed to connect to all addresses|Stream removed"
                r"|Socket closed|The stream is no longer in valid state"
                r"|Failed to process the request\(s\) for model '[^']*', message: Failed to increase the shared memory pool size)"),
     "UNAVAILABLE"),
)
CANCEL_WAIT_S = 10.0  # after a timeout: how long to wait for the cancelled request's final response

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class H3Error(Exception):
    """A failed generation: an error response (refusals: INVALID_ARG, UNAVAILABLE; Triton's own
    errors), or a final response whose INFO is {"kind": "error", "code", "message"} (a started
    request that ended early: CANCELLED, INTERNAL). `code` is the code word (TIMEOUT when the
    client gave up; UNKNOWN for an unrecognised error); `message` is the rest, without
    Triton's ensemble and request-id prefixes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    @classmethod
    def from_server(cls, error: InferenceServerException) -> "H3Error":
        text = REQUEST_ID_PREFIX.sub("", ENSEMBLE_PREFIX.sub("", error.message() or str(error)))
        match = CODE.match(text)
        if match:
            return cls(match.group(1), text[match.end():])
        return cls(next((code for pattern, code in TRITON_ERRORS if pattern.match(text)), "UNKNOWN"), text)


@dataclass
class GenerationResult:
    """One generated clip. video_mp4: the MP4 file (b"" with return_mp4=False); frames: uint8
    [T, H, W, 3] and audio: float32 [2, samples] only when asked for; info: the server's report
    (seed, num_frames, height, width, num_inference_steps, request_id, output_index,
    largest_pack, stage_seconds)."""

    video_mp4: bytes
    info: dict
    frames: np.ndarray | None = None
    audio: np.ndarray | None = None
    progress: list[tuple[int, int, int]] = field(default_factory=list)  # (step, total, queue position)
    previews: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (step, uint8 [Hl, Wl, 3])


def _input(name: str, value, datatype: str) -> grpcclient.InferInput:
    if datatype == "INT64" and not INT64_MIN <= value <= INT64_MAX:
        raise H3Error("INVALID_ARG", f"{name}={value} does not fit INT64 ({INT64_MIN}..{INT64_MAX})")
    tensor = grpcclient.InferInput(name, [1, 1], datatype)
    tensor.set_data_from_numpy(np.array([[value]], dtype=object if datatype == "BYTES" else np.int64))
    return tensor


ARGUMENT_KINDS = {"int": numbers.Integral, "number": numbers.Real, "bool": bool, "str": str, "str or bytes": (str, bytes)}


def _check_type(name: str, value, kind: str, optional: bool = False) -> None:
    """Raise TypeError naming the argument unless `value` is of `kind` (a key of ARGUMENT_KINDS;
    numpy integers count as int, bool never counts as a number) or, when optional, None.
    Catches what tritonclient would silently convert (2.9 -> 2 steps, "false" -> true)."""
    if value is None and optional:
        return
    if isinstance(value, bool) and kind != "bool" or not isinstance(value, ARGUMENT_KINDS[kind]):
        raise TypeError(f"{name} must be {kind}{' or None' if optional else ''}, got {type(value).__name__} {value!r}")


class H3Client:
    """Streaming client for h3_pipeline at `url` (host:port of Triton's gRPC endpoint, no
    scheme). timeout_s: seconds to wait for each response, > 0 (ValueError otherwise)."""

    def __init__(self, url: str = "127.0.0.1:8001", timeout_s: float = 600.0):
        if "://" in url:
            raise ValueError(f"url must be host:port without a scheme, got {url!r}")
        _check_type("timeout_s", timeout_s, "number")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        self.url, self.timeout_s = url, timeout_s

    def generate(self, prompt: str | bytes, *, height: int | None = None, width: int | None = None,
                 num_frames: int | None = None, num_inference_steps: int | None = None,
                 seed: int | None = None, num_outputs: int | None = None, progress_every: int = 0,
                 preview_every: int = 0, deadline_s: float | None = None, return_mp4: bool = True,
                 return_frames: bool = False, return_audio: bool = False, request_id: str = "",
                 inject_fault: str | None = None,
                 on_progress: Callable[[int, int, int], None] | None = None) -> list[GenerationResult]:
        """Generate num_outputs clips (None fields take the server's defaults).

        on_progress(step, total_steps, queue_position) is called for each progress response
        (progress_every > 0). preview_every k > 0 adds a PREVIEW image after steps k, 2k, ...
        deadline_s: seconds from arrival at the DiT after which the server cancels the request.
        return_mp4=False: the server encodes no MP4 (video_mp4 is b""; required by a server
        without PyAV); return_frames / return_audio fill frames / audio.
        request_id: lets `cancel(request_id)` reach this request; "" sends a random one
        ("h3c-<hex>") so that a timeout can cancel the request on the server. inject_fault:
        tests only, refused unless the server's h3_dit has allow_fault_injection "true" (see
        its model.py). Returns the results in output-index order. Raises TypeError naming the
        argument for a wrong Python type (nothing is sent), H3Error with the server's code word,
        or TIMEOUT.
        """
        _check_type("prompt", prompt, "str or bytes")
        for name, value in (("height", height), ("width", width), ("num_frames", num_frames),
                            ("num_inference_steps", num_inference_steps), ("seed", seed),
                            ("num_outputs", num_outputs)):
            _check_type(name, value, "int", optional=True)
        _check_type("progress_every", progress_every, "int")
        _check_type("preview_every", preview_every, "int")
        _check_type("deadline_s", deadline_s, "number", optional=True)
        for name, value in (("return_mp4", return_mp4), ("return_frames", return_frames),
                            ("return_audio", return_audio)):
            _check_type(name, value, "bool")
        _check_type("request_id", request_id, "str")
        _check_type("inject_fault", inject_fault, "str", optional=True)
        values = dict(height=height, width=width, num_frames=num_frames,
                      num_inference_steps=num_inference_steps, seed=seed, num_outputs=num_outputs)
        inputs = [_input("PROMPT", prompt.encode() if isinstance(prompt, str) else prompt, "BYTES")]
        inputs += [_input(INT_INPUTS[k], v, "INT64") for k, v in values.items() if v is not None]
        outputs = [grpcclient.InferRequestedOutput(name) for name in ("VIDEO_MP4", "PROGRESS", "PREVIEW", "INFO")]
        outputs += [grpcclient.InferRequestedOutput(name) for name, wanted in
                    (("FRAMES", return_frames), ("AUDIO", return_audio)) if wanted]
        parameters = {"progress_every": int(progress_every)}  # int(): numpy integers are not JSON
        if preview_every:
            parameters["preview_every"] = int(preview_every)
        if deadline_s is not None:
            parameters["deadline_s"] = deadline_s if isinstance(deadline_s, int) else float(deadline_s)
        if not return_mp4:
            parameters["return_mp4"] = False
        if return_frames:
            parameters["return_frames"] = True
        if return_audio:
            parameters["return_audio"] = True
        if inject_fault is not None:
            parameters["inject_fault"] = inject_fault
        results, progress, previews, ended = [], [], [], None
        for result in self._stream(MODEL, inputs, outputs, parameters, request_id or f"h3c-{uuid.uuid4().hex}"):
            try:
                results += self._read(result, progress, previews, on_progress)
            except H3Error as error:  # ended early; read on to the stream's final response
                ended = error
        if ended is not None:
            raise ended
        return sorted(results, key=lambda r: r.info["output_index"])

    def cancel(self, request_id: str) -> bool:
        """Cancel the request with this id (running, queued, or still in the encoder) through a
        control request to h3_dit. It leaves at the next step boundary and its stream ends with
        a CANCELLED: error. Returns whether the server knew the id (an id it did not know is
        remembered for a while in case its request is still on its way)."""
        control = _input("REQUEST", json.dumps({"cancel_request_id": request_id}).encode(), "BYTES")
        text = grpcclient.InferInput("TEXT_EMBEDS", [1, 0, 0], "FP32")
        text.set_data_from_numpy(np.zeros((1, 0, 0), dtype=np.float32))
        final = list(self._stream(DIT_MODEL, [text, control], [grpcclient.InferRequestedOutput("INFO")], {}, ""))
        return json.loads(final[0].as_numpy("INFO").reshape(-1)[0])["found"]

    def _stream(self, model, inputs, outputs, parameters, request_id):
        """Yield the responses of one streaming request until the final one (an error ends
        the request too). On a timeout the request is cancelled by id when it has one (an
        h3_pipeline request) and its final response awaited for CANCEL_WAIT_S; a stream whose
        request never ended is closed with cancel_requests=True, which frees the client
        (Triton 2.51 then counts the ensemble request as in flight until it exits)."""
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        ended = False
        try:
            try:
                client.start_stream(callback=lambda result, error: responses.put((result, error)))
                client.async_stream_infer(model, inputs, outputs=outputs, request_id=request_id,
                                          parameters=parameters, enable_empty_final_response=True)
            except InferenceServerException as error:  # e.g. nothing listens at the url
                ended = True
                raise H3Error("UNAVAILABLE", f"cannot stream to {self.url}: {error.message() or error}") from None
            while not ended:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    if model == MODEL and request_id:
                        ended = self._cancel_after_timeout(request_id, responses)
                    raise H3Error("TIMEOUT", f"no response from {self.url} within {self.timeout_s} s") from None
                ended = error is not None or result.get_response().parameters["triton_final_response"].bool_param
                if error is not None:
                    raise H3Error.from_server(error)
                yield result
        finally:
            client.stop_stream(cancel_requests=not ended)
            client.close()

    def _cancel_after_timeout(self, request_id: str, responses: queue.Queue) -> bool:
        """Cancel a timed-out request by id; True once its stream has ended (error or final)."""
        try:
            self.cancel(request_id)
        except H3Error:
            return False
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            while True:
                result, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
                if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                    return True
        except queue.Empty:
            return False

    @staticmethod
    def _read(result, progress, previews, on_progress) -> list[GenerationResult]:
        info_tensor = result.as_numpy("INFO")
        if info_tensor is None or info_tensor.size == 0:
            return []  # the empty final response that closes the stream
        info = json.loads(info_tensor.reshape(-1)[0])
        if info["kind"] == "error":  # a started request that ended early (CANCELLED, INTERNAL)
            raise H3Error(info["code"], info["message"])
        step, total, position = (int(v) for v in result.as_numpy("PROGRESS").reshape(-1))
        if info["kind"] == "progress":
            preview = result.as_numpy("PREVIEW")
            if preview is not None and preview.size:
                previews.append((step, preview[0]))
            progress.append((step, total, position))
            if on_progress:
                on_progress(step, total, position)
            return []
        mp4 = result.as_numpy("VIDEO_MP4").reshape(-1)  # empty with return_mp4=False
        frames, audio = result.as_numpy("FRAMES"), result.as_numpy("AUDIO")
        return [GenerationResult(
            video_mp4=bytes(mp4[0]) if mp4.size else b"", info=info,
            frames=frames[0] if frames is not None else None, audio=audio[0] if audio is not None else None,
            progress=list(progress), previews=list(previews),
        )]
