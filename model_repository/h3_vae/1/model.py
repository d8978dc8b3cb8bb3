"""h3_vae: VIDEO_LATENT + AUDIO_LATENT + INFO -> VIDEO_MP4 (+ FRAMES, AUDIO on request) and INFO
with the decode time (an adapter over h3_core.model.vae.decode_clip and h3_core.media).

Decoupled: every h3_dit response reaches this model through the ensemble; one without latents
(progress, an early end, a cancel answer) is answered at once with empty outputs, and one with
latents is decoded on a pool of `decode_workers` threads (h3_core.serving.vae.ordered_pool: one request's
outputs in order, different requests in parallel), so no response waits behind another
request's decode; a heartbeat is answered with a keep-alive response (protocol.KEEPALIVE, unless
the request sent keepalive=false), a result with its response and then the final flag (an
early end carries the final flag in its one send), or at once with UNAVAILABLE when
decode_workers + max_queued_decodes decodes are open; an open decode
gets keep-alives of its own after heartbeat_s seconds without a response, and the gauge
h3_vae_decodes{state="queued"|"running"} counts the open decodes (h3_core.serving.vae.decodes). Every
request ends with its final flag, whatever fails. Everything that touches the stub (requests,
tensors, logging, sends) runs under one lock (stub_lock), execute() included; the cancels of
h3_core.serving.vae.gone_clients go to the registry, outside it. With request parameter
return_mp4 false the latents are still decoded but no MP4 is encoded: VIDEO_MP4 is empty
(BYTES [1, 0]), so a server without PyAV can serve FRAMES / AUDIO (h3_dit refuses return_mp4
true there). A malformed direct request is refused with INVALID_ARG, also a result whose INFO
names a canvas beyond h3_vae's own max_height, max_width, max_num_frames or whose latents do not
fit it."""

import functools
import json
import logging
import math
import threading
import time
import traceback

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from h3_core.config import audio_latent_frames, latent_frames
from h3_core.media import encode_mp4
from h3_core.model.vae import decode_clip
from h3_core.protocol import (
    AUDIO_LATENT,
    KEEPALIVE,
    VIDEO_LATENT,
    check_request_parameters,
    fault_seconds,
)
from h3_core.serving.dit.metrics import end_line
from h3_core.serving.shared.agreement import check_siblings
from h3_core.serving.shared.gpu_turns import GpuTurns, decode_tiles
from h3_core.serving.shared.registry import Registry, server_folder
from h3_core.serving.shared.settings import VaeSettings
from h3_core.serving.shared.triton import error_response, json_tensor, model_parameters, resolve_path, set_threads
from h3_core.serving.vae.decodes import BacklogFull, Decode, Decodes, check_result
from h3_core.serving.vae.gone_clients import GoneClients
from h3_core.serving.vae.ordered_pool import OrderedPool
from h3_core.weights.checkpoint import source_seed
from h3_core.weights.vae_hook import load_vaes

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("h3_vae")

EMPTY_MP4 = np.empty((1, 0), dtype=object)
EMPTY_FRAMES = np.zeros((1, 0, 0, 0, 3), dtype=np.uint8)
EMPTY_AUDIO = np.zeros((1, 2, 0), dtype=np.float32)
DECODE_STATES = ("queued", "running")  # the labels of the gauge h3_vae_decodes, in Decodes.counts() order
NO_PROGRESS = np.zeros((1, 3), dtype=np.int32)
EMPTY_PREVIEW = np.zeros((1, 0, 0, 3), dtype=np.uint8)


def read_inputs(request) -> tuple[dict, torch.Tensor, torch.Tensor, list]:
    """(INFO, video latent [1, 24, T_lat, Hl, Wl], audio latent [1, 2, 32, T_a], [PROGRESS,
    PREVIEW] tensors to pass through) of a request. Raises ValueError naming the input for a
    malformed one."""
    names = ("INFO", VIDEO_LATENT, AUDIO_LATENT, "PROGRESS", "PREVIEW")
    tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in names}
    missing = [name for name, tensor in tensors.items() if tensor is None]
    if missing:
        raise ValueError(f"{missing[0]} is required")
    values = tensors["INFO"].as_numpy().reshape(-1)
    try:
        info = json.loads(values[0]) if values.size == 1 else None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("kind"), str):
        raise ValueError("INFO must hold one JSON object with a string 'kind'")
    video = torch.from_numpy(tensors[VIDEO_LATENT].as_numpy().copy())
    audio = torch.from_numpy(tensors[AUDIO_LATENT].as_numpy().copy())
    passed = [pb_utils.Tensor(name, tensors[name].as_numpy()) for name in ("PROGRESS", "PREVIEW")]
    return info, video, audio, passed


def response(mp4, frames, audio, passed: list, info: dict) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(
        [
            pb_utils.Tensor("VIDEO_MP4", mp4),
            pb_utils.Tensor("FRAMES", frames),
            pb_utils.Tensor("AUDIO", audio),
            *passed,
            json_tensor("INFO", info),
        ]
    )


def keepalive_response(request_id: str) -> "pb_utils.InferenceResponse":
    """The keep-alive response (protocol.KEEPALIVE): empty outputs, PROGRESS (0, 0, 0), INFO
    {"kind": "keepalive", "request_id"}."""
    passed = [pb_utils.Tensor("PROGRESS", NO_PROGRESS), pb_utils.Tensor("PREVIEW", EMPTY_PREVIEW)]
    return response(EMPTY_MP4, EMPTY_FRAMES, EMPTY_AUDIO, passed, {"kind": KEEPALIVE, "request_id": request_id})


class Reply:
    """The response sender of one h3_vae request; remembers whether its final flag went out, so
    that every way out of the request ends it exactly once (`TritonPythonModel.close`)."""

    def __init__(self, sender):
        self.sender, self.final_sent = sender, False

    def send(self, message=None, final: bool = False) -> None:
        if final:
            self.final_sent = True  # before sending: a send that raises closes the sender anyway
        self.sender.send(message, flags=FINAL if final else 0)


class TritonPythonModel:
    def initialize(self, args):
        settings = VaeSettings.from_parameters(model_parameters(args))
        check_siblings(args["model_repository"], VaeSettings.MODEL, model_parameters(args))
        set_threads(settings.cpu_threads)
        source = settings.checkpoint_dir  # random:SEED is no path
        source = source if source_seed(source) is not None else resolve_path(args, source)
        self.video_vae, self.audio_vae = load_vaes(source, settings.device, settings.trust_remote_code)
        # warm up: first-call set-up is not paid by the first client
        decode_clip(
            self.video_vae,
            self.audio_vae,
            1,
            torch.zeros(24, latent_frames(1), 2, 2),
            torch.zeros(2, 32, audio_latent_frames(1)),
        )
        self.decodes_family = pb_utils.MetricFamily(
            name="h3_vae_decodes_total", description="latents decoded to a clip", kind=pb_utils.MetricFamily.COUNTER
        )  # Triton needs it referenced
        self.decodes = self.decodes_family.Metric(labels={"model": "h3_vae"})
        self.open_family = pb_utils.MetricFamily(
            name="h3_vae_decodes",
            description="results in h3_vae waiting for a decode worker (queued) or decoding (running)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.open_gauges = [self.open_family.Metric(labels={"model": "h3_vae", "state": s}) for s in DECODE_STATES]
        self.limits = settings.limits()
        self.allow_faults = settings.allow_fault_injection  # inject_fault's VAE_FAULTS act (tests only)
        # decodes in turns with the DiT steps of this GPU (h3_core.serving.shared.gpu_turns), or at once
        folder = server_folder()  # shared with the server's other models (registry, GPU turns)
        self.turns = GpuTurns.on_device(folder, settings.device, settings.turn_share) if settings.gpu_turns else None
        self.pool = OrderedPool(settings.decode_workers, name="h3_vae-decode")
        # Everything that touches the stub (reading requests, making tensors, logging, sending, BLS
        # calls) happens under this lock: in Triton 2.51 a decode thread sending while execute()
        # ran crashed tritonserver (docs/reliability.md); the decodes themselves run outside it.
        self.stub_lock = threading.Lock()
        self.gone = GoneClients(Registry(folder), pb_utils.Logger.log_info, self.stub_lock)
        self.open_decodes = Decodes(
            self.stub_lock,
            settings.decode_workers,
            settings.max_queued_decodes,
            settings.heartbeat_s,
            lambda decode: decode.reply.send(keepalive_response(decode.request_id)),
            pb_utils.Logger.log_error,
            lambda *counts: [gauge.set(count) for gauge, count in zip(self.open_gauges, counts, strict=True)],
        )

    def execute(self, requests):
        with self.stub_lock:
            for request in requests:
                try:
                    reply = Reply(request.get_response_sender())
                except Exception as error:  # noqa: BLE001 - nothing can reach this request; the others go on
                    self.failure(error, "a request's response sender could not be made")
                    continue
                try:
                    self.answer(request, reply)
                except Exception as error:  # noqa: BLE001 - this request fails alone, with its final flag
                    self.close(reply, None, self.failure(error, "the request could not be answered"))
        return None

    def answer(self, request, reply: Reply) -> None:
        """Answer one request at once when it needs no decode; else queue its decode on the pool
        (under stub_lock). Raises ValueError for a malformed request."""
        info, video, audio, passed = read_inputs(request)
        request_id = str(info.get("request_id", ""))
        gone = request.is_cancelled() and info["kind"] in ("progress", "heartbeat", "result")
        if gone:
            self.gone.cancel(request_id)  # the client is gone: no decode
        if info["kind"] == "error" or (
            info["kind"] == "result" and info.get("output_index") == info.get("num_outputs", 1) - 1
        ):
            self.gone.forget(request_id)  # its last response: the id may come back in a new request
        if gone:
            reply.send(final=True)
            return
        parameters = check_request_parameters(request.parameters())
        if info["kind"] == "heartbeat":  # the DiT's: a keep-alive for the client, unless it turned them off
            reply.send(keepalive_response(request_id) if parameters.get(KEEPALIVE, True) else None, final=True)
            return
        if video.numel() == 0:
            reply.send(response(EMPTY_MP4, EMPTY_FRAMES, EMPTY_AUDIO, passed, info), final=True)
            return
        check_result(info, video.shape, audio.shape, self.limits)
        try:
            silent_s = info.get("silent_s", 0.0)  # INFO may be forged: a number, else none
            silent_s = float(silent_s) if type(silent_s) in (int, float) and math.isfinite(silent_s) else 0.0
            decode = self.open_decodes.add(request_id, reply, parameters.get(KEEPALIVE, True), silent_s)
        except BacklogFull as full:  # a normal final response, as h3_dit ends started requests
            message = (
                f"output {info.get('output_index', 0)} of request {request_id} was not decoded: {full}; retry later"
            )
            ended = {"kind": "error", "request_id": request_id, "code": "UNAVAILABLE", "message": message}
            reply.send(response(EMPTY_MP4, EMPTY_FRAMES, EMPTY_AUDIO, passed, ended), final=True)
            return
        try:
            self.pool.submit(
                request_id, functools.partial(self.decode, decode, info, video[0], audio[0], passed, parameters)
            )
        except Exception:
            self.open_decodes.finish(decode)
            raise

    def failure(self, error: Exception, what: str) -> "pb_utils.InferenceResponse":
        """The error response for `error` (under stub_lock): INVALID_ARG with its message for a
        ValueError, else INTERNAL naming `what`, with the traceback in the server log."""
        if isinstance(error, ValueError):
            return error_response("INVALID_ARG", str(error))
        trace = "".join(traceback.format_exception(error))
        try:
            pb_utils.Logger.log_error(f"h3_vae: {what}:\n{trace}")
        except Exception:  # noqa: BLE001 - the server log failed: Python's log (stderr) then
            log.exception("%s:\n%s", what, trace)
        return error_response("INTERNAL", f"{what} ({type(error).__name__}); see the server log")

    def close(self, reply: Reply, request_id, message) -> None:
        """Send `message` (not final), then the final flag, unless the final flag went out already
        (under stub_lock). A send that fails (e.g. /dev/shm full closes the sender) is answered by
        an UNAVAILABLE error naming request_id; whatever still fails is logged: the request ends
        here whatever happens, and no other request is touched."""
        if reply.final_sent:
            return
        try:
            if message is not None:
                try:
                    reply.send(message)
                except pb_utils.TritonModelException as failed:
                    reply.send(
                        error_response("UNAVAILABLE", f"the result of request {request_id} could not be sent: {failed}")
                    )
        except Exception as error:  # noqa: BLE001 - logged; the final flag still goes out below
            pb_utils.Logger.log_error(f"h3_vae: a response of request {request_id} could not be sent: {error}")
        try:
            reply.send(final=True)
        except Exception as error:  # noqa: BLE001 - nothing more can reach this request
            pb_utils.Logger.log_error(f"h3_vae: the final flag of request {request_id} could not be sent: {error}")

    def decode(
        self, decode: Decode, info: dict, video: torch.Tensor, audio: torch.Tensor, passed: list, parameters: dict
    ) -> None:
        """Decode one output's latents (on a pool thread, without the lock), then close the open
        decode and send its response and the final flag (under stub_lock): the clip, INVALID_ARG
        for latents that do not fit INFO, or INTERNAL for any other failure (in the decode or in
        building the response). Keep-alives go out meanwhile (self.open_decodes)."""
        start, error, outputs = time.perf_counter(), None, None
        try:
            with self.stub_lock:
                self.open_decodes.start(decode)
            fault = parameters.get("inject_fault") if self.allow_faults else None
            if fault == "decode_start_raise":
                raise RuntimeError("injected fault as the decode started")
            if fault is not None and fault_seconds(fault, "decode_slow:") is not None:
                time.sleep(fault_seconds(fault, "decode_slow:"))
            with decode_tiles(self.turns) as tile:
                frames, audio = decode_clip(self.video_vae, self.audio_vae, info["num_frames"], video, audio, tile)
            frames, audio = frames.cpu(), audio.cpu()
            mp4 = (
                np.array([[encode_mp4(frames, audio)]], dtype=object)
                if parameters.get("return_mp4", True)
                else EMPTY_MP4
            )
            outputs = (
                mp4,
                frames[None].numpy() if parameters.get("return_frames") else EMPTY_FRAMES,
                audio[None].numpy() if parameters.get("return_audio") else EMPTY_AUDIO,
            )
            info.setdefault("stage_seconds", {})["decode"] = time.perf_counter() - start
        except Exception as caught:  # noqa: BLE001 - the request fails alone
            error = caught
        request_id, message = info.get("request_id"), None
        with self.stub_lock:
            try:
                if error is not None:
                    raise error
                message = response(*outputs, passed, info)
                self.decodes.increment(1)
                if info.get("output_index") == info.get("num_outputs", 1) - 1:
                    seconds, steps = info["stage_seconds"], info.get("num_inference_steps", 0)
                    line = end_line(
                        str(request_id),
                        "completed",
                        info["height"],
                        info["width"],
                        info["num_frames"],
                        steps,
                        steps,
                        seconds,
                    )
                    pb_utils.Logger.log_info(f"h3_vae: {line}")
            except Exception as failed:  # noqa: BLE001 - the request fails alone
                message = self.failure(failed, f"decode of request {request_id} failed")
            finally:
                self.close(decode.reply, request_id, message)
                self.finish(decode)

    def finish(self, decode: Decode) -> None:
        """Close the open decode after its final response went out (under stub_lock, so no
        keep-alive falls between the two): h3_vae_decodes reaches 0 only when every response is
        with Triton, which a stop's drain waits for (server.process.TritonServer.drain). A
        failure of the gauge is logged."""
        try:
            self.open_decodes.finish(decode)
        except Exception as error:  # noqa: BLE001 - the decode is closed (removed before the gauge is set)
            pb_utils.Logger.log_error(f"h3_vae: the decode gauges could not be set: {error}")

    def finalize(self):
        if self.turns is not None:
            self.turns.stop()  # a decode waiting for its GPU turn goes on without it
        self.pool.close()
        self.open_decodes.close()
        self.gone.close()
