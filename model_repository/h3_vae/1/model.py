"""h3_vae: LATENT rows + INFO -> VIDEO_MP4 (+ FRAMES, AUDIO on request) and INFO with the
decode time (thin adapter over h3_core.engine.decode_latents and h3_core.media).

With request parameter return_mp4 false the latent is still decoded but no MP4 is encoded:
VIDEO_MP4 is empty (BYTES [1, 0]), so a server without PyAV can serve FRAMES / AUDIO (h3_dit
refuses return_mp4 true there)."""
import time

import numpy as np
import torch

from h3_core import layout as L
from h3_core.config import AUDIO_ROW_WIDTH, VIDEO_ROW_WIDTH
from h3_core.engine import decode_latents, load_vaes
from h3_core.media import encode_mp4
from server.adapter import (error_response, json_tensor, model_parameters, read_json, request_parameters,
                            resolve_path)

import triton_python_backend_utils as pb_utils

EMPTY_MP4 = np.empty((1, 0), dtype=object)
EMPTY_FRAMES = np.zeros((1, 0, 0, 0, 3), dtype=np.uint8)
EMPTY_AUDIO = np.zeros((1, 2, 0), dtype=np.float32)


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        torch.set_num_threads(int(params["cpu_threads"]))
        self.video_vae, self.audio_vae = load_vaes(resolve_path(args, params["checkpoint_dir"]), params["device"])
        layout = L.make_layout(1, 32, 32, 1)  # warm up: first-call set-up is not paid by the first client
        decode_latents(self.video_vae, self.audio_vae, layout, 1, torch.zeros(layout.video_rows, VIDEO_ROW_WIDTH),
                       torch.zeros(layout.audio_rows, AUDIO_ROW_WIDTH))
        self.decodes_family = pb_utils.MetricFamily(name="h3_vae_decodes_total", description="latents decoded to a clip",
                                                    kind=pb_utils.MetricFamily.COUNTER)  # Triton needs it referenced
        self.decodes = self.decodes_family.Metric(labels={"model": "h3_vae"})

    def execute(self, requests):
        return [self.decode(request) for request in requests]

    def decode(self, request):
        start = time.perf_counter()
        info = read_json(request, "INFO")
        latent = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "LATENT").as_numpy().reshape(-1).copy())
        if latent.numel() == 0:
            return self.response(EMPTY_MP4, EMPTY_FRAMES, EMPTY_AUDIO, info)
        parameters = request_parameters(request)
        layout = L.make_layout(1, info["height"], info["width"], info["num_frames"])
        video_size = layout.video_rows * VIDEO_ROW_WIDTH
        if latent.numel() != video_size + layout.audio_rows * AUDIO_ROW_WIDTH:
            return error_response("INVALID_ARG", f"LATENT has {latent.numel()} values; the shape in INFO needs "
                                                 f"{video_size + layout.audio_rows * AUDIO_ROW_WIDTH}")
        video_rows = latent[:video_size].reshape(-1, VIDEO_ROW_WIDTH)
        audio_rows = latent[video_size:].reshape(-1, AUDIO_ROW_WIDTH)
        frames, audio = decode_latents(self.video_vae, self.audio_vae, layout, info["num_frames"], video_rows, audio_rows)
        self.decodes.increment(1)
        frames, audio = frames.cpu(), audio.cpu()
        mp4 = EMPTY_MP4
        if parameters.get("return_mp4", True):
            mp4 = np.array([[encode_mp4(frames, audio)]], dtype=object)
        info["stage_seconds"]["decode"] = time.perf_counter() - start
        return self.response(mp4, frames[None].numpy() if parameters.get("return_frames") else EMPTY_FRAMES,
                             audio[None].numpy() if parameters.get("return_audio") else EMPTY_AUDIO, info)

    @staticmethod
    def response(mp4, frames, audio, info):
        return pb_utils.InferenceResponse([pb_utils.Tensor("VIDEO_MP4", mp4), pb_utils.Tensor("FRAMES", frames),
                                           pb_utils.Tensor("AUDIO", audio), json_tensor("INFO", info)])
