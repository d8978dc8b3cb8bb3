"""vLLM-Omni's multipart form read into VideoRequest (read_vllm_omni): its num_inference_steps count
forwards, its files come in order, its H3 fields in extra_params."""

from __future__ import annotations

import json
from collections.abc import Mapping

from h3_core import protocol

from .files import media_type
from .request import (
    REFERENCE_INPUT,
    Keyframe,
    Reference,
    RequestError,
    VideoRequest,
    canvas,
    read_frames,
    read_integer,
    read_keyframe_frames,
    read_number,
    read_object,
    read_prompt,
    read_shift,
    read_task,
)

VLLM_FIELDS = (
    "prompt",
    "short_edge",
    "aspect_ratio",
    "width",
    "height",
    "fps",
    "num_inference_steps",
    "flow_shift",
    "seed",
    "num_outputs_per_prompt",
    "input_reference",
    "input_references",
    "lora",
    "extra_params",
    "model",
)
VLLM_EXTRA_FIELDS = ("task", "duration", "audio_flow_shift", "frame_indices", "start_time_seconds")


def _file_list(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def read_vllm_omni(form: Mapping) -> VideoRequest:
    """vLLM-Omni's multipart fields (a file's value its bytes, another a string) -> VideoRequest:
    prompt, short_edge + aspect_ratio or width / height, fps (24 only), num_inference_steps
    (forwards), flow_shift, seed, num_outputs_per_prompt, input_reference / input_references
    (files, in order), extra_params JSON {task, duration, audio_flow_shift, frame_indices (one per
    file: fl2va), start_time_seconds (one per file, null for a non-video)}, lora (a JSON array of
    {"name", "scale"}: rules.lora_list, a path refused). flow_shift and audio_flow_shift lie in
    0.01..100 (h3_core.rules.check_flow_shift, the server's rule). Raises RequestError at the field's path."""
    read_object("", form, VLLM_FIELDS)
    prompt = read_prompt(form.get("prompt"))
    extra = form.get("extra_params") or {}
    if isinstance(extra, (str, bytes)):
        try:
            extra = json.loads(extra)
        except ValueError as error:
            raise RequestError("extra_params", f"is not valid JSON: {error}") from None
    read_object("extra_params", extra, VLLM_EXTRA_FIELDS)
    files = [("input_reference", d) for d in _file_list(form.get("input_reference"))]
    files += [(f"input_references[{k}]", d) for k, d in enumerate(_file_list(form.get("input_references")))]
    for name, data in files:
        if not isinstance(data, bytes) or not data:
            raise RequestError(name, "must be a non-empty file")
    indices = extra.get("frame_indices")
    implied = "fl2va" if indices is not None else "ref2va" if files else "t2va"
    task = read_task("extra_params.task", extra.get("task", implied))
    request, paths = dict(format="vllm_omni", prompt=prompt, task=task), {}
    if task == "t2va" and files:
        raise RequestError("input_references", f"task 't2va' takes no files; got {len(files)}")
    keyframes, references = [], []
    starts = extra.get("start_time_seconds")
    if starts is not None and (not isinstance(starts, list) or len(starts) != len(files)):
        raise RequestError("extra_params.start_time_seconds", f"must be an array of one value per file ({len(files)})")
    if task == "fl2va":
        if indices is not None and not isinstance(indices, list):
            raise RequestError("extra_params.frame_indices", "must be an array of 0 / -1, one per file")
        if indices is None:
            frames = protocol.keyframe_indices(min(len(files), protocol.MAX_KEYFRAMES), None)
        else:
            frames = read_keyframe_frames("extra_params.frame_indices", list(indices))
        if not files or len(frames) != len(files):
            raise RequestError("extra_params.frame_indices", f"needs one index per file: {len(files)} files")
        for (name, data), frame in zip(files, frames, strict=True):
            if not media_type(data).startswith("image/"):
                raise RequestError(name, "a keyframe must be a PNG, JPEG or WebP image")
            keyframes.append(Keyframe(frame, data, name))
    elif indices is not None:
        raise RequestError("extra_params.frame_indices", "is for task 'fl2va' only")
    for k, (name, data) in enumerate(files if task == "ref2va" else []):
        kind = media_type(data).split("/")[0]
        if kind not in REFERENCE_INPUT:
            raise RequestError(name, "is not a PNG, JPEG, WebP image, an MP4 video or a WAV, FLAC, MP3 audio file")
        start = 0.0 if starts is None or starts[k] is None else starts[k]
        start = read_number(f"extra_params.start_time_seconds[{k}]", start)
        if start and kind != "video":
            raise RequestError(f"extra_params.start_time_seconds[{k}]", "is for video references only")
        paths[f"{REFERENCE_INPUT[kind]}[{sum(r.kind == kind for r in references)}]"] = name
        references.append(Reference(kind, data, name, start, True))
    if "short_edge" in form or "aspect_ratio" in form:
        if "width" in form or "height" in form:
            raise RequestError("short_edge", "give short_edge and aspect_ratio, or width and height, not both")
        short_edge = read_integer("short_edge", form.get("short_edge"))
        request["width"], request["height"] = canvas(short_edge, form.get("aspect_ratio", "16:9"), "aspect_ratio")
        paths.update(width="short_edge", height="short_edge")
    elif "width" in form or "height" in form:
        request["width"], request["height"] = (
            read_integer("width", form.get("width")),
            read_integer("height", form.get("height")),
        )
        paths.update(width="width", height="height")
    if form.get("fps") is not None and read_number("fps", form["fps"]) != protocol.VIDEO_FPS:
        raise RequestError("fps", f"{form['fps']!r} is not allowed: fps is fixed at {protocol.VIDEO_FPS}")
    if extra.get("duration") is not None:
        request["num_frames"] = read_frames("extra_params.duration", extra["duration"])
        paths["num_frames"] = "extra_params.duration"
    for name, key in (("num_inference_steps", "num_inference_steps"), ("seed", "seed")):
        if form.get(name) is not None:
            request[key] = read_integer(name, form[name])
            paths[key] = name
    if form.get("num_outputs_per_prompt") is not None:
        request["num_outputs"] = read_integer("num_outputs_per_prompt", form["num_outputs_per_prompt"])
        paths["num_outputs"] = "num_outputs_per_prompt"
    if form.get("flow_shift") is not None:
        request["flow_shift"] = read_shift("flow_shift", form["flow_shift"])
        paths["flow_shift"] = "flow_shift"
    if extra.get("audio_flow_shift") is not None:
        request["audio_flow_shift"] = read_shift("extra_params.audio_flow_shift", extra["audio_flow_shift"])
        paths["audio_flow_shift"] = "extra_params.audio_flow_shift"
    try:
        request["lora"] = protocol.lora_list(form.get("lora"))
    except ValueError as error:
        raise RequestError("lora", str(error)) from error
    return VideoRequest(**request, keyframes=tuple(keyframes), references=tuple(references), paths=paths)
