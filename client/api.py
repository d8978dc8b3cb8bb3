"""A small Python API over tritonclient.grpc streaming for the h3_pipeline model.

    client = H3Client("127.0.0.1:8001")
    results = client.generate("a red ball rolls to the left", num_inference_steps=4, seed=7)
    open("clip.mp4", "wb").write(results[0].video_mp4)
    # fl2va: the clip starts at one image and ends at another (files sent as they are)
    results = client.generate("the ball rolls away", first_frame="start.png", last_frame="end.png", fit="pad")
    # ref2va: a character and a voice to keep, and an image the clip shows at frame 40
    results = client.generate(
        "she waves and says hello", reference_images=["woman.png"], reference_audio=["voice.wav"],
        guides=[("wave.png", 40)],
    )

Every call has two client-side limits (H3Client's docstring): an idle timeout (the longest gap
between responses) and an optional total timeout (the whole call). When one expires the client
cancels the request on the server by its id, closes the stream and raises H3Error("TIMEOUT", ...).

Several servers: with url "dns:///NAME:PORT" (e.g. a Kubernetes headless Service) or
"ipv4:ADDR:PORT,ADDR:PORT" each request goes to the next server in turn (gRPC's round_robin
policy over every address, per request rather than per connection), and a cancel by id goes to
every server (docs/scaling.md).
Names shared with the server (models, tensors, parameters, error codes) come from h3_core.protocol,
which needs no torch.
"""

import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from h3_core import protocol

from .addresses import channel_args, check_url, server_addresses
from .errors import H3Error
from .inputs import (
    check_seconds,
    check_type,
    keyframe_inputs,
    lora_input,
    media_bytes,
    reference_inputs,
    request_parameters,
    scalar_input,
    sigma_inputs,
)

CANCEL_WAIT_S = 10.0  # after a timeout: how long to wait for the cancelled request's final response
# With deadline_s and no total_timeout_s, a call may last deadline_s + this many seconds: the server
# counts deadline_s from the request's arrival and cancels at the next step boundary after it, and a
# request that finished its steps in time is still decoded (about 7 s for the largest request the
# shipped CPU repository allows), so this covers the transfer, one step and a decode or a few.
DEADLINE_MARGIN_S = 30.0
# Each call streams over a channel of the client's pool; a channel is reused for this many seconds
# from its creation (then closed): on one channel round_robin sends successive requests to
# successive servers, and a new channel resolves a dns:/// name again (servers added since).
CHANNEL_MAX_AGE_S = 300.0
# seconds a unary call (model_config, ready) waits for its answer
UNARY_TIMEOUT_S = 10.0


@dataclass
class GenerationResult:
    """One generated clip. video_mp4: the MP4 file (b"" with return_mp4=False); frames: uint8
    [T, H, W, 3] and audio: float32 [2, samples] at protocol.AUDIO_SAMPLE_RATE Hz, only when asked
    for; info: the server's report (seed, num_frames, height, width, num_inference_steps,
    request_id, output_index, largest_pack, stage_seconds)."""

    video_mp4: bytes
    info: dict
    frames: np.ndarray | None = None
    audio: np.ndarray | None = None
    progress: list[tuple[int, int, int]] = field(default_factory=list)  # (step, total, queue position)
    previews: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (step, uint8 [Hl * p, Wl * p, 3])


class H3Client:
    """Streaming client for h3_pipeline at `url`: host:port of Triton's gRPC endpoint (no scheme),
    or several servers as dns:///host:port or ipv4:ADDR:PORT,... (check_url): each request then
    goes to the next server (round_robin), and cancel() asks every server.

    Two client-side limits, in seconds, for every call (generate and cancel):
      idle_timeout_s: the longest wait for the next response, counted from sending the request
        and then from each response. Keep-alive responses count (the server sends one after its
        heartbeat_s seconds, 15 by default, without another response; they are skipped otherwise),
        so a live request with progress off is not cut during its steps or its decode; the wait
        before the first keep-alive includes the encoder and Triton's queue.
      total_timeout_s: the longest a whole call may take, counted from sending the request; None:
        no limit, except that generate(deadline_s=D) then allows D + DEADLINE_MARGIN_S seconds,
        so that the client does not give up before the server's own deadline has ended the
        request (the server counts deadline_s from the request's arrival, a moment after sending).
    When one expires the client cancels the request on the server by its id, waits up to
    CANCEL_WAIT_S seconds for its final response, closes the stream and raises
    H3Error("TIMEOUT", ...) naming the limit.

    Calls stream over gRPC channels the client keeps for CHANNEL_MAX_AGE_S (one per concurrent
    call); close(), or leaving a `with H3Client(...) as client:` block, closes them. Every call
    stops its stream and closes its channel (or keeps it for the next call, after a final
    response) before it returns or raises, KeyboardInterrupt and exceptions from the callbacks
    included: nothing is left to garbage collection, where tritonclient's finalizer closes the
    channel and can deadlock (grpc's Channel._close waiting on a condition whose lock is held).

    Raises ValueError for a url with a scheme or a limit <= 0, TypeError for a limit that is not
    a number.
    """

    def __init__(
        self, url: str = "127.0.0.1:8001", *, idle_timeout_s: float = 600.0, total_timeout_s: float | None = None
    ):
        self.url = check_url(url)
        check_seconds("idle_timeout_s", idle_timeout_s)
        check_seconds("total_timeout_s", total_timeout_s, optional=True)
        self.idle_timeout_s, self.total_timeout_s = idle_timeout_s, total_timeout_s
        self._idle: dict[str, list[tuple[float, grpcclient.InferenceServerClient]]] = {}  # target -> (born, client)
        self._lock = threading.Lock()

    def __enter__(self) -> "H3Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels kept for reuse (calls still running keep theirs until they end)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for _, connection in connections:
                connection.close()

    def generate(
        self,
        prompt: str | bytes,
        *,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        num_inference_steps: int | None = None,
        seed: int | None = None,
        num_outputs: int | None = None,
        progress_every: int = 0,
        preview_every: int = 0,
        deadline_s: float | None = None,
        request_priority: int = 0,
        return_mp4: bool = True,
        return_frames: bool = False,
        return_audio: bool = False,
        request_id: str = "",
        inject_fault: str | None = None,
        first_frame: str | os.PathLike | bytes | None = None,
        last_frame: str | os.PathLike | bytes | None = None,
        fit: str | None = None,
        flow_shift: float | None = None,
        audio_flow_shift: float | None = None,
        cache_threshold: float | None = None,
        video_sigmas: Sequence[float] | None = None,
        audio_sigmas: Sequence[float] | None = None,
        lora: Sequence[tuple[str, float] | Mapping | str] | None = None,
        task: str | None = None,
        reference_images: Sequence[str | os.PathLike | bytes] = (),
        reference_videos: Sequence[str | os.PathLike | bytes] = (),
        reference_audio: Sequence[str | os.PathLike | bytes] = (),
        guides: Sequence[tuple[str | os.PathLike | bytes, int]] = (),
        references: Sequence[Mapping] | None = None,
        on_progress: Callable[[int, int, int], None] | None = None,
        on_preview: Callable[[int, np.ndarray], None] | None = None,
    ) -> list[GenerationResult]:
        """Generate num_outputs clips (None fields take the server's defaults; docs/request_contract.md
        has every field's range).

        on_progress(step, total_steps, queue_position) is called for each progress response
        (progress_every > 0). preview_every k > 0 adds a PREVIEW image after steps k, 2k, ...;
        on_preview(step, image) is called with each (uint8 [Hl * p, Wl * p, 3], p px per latent cell) as it
        arrives, before on_progress for that step; the results hold them too (`previews`).
        deadline_s: seconds, counted by the server from the request's arrival, after which the
        server cancels the request at the next step boundary (it then ends with CANCELLED); also
        sets this call's total timeout when the client has none (class docstring).
        request_priority: higher runs first under the server's srpt policy (default 0).
        return_mp4=False: the server encodes no MP4 (video_mp4 is b""; required by a server
        without PyAV); return_frames / return_audio fill frames / audio.
        request_id: lets `cancel(request_id)` reach this request; "" sends a random one
        ("h3c-<hex>") so that a timeout can cancel the request on the server. inject_fault:
        tests only, refused unless the server's h3_dit has allow_fault_injection "true".

        Keyframes (task fl2va, docs/model.md §2.1): first_frame / last_frame, each an image file's path
        (str or os.PathLike) or its bytes (PNG, JPEG or WebP, sent unchanged: the server decodes
        them), condition the clip's first / last frame; they go as KEYFRAMES BYTES [1, K] in the
        order first, last with KEYFRAME_INDICES INT64 [1, K] (0 first, -1 last; keyframe_inputs).
        fit: how the server fits a keyframe to the canvas, one of protocol.FITS (server default
        protocol.DEFAULT_FIT). flow_shift / audio_flow_shift: the shift of the video / audio sigma
        schedule, > 0 and <= protocol.MAX_FLOW_SHIFT (docs/model.md §3.1). cache_threshold: the step
        cache's threshold, 0 (every step computed) .. the server's max_cache_threshold; larger
        skips more steps (docs/request_contract.md). video_sigmas / audio_sigmas: the clock's own
        sigma list, num_inference_steps + 1 numbers strictly decreasing from exactly 1 to exactly 0,
        sent as VIDEO_SIGMAS / AUDIO_SIGMAS FP32 (sigma_inputs; without num_inference_steps the server
        takes the list's length - 1 steps). lora: the LoRA adapters to apply, composed in order,
        each ("name", scale), {"name": ..., "scale": ...} or "NAME[:SCALE]" (scale 1.0 when left
        out, -4..4), each loaded on the server (docs/lora.md), sent as LORA (lora_input). task: one of protocol.TASKS
        (TASK BYTES [1, 1]); None lets the server choose it from the inputs (keyframes: fl2va;
        references or guides: ref2va). Each of these is sent only when given (None: the server's
        default).

        References and timeline guides (task ref2va, docs/model.md §2.1-2.3), each a sequence of files'
        paths or bytes sent unchanged, in its order, only when not empty (reference_inputs):
        reference_images (PNG, JPEG, WebP: a character, an object) as REFERENCE_IMAGES BYTES
        [1, N], reference_videos (MP4) as REFERENCE_VIDEOS BYTES [1, N], reference_audio (WAV,
        FLAC, MP3: a voice, a sound) as REFERENCE_AUDIO BYTES [1, N]; guides, (image, frame) pairs
        (frame 0 .. num_frames - 1, the frame the image should appear at), as GUIDES BYTES [1, N]
        and GUIDE_FRAMES INT64 [1, N]. The server checks the counts (protocol.MAX_REFERENCE_IMAGES
        and the others by default) and the frames. references: the reference files' block order,
        REFERENCES' entries ({"input": "REFERENCE_VIDEOS", "index": 0, "start_time_seconds": 2.5,
        "audio": true}; protocol.reference_list); None: images, then videos, then audio.

        Returns the results in output-index order. Raises TypeError naming the argument (and the
        item, e.g. "reference_images[1]") for a wrong Python type, ValueError for deadline_s <= 0,
        a request_id over protocol.MAX_REQUEST_ID_CHARS characters or holding a NUL (Triton would cut
        it there, and cancel(request_id) would not find it), or a file's path that does not exist,
        is not a file or cannot be read, or empty file bytes (media_bytes; in each case nothing is
        sent), H3Error with the server's code word
        (INVALID_ARG for a value out of range, e.g. fit not in FITS, too many references, a guide
        frame past the clip or a file it cannot decode), or with TIMEOUT.
        """
        check_type("prompt", prompt, "str or bytes")
        for name, value in (
            ("height", height),
            ("width", width),
            ("num_frames", num_frames),
            ("num_inference_steps", num_inference_steps),
            ("seed", seed),
            ("num_outputs", num_outputs),
        ):
            check_type(name, value, "int", optional=True)
        check_type("progress_every", progress_every, "int")
        check_type("preview_every", preview_every, "int")
        check_seconds("deadline_s", deadline_s, optional=True)
        check_type("request_priority", request_priority, "int")
        for name, value in (
            ("return_mp4", return_mp4),
            ("return_frames", return_frames),
            ("return_audio", return_audio),
        ):
            check_type(name, value, "bool")
        check_type("request_id", request_id, "str")
        protocol.check_request_id("request_id", request_id)
        check_type("inject_fault", inject_fault, "str", optional=True)
        check_type("fit", fit, "str", optional=True)
        check_type("flow_shift", flow_shift, "number", optional=True)
        check_type("audio_flow_shift", audio_flow_shift, "number", optional=True)
        check_type("cache_threshold", cache_threshold, "number", optional=True)
        check_type("task", task, "str", optional=True)
        keyframes = keyframe_inputs(
            None if first_frame is None else media_bytes("first_frame", first_frame, "image"),
            None if last_frame is None else media_bytes("last_frame", last_frame, "image"),
        )
        files = reference_inputs(reference_images, reference_videos, reference_audio, guides)
        fields = dict(
            height=height,
            width=width,
            num_frames=num_frames,
            num_inference_steps=num_inference_steps,
            seed=seed,
            num_outputs=num_outputs,
        )
        inputs = [scalar_input(protocol.PROMPT, prompt.encode() if isinstance(prompt, str) else prompt, "BYTES")]
        inputs += [
            scalar_input(name, fields[key], "INT64")
            for name, key in protocol.INT_INPUTS.items()
            if fields[key] is not None
        ]
        inputs += keyframes + files + sigma_inputs(video_sigmas, audio_sigmas) + lora_input(lora)
        if task is not None:
            inputs.append(scalar_input(protocol.TASK, task.encode(), "BYTES"))
        if references is not None:  # the server checks the entries (protocol.reference_list)
            inputs.append(
                scalar_input(protocol.REFERENCES, json.dumps([dict(e) for e in references]).encode(), "BYTES")
            )
        wanted = {protocol.FRAMES: return_frames, protocol.AUDIO: return_audio}
        outputs = [grpcclient.InferRequestedOutput(name) for name in protocol.OUTPUTS if wanted.get(name, True)]
        parameters = request_parameters(
            progress_every=progress_every,
            preview_every=preview_every,
            deadline_s=deadline_s,
            request_priority=request_priority,
            return_mp4=return_mp4,
            return_frames=return_frames,
            return_audio=return_audio,
            inject_fault=inject_fault,
            fit=fit,
            flow_shift=flow_shift,
            audio_flow_shift=audio_flow_shift,
            cache_threshold=cache_threshold,
        )
        if self.total_timeout_s is not None:
            total = (self.total_timeout_s, "total_timeout_s")
        elif deadline_s is not None:
            total = (deadline_s + DEADLINE_MARGIN_S, f"deadline_s {deadline_s:g} + {DEADLINE_MARGIN_S:g} s margin")
        else:
            total = None
        results, progress, previews, ended = [], [], [], None
        request_id = request_id or f"h3c-{uuid.uuid4().hex}"
        # closing(): a callback's exception (or KeyboardInterrupt) leaves the loop with the stream
        # still open; it is stopped here, not when the suspended generator is collected
        with closing(self._stream(protocol.PIPELINE_MODEL, inputs, outputs, parameters, request_id, total)) as stream:
            for result in stream:
                try:
                    results += self._read(result, progress, previews, on_progress, on_preview)
                except H3Error as error:  # ended early; read on to the stream's final response
                    ended = error
        if ended is not None:
            raise ended
        return sorted(results, key=lambda r: r.info["output_index"])

    def cancel(self, request_id: str) -> str:
        """Cancel the request with this id through a request to h3_cancel of every server behind
        the url (server_addresses; one for host:port), answered at once, also while a DiT
        instance runs a whole generation in one execute (execution mode "request"); returns the
        answer, one of
        protocol.CANCEL_STATES ("cancelled" if a server cancelled it, else "finished" if one had
        finished it, else "unknown"; request ids are unique, so at most one server holds it):

          "cancelled": the request was running or waiting in the DiT; it leaves the pack at the
            next step boundary and its stream ends with H3Error CANCELLED.
          "finished": the request already left the DiT (its result is being decoded or was
            delivered): nothing was done, and its stream ends normally.
          "unknown": no request with this id is known (never sent, or still in Triton's queue or
            the text encoder; a request with files is held while h3_encoder decodes them: it
            answers "cancelled" and stops between files).
            The server remembers the id for protocol.EARLY_CANCEL_SECONDS, and a request with it
            that arrives in that time ends with CANCELLED.

        Raises TypeError for a non-str id, H3Error with the server's code word (INVALID_ARG for
        an empty id; UNAVAILABLE when the name does not resolve or a server cannot be reached,
        unless another server answered "cancelled" or "finished"), TIMEOUT, or UNKNOWN for an
        answer without one of those states (a server older than this client).
        """
        check_type("request_id", request_id, "str")
        answers, errors = [], []
        for address in server_addresses(self.url):
            try:
                answers.append(self._cancel_at(address, request_id))
            except H3Error as error:
                errors.append(error)
        if errors and not {"cancelled", "finished"} & set(answers):
            raise errors[0]
        return next(state for state in protocol.CANCEL_STATES if state in answers)

    def lora_control(self, action: str, name: str | None = None, path: str | None = None) -> dict:
        """A LoRA control request (docs/lora.md §"Serving") to h3_cancel of every server behind the
        url: action "lora_load" (name, path: a safetensors file on the server's disk),
        "lora_unload" (name) or "lora_list". Returns the server's INFO answer ({"kind": "lora",
        "action", "name", "instances": {instance: report}} or {"kind": "lora_list", "adapters":
        [...]}); with several servers, one answer whose instances (or adapters) are all of
        theirs, each instance named "host:port/instance". Raises H3Error with the server's code
        word (INVALID_ARG: a malformed control, a name loaded already or not loaded, a load every
        DiT instance refused, e.g. beyond max_loras or max_lora_rank, with its message)."""
        body = {key: value for key, value in (("name", name), ("path", path)) if value is not None}
        control = scalar_input(protocol.REQUEST, json.dumps({action: body}).encode(), "BYTES")
        requested = [grpcclient.InferRequestedOutput(protocol.INFO)]
        addresses = server_addresses(self.url)
        answers = []
        for address in addresses:
            with closing(self._stream(protocol.CANCEL_MODEL, [control], requested, {}, "", None, address)) as stream:
                final = list(stream)
            answers.append(json.loads(final[0].as_numpy(protocol.INFO).reshape(-1)[0]))
        if len(answers) == 1:
            return answers[0]
        merged = dict(answers[0])
        if "instances" in merged:
            merged["instances"] = {
                f"{address}/{instance}": report
                for address, answer in zip(addresses, answers, strict=True)
                for instance, report in answer["instances"].items()
            }
        else:
            merged["adapters"] = [entry for answer in answers for entry in answer["adapters"]]
        return merged

    def model_config(self, model: str) -> dict:
        """Triton's configuration of `model` (get_model_config as JSON: "name", "parameters"
        {key: {"string_value": ...}}, ...) from the next server behind the url. Raises H3Error
        UNAVAILABLE when no server answers within UNARY_TIMEOUT_S, else with Triton's code word
        (UNKNOWN for a model that is not loaded)."""
        return self._unary(lambda client: client.get_model_config(model, as_json=True, client_timeout=UNARY_TIMEOUT_S))[
            "config"
        ]

    def ready(self) -> bool:
        """Whether the next server behind the url answers within UNARY_TIMEOUT_S and has
        h3_pipeline ready (Triton's is_model_ready: every model of the ensemble loaded)."""
        try:
            return self._unary(
                lambda client: client.is_model_ready(protocol.PIPELINE_MODEL, client_timeout=UNARY_TIMEOUT_S)
            )
        except H3Error:
            return False

    def _unary(self, call: Callable[[grpcclient.InferenceServerClient], object]):
        """call(client) on a pooled connection to the url, kept for reuse when it answered. An
        InferenceServerException becomes H3Error: UNAVAILABLE when the server could not be
        reached or did not answer in time, else H3Error.from_server's."""
        born, client = self._connection(self.url)
        try:
            answer = call(client)
        except InferenceServerException as error:
            client.close()
            if error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"):
                raise H3Error("UNAVAILABLE", f"{self.url} did not answer: {error.message()}") from None
            raise H3Error.from_server(error) from None
        with self._lock:
            self._idle.setdefault(self.url, []).append((born, client))
        return answer

    def _cancel_at(self, address: str, request_id: str) -> str:
        """cancel() of one server at address (host:port)."""
        control = scalar_input(protocol.REQUEST, json.dumps({protocol.CANCEL_FIELD: request_id}).encode(), "BYTES")
        requested = [grpcclient.InferRequestedOutput(protocol.INFO)]
        with closing(self._stream(protocol.CANCEL_MODEL, [control], requested, {}, "", None, address)) as stream:
            final = list(stream)
        answer = json.loads(final[0].as_numpy(protocol.INFO).reshape(-1)[0])
        if answer.get("state") not in protocol.CANCEL_STATES:
            raise H3Error("UNKNOWN", f"the cancel answer has no state in {protocol.CANCEL_STATES}: {answer}")
        return answer["state"]

    def _connection(self, target: str) -> tuple[float, grpcclient.InferenceServerClient]:
        """(monotonic creation time, client) for one call to target: an idle kept one younger than
        CHANNEL_MAX_AGE_S (older ones are closed), else a new one with channel_args(target)."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(target, [])
            while idle:
                born, connection = idle.pop()
                if now - born < CHANNEL_MAX_AGE_S:
                    return born, connection
                connection.close()
        return now, grpcclient.InferenceServerClient(target, channel_args=channel_args(target))

    def _stream(self, model, inputs, outputs, parameters, request_id, total, target=None):
        """Yield the responses of one streaming request until the final one (an error ends the
        request too). total: None or (seconds from sending, the name of that limit for the
        message). On a timeout the request is cancelled by id when it has one (an h3_pipeline
        request) and its final response awaited for CANCEL_WAIT_S; a stream whose request never
        ended is closed with cancel_requests=True, which frees the client (Triton 2.51 then
        counts the ensemble request as in flight until it exits). target: where to stream (default:
        the url); its channel is kept for the next call when the stream ended with its final
        response, else closed, on every way out (an exception, KeyboardInterrupt, or the
        generator's close())."""
        responses: queue.Queue = queue.Queue()
        target = target or self.url
        born, client = self._connection(target)
        ended = reusable = False
        try:
            try:
                client.start_stream(callback=lambda result, error: responses.put((result, error)))
                sent = time.monotonic()
                client.async_stream_infer(
                    model,
                    inputs,
                    outputs=outputs,
                    request_id=request_id,
                    parameters=parameters,
                    enable_empty_final_response=True,
                )
            except InferenceServerException as error:  # e.g. nothing listens at the url
                ended = True
                raise H3Error("UNAVAILABLE", f"cannot stream to {target}: {error.message() or error}") from None
            while not ended:
                left = None if total is None else sent + total[0] - time.monotonic()
                try:
                    if left is not None and left <= 0:
                        raise queue.Empty
                    result, error = responses.get(
                        timeout=self.idle_timeout_s if left is None else min(self.idle_timeout_s, left)
                    )
                except queue.Empty:
                    if total is not None and time.monotonic() >= sent + total[0]:
                        message = f"no final response from {target} within {total[0]:g} s of sending ({total[1]})"
                    else:
                        message = f"no response from {target} for {self.idle_timeout_s:g} s (idle_timeout_s)"
                    if model == protocol.PIPELINE_MODEL and request_id:
                        ended = self._cancel_after_timeout(request_id, responses)
                    raise H3Error("TIMEOUT", message) from None
                ended = error is not None or result.get_response().parameters["triton_final_response"].bool_param
                if error is not None:
                    raise H3Error.from_server(error)
                reusable = ended
                yield result
        finally:
            try:
                client.stop_stream(cancel_requests=not ended)
            except BaseException:
                reusable = False
                raise
            finally:
                if reusable:
                    with self._lock:
                        self._idle.setdefault(target, []).append((born, client))
                else:
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
    def _read(result, progress, previews, on_progress, on_preview) -> list[GenerationResult]:
        info_tensor = result.as_numpy(protocol.INFO)
        if info_tensor is None or info_tensor.size == 0:
            return []  # the empty final response that closes the stream
        info = json.loads(info_tensor.reshape(-1)[0])
        if info["kind"] == protocol.KEEPALIVE:
            return []  # it only kept the stream busy for proxies (it restarted the idle timeout)
        if info["kind"] == "error":  # a started request that ended early (CANCELLED, INTERNAL)
            raise H3Error(info["code"], info["message"])
        step, total, position = (int(v) for v in result.as_numpy(protocol.PROGRESS).reshape(-1))
        if info["kind"] == "progress":
            preview = result.as_numpy(protocol.PREVIEW)
            if preview is not None and preview.size:
                previews.append((step, preview[0]))
                if on_preview:
                    on_preview(step, preview[0])
            progress.append((step, total, position))
            if on_progress:
                on_progress(step, total, position)
            return []
        mp4 = result.as_numpy(protocol.VIDEO_MP4).reshape(-1)  # empty with return_mp4=False
        frames, audio = result.as_numpy(protocol.FRAMES), result.as_numpy(protocol.AUDIO)
        return [
            GenerationResult(
                video_mp4=bytes(mp4[0]) if mp4.size else b"",
                info=info,
                frames=frames[0] if frames is not None else None,
                audio=audio[0] if audio is not None else None,
                progress=list(progress),
                previews=list(previews),
            )
        ]
