"""h3_vae: VIDEO_LATENT + AUDIO_LATENT + INFO -> VIDEO_MP4 (+ FRAMES, AUDIO on request) and INFO
with the decode time (an adapter over h3_core.engine.decode_clip and h3_core.media).

Every h3_dit response reaches this model through the ensemble; one without latents (progress,
an early end, a cancel answer) is passed on at once with empty outputs. With request parameter
return_mp4 false the latents are still decoded but no MP4 is encoded: VIDEO_MP4 is empty
(BYTES [1, 0]), so a server without PyAV can serve FRAMES / AUDIO (h3_dit refuses return_mp4
true there). A malformed direct request is refused with INVALID_ARG."""
import json
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from h3_core.engine import decode_clip, load_vaes
from h3_core.layout import audio_latent_frames, latent_frames
from h3_core.media import encode_mp4
from h3_core.protocol import AUDIO_LATENT, VIDEO_LATENT, check_request_parameters
from h3_core.settings import VaeSettings
from server.adapter import error_response, json_tensor, model_parameters, resolve_path, set_threads

EMPTY_MP4 = np.empty((1, 0), dtype=object)
EMPTY_FRAMES = np.zeros((1, 0, 0, 0, 3), dtype=np.uint8)
EMPTY_AUDIO = np.zeros((1, 2, 0), dtype=np.float32)
RESULT_FIELDS = ("height", "width", "num_frames")


def read_inputs(request) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(INFO, video latent [1, 24, T_lat, Hl, Wl], audio latent [1, 2, 32, T_a]) of a request.
    Raises ValueError naming the input for a malformed one."""
    tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in ("INFO", VIDEO_LATENT, AUDIO_LATENT)}
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
    return info, video, audio


class TritonPythonModel:
    def initialize(self, args):
        settings = VaeSettings.from_parameters(model_parameters(args))
        set_threads(settings.cpu_threads)
        self.video_vae, self.audio_vae = load_vaes(resolve_path(args, settings.checkpoint_dir), settings.device)
        # warm up: first-call set-up is not paid by the first client
        decode_clip(self.video_vae, self.audio_vae, 1, torch.zeros(24, latent_frames(1), 2, 2),
                    torch.zeros(2, 32, audio_latent_frames(1)))
        self.decodes_family = pb_utils.MetricFamily(name="h3_vae_decodes_total", description="latents decoded to a clip",
                                                    kind=pb_utils.MetricFamily.COUNTER)  # Triton needs it referenced
        self.decodes = self.decodes_family.Metric(labels={"model": "h3_vae"})

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self.decode(request))
            except ValueError as error:
                responses.append(error_response("INVALID_ARG", str(error)))
        return responses

    def decode(self, request):
        """One h3_dit response -> the client's response. Raises ValueError for malformed inputs."""
        start = time.perf_counter()
        info, video, audio = read_inputs(request)
        if video.numel() == 0:
            return self.response(EMPTY_MP4, EMPTY_FRAMES, EMPTY_AUDIO, info)
        parameters = check_request_parameters(request.parameters())
        if info["kind"] != "result" or any(type(info.get(name)) is not int for name in RESULT_FIELDS):
            raise ValueError(f"INFO of a response with latents must be a result holding integers {list(RESULT_FIELDS)}")
        if video.dim() != 5 or video.shape[0] != 1 or audio.dim() != 4 or audio.shape[0] != 1:
            raise ValueError(f"{VIDEO_LATENT} must be [1, 24, T_lat, Hl, Wl] and {AUDIO_LATENT} [1, 2, 32, T_a], got "
                             f"{list(video.shape)} and {list(audio.shape)}")
        frames, audio = decode_clip(self.video_vae, self.audio_vae, info["num_frames"], video[0], audio[0])
        self.decodes.increment(1)
        frames, audio = frames.cpu(), audio.cpu()
        mp4 = EMPTY_MP4
        if parameters.get("return_mp4", True):
            mp4 = np.array([[encode_mp4(frames, audio)]], dtype=object)
        info.setdefault("stage_seconds", {})["decode"] = time.perf_counter() - start
        return self.response(mp4, frames[None].numpy() if parameters.get("return_frames") else EMPTY_FRAMES,
                             audio[None].numpy() if parameters.get("return_audio") else EMPTY_AUDIO, info)

    @staticmethod
    def response(mp4, frames, audio, info):
        return pb_utils.InferenceResponse([pb_utils.Tensor("VIDEO_MP4", mp4), pb_utils.Tensor("FRAMES", frames),
                                           pb_utils.Tensor("AUDIO", audio), json_tensor("INFO", info)])
