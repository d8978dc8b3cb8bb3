"""The one typed generation request (VideoRequest, with its keyframes and references), the refusal
of a request (RequestError, at the sender's field path) and the field checks the format readers
share: each applies h3_core.rules' field rule (one place for each rule) and words its refusal at
the sender's path ("seed: 'x' must be an integer"). Plain Python, no torch."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from h3_core import protocol
from h3_core.rules import (
    PROMPT_REQUIRED,
    InvalidRequest,
    InvalidValue,
    check_at_least,
    check_choice,
    check_flow_shift,
    check_int64,
    check_integer,
    check_number,
    check_prompt_sent,
)

FORMATS = ("openai", "sglang", "vllm_omni")
ASPECT = re.compile(r"^([1-9][0-9]*):([1-9][0-9]*)$")
REFERENCE_INPUT = {
    "image": protocol.REFERENCE_IMAGES,
    "video": protocol.REFERENCE_VIDEOS,
    "audio": protocol.REFERENCE_AUDIO,
}


class RequestError(ValueError):
    """A refused request: `path` is the field in the sender's terms; the message starts with it
    ("PATH: TEXT"); `text` is what follows the path."""

    def __init__(self, path: str, text: str):
        super().__init__(f"{path}: {text}")
        self.path, self.text = path, text


def at_path(path: str, error: InvalidValue) -> RequestError:
    """A field rule's refusal (h3_core.rules) at the sender's field path: "PATH: VALUE REASON"."""
    return RequestError(path, f"{error.value!r} {error.reason}")


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
                {
                    "kind": r.kind,
                    "sha256": hashlib.sha256(r.data).hexdigest(),
                    "start_time_seconds": r.start_time_seconds,
                    "audio": r.audio,
                }
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


def read_integer(path: str, value, low: int | None = None) -> int:
    """`value` (an int, or a form's digits) as an int in INT64, >= `low` when given
    (h3_core.rules.check_integer, check_at_least, check_int64). Raises RequestError at `path`."""
    try:
        number = check_integer(path, value, text=True)
        if low is not None:
            check_at_least(path, number, low)
        return check_int64(path, number)
    except InvalidValue as error:
        raise at_path(path, error) from error


def read_number(path: str, value, positive: bool = False) -> float:
    """`value` (a number, or a form's decimal text) as a float, finite and >= 0 (> 0 when
    `positive`; h3_core.rules.check_number). Raises RequestError at `path`."""
    try:
        return check_number(path, value, text=True, low=0, strict=positive)
    except InvalidValue as error:
        raise at_path(path, error) from error


def read_shift(path: str, value) -> float:
    """A sigma schedule's shift (a number, or a form's decimal text) in
    rules.MIN_FLOW_SHIFT..MAX_FLOW_SHIFT (h3_core.rules.check_flow_shift, the server's rule too).
    Raises RequestError at `path`."""
    try:
        return check_flow_shift(path, check_number(path, value, text=True))
    except InvalidValue as error:
        raise at_path(path, error) from error


def read_frames(path: str, seconds) -> int:
    """Frames asked for by a duration in seconds at 24 fps (protocol.frames_for_seconds)."""
    return protocol.frames_for_seconds(read_number(path, seconds, positive=True))


def read_object(path: str, value, allowed: tuple[str, ...]) -> Mapping:
    """`value` when it is an object whose keys are all `allowed`. Raises RequestError at `path`
    (at "PATH.KEY" for an unknown key)."""
    if not isinstance(value, Mapping):
        raise RequestError(path, f"must be an object, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            raise RequestError(where, f"is unknown; allowed: {list(allowed)}")
    return value


def read_prompt(value) -> str:
    """The request's prompt, a str (h3_core.rules.check_prompt_sent); RequestError at "prompt"."""
    try:
        return check_prompt_sent(value)
    except InvalidRequest as error:
        raise RequestError("prompt", PROMPT_REQUIRED) from error


def read_task(path: str, value) -> str:
    """The request's task, one of protocol.TASKS (h3_core.rules.check_choice); RequestError at `path`."""
    try:
        return check_choice(path, value, protocol.TASKS)
    except InvalidValue as error:
        raise at_path(path, error) from error


def read_keyframe_frames(path: str, frames: list[int]) -> list[int]:
    """The keyframes' frame indices, checked by protocol.keyframe_indices; RequestError at `path`."""
    try:
        return protocol.keyframe_indices(len(frames), frames)
    except ValueError as error:
        raise RequestError(path, str(error)) from None
