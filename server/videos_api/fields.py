"""The Videos API's request fields (OpenAI's shapes) mapped onto h3_pipeline's, and errors mapped
onto HTTP status codes. No FastAPI here: plain functions over plain values.

    POST /v1/videos field    -> h3_pipeline                 notes
    prompt (required)        -> PROMPT                      checked by h3_encoder
    size "WxH"               -> WIDTH, HEIGHT               e.g. "96x64"; absent: the model's default
    seconds "4"              -> NUM_FRAMES = round(s x 24)  a string (the SDK) or a number; not with num_frames
    num_frames               -> NUM_FRAMES                  our extension
    num_inference_steps      -> NUM_INFERENCE_STEPS         our extension
    seed                     -> SEED                        absent: drawn by the front end (kept for restarts)
    n                        -> NUM_OUTPUTS                 clips seed, seed + 1, ...; content ?index=k
    preview_every            -> preview_every parameter     default 1; 0: no previews
    model                    -> (none)                      absent or the served model name
    input_reference          -> refused                     text-to-video only

Ranges are Triton's (h3_encoder / h3_dit parameters), so the refusal text is the server's own
INVALID_ARG message (docs/request_contract.md); the front end only checks forms (a number where a
number belongs, "WxH"). Every error message starts with its code word, like Triton's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from h3_core import protocol

# request fields of POST /v1/videos (and /v1/videos/sync), input_reference refused with a message
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
)
INT_FIELDS = {
    "num_frames": "num_frames",
    "num_inference_steps": "num_inference_steps",
    "seed": "seed",
    "n": "num_outputs",
}
SIZE_PATTERN = re.compile(r"^([0-9]+)x([0-9]+)$")
INTEGER_PATTERN = re.compile(r"^-?[0-9]+$")
DEFAULT_PREVIEW_EVERY = 1
# Retry-After (seconds) for a full DiT (429) and for a server that cannot serve now (503: shutting
# down, restarting under --supervise, unreachable)
RETRY_AFTER_FULL_S = 5
RETRY_AFTER_UNAVAILABLE_S = 10
# a server refusal names its field first ("num_frames=0 is out of range ...", "prompt is 5000 bytes ..."):
# the API field of each server field
FIELD_IN_TEXT = re.compile(r"^([a-z_]+)(=| )")
API_FIELD = {
    "prompt": "prompt",
    "width": "size",
    "height": "size",
    "num_frames": "num_frames",
    "num_inference_steps": "num_inference_steps",
    "seed": "seed",
    "num_outputs": "n",
}
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


def error_from_server(code: str, text: str, request: dict | None = None) -> ApiError:
    """The HTTP error for an H3Error's code word and text (the message after the code):
    INVALID_ARG 400; UNAVAILABLE 429 with Retry-After when the DiT is full (its text ends with
    'retry later'), else 503 with Retry-After; CANCELLED 409; TIMEOUT 504; INTERNAL 500; anything
    else 502. `param` is the API field the text names first; with the parsed `request`, a
    num_frames refusal of a request that sent seconds names seconds and says how it was derived."""
    name = FIELD_IN_TEXT.match(text)
    field = API_FIELD.get(name.group(1)) if name else None
    if request is not None and field == "num_frames" and request.get("seconds") is not None:
        field, text = "seconds", f"{text} (seconds={request['seconds']!r} at {protocol.VIDEO_FPS} fps)"
    if code == "UNAVAILABLE":
        full = text.endswith("retry later")
        status, wait = (429, RETRY_AFTER_FULL_S) if full else (503, RETRY_AFTER_UNAVAILABLE_S)
        return ApiError(status, code, text, field, {"Retry-After": str(wait)})
    return ApiError(CODE_STATUS.get(code, 502), code, text, field)


def _integer(name: str, value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER_PATTERN.match(value.strip()):
        return int(value.strip())
    raise invalid(f"{name}={value!r} must be an integer", name)


def _seconds(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        try:
            seconds = float(value) if isinstance(value, str) else math.nan
        except ValueError:
            seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise invalid(f"seconds={value!r} must be a number of seconds > 0", "seconds")
    return seconds


def parse_create(form: Mapping[str, object], model_name: str) -> dict:
    """The generation request of a POST /v1/videos body (JSON or form fields, values as sent):
    {"prompt", "width", "height", "num_frames", "num_inference_steps", "seed", "num_outputs",
    "preview_every", "size", "seconds"}, None where the server's default applies ("size" and
    "seconds" keep the strings as sent, for the video object). Raises ApiError 400 INVALID_ARG
    naming the field for an unknown field, input_reference, a missing or non-string prompt, a
    model other than `model_name`, a size not "WxH", seconds not a number > 0, seconds together
    with num_frames, or a non-integer integer field."""
    if "input_reference" in form:
        raise invalid("input_reference is not supported: this server generates video from text only", "input_reference")
    unknown = sorted(set(form) - set(CREATE_FIELDS))
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}; allowed: {sorted(CREATE_FIELDS)}", unknown[0])
    prompt = form.get("prompt")
    if not isinstance(prompt, str):
        raise invalid("prompt is required and must be a string", "prompt")
    model = form.get("model")
    if model is not None and model != model_name:
        raise invalid(f"model={model!r} is not served here; allowed: {model_name!r}", "model")
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
        request["num_frames"] = round(_seconds(seconds) * protocol.VIDEO_FPS)
        request["seconds"] = str(seconds)
    preview_every = form.get("preview_every")
    request["preview_every"] = (
        DEFAULT_PREVIEW_EVERY if preview_every is None else _integer("preview_every", preview_every)
    )
    return request
