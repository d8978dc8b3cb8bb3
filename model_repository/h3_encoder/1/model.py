"""h3_encoder: PROMPT -> TEXT_EMBEDS, optional request fields -> REQUEST JSON (thin adapter
over h3_core.encoder)."""
import time

import torch
from h3_core.encoder import TextEncoder
from server.adapter import error_response, json_tensor, model_parameters

import triton_python_backend_utils as pb_utils

FIELDS = {"HEIGHT": "height", "WIDTH": "width", "NUM_FRAMES": "num_frames",
          "NUM_INFERENCE_STEPS": "num_inference_steps", "SEED": "seed", "NUM_OUTPUTS": "num_outputs"}


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        torch.set_num_threads(int(params["cpu_threads"]))
        self.encoder = TextEncoder(params["encoder_path"] or None, int(params["hidden_layer"]),
                                   int(params["max_tokens"]))
        self.max_prompt_bytes = int(params["max_prompt_bytes"])
        self.encoder.encode("warm up")  # first-call set-up is not paid by the first client

    def execute(self, requests):
        return [self.encode(request) for request in requests]

    def encode(self, request):
        start = time.perf_counter()
        tensor = pb_utils.get_input_tensor_by_name(request, "PROMPT")
        if tensor is None:
            return error_response("INVALID_ARG", "PROMPT is required")
        raw = tensor.as_numpy().reshape(-1)
        if raw.size != 1:
            return error_response("INVALID_ARG", f"PROMPT must hold exactly one string, got {raw.size}")
        value = raw[0]
        if len(value) > self.max_prompt_bytes:
            return error_response("INVALID_ARG", f"prompt is {len(value)} bytes: allowed 1..{self.max_prompt_bytes}")
        try:
            prompt = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as error:
            return error_response("INVALID_ARG", f"prompt is not valid UTF-8 ({error.reason} at byte {error.start})")
        fields = {}
        for name, field in FIELDS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                values = tensor.as_numpy().reshape(-1)
                if values.size != 1:
                    return error_response("INVALID_ARG", f"{name} must hold exactly one INT64 value, got {values.size}")
                fields[field] = int(values[0])
        try:
            embeds = self.encoder.encode(prompt)
        except ValueError as error:
            return error_response("INVALID_ARG", str(error))
        fields["encode_seconds"] = time.perf_counter() - start
        return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT_EMBEDS", embeds[None].numpy()),
                                           json_tensor("REQUEST", fields)])
