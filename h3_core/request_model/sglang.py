"""SGLang's H3 JSON request read into VideoRequest (read_sglang). Its step count counts sigma points
including the final 0, so its N is N - 1 forwards (its default 50 is 49)."""

from __future__ import annotations

from collections.abc import Mapping

from h3_core import protocol

from .files import UrlPolicy, media_seconds, read_uri
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
    read_task,
)

# SGLang's H3 defaults where its request leaves them out: the shifts of the video and audio sigma
# schedules (docs/model.md §3.1)
SGLANG_FLOW_SHIFT, SGLANG_AUDIO_FLOW_SHIFT = 12.0, 3.0
SGLANG_FIELDS = ("task", "prompt", "conditions", "target", "seed", "num_inference_steps")
SGLANG_REFUSED = {  # fields SGLang's H3 refuses, and why
    "guidance_scale": "H3 is guidance-distilled: no guidance_scale",
    "negative_prompt": "H3 is guidance-distilled: no negative_prompt",
    "num_frames": "give target.duration_seconds (frames are aligned to 17n+5)",
    "fps": f"fps is fixed at {protocol.VIDEO_FPS}",
}
SGLANG_CONDITION_FIELDS = ("type", "uri", "role", "frame_index", "start_time_seconds")
SGLANG_TYPES = ("image", "video", "audio", "video_audio")
SGLANG_TARGET_FIELDS = ("short_edge", "aspect_ratio", "duration_seconds")


def steps_from_sigma_points(path: str, value) -> int:
    """SGLang's num_inference_steps (sigma points including 0) as forwards: N - 1."""
    points = read_integer(path, value)
    if points < 2:
        raise RequestError(path, f"{points} is out of range: allowed >= 2 (sigma points including 0: N - 1 forwards)")
    return points - 1


def read_sglang(body: Mapping, parts: Mapping[str, bytes] | None = None, policy: UrlPolicy | None = None):
    """SGLang's H3 JSON -> VideoRequest: {task, prompt, conditions: [{type, uri, role, frame_index,
    start_time_seconds}], target: {short_edge, aspect_ratio, duration_seconds}, seed,
    num_inference_steps (sigma points: N - 1 forwards)}; flow shifts SGLANG_FLOW_SHIFT /
    SGLANG_AUDIO_FLOW_SHIFT. Its rules: guidance_scale, negative_prompt, num_frames and fps
    refused; t2va takes no conditions, fl2va 1 or 2 image keyframes (frame_index 0 / -1; without
    it the first and the last), ref2va references only; frame_index for keyframes only,
    start_time_seconds for video references only. `parts`: a multipart body's file parts
    (uri part:NAME). Raises RequestError at the field's path."""
    parts = parts or {}
    for name, why in SGLANG_REFUSED.items():
        if name in body:
            raise RequestError(name, f"is not accepted by SGLang's H3 format: {why}")
    read_object("", body, SGLANG_FIELDS)
    task = read_task("task", body.get("task"))
    prompt = read_prompt(body.get("prompt"))
    conditions = body.get("conditions") or []
    if not isinstance(conditions, list):
        raise RequestError("conditions", f"must be an array, got {type(conditions).__name__}")
    if task == "t2va" and conditions:
        raise RequestError("conditions", f"task 't2va' takes no conditions; got {len(conditions)}")
    keyframes, references, paths = [], [], {}
    frames, keyframe_paths = [], []
    for i, condition in enumerate(conditions):
        at = f"conditions[{i}]"
        read_object(at, condition, SGLANG_CONDITION_FIELDS)
        kind = condition.get("type")
        if kind not in SGLANG_TYPES:
            raise RequestError(f"{at}.type", f"{kind!r} is not allowed: allowed {list(SGLANG_TYPES)}")
        role = condition.get("role", "keyframe" if task == "fl2va" else "reference")
        if role not in ("keyframe", "reference"):
            raise RequestError(f"{at}.role", f"{role!r} is not allowed: allowed ['keyframe', 'reference']")
        wanted = "keyframe" if task == "fl2va" else "reference"
        if role != wanted:
            raise RequestError(f"{at}.role", f"task {task!r} takes {wanted} conditions only, got {role!r}")
        if "frame_index" in condition and role != "keyframe":
            raise RequestError(f"{at}.frame_index", "is for keyframes only")
        if "start_time_seconds" in condition and kind not in ("video", "video_audio"):
            raise RequestError(f"{at}.start_time_seconds", "is for video references only")
        data = read_uri(f"{at}.uri", condition.get("uri"), parts, policy)
        if role == "keyframe":
            if kind != "image":
                raise RequestError(f"{at}.type", f"a keyframe is an image, got {kind!r}")
            frame = condition.get("frame_index", protocol.FIRST_FRAME if i == 0 else protocol.LAST_FRAME)
            if type(frame) is not int or frame not in (protocol.FIRST_FRAME, protocol.LAST_FRAME):
                raise RequestError(f"{at}.frame_index", f"{frame!r} is not allowed: 0 (first frame) or -1 (last frame)")
            keyframe_paths.append(f"{at}.uri")
            frames.append(frame)
            keyframes.append(data)
        else:
            base = kind.removesuffix("_audio")
            start = read_number(f"{at}.start_time_seconds", condition.get("start_time_seconds", 0))
            name = REFERENCE_INPUT[base]
            paths[f"{name}[{sum(r.kind == base for r in references)}]"] = f"{at}.uri"
            references.append(Reference(base, data, f"{at}.uri", start, kind != "video"))
    if task == "fl2va" and not keyframes:
        raise RequestError("conditions", "task 'fl2va' needs 1 or 2 image keyframes")
    if task == "ref2va" and not references:
        raise RequestError("conditions", "task 'ref2va' needs at least one reference")
    frames = read_keyframe_frames("conditions", frames) if keyframes else []
    request = dict(format="sglang", prompt=prompt, task=task, flow_shift=SGLANG_FLOW_SHIFT)
    request["audio_flow_shift"] = SGLANG_AUDIO_FLOW_SHIFT
    target = read_object("target", body.get("target", {}), SGLANG_TARGET_FIELDS)
    if "short_edge" in target:
        short_edge = read_integer("target.short_edge", target["short_edge"], low=1)
        aspect = target.get("aspect_ratio", "16:9")
        if aspect == "auto":
            aspect = _auto_aspect(keyframes or [r.data for r in references if r.kind == "image"])
        request["width"], request["height"] = canvas(short_edge, aspect, "target.aspect_ratio")
        paths.update(width="target.short_edge", height="target.short_edge")
    elif "aspect_ratio" in target:
        raise RequestError("target.aspect_ratio", "needs target.short_edge")
    if "duration_seconds" in target:
        request["num_frames"] = read_frames("target.duration_seconds", target["duration_seconds"])
        paths["num_frames"] = "target.duration_seconds"
    elif task == "ref2va":
        sounding = [r for r in references if r.kind == "audio" or (r.kind == "video" and r.audio)]
        if len(sounding) == 1:
            request["num_frames"] = protocol.frames_for_seconds(media_seconds(sounding[0].data, sounding[0].path))
            paths["num_frames"] = sounding[0].path
    if body.get("seed") is not None:
        request["seed"] = read_integer("seed", body["seed"])
        paths["seed"] = "seed"
    if body.get("num_inference_steps") is not None:
        request["num_inference_steps"] = steps_from_sigma_points("num_inference_steps", body["num_inference_steps"])
        paths["num_inference_steps"] = "num_inference_steps"
    kept = tuple(Keyframe(f, d, p) for f, d, p in zip(frames, keyframes, keyframe_paths, strict=True))
    return VideoRequest(**request, keyframes=kept, references=tuple(references), paths=paths)


def _auto_aspect(images: list[bytes]) -> str:
    """ "W:H" of the first image's header; RequestError at target.aspect_ratio without one."""
    if not images:
        raise RequestError("target.aspect_ratio", "'auto' needs an image condition to take the aspect from")
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(images[0])) as image:
            return f"{image.width}:{image.height}"
    except (OSError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise RequestError(
            "target.aspect_ratio", f"'auto' cannot read the first image condition's header ({type(error).__name__})"
        ) from None
