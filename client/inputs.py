"""A generation request's input tensors and argument checks, client side: the type checks that
catch what tritonclient would silently convert (check_type, check_seconds; an int or a number by
h3_core.rules' field rules), the [1, 1] scalar inputs (INT64 by h3_core.rules.check_int64), the
media files sent unchanged (media_bytes) as fl2va keyframes (keyframe_inputs) and ref2va
references and guides (reference_inputs), the sigma lists (sigma_inputs). Used by
client.api.H3Client.generate.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from h3_core import protocol, rules

from .errors import H3Error


def check_int64(name: str, value: int) -> None:
    """Raise H3Error INVALID_ARG naming the value unless it fits INT64 (what tritonclient sends;
    h3_core.rules.check_int64, the server's and the Videos API's rule), the rule's error its cause."""
    try:
        rules.check_int64(name, value)
    except rules.InvalidValue as error:
        raise H3Error("INVALID_ARG", str(error)) from error


def scalar_input(name: str, value, datatype: str) -> grpcclient.InferInput:
    """A [1, 1] input tensor `name` holding `value`: datatype "BYTES" (bytes) or "INT64" (an int;
    H3Error INVALID_ARG when it does not fit INT64)."""
    if datatype == "INT64":
        check_int64(name, value)
    tensor = grpcclient.InferInput(name, [1, 1], datatype)
    tensor.set_data_from_numpy(np.array([[value]], dtype=object if datatype == "BYTES" else np.int64))
    return tensor


ARGUMENT_KINDS = {
    "bool": bool,
    "str": str,
    "str or bytes": (str, bytes),
    "a path or bytes": (str, os.PathLike, bytes),
}


FIELD_RULES = {"int": rules.check_integer, "number": rules.check_number}  # never a bool


def check_type(name: str, value, kind: str, optional: bool = False) -> None:
    """Raise TypeError naming the argument unless `value` is of `kind` (a key of ARGUMENT_KINDS or
    FIELD_RULES; numpy integers count as int, bool never counts as a number) or, when optional, None.
    Catches what tritonclient would silently convert (2.9 -> 2 steps, "false" -> true). An int
    and a number are the field rules' (h3_core.rules.check_integer, check_number): their
    InvalidValue is the TypeError's cause."""
    if value is None and optional:
        return
    wrong = TypeError(f"{name} must be {kind}{' or None' if optional else ''}, got {type(value).__name__} {value!r}")
    try:
        if kind in FIELD_RULES:
            FIELD_RULES[kind](name, value)
        elif isinstance(value, bool) and kind != "bool" or not isinstance(value, ARGUMENT_KINDS[kind]):
            raise wrong
    except rules.InvalidValue as error:
        raise wrong from error


def check_seconds(name: str, value, optional: bool = False) -> None:
    """Raise TypeError (not a number) or ValueError (not > 0) naming the argument; None passes
    when optional."""
    check_type(name, value, "number", optional)
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value}")


# The media files a request may carry, sent unchanged (the server decodes them): kind -> (the file
# in words, its formats).
MEDIA_FILES = {
    "image": ("an image file", "a PNG, JPEG or WebP file"),
    "video": ("a video file", "an MP4 file"),
    "audio": ("an audio file", "a WAV, FLAC or MP3 file"),
}


def media_bytes(name: str, value: str | os.PathLike | bytes, media: str) -> bytes:
    """The encoded media file an argument names: `value`'s bytes, or the bytes of the file at the path
    `value` (str or os.PathLike), unchanged (the server decodes them; the client decodes nothing).
    media: a key of MEDIA_FILES ("image", "video" or "audio"), for the messages. Raises TypeError for
    another type, ValueError naming the argument (`name`) for a path that does not exist, is not a
    file or cannot be read, and for no bytes (an empty file: naming its path too)."""
    check_type(name, value, "a path or bytes")
    noun, formats = MEDIA_FILES[media]
    if isinstance(value, bytes):
        data, shown = value, name
    else:
        path = Path(value)
        shown = f"{name} {path}"
        if not path.exists():
            raise ValueError(f"{shown}: no such file")
        if not path.is_file():
            raise ValueError(f"{shown} is not a file; give {noun}'s path")
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ValueError(f"{shown}: cannot read it ({error.strerror})") from None
    if not data:
        raise ValueError(f"{shown} is empty: give {formats}")
    return data


def keyframe_inputs(first_frame: bytes | None, last_frame: bytes | None) -> list[grpcclient.InferInput]:
    """h3_pipeline's fl2va inputs for the keyframes given (encoded image files' bytes), in the order
    first, last: KEYFRAMES BYTES [1, K] and KEYFRAME_INDICES INT64 [1, K] holding
    protocol.FIRST_FRAME (0) and protocol.LAST_FRAME (-1) respectively, K = 1 or 2; [] when both
    are None."""
    given = [
        (data, index)
        for data, index in ((first_frame, protocol.FIRST_FRAME), (last_frame, protocol.LAST_FRAME))
        if data is not None
    ]
    if not given:
        return []
    keyframes = grpcclient.InferInput(protocol.KEYFRAMES, [1, len(given)], "BYTES")
    keyframes.set_data_from_numpy(np.array([[data for data, _ in given]], dtype=object))
    indices = grpcclient.InferInput(protocol.KEYFRAME_INDICES, [1, len(given)], "INT64")
    indices.set_data_from_numpy(np.array([[index for _, index in given]], dtype=np.int64))
    return [keyframes, indices]


def sigma_inputs(video_sigmas: Sequence[float] | None, audio_sigmas: Sequence[float] | None) -> list:
    """h3_pipeline's VIDEO_SIGMAS and AUDIO_SIGMAS FP32 [1, N] (protocol.SIGMA_INPUTS: a request's own
    sigma list per clock, docs/model.md §3.1), one for each argument that is not None, in that
    order. The values are the server's to check (N = the steps + 1, from exactly 1 down to exactly 0,
    strictly decreasing). Raises TypeError naming the argument and item (e.g. "video_sigmas[1]") for
    a wrong type."""
    inputs = []
    for (input_name, name), values in zip(protocol.SIGMA_INPUTS.items(), (video_sigmas, audio_sigmas), strict=True):
        if values is None:
            continue
        _sequence(name, values)
        for index, value in enumerate(values):
            check_type(f"{name}[{index}]", value, "number")
        inputs.append(grpcclient.InferInput(input_name, [1, len(values)], "FP32"))
        inputs[-1].set_data_from_numpy(np.array([values], dtype=np.float32).reshape(1, len(values)))
    return inputs


def lora_input(lora) -> list:
    """h3_pipeline's LORA BYTES [1, 1] (protocol.LORA): the request's adapters as a JSON array of
    {"name", "scale"}, from `lora`, a sequence of ("name", scale) pairs, {"name", "scale"} dicts or
    "NAME[:SCALE]" strings (protocol.lora_list, the rule every entry point uses); [] for None or
    an empty sequence. Raises ValueError (protocol.InvalidRequest, naming `lora` and the entry)
    for a malformed entry, a name outside rules.LORA_NAME, a name twice or a scale out of range;
    whether the server holds the adapters is the server's check (INVALID_ARG)."""
    entries = protocol.lora_list(list(lora) if isinstance(lora, tuple) else lora)
    if not entries:
        return []
    return [_bytes_input(protocol.LORA, json.dumps(protocol.lora_entries(entries)).encode())]


def _bytes_input(name: str, data: bytes) -> grpcclient.InferInput:
    """A BYTES [1, 1] input holding `data`."""
    tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[data]], dtype=object))
    return tensor


def _sequence(name: str, value) -> None:
    """Raise TypeError naming the argument unless `value` is a sequence (a list, a tuple) other than
    str and bytes (whose items are characters)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else f"{shown[:40]}... ({len(value)} items)"
        raise TypeError(f"{name} must be a sequence (list or tuple), got {type(value).__name__} {shown}")


def reference_inputs(
    reference_images: Sequence[str | os.PathLike | bytes] = (),
    reference_videos: Sequence[str | os.PathLike | bytes] = (),
    reference_audio: Sequence[str | os.PathLike | bytes] = (),
    guides: Sequence[tuple[str | os.PathLike | bytes, int]] = (),
) -> list[grpcclient.InferInput]:
    """h3_pipeline's ref2va inputs (docs/model.md §2.1-2.3; protocol.REFERENCE_INPUTS), each file's bytes
    unchanged (media_bytes), each input in its argument's order and only when its argument is not
    empty: REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIO BYTES [1, N] (image, MP4, audio
    files), then GUIDES BYTES [1, N] (image files) with GUIDE_FRAMES INT64 [1, N] (the frame each
    guide should appear at). Every argument is a sequence of paths (str or os.PathLike) or bytes;
    guides a sequence of (image, frame) pairs, frame an int. Counts and frame ranges are the
    server's to check (its limits are configurable). Raises TypeError naming the argument and item
    (e.g. "reference_images[1]", "guides[0] frame") for a wrong type, ValueError for a missing,
    unreadable or empty file (media_bytes), H3Error INVALID_ARG for a frame outside INT64."""
    inputs = []
    for input_name, name, files, media in (
        (protocol.REFERENCE_IMAGES, "reference_images", reference_images, "image"),
        (protocol.REFERENCE_VIDEOS, "reference_videos", reference_videos, "video"),
        (protocol.REFERENCE_AUDIO, "reference_audio", reference_audio, "audio"),
    ):
        _sequence(name, files)
        data = [media_bytes(f"{name}[{k}]", value, media) for k, value in enumerate(files)]
        if data:
            inputs.append(grpcclient.InferInput(input_name, [1, len(data)], "BYTES"))
            inputs[-1].set_data_from_numpy(np.array([data], dtype=object))
    _sequence("guides", guides)
    images, frames = [], []
    for k, guide in enumerate(guides):
        if isinstance(guide, (str, bytes)) or not isinstance(guide, Sequence) or len(guide) != 2:
            raise TypeError(f"guides[{k}] must be an (image, frame) pair, got {type(guide).__name__} {guide!r}")
        image, frame = guide
        check_type(f"guides[{k}] frame", frame, "int")
        check_int64(f"guides[{k}] frame", frame)
        images.append(media_bytes(f"guides[{k}]", image, "image"))
        frames.append(int(frame))
    if images:
        guide_images = grpcclient.InferInput(protocol.GUIDES, [1, len(images)], "BYTES")
        guide_images.set_data_from_numpy(np.array([images], dtype=object))
        guide_frames = grpcclient.InferInput(protocol.GUIDE_FRAMES, [1, len(frames)], "INT64")
        guide_frames.set_data_from_numpy(np.array([frames], dtype=np.int64))
        inputs += [guide_images, guide_frames]
    return inputs


def json_number(value: numbers.Real) -> int | float:
    """A JSON-able request parameter: an int stays an int, anything else (numpy floats and
    integers included) becomes a float."""
    return value if isinstance(value, int) else float(value)


def request_parameters(
    *,
    progress_every: int,
    preview_every: int,
    deadline_s: float | None,
    request_priority: int,
    return_mp4: bool,
    return_frames: bool,
    return_audio: bool,
    inject_fault: str | None,
    fit: str | None,
    flow_shift: float | None,
    audio_flow_shift: float | None,
    cache_threshold: float | None,
) -> dict[str, int | float | bool | str]:
    """h3_pipeline's request parameters of H3Client.generate's checked arguments (their meaning:
    its docstring; docs/request_contract.md): progress_every always, every other one only when it
    differs from the server's default (0, None, return_mp4 true, return_frames and return_audio
    false). Numbers become JSON numbers (numpy integers and floats included)."""
    parameters: dict[str, int | float | bool | str] = {"progress_every": int(progress_every)}
    if preview_every:
        parameters["preview_every"] = int(preview_every)
    if deadline_s is not None:
        parameters["deadline_s"] = json_number(deadline_s)
    if request_priority:
        parameters["request_priority"] = int(request_priority)
    if not return_mp4:
        parameters["return_mp4"] = False
    if return_frames:
        parameters["return_frames"] = True
    if return_audio:
        parameters["return_audio"] = True
    if inject_fault is not None:
        parameters["inject_fault"] = inject_fault
    if fit is not None:
        parameters["fit"] = fit
    for name, value in (
        ("flow_shift", flow_shift),
        ("audio_flow_shift", audio_flow_shift),
        ("cache_threshold", cache_threshold),
    ):
        if value is not None:
            parameters[name] = json_number(value)
    return parameters
