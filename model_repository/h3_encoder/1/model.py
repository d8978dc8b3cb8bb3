"""h3_encoder: PROMPT -> TEXT_EMBEDS + ENCODE_SECONDS (thin adapter over h3_core.encoder)."""
import time

import torch

from h3_core.encoder import TextEncoder
from server.adapter import error_response, model_parameters, torch_tensor

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        self.encoder = TextEncoder(params["encoder_path"] or None, int(params["hidden_layer"]),
                                   int(params["max_tokens"]))
        self.max_prompt_bytes = int(params["max_prompt_bytes"])
        self.encoder.encode("warm up")  # first-call set-up is not paid by the first client

    def execute(self, requests):
        return [self.encode(request) for request in requests]

    def encode(self, request):
        start = time.perf_counter()
        raw = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)
        if raw.size != 1:
            return error_response("INVALID_ARG", f"PROMPT must hold exactly one string, got {raw.size}")
        value = raw[0]
        if len(value) > self.max_prompt_bytes:
            return error_response("INVALID_ARG", f"prompt is {len(value)} bytes: allowed 1..{self.max_prompt_bytes}")
        try:
            prompt = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as error:
            return error_response("INVALID_ARG", f"prompt is not valid UTF-8 ({error.reason} at byte {error.start})")
        try:
            embeds = self.encoder.encode(prompt)
        except ValueError as error:
            return error_response("INVALID_ARG", str(error))
        seconds = torch.tensor([[time.perf_counter() - start]], dtype=torch.float32)
        return pb_utils.InferenceResponse([torch_tensor("TEXT_EMBEDS", embeds[None]),
                                           torch_tensor("ENCODE_SECONDS", seconds)])
