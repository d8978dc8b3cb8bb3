"""The request rules, each defined once, in the core's words and torch-free: the domain error the
core raises (InvalidRequest, naming the request field; InvalidValue, a field's value and the rule's
words), each field rule (check_integer, check_int64, check_at_least, check_in_range, check_number,
check_seconds, check_flow_shift, check_choice, check_prompt_sent), the prompt rules (check_prompt,
check_prompt_bytes), the task rule (check_task) and the LoRA rules (lora_list: a request's
adapters as every entry point sends them, check_lora_name, check_lora).

Every entry point applies these rules and words their refusal for its wire (docs/request_contract.md
§"One rule, every entry point"): h3_dit's validate_request and admission and the request
parameters (h3_core.protocol) raise them as they are (Triton INVALID_ARG), the request model
(h3_core.request_model) as a RequestError at the sender's field path, the Videos API as OpenAI's
error shape naming its field, H3Client and the CLI as a ValueError / TypeError / argparse error
naming the argument or flag; each keeps the rule's error as its __cause__."""

import json
import math
import numbers
import re
import unicodedata

from h3_core.config import MAX_KEYFRAMES

TASKS = ("t2va", "fl2va", "ref2va")  # text, first/last frame, references (docs/model.md §2.1)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # an integer field travels as INT64
MAX_FLOW_SHIFT = 100.0  # flow_shift / audio_flow_shift: the sigma schedule's shift (docs/model.md §3.1)
# Below it the schedule's float32 arithmetic (sampling.shift_sigma) is wrong: (shift - 1) rounds,
# by 1e-3 relative at 1e-5, 50 % at 3e-8, and to -1 (0/0 = NaN at sigma 1) below 6e-8. At 0.01
# the float32 schedule is within 1e-6 of the float64 one.
MIN_FLOW_SHIFT = 1 / MAX_FLOW_SHIFT
# the words of the field rules (what a refusal says after "FIELD=VALUE")
MUST_BE_INTEGER = "must be an integer"
DOES_NOT_FIT_INT64 = f"does not fit INT64 ({INT64_MIN}..{INT64_MAX})"
MUST_BE_NUMBER = "must be a number"
MUST_BE_SECONDS = "must be a number of seconds > 0"
PROMPT_REQUIRED = "is required and must be a string"
# a form's text: an integer is ASCII digits with an optional minus sign; a number ASCII decimal
# (float() would also take "٤", "４", "0_5" and "nan")
INTEGER_TEXT = re.compile(r"^\s*-?[0-9]+\s*$")
NUMBER_TEXT = re.compile(r"^\s*-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*$")
LORA_SCALE_MAX = 4.0  # a request's LoRA scales lie in -LORA_SCALE_MAX..LORA_SCALE_MAX
# a LoRA adapter's name (docs/lora.md): no "=", "," or ":", which the settings and the CLI use as separators
LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LORA_NAME_RULE = "1..64 letters, digits, '_', '.' or '-', the first a letter or digit"


class InvalidRequest(ValueError):
    """A request the core refuses. `field`: the request field it is about, in the core's words
    ("prompt", "task", "height", ...); str(error): why, naming the field, the value and what is
    allowed. A ValueError, so an adapter that answers any ValueError with INVALID_ARG keeps doing so."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class InvalidValue(InvalidRequest):
    """A field's value that its rule refuses: `field` as the caller named it, `value` as sent,
    `reason` the rule's words (MUST_BE_INTEGER, "is out of range: allowed 1..50", ...).
    str(error): "FIELD=VALUE REASON" (a str or bytes value shown by its repr, another by str)."""

    def __init__(self, field: str, value, reason: str):
        super().__init__(field, f"{field}={shown(value)} {reason}")
        self.value, self.reason = value, reason

    def got(self) -> str:
        """The refusal worded "FIELD REASON, got VALUE" (h3_dit's REQUEST fields)."""
        return f"{self.field} {self.reason}, got {self.value!r}"


def shown(value) -> str:
    """A value in a refusal: repr of a str or bytes (quoted), else str (numpy numbers as numbers)."""
    return repr(value) if isinstance(value, (str, bytes)) else str(value)


def check_integer(field: str, value, text: bool = False) -> int:
    """`value` as an int: an int or numpy integer (numbers.Integral; a bool never), or with `text`
    (a form's or a flag's field) a str of INTEGER_TEXT. Raises InvalidValue MUST_BE_INTEGER."""
    if text and isinstance(value, str) and INTEGER_TEXT.match(value):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidValue(field, value, MUST_BE_INTEGER)
    return int(value)


def check_int64(field: str, value: int) -> int:
    """`value` when INT64_MIN <= value <= INT64_MAX (what an INT64 input or request parameter
    holds), else InvalidValue DOES_NOT_FIT_INT64."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidValue(field, value, DOES_NOT_FIT_INT64)
    return value


def check_at_least(field: str, value, low):
    """`value` when value >= low, else InvalidValue "is out of range: allowed >= LOW"."""
    if not value >= low:
        raise InvalidValue(field, value, f"is out of range: allowed >= {low}")
    return value


def check_in_range(field: str, value, low, high, note: str = ""):
    """`value` when low <= value <= high, else InvalidValue "is out of range: allowed LOW..HIGH"
    with `note` after it (" (priority_max)")."""
    if not low <= value <= high:
        raise InvalidValue(field, value, f"is out of range: allowed {low}..{high}{note}")
    return value


def _number_of(value, text: bool) -> float | None:
    """An int or float (not bool), or with `text` a str of NUMBER_TEXT, as a float; else None."""
    if text and isinstance(value, str):
        return float(value) if NUMBER_TEXT.match(value) else None
    return None if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(value)


def check_number(field: str, value, text: bool = False, low: float | None = None, strict: bool = False) -> float:
    """`value` as a float: an int or float (numpy's too, never a bool), or with `text` a str of
    NUMBER_TEXT. With `low` also finite and >= low (> low when `strict`). Raises InvalidValue
    MUST_BE_NUMBER, or with `low` "must be a finite number >= LOW" (> LOW)."""
    number = _number_of(value, text)
    if low is None:
        if number is None:
            raise InvalidValue(field, value, MUST_BE_NUMBER)
        return number
    if number is None or not math.isfinite(number) or number < low or (strict and number == low):
        raise InvalidValue(field, value, f"must be a finite number {'>' if strict else '>='} {low:g}")
    return number


def check_seconds(field: str, value, text: bool = False) -> float:
    """A duration or a time limit in seconds: `value` as a float, finite and > 0 (check_number's
    kinds). Raises InvalidValue MUST_BE_SECONDS."""
    number = _number_of(value, text)
    if number is None or not (math.isfinite(number) and number > 0):
        raise InvalidValue(field, value, MUST_BE_SECONDS)
    return number


def check_flow_shift(field: str, value: float) -> float:
    """A sigma schedule's shift (flow_shift, audio_flow_shift): `value` in
    MIN_FLOW_SHIFT..MAX_FLOW_SHIFT (NaN refused), else InvalidValue "is out of range: allowed
    0.01..100.0"."""
    return check_in_range(field, value, MIN_FLOW_SHIFT, MAX_FLOW_SHIFT)


def check_choice(field: str, value, allowed) -> str:
    """`value` when it is one of `allowed` (TASKS, FITS), else InvalidValue "is not allowed:
    allowed [...]"."""
    if value not in allowed:
        raise InvalidValue(field, value, f"is not allowed: allowed {list(allowed)}")
    return value


def check_prompt_sent(value) -> str:
    """A request's prompt as sent, before the prompt rule (check_prompt, the server's): a str.
    Raises InvalidRequest (field "prompt") "prompt is required and must be a string"."""
    if not isinstance(value, str):
        raise InvalidRequest("prompt", f"prompt {PROMPT_REQUIRED}")
    return value


BYTE_ORDER_MARK = "\ufeff"  # dropped once from the start of a prompt (a decoder may leave it there)
# Unicode general categories of characters that show nothing: separators (Zs space, Zl line,
# Zp paragraph), controls (Cc: tab, newline, ...) and format characters (Cf: U+200B zero-width
# space, U+200D zero-width joiner, U+FEFF, bidi marks, ...).
INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Me"})  # + marks that only combine
# default-ignorable or blank characters of other categories (Unicode DerivedCoreProperties, and the
# blank braille pattern): Hangul fillers, variation selectors, U+2800
INVISIBLE_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800") | frozenset(map(chr, range(0xFE00, 0xFE10)))
SHOWN_PROMPT_CHARS = 32  # an error message quotes at most this many characters of a prompt


def _shown(prompt: str) -> str:
    if len(prompt) <= SHOWN_PROMPT_CHARS:
        return repr(prompt)
    return f"{prompt[:SHOWN_PROMPT_CHARS]!r}... ({len(prompt)} characters)"


def check_prompt(prompt: str) -> str:
    """The one prompt rule, applied by validate_request and by the text encoder.

    Returns the prompt the text encoder reads: `prompt` without one leading byte-order mark
    (U+FEFF); nothing else is changed. Raises InvalidRequest (field "prompt") "prompt must be a
    non-empty string, got ..." if `prompt` is not a str or is empty, and "prompt must contain
    visible characters, got ..." (the prompt's repr, cut after SHOWN_PROMPT_CHARS characters) if
    every character is in INVISIBLE_CATEGORIES or INVISIBLE_CHARACTERS, e.g. only spaces,
    newlines, zero-width spaces, byte-order marks, lone combining marks or Hangul fillers.
    """
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("prompt", f"prompt must be a non-empty string, got {prompt!r}")
    if all(unicodedata.category(char) in INVISIBLE_CATEGORIES or char in INVISIBLE_CHARACTERS for char in prompt):
        raise InvalidRequest("prompt", f"prompt must contain visible characters, got {_shown(prompt)}")
    return prompt.removeprefix(BYTE_ORDER_MARK)


def check_prompt_bytes(size: int, max_bytes: int) -> None:
    """The prompt's size rule: raise InvalidRequest (field "prompt") "prompt is SIZE bytes: allowed
    1..MAX_BYTES" when its UTF-8 encoding (`size` bytes, a leading byte-order mark counted) passes
    `max_bytes`. validate_request applies it to a prompt, h3_encoder to the PROMPT input's bytes
    before decoding them."""
    if size > max_bytes:
        raise InvalidRequest("prompt", f"prompt is {size} bytes: allowed 1..{max_bytes}")


def check_task(task: str, kinds: list[str]) -> str:
    """The request's task, checked against the kinds of its conditions (h3_core.diffusion.conditions:
    "keyframe", "guide", "image", "audio", "video", "video_audio"); returns it. Raises
    InvalidRequest (field "task") for a task not in TASKS, t2va with conditions, fl2va without
    keyframes or with anything else, ref2va without guides or references or with keyframes."""
    check_choice("task", task, TASKS)
    keyframes = kinds.count("keyframe")
    others = len(kinds) - keyframes
    if task == "t2va" and kinds:
        raise InvalidRequest("task", f"task='t2va' takes no conditions; got {len(kinds)}")
    if task == "fl2va" and (not keyframes or others):
        raise InvalidRequest(
            "task",
            f"task='fl2va' needs keyframes (1 or {MAX_KEYFRAMES} images) and nothing else; "
            f"got {keyframes} keyframes and {others} guides or references",
        )
    if task == "ref2va" and (not others or keyframes):
        raise InvalidRequest(
            "task",
            f"task='ref2va' needs references or guides and no keyframes; "
            f"got {others} references or guides and {keyframes} keyframes",
        )
    return task


def check_lora_name(name) -> str:
    """Return `name` when it is a LoRA adapter name (LORA_NAME); raise InvalidRequest (field
    "lora") "lora name ... is not allowed: allowed LORA_NAME_RULE" otherwise."""
    if not isinstance(name, str) or not LORA_NAME.fullmatch(name):
        raise InvalidRequest("lora", f"lora name {name!r} is not allowed: allowed {LORA_NAME_RULE}")
    return name


def check_lora(lora: tuple[tuple[str, float], ...]) -> None:
    """Raise InvalidRequest (field "lora") unless every entry is a (name, scale) pair, the name
    a LORA_NAME named once, the scale a finite number in -LORA_SCALE_MAX..LORA_SCALE_MAX. Whether
    the adapters are loaded is the engine's check (Engine.check_loras_loaded)."""
    names = set()
    for entry in lora:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise InvalidRequest("lora", f"lora entry {entry!r} is not a (name, scale) pair")
        name, scale = entry
        check_lora_name(name)
        if name in names:
            raise InvalidRequest("lora", f"lora names {name!r} twice: each adapter at most once a request")
        names.add(name)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            raise InvalidRequest("lora", f"lora {name!r} scale={scale!r} is not a finite number")
        if abs(scale) > LORA_SCALE_MAX:
            raise InvalidRequest(
                "lora", f"lora {name!r} scale={scale} is out of range: allowed -{LORA_SCALE_MAX}..{LORA_SCALE_MAX}"
            )


def _lora_entry(entry) -> tuple[str, float]:
    """One entry of lora_list's input -> (name, scale), scale a float when it is a number."""
    if isinstance(entry, str):  # NAME[:SCALE]
        name, colon, scale = entry.partition(":")
        if not colon:
            return name, 1.0
        try:
            return name, float(scale)
        except ValueError:
            raise InvalidRequest("lora", f"lora {entry!r}: scale {scale!r} is not a number (NAME[:SCALE])") from None
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"name", "scale"})
        if unknown or "name" not in entry:
            raise InvalidRequest(
                "lora", f"lora entry {entry!r} is not an object of 'name' and optional 'scale' (unknown: {unknown})"
            )
        entry = (entry["name"], entry.get("scale", 1.0))
    if isinstance(entry, list | tuple) and len(entry) == 2:
        name, scale = entry
        if isinstance(scale, int) and not isinstance(scale, bool):
            scale = float(scale)
        return name, scale
    raise InvalidRequest(
        "lora", f"lora entry {entry!r} is not {{'name': ..., 'scale': ...}}, [name, scale] or NAME[:SCALE]"
    )


def lora_list(value) -> tuple[tuple[str, float], ...]:
    """The one reading of a request's `lora`, for every entry point: `value` is a JSON array
    text or a sequence whose entries are {"name": NAME, "scale": SCALE} objects (scale optional,
    1.0; no other key, so no path), [NAME, SCALE] pairs, "NAME[:SCALE]" strings or JSON texts of
    an array or one object (a form's repeated field); None or "" is no adapter. Returns
    ((name, scale float), ...) in order, checked by check_lora. Raises InvalidRequest (field
    "lora") naming the entry for anything else."""
    if value is None or value == "":
        return ()
    if isinstance(value, bytes | str):
        try:
            value = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            raise InvalidRequest("lora", f"lora {str(value)[:80]!r} is not a JSON array of adapters") from None
    if not isinstance(value, list | tuple):
        raise InvalidRequest("lora", f"lora must be a list of adapters, got {value!r}")
    entries = []
    for entry in value:  # a form's repeated field: JSON texts and NAME[:SCALE] strings mixed
        if isinstance(entry, str) and entry.lstrip().startswith(("[", "{")):
            try:
                entry = json.loads(entry)
            except ValueError:
                raise InvalidRequest("lora", f"lora {entry[:80]!r} is not valid JSON") from None
        entries += entry if isinstance(entry, list) else [entry]
    lora = tuple(_lora_entry(entry) for entry in entries)
    check_lora(lora)
    return lora


def lora_entries(lora: tuple[tuple[str, float], ...]) -> list[dict]:
    """The wire's form of a request's adapters (REQUEST "lora", the LORA input, INFO's echo):
    [{"name": NAME, "scale": SCALE}, ...] in order."""
    return [{"name": name, "scale": scale} for name, scale in lora]
