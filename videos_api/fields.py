"""The Videos API's request fields (OpenAI's shapes) mapped onto h3_pipeline's, and errors mapped
onto HTTP status codes. No FastAPI here: plain functions over plain values.

    POST /v1/videos field    -> h3_pipeline                 notes
    prompt (required)        -> PROMPT                      checked by h3_encoder
    size "WxH"               -> WIDTH, HEIGHT               e.g. "96x64"; absent: the model's default
                                                            (fl2va: the first keyframe's aspect)
    seconds "4"              -> NUM_FRAMES = round(s x 24)  a string (the SDK) or a number; not with num_frames
    num_frames               -> NUM_FRAMES                  our extension
    num_inference_steps      -> NUM_INFERENCE_STEPS         our extension
    seed                     -> SEED                        absent: drawn by the front end (kept for restarts)
    n                        -> NUM_OUTPUTS                 clips seed, seed + 1, ...; content ?index=k
    preview_every            -> preview_every parameter     default 1; 0: no previews
    model                    -> (none)                      absent or the served model name
    input_reference (file)   -> KEYFRAMES, index 0          the first frame (fl2va); PNG, JPEG, WebP
    last_frame (file)        -> KEYFRAMES, index -1         our extension: the last frame (fl2va)
    reference_images (files) -> REFERENCE_IMAGES            our extension (ref2va), repeatable
    reference_videos (files) -> REFERENCE_VIDEOS            our extension (ref2va), repeatable; MP4
    reference_audio (files)  -> REFERENCE_AUDIO             our extension (ref2va), repeatable; WAV, FLAC, MP3
    task                     -> TASK                        our extension; absent: protocol.implied_task
    fit                      -> fit parameter               our extension: crop (default), pad, stretch

A file field is a multipart file, or a string holding a base64 data URL ("data:image/png;base64,...":
what JSON bodies and the SDK's extra_body can carry); input_reference also as OpenAI's object
{"image_url": DATA_URL} (multipart: the field `input_reference[image_url]`). The front end decodes
no media: the server checks the files, and its refusal ("KEYFRAMES[0]: is not an image ...") comes
back naming the API field ("input_reference: is not an image ...").

Ranges are Triton's (h3_encoder / h3_dit parameters), so the refusal text is the server's own
INVALID_ARG message (docs/request_contract.md); the front end only checks forms (a number where a
number belongs, "WxH"), each with the one rule of h3_core.rules or h3_core.request_model (an
integer, seconds, a number, INT64, the prompt sent as a string, a data URL), worded with the API
field. Every error message starts with its code word, like Triton's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from h3_core import protocol, rules
from h3_core.request_model import (
    RequestError,
    data_url_bytes,
    media_type,  # noqa: F401 - the file's media type, one rule
)

# The file fields: API field -> (its content variant, which also names its files in the job's
# inputs/ folder; H3Client.generate's argument; repeatable). input_reference is OpenAI's field.
MEDIA_FIELDS = {
    "input_reference": ("first_frame", "first_frame", False),
    "last_frame": ("last_frame", "last_frame", False),
    "reference_images": ("reference_image", "reference_images", True),
    "reference_videos": ("reference_video", "reference_videos", True),
    "reference_audio": ("reference_audio", "reference_audio", True),
}
OTHER_REPEATABLE = ("input_references", "lora")  # vLLM-Omni's file field (formats.py); lora: NAME[:SCALE] each
KEYFRAME_FIELDS = ("input_reference", "last_frame")  # KEYFRAMES' order (client.api.keyframe_inputs)
# request fields of POST /v1/videos (and /v1/videos/sync)
CREATE_FIELDS = (
    "prompt",
    "model",
    "size",
    "seconds",
    "num_frames",
    "num_inference_steps",
    "seed",
    "n",
    "preview_every",
    "task",
    "fit",
    "flow_shift",
    "audio_flow_shift",
    "references",
    "lora",
    *MEDIA_FIELDS,
)
MEDIA_FIELDS_OF = {"image": "reference_images", "video": "reference_videos", "audio": "reference_audio"}
INT_FIELDS = {
    "num_frames": "num_frames",
    "num_inference_steps": "num_inference_steps",
    "seed": "seed",
    "n": "num_outputs",
}
SIZE_PATTERN = re.compile(r"^([0-9]+)x([0-9]+)$")
DEFAULT_PREVIEW_EVERY = 1
# Retry-After (seconds) for a full DiT (429) and for a server that cannot serve now (503: shutting
# down, restarting under --supervise, unreachable)
RETRY_AFTER_FULL_S = 5
RETRY_AFTER_UNAVAILABLE_S = 10
# a server refusal names its field first ("num_frames=0 is out of range ...", "prompt is 5000 bytes ...",
# "KEYFRAMES[0]: is not an image ...", the client's "SEED=... does not fit INT64"): the API field of each
# server field, its name lower-cased
FIELD_IN_TEXT = re.compile(r"^([A-Za-z_]+)(=| )")
API_FIELD = {
    "prompt": "prompt",
    "width": "size",
    "height": "size",
    "num_frames": "num_frames",
    "num_inference_steps": "num_inference_steps",
    "seed": "seed",
    "num_outputs": "n",
    "fit": "fit",
    "task": "task",
    "preview_every": "preview_every",
    "flow_shift": "flow_shift",
    "audio_flow_shift": "audio_flow_shift",
    "lora": "lora",
}
API_INPUT = {  # h3_pipeline inputs -> API fields (KEYFRAMES: _input_field)
    protocol.TASK: "task",
    protocol.REFERENCE_IMAGES: "reference_images",
    protocol.REFERENCE_VIDEOS: "reference_videos",
    protocol.REFERENCE_AUDIO: "reference_audio",
}
INPUT_IN_TEXT = re.compile(rf"^({'|'.join([protocol.KEYFRAMES, *API_INPUT])})(\[[0-9]+\])?")
CODE_STATUS = {"INVALID_ARG": 400, "CANCELLED": 409, "TIMEOUT": 504, "INTERNAL": 500, "UNKNOWN": 502}


class ApiError(Exception):
    """An HTTP error with an OpenAI-shaped body: {"error": {"message", "type", "param", "code"}}.
    `code` is a code word (Triton's INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL, the client's
    TIMEOUT, or the front end's NOT_FOUND, CONFLICT, UNAUTHORIZED, TOO_LARGE, LENGTH_REQUIRED);
    the message starts with it."""

    def __init__(self, status: int, code: str, text: str, param: str | None = None, headers: dict | None = None):
        super().__init__(f"{code}: {text}")
        self.status, self.code, self.message, self.param = status, code, f"{code}: {text}", param
        self.headers = dict(headers or {})

    def _with_param(self, param: str) -> ApiError:
        self.param = param
        return self

    def body(self) -> dict:
        """The JSON body of the response."""
        kind = "rate_limit_error" if self.status == 429 else "server_error" if self.status >= 500 else None
        return {
            "error": {
                "message": self.message,
                "type": kind or "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(text: str, param: str | None = None) -> ApiError:
    """A 400 INVALID_ARG error with `text` (the message after the code word) about `param`."""
    return ApiError(400, "INVALID_ARG", text, param)


def refused(error: rules.InvalidRequest, param: str) -> ApiError:
    """A field rule's refusal (h3_core.rules: its text names the API field) as a 400 INVALID_ARG
    error about `param`; raise it `from error`."""
    return invalid(str(error), param)


def _input_field(text: str, request: dict | None) -> tuple[str | None, str]:
    """(the API field, the text) of a refusal that starts with an h3_pipeline input's name: a file's
    name ("KEYFRAMES[1]", "REFERENCE_AUDIO[0]") is replaced by its API field's ("last_frame",
    "reference_audio[0]"; KEYFRAMES[k] is the k-th keyframe the parsed `request` sent, in
    KEYFRAME_FIELDS' order); (None, text) for a text that names none."""
    match = INPUT_IN_TEXT.match(text)
    if not match:
        return None, text
    name, index = match.group(1), match.group(2)
    if name == protocol.KEYFRAMES:
        inputs = request["inputs"] if request is not None else {}
        sent = [field for field in KEYFRAME_FIELDS if MEDIA_FIELDS[field][0] in inputs] or ["input_reference"]
        field = sent[min(int(index[1:-1]), len(sent) - 1)] if index else sent[0]
        return field, field + text[match.end() :] if index else text
    field = API_INPUT[name]
    return field, f"{field}{index}{text[match.end() :]}" if index else text


def error_from_server(code: str, text: str, request: dict | None = None) -> ApiError:
    """The HTTP error for an H3Error's code word and text (the message after the code):
    INVALID_ARG 400; UNAVAILABLE 429 with Retry-After when the DiT is full (its text ends with
    'retry later'), else 503 with Retry-After; CANCELLED 409; TIMEOUT 504; INTERNAL 500; anything
    else 502. `param` is the API field the text names first (a file's refusal is reworded with
    the API field's name: _input_field); with the parsed `request`, a num_frames refusal of a
    request that sent seconds names seconds and says how it was derived. A request read from
    SGLang's or vLLM-Omni's format (its "paths", formats.read) gets the sender's field path
    instead, as param and before the text: "target.duration_seconds: num_frames=240 is ..."."""
    paths = (request or {}).get("paths")
    if paths:  # SGLang's or vLLM-Omni's format: the sender's field path
        named = INPUT_IN_TEXT.match(text) or FIELD_IN_TEXT.match(text)
        key = named.group(0).rstrip("= ") if named else None
        key = key if key is None or key in paths else key.lower()
        if key in paths:
            return error_from_server(code, f"{paths[key]}: {text}")._with_param(paths[key])
    field, text = _input_field(text, request)
    if field is None:
        name = FIELD_IN_TEXT.match(text)
        field = API_FIELD.get(name.group(1).lower()) if name else None
    if request is not None and field == "num_frames" and request.get("seconds") is not None:
        field, text = "seconds", f"{text} (seconds={request['seconds']!r} at {protocol.VIDEO_FPS} fps)"
    if code == "UNAVAILABLE":
        full = text.endswith("retry later")
        status, wait = (429, RETRY_AFTER_FULL_S) if full else (503, RETRY_AFTER_UNAVAILABLE_S)
        return ApiError(status, code, text, field, {"Retry-After": str(wait)})
    return ApiError(CODE_STATUS.get(code, 502), code, text, field)


def form_fields(items: Iterable[tuple[str, object]]) -> dict:
    """The fields of a multipart or urlencoded body, (name, value) pairs as sent (a file's value
    its bytes, any other a string), as parse_create takes them: a repeatable file field
    (MEDIA_FIELDS, and vLLM-Omni's input_references) a list of its values in their order, sent
    under its name or with the SDK's "[]" (extra_body lists: `reference_images[]`); the SDK's
    `input_reference[image_url]` as input_reference {"image_url": value}. Raises ApiError 400
    INVALID_ARG naming a field sent twice that is not repeatable."""
    fields: dict = {}
    for name, value in items:
        name = name.removesuffix("[]")
        if name == "input_reference[image_url]":
            name, value = "input_reference", {"image_url": value}
        if (name in MEDIA_FIELDS and MEDIA_FIELDS[name][2]) or name in OTHER_REPEATABLE:
            fields.setdefault(name, []).append(value)
        elif name in fields:
            raise invalid(f"{name} was sent twice: it takes one value", name)
        else:
            fields[name] = value
    return fields


def _file(field: str, name: str, value) -> bytes:
    """The bytes of an item of file field `field` (`name`: the item's, e.g. "reference_images[1]",
    for the message): an upload's bytes, a base64 data URL's decoded bytes, or (input_reference)
    OpenAI's {"image_url": DATA_URL}. Raises ApiError 400 INVALID_ARG about `field` for another
    value, a file_id (there is no Files API), a URL that is not a base64 data URL, bad base64, no
    bytes."""
    if isinstance(value, dict) and field == "input_reference":
        if "file_id" in value:
            raise invalid("input_reference file_id is not served: upload the file or send a data URL", field)
        if set(value) != {"image_url"}:
            raise invalid(f"input_reference must hold image_url alone, got keys {sorted(value)}", field)
        value = value["image_url"]
    if isinstance(value, str):
        try:
            decoded = data_url_bytes(name, value)  # the request model's data: URL rule
        except RequestError as error:
            raise invalid(f"{name} {error.text}", field) from error
        if decoded is None:
            shown = value if len(value) <= 40 else f"{value[:40]}..."
            raise invalid(
                f"{name}={shown!r} must be a file or a base64 data URL (data:image/png;base64,...): "
                "this server fetches no URLs",
                field,
            )
        value = decoded
    if not isinstance(value, bytes):
        raise invalid(f"{name} must be a file or a base64 data URL, got {type(value).__name__}", field)
    if not value:
        raise invalid(f"{name} is empty (0 bytes)", field)
    return value


def _media(form: Mapping[str, object]) -> dict[str, list[bytes]]:
    """The files of the file fields present: content variant -> the files' bytes, in order."""
    media = {}
    for name, (variant, _, repeatable) in MEDIA_FIELDS.items():
        value = form.get(name)
        if value is None:
            continue
        if repeatable:
            items = value if isinstance(value, list) else [value]
            media[variant] = [_file(name, f"{name}[{k}]", item) for k, item in enumerate(items)]
        else:
            media[variant] = [_file(name, name, value)]
    return {variant: files for variant, files in media.items() if files}


def _integer(name: str, value) -> int:
    """An integer field: a JSON number or a form's digits (h3_core.rules.check_integer)."""
    try:
        return rules.check_integer(name, value, text=True)
    except rules.InvalidValue as error:
        raise refused(error, name) from error


def _seconds(value) -> float:
    """`seconds`: a number of seconds > 0, ASCII decimal text (h3_core.rules.check_seconds)."""
    try:
        return rules.check_seconds("seconds", value, text=True)
    except rules.InvalidValue as error:
        raise refused(error, "seconds") from error


def check_model(model, model_name: str) -> None:
    """A create's `model`: absent or `model_name` (every request format's rule). Raises
    rules.InvalidValue "is not served here; allowed: 'NAME'"."""
    if model is not None and model != model_name:
        raise rules.InvalidValue("model", model, f"is not served here; allowed: {model_name!r}")


def parse_create(form: Mapping[str, object], model_name: str) -> tuple[dict, dict[str, list[bytes]]]:
    """The generation request of a POST /v1/videos body (JSON, or form_fields of a form) and its
    files: (request, media). request: {"prompt", "width", "height", "num_frames",
    "num_inference_steps", "seed", "num_outputs", "preview_every", "size", "seconds", "task",
    "fit", "inputs"}, None where the server's default applies ("size" and "seconds" keep the
    strings as sent, for the video object; "inputs" maps each content variant sent to its files'
    media types, media_type). media: content variant -> the files' bytes (MEDIA_FIELDS). Raises
    ApiError 400 INVALID_ARG naming the field for an unknown field, a missing or non-string
    prompt, a model other than `model_name`, a size not "WxH", seconds not a number > 0, seconds
    together with num_frames, a non-integer integer field, a task or fit that is not a string, or
    a file field that holds no file (_file), a malformed lora (protocol.lora_list). Values (task,
    fit, the files' contents, whether a LoRA adapter is loaded) are the server's to check."""
    unknown = sorted(set(form) - set(CREATE_FIELDS))
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}; allowed: {sorted(CREATE_FIELDS)}", unknown[0])
    try:
        prompt = rules.check_prompt_sent(form.get("prompt"))  # its content: the server's prompt rule
    except rules.InvalidRequest as error:
        raise refused(error, "prompt") from error
    try:
        check_model(form.get("model"), model_name)
    except rules.InvalidValue as error:
        raise refused(error, "model") from error
    request = {"prompt": prompt, "width": None, "height": None, "size": None, "seconds": None}
    size = form.get("size")
    if size is not None:
        match = SIZE_PATTERN.match(size) if isinstance(size, str) else None
        if not match:
            raise invalid(f"size={size!r} must be WIDTHxHEIGHT in pixels, e.g. '96x64'", "size")
        request.update(size=size, width=int(match.group(1)), height=int(match.group(2)))
    for name, key in INT_FIELDS.items():
        request[key] = None if form.get(name) is None else _integer(name, form[name])
    seconds = form.get("seconds")
    if seconds is not None:
        if request["num_frames"] is not None:
            raise invalid("give seconds or num_frames, not both", "seconds")
        request["num_frames"] = protocol.frames_for_seconds(_seconds(seconds))
        request["seconds"] = str(seconds)
    preview_every = form.get("preview_every")
    request["preview_every"] = (
        DEFAULT_PREVIEW_EVERY if preview_every is None else _integer("preview_every", preview_every)
    )
    try:
        rules.check_int64("preview_every", request["preview_every"])  # a request parameter: INT64
    except rules.InvalidValue as error:
        raise refused(error, "preview_every") from error
    for name in ("task", "fit"):
        value = form.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{name}={value!r} must be a string", name)
        request[name] = value
    for name in ("flow_shift", "audio_flow_shift"):
        request[name] = None if form.get(name) is None else _shift(name, form[name])
    try:  # a JSON array of {"name", "scale"}, or the form field repeated as NAME[:SCALE]
        request["lora"] = protocol.lora_entries(protocol.lora_list(form.get("lora")))
    except ValueError as error:
        raise refused(error, "lora") from error
    media = _media(form)
    request["references"] = _references(form.get("references"), media)
    request["inputs"] = {variant: [media_type(data) for data in files] for variant, files in media.items()}
    return request, media


def _shift(name: str, value) -> float:
    """A flow shift sent as a number or a form's decimal text (h3_core.rules.check_number; its
    range, check_flow_shift, is applied by the server)."""
    try:
        return rules.check_number(name, value, text=True)
    except rules.InvalidValue as error:
        raise refused(error, name) from error


def _references(value, media: Mapping[str, list[bytes]]) -> list[dict] | None:
    """The `references` field (REFERENCES' JSON array, as text or as a JSON body's array): the
    reference files' block order, a video's start_time_seconds and audio (protocol.reference_list,
    its inputs named by their API fields); None when absent."""
    if value is None:
        return None
    counts = {
        protocol.REFERENCE_IMAGES: len(media.get("reference_image", [])),
        protocol.REFERENCE_VIDEOS: len(media.get("reference_video", [])),
        protocol.REFERENCE_AUDIO: len(media.get("reference_audio", [])),
    }
    try:
        entries = protocol.reference_list(value if isinstance(value, str) else json.dumps(value), counts)
    except ValueError as error:
        raise invalid(str(error).replace(protocol.REFERENCES, "references", 1), "references") from None
    return [  # as REFERENCES takes them: start_time_seconds and audio on videos only
        entry if entry["input"] == protocol.REFERENCE_VIDEOS else {"input": entry["input"], "index": entry["index"]}
        for entry in entries
    ]


def task_of(request: dict) -> str:
    """The task of a parsed request: its `task`, else the one its files imply (protocol.implied_task)."""
    keyframe_variants = {MEDIA_FIELDS[field][0] for field in KEYFRAME_FIELDS}
    sent = set(request["inputs"])
    return request["task"] or protocol.implied_task(bool(sent & keyframe_variants), bool(sent - keyframe_variants))
