"""The one typed generation request (VideoRequest) and the three request formats H3's users send,
read into it: SGLang's H3 JSON (read_sglang), vLLM-Omni's multipart form (read_vllm_omni) and ours,
OpenAI-style (from_fields). Plain Python, no torch: the Videos API, the CLI and H3Client use it.

Step counts differ by format: ours and vLLM-Omni's num_inference_steps count forwards (DiT
evaluations); SGLang's H3 counts sigma points including the final 0, so its N is N - 1 forwards
(its default 50 is 49). VideoRequest.num_inference_steps always counts forwards.

A refusal is a RequestError (a ValueError) whose `path` is the field in the sender's own terms
("target.duration_seconds", "conditions[1].uri", "extra_params.frame_indices") and whose message
starts with it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import math
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from h3_core import protocol

FORMATS = ("openai", "sglang", "vllm_omni")
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
VLLM_FIELDS = tuple(  # vLLM-Omni's multipart fields
    "prompt short_edge aspect_ratio width height fps num_inference_steps flow_shift seed num_outputs_per_prompt "
    "input_reference input_references lora extra_params model".split()
)
VLLM_EXTRA_FIELDS = ("task", "duration", "audio_flow_shift", "frame_indices", "start_time_seconds")
ASPECT = re.compile(r"^([1-9][0-9]*):([1-9][0-9]*)$")
DATA_URL = re.compile(r"^data:[^,]*;base64,", re.IGNORECASE)
FETCH_CHUNK_BYTES = 64 * 1024  # fetch_url reads this much at a time, checking its limits between reads
REFERENCE_INPUT = {
    "image": protocol.REFERENCE_IMAGES,
    "video": protocol.REFERENCE_VIDEOS,
    "audio": protocol.REFERENCE_AUDIO,
}


class RequestError(ValueError):
    """A refused request: `path` is the field in the sender's terms; the message starts with it."""

    def __init__(self, path: str, text: str):
        super().__init__(f"{path}: {text}")
        self.path = path


@dataclass(frozen=True)
class Keyframe:
    """An fl2va keyframe: an image file's bytes and the frame it conditions (FIRST_FRAME 0 or
    LAST_FRAME -1); `path` names it in the sender's terms."""

    frame: int
    data: bytes
    path: str


@dataclass(frozen=True)
class Reference:
    """A ref2va reference: kind "image", "video" or "audio", the file's bytes, where a video's use
    starts in it (start_time_seconds, seconds >= 0) and whether a video's audio is used."""

    kind: str
    data: bytes
    path: str
    start_time_seconds: float = 0.0
    audio: bool = True


@dataclass(frozen=True)
class UrlPolicy:
    """Which http(s) URIs a request may name: hosts (exact names) the operator allows (empty: no
    URL is fetched), whether private, loopback and link-local addresses may be reached, the largest
    download in bytes, the longest in seconds, and the most redirects (each checked again)."""

    hosts: frozenset[str] = frozenset()
    allow_private: bool = False
    max_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 10.0
    max_redirects: int = 3


@dataclass(frozen=True)
class VideoRequest:
    """One generation request, whatever format it came in. width / height: pixels (None: the
    server's default); num_frames: frames asked for at 24 fps (served as align_num_frames of it);
    num_inference_steps: forwards; flow_shift / audio_flow_shift: None for the server's default;
    keyframes (fl2va) and references (ref2va, in block order). `paths` maps the server's field
    names (width, height, num_frames, num_inference_steps, seed, num_outputs, the shifts, and each file's
    reference's input name such as "REFERENCE_AUDIO[0]") to the sender's field paths, for the
    server's refusals (a keyframe's own `path` names it)."""

    format: str
    prompt: str
    task: str
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    seed: int | None = None
    num_outputs: int | None = None
    flow_shift: float | None = None
    audio_flow_shift: float | None = None
    lora: tuple[tuple[str, float], ...] = ()  # (name, scale) of each LoRA adapter, in order (rules.lora_list)
    keyframes: tuple[Keyframe, ...] = ()
    references: tuple[Reference, ...] = ()
    paths: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def clip_frames(self) -> int | None:
        """The frames of the served clip (protocol.align_num_frames), None for the server's default."""
        return None if self.num_frames is None else protocol.align_num_frames(self.num_frames)

    def reference_order(self) -> list[dict]:
        """REFERENCES' entries (protocol.reference_list): each reference's input and index within
        its input, a video's start_time_seconds and audio, in block order."""
        counts: dict[str, int] = {}
        entries = []
        for reference in self.references:
            name = REFERENCE_INPUT[reference.kind]
            entry = {"input": name, "index": counts.get(name, 0)}
            if reference.kind == "video":
                entry.update(start_time_seconds=reference.start_time_seconds, audio=reference.audio)
            counts[name] = entry["index"] + 1
            entries.append(entry)
        return entries

    def generate_arguments(self) -> dict:
        """client.api.H3Client.generate's keyword arguments for this request (the prompt aside):
        sizes, frames, forwards, seed, outputs, shifts, task, keyframes (first_frame / last_frame
        bytes) and references (their files by kind and their block order)."""
        frames = {keyframe.frame: keyframe.data for keyframe in self.keyframes}
        kinds = {kind: [r.data for r in self.references if r.kind == kind] for kind in REFERENCE_INPUT}
        return dict(
            height=self.height,
            width=self.width,
            num_frames=self.num_frames,
            num_inference_steps=self.num_inference_steps,
            seed=self.seed,
            num_outputs=self.num_outputs,
            flow_shift=self.flow_shift,
            audio_flow_shift=self.audio_flow_shift,
            lora=self.lora,
            task=self.task,
            first_frame=frames.get(protocol.FIRST_FRAME),
            last_frame=frames.get(protocol.LAST_FRAME),
            reference_images=kinds["image"],
            reference_videos=kinds["video"],
            reference_audio=kinds["audio"],
            references=self.reference_order() if self.references else None,
        )

    def wire(self) -> bytes:
        """The normalised request: canonical JSON (sorted keys, no spaces) of every field that
        decides the output, files by SHA-256; equal bytes for the same request in any format."""
        value = {
            "prompt": self.prompt,
            "task": self.task,
            "width": self.width,
            "height": self.height,
            "num_frames": self.num_frames,
            "num_inference_steps": self.num_inference_steps,
            "seed": self.seed,
            "num_outputs": self.num_outputs,
            "flow_shift": self.flow_shift,
            "audio_flow_shift": self.audio_flow_shift,
            "lora": protocol.lora_entries(self.lora),
            "keyframes": [{"frame": k.frame, "sha256": hashlib.sha256(k.data).hexdigest()} for k in self.keyframes],
            "references": [
                dict(kind=r.kind, sha256=hashlib.sha256(r.data).hexdigest(), start_time_seconds=r.start_time_seconds)
                | {"audio": r.audio}
                for r in self.references
            ],
        }
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canvas(short_edge: int, aspect_ratio: str, path: str) -> tuple[int, int]:
    """(width, height) in pixels of a short edge and an aspect "W:H": the short edge as given, the
    long edge short_edge x ratio rounded down to a multiple of protocol.CANVAS_MULTIPLE (32):
    768 at "16:9" -> (1344, 768), 64 at "16:9" -> (96, 64). Raises RequestError at `path`."""
    match = ASPECT.match(aspect_ratio) if isinstance(aspect_ratio, str) else None
    if not match:
        raise RequestError(path, f"{aspect_ratio!r} must be 'W:H' with positive integers, e.g. '16:9'")
    w, h = int(match.group(1)), int(match.group(2))
    long_edge = short_edge * max(w, h) // min(w, h) // protocol.CANVAS_MULTIPLE * protocol.CANVAS_MULTIPLE
    return (long_edge, short_edge) if w >= h else (short_edge, long_edge)


def _int(path: str, value, low: int | None = None) -> int:
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        value = int(value.strip())
    if type(value) is not int:
        raise RequestError(path, f"{value!r} must be an integer")
    if low is not None and value < low:
        raise RequestError(path, f"{value} is out of range: allowed >= {low}")
    if not protocol.INT64_MIN <= value <= protocol.INT64_MAX:
        raise RequestError(path, f"{value} does not fit INT64")
    return value


def _number(path: str, value, positive: bool = False) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if type(value) not in (int, float) or not math.isfinite(value) or (positive and value <= 0) or value < 0:
        allowed = "> 0" if positive else ">= 0"
        raise RequestError(path, f"{value!r} must be a finite number {allowed}")
    return float(value)


def _frames(path: str, seconds) -> int:
    """Frames asked for by a duration in seconds at 24 fps."""
    return protocol.frames_for_seconds(_number(path, seconds, positive=True))


def _steps_from_sigma_points(path: str, value) -> int:
    """SGLang's num_inference_steps (sigma points including 0) as forwards: N - 1."""
    points = _int(path, value)
    if points < 2:
        raise RequestError(path, f"{points} is out of range: allowed >= 2 (sigma points including 0: N - 1 forwards)")
    return points - 1


def read_uri(path: str, uri, parts: Mapping[str, bytes], policy: UrlPolicy | None = None) -> bytes:
    """The bytes a condition's `uri` names: a base64 data: URL, "part:NAME" (the file part NAME of
    the same multipart body, in `parts`), or an http(s) URL of a host `policy` allows (fetch_url).
    Raises RequestError at `path` for file:// (never read), another scheme, a host not allowed,
    bad base64, a missing part, or no bytes."""
    if not isinstance(uri, str):
        raise RequestError(path, f"must be a string URI, got {type(uri).__name__}")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if DATA_URL.match(uri):
        try:
            data = base64.b64decode(uri[DATA_URL.match(uri).end() :], validate=True)
        except binascii.Error as error:
            raise RequestError(path, f"is not valid base64 after 'data:...;base64,': {error}") from None
    elif scheme == "part":
        name = uri[5:]
        if name not in parts:
            raise RequestError(path, f"names part {name!r}, which the body does not hold (parts: {sorted(parts)})")
        data = parts[name]
    elif scheme == "file":
        raise RequestError(path, "file:// URIs are refused: send a data: URL, a part:NAME file part or an allowed URL")
    elif scheme in ("http", "https"):
        data = fetch_url(path, uri, policy or UrlPolicy())
    else:
        raise RequestError(path, "must be a data: URL, part:NAME or an http(s) URL of an allowed host")
    if not isinstance(data, bytes) or not data:
        raise RequestError(path, "holds no bytes")
    return data


def _check_host(path: str, url: str, policy: UrlPolicy) -> None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise RequestError(path, f"redirects to {url!r}: only http(s) URLs are fetched")
    if parsed.hostname not in policy.hosts:
        raise RequestError(path, f"host {parsed.hostname!r} is not allowed (allowed hosts: {sorted(policy.hosts)})")
    if not policy.allow_private:
        for info in socket.getaddrinfo(parsed.hostname, parsed.port or 80, proto=socket.IPPROTO_TCP):
            address = ipaddress.ip_address(info[4][0])
            if address.is_private or address.is_loopback or address.is_link_local or address.is_reserved:
                raise RequestError(path, f"host {parsed.hostname!r} resolves to {address}, a private address")


def fetch_url(path: str, url: str, policy: UrlPolicy) -> bytes:
    """The body of an http(s) GET of `url` under `policy`: the host (and every redirect's) in
    policy.hosts and not private unless allowed, at most policy.max_redirects redirects, at most
    policy.max_bytes bytes, within policy.timeout_s seconds in all. Raises RequestError at
    `path` otherwise, and for an HTTP error or a failed connection."""
    redirects = []

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            redirects.append(newurl)
            if len(redirects) > policy.max_redirects:
                raise RequestError(path, f"more than {policy.max_redirects} redirects")
            _check_host(path, newurl, policy)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    _check_host(path, url, policy)
    opener = urllib.request.build_opener(Redirects)
    deadline = time.monotonic() + policy.timeout_s
    data = bytearray()
    try:
        with opener.open(url, timeout=policy.timeout_s) as response:
            while chunk := response.read1(FETCH_CHUNK_BYTES):  # what has arrived, up to the chunk
                data += chunk
                if len(data) > policy.max_bytes:
                    raise RequestError(path, f"is larger than {policy.max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError
    except RequestError:
        raise
    except OSError as error:  # URLError, HTTPError, timeouts
        if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
            raise RequestError(path, f"took longer than {policy.timeout_s:g} s to download") from None
        raise RequestError(path, f"could not be fetched: {error}") from None
    return bytes(data)


# A file's kind from its first bytes: PNG, JPEG, WebP images; WAV (RIFF), FLAC, MP3 (an ID3 tag or
# an MPEG frame sync) audio; MP4 (ISO BMFF ftyp box) video.
SIGNATURES = (
    (re.compile(rb"^\x89PNG\r\n\x1a\n"), "image/png"),
    (re.compile(rb"^\xff\xd8\xff"), "image/jpeg"),
    (re.compile(rb"^RIFF....WEBP", re.DOTALL), "image/webp"),
    (re.compile(rb"^RIFF....WAVE", re.DOTALL), "audio/wav"),
    (re.compile(rb"^fLaC"), "audio/flac"),
    (re.compile(rb"^(ID3|\xff[\xe0-\xff])"), "audio/mpeg"),
    (re.compile(rb"^....ftyp", re.DOTALL), "video/mp4"),
)
UNKNOWN_MEDIA_TYPE = "application/octet-stream"


def media_type(data: bytes) -> str:
    """The media type of a file from its first bytes (SIGNATURES), else UNKNOWN_MEDIA_TYPE."""
    return next((kind for pattern, kind in SIGNATURES if pattern.match(data)), UNKNOWN_MEDIA_TYPE)


def _keys(path: str, value, allowed: tuple[str, ...]) -> Mapping:
    if not isinstance(value, Mapping):
        raise RequestError(path, f"must be an object, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            raise RequestError(where, f"is unknown; allowed: {list(allowed)}")
    return value


def _prompt(value) -> str:
    if not isinstance(value, str):
        raise RequestError("prompt", "is required and must be a string")
    return value


def _task(path: str, value) -> str:
    if value not in protocol.TASKS:
        raise RequestError(path, f"{value!r} is not allowed: allowed {list(protocol.TASKS)}")
    return value


def _keyframe_frames(path: str, frames: list[int]) -> list[int]:
    try:
        return protocol.keyframe_indices(len(frames), frames)
    except ValueError as error:
        raise RequestError(path, str(error)) from None


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
    _keys("", body, SGLANG_FIELDS)
    task = _task("task", body.get("task"))
    prompt = _prompt(body.get("prompt"))
    conditions = body.get("conditions") or []
    if not isinstance(conditions, list):
        raise RequestError("conditions", f"must be an array, got {type(conditions).__name__}")
    if task == "t2va" and conditions:
        raise RequestError("conditions", f"task 't2va' takes no conditions; got {len(conditions)}")
    keyframes, references, paths = [], [], {}
    frames, keyframe_paths = [], []
    for i, condition in enumerate(conditions):
        at = f"conditions[{i}]"
        _keys(at, condition, SGLANG_CONDITION_FIELDS)
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
            start = _number(f"{at}.start_time_seconds", condition.get("start_time_seconds", 0))
            name = REFERENCE_INPUT[base]
            paths[f"{name}[{sum(r.kind == base for r in references)}]"] = f"{at}.uri"
            references.append(Reference(base, data, f"{at}.uri", start, kind != "video"))
    if task == "fl2va" and not keyframes:
        raise RequestError("conditions", "task 'fl2va' needs 1 or 2 image keyframes")
    if task == "ref2va" and not references:
        raise RequestError("conditions", "task 'ref2va' needs at least one reference")
    frames = _keyframe_frames("conditions", frames) if keyframes else []
    request = dict(format="sglang", prompt=prompt, task=task, flow_shift=SGLANG_FLOW_SHIFT)
    request["audio_flow_shift"] = SGLANG_AUDIO_FLOW_SHIFT
    target = _keys("target", body.get("target", {}), SGLANG_TARGET_FIELDS)
    if "short_edge" in target:
        short_edge = _int("target.short_edge", target["short_edge"], low=1)
        aspect = target.get("aspect_ratio", "16:9")
        if aspect == "auto":
            aspect = _auto_aspect(keyframes or [r.data for r in references if r.kind == "image"])
        request["width"], request["height"] = canvas(short_edge, aspect, "target.aspect_ratio")
        paths.update(width="target.short_edge", height="target.short_edge")
    elif "aspect_ratio" in target:
        raise RequestError("target.aspect_ratio", "needs target.short_edge")
    if "duration_seconds" in target:
        request["num_frames"] = _frames("target.duration_seconds", target["duration_seconds"])
        paths["num_frames"] = "target.duration_seconds"
    elif task == "ref2va":
        sounding = [r for r in references if r.kind == "audio" or (r.kind == "video" and r.audio)]
        if len(sounding) == 1:
            request["num_frames"] = protocol.frames_for_seconds(media_seconds(sounding[0].data, sounding[0].path))
            paths["num_frames"] = sounding[0].path
    if body.get("seed") is not None:
        request["seed"] = _int("seed", body["seed"])
        paths["seed"] = "seed"
    if body.get("num_inference_steps") is not None:
        request["num_inference_steps"] = _steps_from_sigma_points("num_inference_steps", body["num_inference_steps"])
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


def media_seconds(data: bytes, path: str) -> float:
    """The duration in seconds of an audio or video file (PyAV reads its container). Raises
    RequestError at `path` when it cannot be read."""
    import io

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if container.duration is None:
                raise ValueError("no duration")
            return container.duration / av.time_base
    except (av.FFmpegError, ValueError) as error:
        raise RequestError(path, f"has no readable duration: {error}") from None


def _file_list(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def read_vllm_omni(form: Mapping) -> VideoRequest:
    """vLLM-Omni's multipart fields (a file's value its bytes, another a string) -> VideoRequest:
    prompt, short_edge + aspect_ratio or width / height, fps (24 only), num_inference_steps
    (forwards), flow_shift, seed, num_outputs_per_prompt, input_reference / input_references
    (files, in order), extra_params JSON {task, duration, audio_flow_shift, frame_indices (one per
    file: fl2va), start_time_seconds (one per file, null for a non-video)}, lora (a JSON array of
    {"name", "scale"}: rules.lora_list, a path refused). Raises RequestError at the field's path."""
    _keys("", form, VLLM_FIELDS)
    prompt = _prompt(form.get("prompt"))
    extra = form.get("extra_params") or {}
    if isinstance(extra, (str, bytes)):
        try:
            extra = json.loads(extra)
        except ValueError as error:
            raise RequestError("extra_params", f"is not valid JSON: {error}") from None
    _keys("extra_params", extra, VLLM_EXTRA_FIELDS)
    files = [("input_reference", d) for d in _file_list(form.get("input_reference"))]
    files += [(f"input_references[{k}]", d) for k, d in enumerate(_file_list(form.get("input_references")))]
    for name, data in files:
        if not isinstance(data, bytes) or not data:
            raise RequestError(name, "must be a non-empty file")
    indices = extra.get("frame_indices")
    implied = "fl2va" if indices is not None else "ref2va" if files else "t2va"
    task = _task("extra_params.task", extra.get("task", implied))
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
            frames = _keyframe_frames("extra_params.frame_indices", list(indices))
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
        start = _number(f"extra_params.start_time_seconds[{k}]", start)
        if start and kind != "video":
            raise RequestError(f"extra_params.start_time_seconds[{k}]", "is for video references only")
        paths[f"{REFERENCE_INPUT[kind]}[{sum(r.kind == kind for r in references)}]"] = name
        references.append(Reference(kind, data, name, start, True))
    if "short_edge" in form or "aspect_ratio" in form:
        if "width" in form or "height" in form:
            raise RequestError("short_edge", "give short_edge and aspect_ratio, or width and height, not both")
        short_edge = _int("short_edge", form.get("short_edge"))
        request["width"], request["height"] = canvas(short_edge, form.get("aspect_ratio", "16:9"), "aspect_ratio")
        paths.update(width="short_edge", height="short_edge")
    elif "width" in form or "height" in form:
        request["width"], request["height"] = _int("width", form.get("width")), _int("height", form.get("height"))
        paths.update(width="width", height="height")
    if form.get("fps") is not None and _number("fps", form["fps"]) != protocol.VIDEO_FPS:
        raise RequestError("fps", f"{form['fps']!r} is not allowed: fps is fixed at {protocol.VIDEO_FPS}")
    if extra.get("duration") is not None:
        request["num_frames"] = _frames("extra_params.duration", extra["duration"])
        paths["num_frames"] = "extra_params.duration"
    for name, key in (("num_inference_steps", "num_inference_steps"), ("seed", "seed")):
        if form.get(name) is not None:
            request[key] = _int(name, form[name])
            paths[key] = name
    if form.get("num_outputs_per_prompt") is not None:
        request["num_outputs"] = _int("num_outputs_per_prompt", form["num_outputs_per_prompt"])
        paths["num_outputs"] = "num_outputs_per_prompt"
    if form.get("flow_shift") is not None:
        request["flow_shift"] = _number("flow_shift", form["flow_shift"], positive=True)
        paths["flow_shift"] = "flow_shift"
    if extra.get("audio_flow_shift") is not None:
        request["audio_flow_shift"] = _number("extra_params.audio_flow_shift", extra["audio_flow_shift"], True)
        paths["audio_flow_shift"] = "extra_params.audio_flow_shift"
    try:
        request["lora"] = protocol.lora_list(form.get("lora"))
    except ValueError as error:
        raise RequestError("lora", str(error)) from None
    return VideoRequest(**request, keyframes=tuple(keyframes), references=tuple(references), paths=paths)
