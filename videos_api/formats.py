"""The three request formats of POST /v1/videos (and /v1/videos/sync), told apart and read into
h3_core.request_model.VideoRequest, then into the parsed create the jobs run (fields.parse_create's
shape): ours (OpenAI-style), SGLang's H3 JSON and vLLM-Omni's multipart form.

    a JSON body with "conditions" or "target", or a multipart body whose "request" field holds
    such JSON (its uris may name the body's file parts: part:NAME)          -> SGLang's H3
    a form with any of VLLM_ONLY (short_edge, width, extra_params, ...)       -> vLLM-Omni's
    anything else                                                             -> ours
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from h3_core import protocol, request_model, rules
from h3_core.request_model import RequestError, VideoRequest

from . import fields

SGLANG_MARKS = ("conditions", "target")
VLLM_ONLY = (
    "short_edge",
    "aspect_ratio",
    "width",
    "height",
    "fps",
    "num_outputs_per_prompt",
    "input_references",
    "extra_params",
)
VARIANT = {"image": "reference_image", "video": "reference_video", "audio": "reference_audio"}
KEYFRAME_VARIANT = {protocol.FIRST_FRAME: "first_frame", protocol.LAST_FRAME: "last_frame"}


def format_of(form: Mapping, multipart: bool) -> str:
    """Which format a create body is in (module docstring): "sglang", "vllm_omni" or "openai"."""
    if any(mark in form for mark in SGLANG_MARKS) or (multipart and "request" in form):
        return "sglang"
    if any(name in form for name in VLLM_ONLY):
        return "vllm_omni"
    return "openai"


def read(form: Mapping, multipart: bool, model_name: str, policy: request_model.UrlPolicy | None = None):
    """(parsed, media) of a create body in any format (parse_create's shape, plus "format",
    "flow_shift", "audio_flow_shift", "references" (REFERENCES' entries or None), "paths" (server
    field -> the sender's field path) and "wire" (VideoRequest.wire() as text)). Raises ApiError
    400 INVALID_ARG naming the field path in the sender's terms."""
    kind = format_of(form, multipart)
    try:
        if kind == "openai":
            parsed, media = fields.parse_create(form, model_name)
            request = from_parsed(parsed, media)
        else:
            try:
                fields.check_model(form.get("model"), model_name)
            except rules.InvalidValue as error:
                raise request_model.at_path("model", error) from error
            if kind == "sglang":
                body, parts = form, {}
                if multipart and "request" in form:
                    body = _sglang_text(form["request"])
                    parts = {name: value for name, value in form.items() if isinstance(value, bytes)}
                request = request_model.read_sglang({k: v for k, v in body.items() if k != "model"}, parts, policy)
            else:
                request = request_model.read_vllm_omni({k: v for k, v in form.items() if k != "model"})
            parsed, media = to_parsed(request)
    except RequestError as error:
        raise fields.invalid(str(error), error.path) from error
    parsed.update(format=request.format, wire=request.wire().decode("utf-8"))
    return parsed, media


def _sglang_text(value) -> dict:
    try:
        body = json.loads(value)
    except (TypeError, ValueError) as error:
        raise RequestError("request", f"must hold SGLang's H3 JSON: {error}") from None
    if not isinstance(body, dict):
        raise RequestError("request", "must hold a JSON object")
    return body


def to_parsed(request: VideoRequest) -> tuple[dict, dict[str, list[bytes]]]:
    """The parsed create (fields.parse_create's shape and read's extra keys) and the media of a
    VideoRequest read from SGLang's or vLLM-Omni's format."""
    keyframes = sorted(request.keyframes, key=lambda k: k.frame == protocol.LAST_FRAME)  # KEYFRAMES' order
    media: dict[str, list[bytes]] = {}
    for keyframe in keyframes:
        media[KEYFRAME_VARIANT[keyframe.frame]] = [keyframe.data]
    for reference in request.references:
        media.setdefault(VARIANT[reference.kind], []).append(reference.data)
    paths = dict(request.paths)
    paths.update({f"{protocol.KEYFRAMES}[{k}]": keyframe.path for k, keyframe in enumerate(keyframes)})
    size = f"{request.width}x{request.height}" if request.width is not None else None
    seconds = None if request.num_frames is None else f"{request.num_frames / protocol.VIDEO_FPS:g}"
    parsed = {
        "prompt": request.prompt,
        "width": request.width,
        "height": request.height,
        "size": size,
        "seconds": seconds,
        "num_frames": request.num_frames,
        "num_inference_steps": request.num_inference_steps,
        "seed": request.seed,
        "num_outputs": request.num_outputs,
        "preview_every": fields.DEFAULT_PREVIEW_EVERY,
        "task": request.task,
        "fit": None,
        "flow_shift": request.flow_shift,
        "audio_flow_shift": request.audio_flow_shift,
        "lora": protocol.lora_entries(request.lora),
        "references": request.reference_order() if request.references else None,
        "paths": paths,
        "inputs": {variant: [fields.media_type(data) for data in files] for variant, files in media.items()},
    }
    return parsed, media


def from_parsed(parsed: dict, media: Mapping[str, list[bytes]]) -> VideoRequest:
    """The VideoRequest of our format's parsed create and its media (references in the order of
    its `references` field, else images, videos, audio)."""
    keyframes = tuple(
        request_model.Keyframe(frame, media[variant][0], field)
        for field, frame, variant in (
            ("input_reference", protocol.FIRST_FRAME, "first_frame"),
            ("last_frame", protocol.LAST_FRAME, "last_frame"),
        )
        if variant in media
    )
    counts = {name: len(media.get(VARIANT[kind], [])) for kind, name in request_model.REFERENCE_INPUT.items()}
    order = parsed.get("references")
    entries = protocol.reference_list(None if order is None else json.dumps(order), counts)
    kinds = {name: kind for kind, name in request_model.REFERENCE_INPUT.items()}
    references = tuple(
        request_model.Reference(
            kinds[e["input"]],
            media[VARIANT[kinds[e["input"]]]][e["index"]],
            f"{fields.MEDIA_FIELDS_OF[kinds[e['input']]]}[{e['index']}]",
            e["start_time_seconds"],
            e["audio"],
        )
        for e in entries
    )
    return VideoRequest(
        format="openai",
        prompt=parsed["prompt"],
        task=fields.task_of(parsed),
        width=parsed["width"],
        height=parsed["height"],
        num_frames=parsed["num_frames"],
        num_inference_steps=parsed["num_inference_steps"],
        seed=parsed["seed"],
        num_outputs=parsed["num_outputs"],
        flow_shift=parsed.get("flow_shift"),
        audio_flow_shift=parsed.get("audio_flow_shift"),
        lora=protocol.lora_list(parsed.get("lora")),
        keyframes=keyframes,
        references=references,
    )
