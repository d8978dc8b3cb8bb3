"""GET /v1/models: the served model as OpenAI's model object, plus what it accepts, read from
Triton's configuration of h3_encoder and h3_dit on every call (a restarted Triton may serve other
limits):

    {"id": "h3", "object": "model", "created": <unix s the front end started>, "owned_by": "h3-triton",
     "config_name": "demo", "tasks": ["t2va", "fl2va", "ref2va"], "fps": 24,
     "size": {"default": "96x64", "multiple": 32, "width": {"min": 32, "max": 256},
              "height": {"min": 32, "max": 256}},
     "num_frames": {"default": 22, "min": 1, "max": 124},
     "num_inference_steps": {"default": 8, "min": 1, "max": 50},
     "n": {"min": 1, "max": 4}, "max_prompt_bytes": 4096}

The defaults are those of h3_dit's config (h3_core.config: what a request without size, seconds,
num_frames or num_inference_steps gets); widths and heights are multiples of CANVAS_MULTIPLE up
to the smaller of the two models' maxima; tasks are those h3_dit serves.
"""

from __future__ import annotations

from client.api import H3Client, H3Error
from h3_core import protocol

from .fields import error_from_server

OWNED_BY = "h3-triton"


def _parameters(client: H3Client, model: str) -> dict[str, str]:
    config = client.model_config(model)
    # an empty string_value is left out of the JSON (protobuf default)
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def model_card(client: H3Client, model_name: str, created: int) -> dict:
    """The model object of `model_name` (module docstring) from the Triton behind `client`;
    `created` in unix seconds. Raises ApiError (fields.error_from_server) when Triton cannot
    answer (503 UNAVAILABLE for an unreachable one)."""
    # torch comes with these; imported here, so a front end that is never asked does not load it
    from h3_core.config import CANVAS_MULTIPLE, get_config
    from h3_core.serving.settings import DitSettings, EncoderSettings

    try:
        encoder = EncoderSettings.from_parameters(_parameters(client, protocol.ENCODER_MODEL))
        dit = DitSettings.from_parameters(_parameters(client, protocol.DIT_MODEL))
    except H3Error as error:
        raise error_from_server(error.code, error.message) from None
    defaults = get_config(dit.config_name)
    return {
        "id": model_name,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "config_name": dit.config_name,
        "tasks": dit.served_tasks(),
        "fps": protocol.VIDEO_FPS,
        "size": {
            "default": f"{defaults.default_width}x{defaults.default_height}",
            "multiple": CANVAS_MULTIPLE,
            "width": {"min": CANVAS_MULTIPLE, "max": min(encoder.max_width, dit.max_width)},
            "height": {"min": CANVAS_MULTIPLE, "max": min(encoder.max_height, dit.max_height)},
        },
        "num_frames": {"default": defaults.default_num_frames, "min": 1, "max": dit.max_num_frames},
        "num_inference_steps": {"default": defaults.default_steps, "min": 1, "max": dit.max_steps},
        "n": {"min": 1, "max": dit.max_outputs},
        "max_prompt_bytes": encoder.max_prompt_bytes,
    }
