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

import io

from PIL import Image, UnidentifiedImageError

from client.api import H3Client, H3Error
from h3_core import protocol

from .fields import KEYFRAME_FIELDS, MEDIA_FIELDS, error_from_server

OWNED_BY = "h3-triton"
TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


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
    from h3_core.serving.shared.settings import DitSettings, EncoderSettings

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


def _upright_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) of an image file as the server decodes it (EXIF orientation applied), read
    from its header by Pillow (no pixels decoded); None when Pillow cannot read it or refuses it as
    a decompression bomb (the server will refuse it, naming the input)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            transposed = image.getexif().get(0x0112) in TRANSPOSED
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning):
        return None  # a header over Pillow's bomb limit too: h3_encoder refuses it naming the input
    return (width, height) if transposed else (height, width)


def resolved_defaults(client: H3Client, request: dict, media: dict[str, list[bytes]], model_name: str) -> dict:
    """What the server will use where a parsed create `request` (fields.parse_create) left the
    defaults to it: {"size": "WxH", "num_frames": N}, for the video object from create on (its
    size and seconds are never null). The size: the model's default canvas, or with a keyframe the
    first keyframe's aspect at about the default area (h3_core.inputs.images.canvas_for_image, as the
    server computes it; its header read with Pillow). Raises ApiError 503 when Triton cannot be
    asked (model_card)."""
    from h3_core.inputs.images import canvas_for_image

    card = model_card(client, model_name, 0)
    size, num_frames = card["size"], card["num_frames"]["default"]
    keyframes = [media[MEDIA_FIELDS[field][0]][0] for field in KEYFRAME_FIELDS if MEDIA_FIELDS[field][0] in media]
    source = _upright_size(keyframes[0]) if keyframes else None
    if source is None:
        return {"size": size["default"], "num_frames": num_frames}
    default_width, default_height = (int(side) for side in size["default"].split("x"))
    height, width = canvas_for_image(
        *source, default_width * default_height, size["height"]["max"], size["width"]["max"]
    )
    return {"size": f"{width}x{height}", "num_frames": num_frames}
