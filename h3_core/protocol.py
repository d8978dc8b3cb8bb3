"""The wire contract of h3-triton: model and tensor names, request fields and parameters, error
codes, the INFO kinds and the prompt rule (check_prompt). Plain Python (no torch, no numpy, no
Triton): the client, the Triton models and the tests import it, and the client installs without torch.

Request flow (the ensemble `h3_pipeline`): PROMPT + the optional INT64 inputs -> h3_encoder ->
TEXT_EMBEDS + REQUEST (JSON) -> h3_dit (iterative, decoupled: progress, previews, then one result
per output) -> VIDEO_LATENT + AUDIO_LATENT + INFO -> h3_vae -> VIDEO_MP4, FRAMES, AUDIO, INFO.
"""

import json
import math
import re

# The media constants and the request rules are the core's (defined once there, torch-free);
# the wire re-exports what its clients need.
from h3_core.config import (  # noqa: F401
    AUDIO_CHANNELS,
    AUDIO_SAMPLE_RATE,
    CANVAS_MULTIPLE,
    DEFAULT_FIT,
    FIRST_FRAME,
    FITS,
    LAST_FRAME,
    MAX_KEYFRAMES,
    align_num_frames,
    frames_for_seconds,
)
from h3_core.config import FPS as VIDEO_FPS  # noqa: F401  (VIDEO_MP4 and FRAMES run at it)
from h3_core.rules import (  # noqa: F401
    INT64_MAX,
    INT64_MIN,
    LORA_NAME_RULE,
    LORA_SCALE_MAX,
    MAX_FLOW_SHIFT,
    MIN_FLOW_SHIFT,
    TASKS,
    InvalidRequest,
    InvalidValue,
    check_at_least,
    check_choice,
    check_flow_shift,
    check_int64,
    check_lora_name,
    check_prompt,
    check_prompt_bytes,
    lora_entries,
    lora_list,
)
from h3_core.rules import check_task as check_task_rule

PIPELINE_MODEL = "h3_pipeline"  # the entry point clients call
ENCODER_MODEL = "h3_encoder"
DIT_MODEL = "h3_dit"  # it answers a cancel-by-id control request too, between its executes
VAE_MODEL = "h3_vae"
CANCEL_MODEL = "h3_cancel"  # clients send cancels by id here: never busy with a generation

PROMPT = "PROMPT"  # BYTES [1, 1], required
# The optional INT64 [1, 1] inputs of h3_pipeline and the REQUEST field each becomes.
INT_INPUTS = {
    "HEIGHT": "height",
    "WIDTH": "width",
    "NUM_FRAMES": "num_frames",
    "NUM_INFERENCE_STEPS": "num_inference_steps",
    "SEED": "seed",
    "NUM_OUTPUTS": "num_outputs",
}
# The optional FP32 [1, N] inputs of h3_pipeline and the REQUEST field each becomes (a list of numbers):
# a request's own sigma list for the video / audio clock (docs/model.md §3.1), N = NUM_INFERENCE_STEPS + 1
# noise levels strictly decreasing from exactly 1 to exactly 0, used instead of the shifted uniform
# schedule. Without NUM_INFERENCE_STEPS the request takes N - 1 steps.
SIGMA_INPUTS = {"VIDEO_SIGMAS": "video_sigmas", "AUDIO_SIGMAS": "audio_sigmas"}
# LORA BYTES [1, 1] (optional): the request's LoRA adapters, a JSON array of {"name": NAME, "scale":
# SCALE} (scale optional, 1.0), composed in order (docs/lora.md); read by rules.lora_list, each name an
# adapter loaded on the server (h3_dit refuses another). REQUEST field "lora" holds the same array.
LORA = "LORA"
# Outputs of h3_pipeline: VIDEO_MP4 BYTES [1, 0 or 1]; FRAMES uint8 [1, T, H, W, 3] and AUDIO float32
# [1, 2, samples] (empty unless asked for); PROGRESS int32 [1, 3] = (step, total steps, queue position);
# PREVIEW uint8 [1, Hl, Wl, 3] (empty unless a preview is due); INFO BYTES [1, 1] JSON (INFO_KINDS).
# Conditioned tasks (docs/model.md §2.1). TASK BYTES [1, 1] is optional: one of TASKS; without it the task
# follows the inputs (KEYFRAMES -> fl2va, nothing -> t2va).
TASK = "TASK"  # one of TASKS
# fl2va: KEYFRAMES BYTES [1, K], K = 1 or 2 encoded images (PNG, JPEG or WebP files, h3_core.inputs.images);
# KEYFRAME_INDICES INT64 [1, K] the frame each conditions, FIRST_FRAME or LAST_FRAME, distinct; without
# it one keyframe is the first frame and two are the first and the last.
KEYFRAMES = "KEYFRAMES"
KEYFRAME_INDICES = "KEYFRAME_INDICES"
# ref2va (docs/model.md §2.1-2.3): references and timeline guides, each list optional, at least one item
# in all. REFERENCE_IMAGES BYTES [1, N] image files (PNG, JPEG, WebP: a character, an object);
# REFERENCE_VIDEOS BYTES [1, N] MP4 files (with their audio track when they have one);
# REFERENCE_AUDIO BYTES [1, N] WAV, FLAC or MP3 files (a voice, a sound). The reference blocks follow
# REFERENCES' order when it is sent, else images, then videos, then audio, each input in its own
# order (docs/model.md §2.1: reference blocks in request order; where each sits in RoPE time and how the
# prompt numbers it follow that order). GUIDES BYTES [1, N]
# image files with GUIDE_FRAMES INT64 [1, N]: the frame (0 .. NUM_FRAMES - 1) each should appear at.
# KEYFRAMES and references in one request are refused (fl2va's keyframes are ref2va's guides at
# the first and last frame: send GUIDES for both).
REFERENCE_IMAGES = "REFERENCE_IMAGES"
REFERENCE_VIDEOS = "REFERENCE_VIDEOS"
REFERENCE_AUDIO = "REFERENCE_AUDIO"
GUIDES = "GUIDES"
GUIDE_FRAMES = "GUIDE_FRAMES"
REFERENCE_INPUTS = (REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIO, GUIDES)
# REFERENCES BYTES [1, 1] (optional): the reference files in the order their blocks take, a JSON
# array of REFERENCE_ENTRY_FIELDS objects, each file of REFERENCE_IMAGES / _VIDEOS / _AUDIO once:
# {"input": "REFERENCE_AUDIO", "index": 0}, {"input": "REFERENCE_IMAGES", "index": 0},
# {"input": "REFERENCE_VIDEOS", "index": 0, "start_time_seconds": 2.5, "audio": false}. A video's
# "start_time_seconds" (>= 0, default 0) is where its use starts in the file (H3's request format);
# "audio" false uses the video without its audio (a block of kind "video" even when the file has a
# sound track), true (the default) with it ("video_audio" when it has one).
REFERENCES = "REFERENCES"
REFERENCE_ENTRY_FIELDS = ("input", "index", "start_time_seconds", "audio")
ORDERED_INPUTS = (REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIO)  # the inputs REFERENCES orders
# default limits (h3_encoder parameters): counts per kind and in all
MAX_REFERENCE_IMAGES, MAX_REFERENCE_VIDEOS, MAX_REFERENCE_AUDIO, MAX_REFERENCES = 9, 3, 3, 12
# The kinds of condition block a request's rows may hold (h3_core.diffusion.layout): fl2va's keyframe,
# ref2va's guide (both one latent frame at the target's grid), image (one latent frame at its own
# grid), audio (reference audio rows), video and video_audio (audio rows, then video rows).
CONDITION_KINDS = ("keyframe", "guide", "image", "audio", "video", "video_audio")
# fit: how a keyframe is fitted to the canvas, one of FITS (request parameter "fit", default DEFAULT_FIT)
OUTPUTS = ("VIDEO_MP4", "FRAMES", "AUDIO", "PROGRESS", "PREVIEW", "INFO")
VIDEO_MP4, FRAMES, AUDIO, PROGRESS, PREVIEW, INFO = OUTPUTS
# AUDIO holds AUDIO_CHANNELS channels (left, right) of AUDIO_SAMPLE_RATE samples per second, in [-1, 1].
# VIDEO_MP4 and FRAMES run at VIDEO_FPS frames per second; HEIGHT and WIDTH must be multiples of
# CANVAS_MULTIPLE (docs/model.md §4.2); all h3_core.config's.

# Between the models.
TEXT_EMBEDS = "TEXT_EMBEDS"  # float32 [1, L, text_dim]; [1, 0, 0] in a control request
REQUEST = "REQUEST"  # BYTES [1, 1] JSON: REQUEST_FIELDS present, or {CANCEL_FIELD: id} alone
# float32 [1, N]: every condition block's clean normalised latents, flattened and concatenated in
# REQUEST's "conditions" order (for each block its video latent, then its audio latent); [1, 0]
# without conditions (every h3_dit request carries it)
CONDITION_LATENTS = "CONDITION_LATENTS"
VIDEO_LATENT = "VIDEO_LATENT"  # float32 [1, 24, T_lat, Hl, Wl] final video latent; [1, 0, 0, 0, 0] when none
AUDIO_LATENT = "AUDIO_LATENT"  # float32 [1, 2, 32, T_a] final stereo audio latent; [1, 0, 0, 0] when none
# exactly what h3_encoder writes: the INT_INPUTS, SIGMA_INPUTS and LORA ("lora") present, the seconds it
# spent and the unix time it received the request (deadline_s counts from there); for a conditioned
# request also "task" (one of TASKS), "conditions" (CONDITION_FIELDS per block, in CONDITION_LATENTS'
# order), "vision_spans" ([start, end) token ranges of TEXT_EMBEDS that are vision tokens, token tag 0)
# and "geometry" (how the canvas was chosen and the images fitted; echoed in the result's INFO);
# "outside_training" (a list of strings: the prompt's words not in the weights' training.json,
# h3_core.model.training_metadata; h3_dit adds the sizes outside it and echoes them in the result's
# INFO "outside_training")
REQUEST_FIELDS = (
    tuple(INT_INPUTS.values())
    + tuple(SIGMA_INPUTS.values())
    + (
        "lora",
        "encode_seconds",
        "received_unix_s",
        "task",
        "conditions",
        "vision_spans",
        "geometry",
        "outside_training",
    )
)
CANCEL_FIELD = "cancel_request_id"
# one entry of REQUEST's "conditions": "kind" (CONDITION_KINDS), "frame" (keyframes and guides:
# the frame index), "video" (visual kinds: the latent's shape [24, T, h, w]), "audio" (audio kinds:
# [2, 32, T]); references also "input" (the file: "REFERENCE_AUDIO[0]") and videos
# "start_time_seconds" (REFERENCES), both echoed in the result's INFO "conditions"
CONDITION_FIELDS = ("kind", "frame", "video", "audio", "input", "start_time_seconds")
CONDITION_ECHO = ("kind", "frame", "input", "start_time_seconds")  # what INFO "conditions" says of a block

# Error codes: every error message starts with one of these and ": ". Streaming clients receive
# only the message text; through the ensemble Triton 2.51 prefixes "in ensemble 'h3_pipeline', ".
ERROR_CODES = ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL")
CODE_PATTERN = re.compile(rf"^({'|'.join(ERROR_CODES)}): ")

# INFO["kind"]: "progress" (PROGRESS, maybe PREVIEW), "result" (one output), "error" (a started request
# that ended early: INFO holds "code" and "message"; its final response), "cancel" (the answer to a
# control request: INFO holds "request_id" and "state", one of CANCEL_STATES).
# "keepalive" (KEEPALIVE): a response with empty outputs, PROGRESS (0, 0, 0) and INFO {"kind": "keepalive",
# "request_id"}, sent by h3_vae when nothing else went to the client for heartbeat_s seconds (while
# the DiT works on a request that asked for no progress, while its clip waits for or runs its decode),
# so that a proxy's idle timeout does not cut the stream; clients skip it; request parameter
# keepalive=false turns it off for that request (perf_analyzer counts every response).
# "heartbeat" is internal (h3_dit -> h3_vae, which sends a keep-alive for it; a direct h3_dit caller
# ignores it).
KEEPALIVE = "keepalive"
INFO_KINDS = ("progress", "result", "error", "cancel", KEEPALIVE, "heartbeat")
# The answer to a cancel by id: the request was running or waiting and now ends with CANCELLED
# ("cancelled"); it already left the DiT (finished, decoding or delivered; nothing was done:
# "finished"); or no request with that id is known ("unknown": the id is remembered for
# EARLY_CANCEL_SECONDS, so a request with it that arrives in that time ends with CANCELLED).
CANCEL_STATES = ("cancelled", "finished", "unknown")
EARLY_CANCEL_SECONDS = 600.0
MAX_REQUEST_ID_CHARS = 256  # request ids (the client's, or a cancel's target) are at most this long
# A request id holds no NUL: Triton's C API cuts an id at its first NUL, so the request would run
# under a shorter id than its client's, and a cancel by the client's id would answer "unknown".

# Request parameters a client may set, with their JSON types. Triton's reserved `priority`,
# `timeout` and `sequence_*` are ignored (never used by h3-triton).
REQUEST_PARAMETERS = {
    "progress_every": (int,),
    "preview_every": (int,),
    "deadline_s": (int, float),
    "request_priority": (int,),
    "return_mp4": (bool,),
    "return_frames": (bool,),
    "return_audio": (bool,),
    KEEPALIVE: (bool,),
    "inject_fault": (str,),
    "fit": (str,),
    "flow_shift": (int, float),
    "audio_flow_shift": (int, float),
    "cache_threshold": (int, float),  # its range: h3_dit's max_cache_threshold (validate_request)
    "ref_kv_refresh": (int,),  # its range: h3_dit's max_ref_kv_refresh (validate_request)
}
RESERVED_PARAMETERS = ("priority", "timeout")
# inject_fault (tests only; h3_core.serving.dit.admission.check_fault lists every value) acting in
# h3_encoder where its allow_fault_injection is true: its encode raises a RuntimeError (as a VAE out
# of memory would), or its registry announcement does
ENCODER_FAULTS = ("encode_raise", "announce_raise")
# ... acting in h3_vae where its allow_fault_injection is true: the decode fails as it starts; and
# "decode_slow:S", each of the request's decodes takes S seconds more (fault_seconds)
VAE_FAULTS = ("decode_start_raise",)
# flow_shift / audio_flow_shift lie in MIN_FLOW_SHIFT..MAX_FLOW_SHIFT (h3_core.rules.check_flow_shift);
# INT64 inputs and request parameters in INT64_MIN..INT64_MAX (h3_core.rules.check_int64)
JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def implied_task(keyframes: bool, references: bool) -> str:
    """The task a request without TASK asks for: fl2va with keyframes, ref2va with references or
    guides, else t2va."""
    return "fl2va" if keyframes else "ref2va" if references else "t2va"


def check_task(task: str, kinds: list[str]) -> str:
    """The request's task, checked against the kinds of its conditions (CONDITION_KINDS) by the
    core's rule (h3_core.rules.check_task); returns it. Its refusals in the wire's words: raises
    ValueError naming TASK for a task not in TASKS, t2va with conditions, fl2va without
    KEYFRAMES or with anything else, ref2va without guides or references or with KEYFRAMES."""
    try:
        check_choice(TASK, task, TASKS)
    except InvalidValue as error:  # the wire's words, a plain ValueError (the core's is InvalidRequest)
        raise ValueError(str(error)) from error
    try:
        return check_task_rule(task, kinds)
    except InvalidRequest:
        keyframes = kinds.count("keyframe")
        others = len(kinds) - keyframes
    if task == "t2va":
        raise ValueError(
            f"{TASK}='t2va' takes no conditions; got {len(kinds)} (send TASK 'fl2va' / 'ref2va' or no TASK)"
        )
    if task == "fl2va":
        raise ValueError(
            f"{TASK}='fl2va' needs {KEYFRAMES} (1 or {MAX_KEYFRAMES} images) and nothing else; "
            f"got {keyframes} keyframes and {others} guides or references"
        )
    raise ValueError(
        f"{TASK}='ref2va' needs references or guides ({', '.join(REFERENCE_INPUTS)}) and no {KEYFRAMES}; "
        f"got {others} references or guides and {keyframes} keyframes"
    )


def keyframe_indices(count: int, indices: list[int] | None) -> list[int]:
    """The frame index of each of `count` keyframes: `indices` (KEYFRAME_INDICES) when given, else
    [FIRST_FRAME] for one keyframe and [FIRST_FRAME, LAST_FRAME] for two. Raises ValueError naming
    the input for more than MAX_KEYFRAMES keyframes, a count mismatch, an index other than
    FIRST_FRAME / LAST_FRAME, or a repeated index; KEYFRAME_INDICES without KEYFRAMES too."""
    if count > MAX_KEYFRAMES:
        raise ValueError(f"{KEYFRAMES} holds {count} images: allowed 1..{MAX_KEYFRAMES} (the first and the last frame)")
    if indices is None:
        return [FIRST_FRAME, LAST_FRAME][:count]
    if count == 0:
        raise ValueError(f"{KEYFRAME_INDICES} was sent without {KEYFRAMES}")
    if len(indices) != count:
        raise ValueError(f"{KEYFRAME_INDICES} holds {len(indices)} values for {count} {KEYFRAMES}: one per keyframe")
    for index in indices:
        if index not in (FIRST_FRAME, LAST_FRAME):
            raise ValueError(
                f"{KEYFRAME_INDICES} value {index} is not allowed: "
                f"{FIRST_FRAME} (first frame) or {LAST_FRAME} (last frame)"
            )
    if len(set(indices)) != len(indices):
        raise ValueError(f"{KEYFRAME_INDICES} {indices} repeats a frame: each keyframe conditions a different frame")
    return list(indices)


def reference_list(raw, counts: dict[str, int]) -> list[dict]:
    """The reference files in block order: REFERENCES' JSON text (`raw`, str or UTF-8 bytes) or,
    when None, images, then videos, then audio, each input in its own order; `counts` maps each of
    ORDERED_INPUTS to its number of files. Returns one dict per file with every
    REFERENCE_ENTRY_FIELDS key ("start_time_seconds" 0.0 and "audio" True where not given; both
    only meaningful for REFERENCE_VIDEOS). Raises ValueError naming REFERENCES and the entry:
    not a JSON array of objects, an unknown key, an input other than ORDERED_INPUTS, an index
    that is not an integer in 0..count - 1, start_time_seconds that is not a finite number >= 0
    or "audio" that is not a boolean (and either on a file that is not a video), a file listed
    twice or left out."""
    if raw is None:
        return [
            {"input": name, "index": index, "start_time_seconds": 0.0, "audio": True}
            for name in ORDERED_INPUTS
            for index in range(counts.get(name, 0))
        ]
    try:
        entries = json.loads(raw)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{REFERENCES} is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(f"{REFERENCES} is not valid JSON: nested too deeply") from None
    if type(entries) is not list or not all(type(entry) is dict for entry in entries):
        raise ValueError(f"{REFERENCES} must be a JSON array of objects, got {json.dumps(entries)[:80]}")
    listed, seen = [], set()
    for position, entry in enumerate(entries):
        where = f"{REFERENCES}[{position}]"
        unknown = sorted(set(entry) - set(REFERENCE_ENTRY_FIELDS))
        if unknown:
            raise ValueError(f"{where} has unknown key {unknown[0]!r}; allowed: {list(REFERENCE_ENTRY_FIELDS)}")
        name, index = entry.get("input"), entry.get("index")
        if name not in ORDERED_INPUTS:
            raise ValueError(f"{where} input {name!r} is not allowed: allowed {list(ORDERED_INPUTS)}")
        count = counts.get(name, 0)
        if type(index) is not int or not 0 <= index < count:
            raise ValueError(f"{where} index {index!r} is out of range: {name} holds {count} files")
        start, audio = entry.get("start_time_seconds", 0.0), entry.get("audio", True)
        if name != REFERENCE_VIDEOS and ("start_time_seconds" in entry or "audio" in entry):
            raise ValueError(f"{where}: start_time_seconds and audio are for {REFERENCE_VIDEOS} only")
        if type(start) not in (int, float) or not 0 <= start < math.inf:
            raise ValueError(f"{where} start_time_seconds={start!r} is out of range: allowed finite >= 0 seconds")
        if type(audio) is not bool:
            raise ValueError(f"{where} audio must be true or false, got {json.dumps(audio)}")
        if (name, index) in seen:
            raise ValueError(f"{REFERENCES} lists {name}[{index}] twice: list every reference file once")
        seen.add((name, index))
        listed.append({"input": name, "index": index, "start_time_seconds": float(start), "audio": audio})
    for name in ORDERED_INPUTS:
        for index in range(counts.get(name, 0)):
            if (name, index) not in seen:
                raise ValueError(f"{REFERENCES} leaves out {name}[{index}]: list every reference file once")
    return listed


def check_request_parameters(raw: str) -> dict:
    """The request parameters (Triton's JSON text of them) as a dict, Triton's own keys
    (sequence_*, priority, timeout) left out. Raises ValueError naming the parameter for an
    unknown name, a value of the wrong type or out of range (progress_every and preview_every
    >= 0, deadline_s finite > 0 seconds, flow_shift and audio_flow_shift in [MIN_FLOW_SHIFT, MAX_FLOW_SHIFT],
    fit one of FITS; h3_core.rules' field rules, so the refusal is an InvalidValue)."""
    parameters = {}
    for name, value in json.loads(raw or "{}").items():
        if name.startswith("sequence_") or name in RESERVED_PARAMETERS:
            continue
        if name not in REQUEST_PARAMETERS:
            raise ValueError(f"request parameter {name!r} is unknown; allowed: {sorted(REQUEST_PARAMETERS)}")
        if type(value) not in REQUEST_PARAMETERS[name]:
            kinds = " or ".join(kind.__name__ for kind in REQUEST_PARAMETERS[name])
            raise ValueError(f"request parameter {name!r} must be {kinds}, got {value!r}")
        parameters[name] = value
    for name in ("progress_every", "preview_every"):
        check_at_least(name, parameters.get(name, 0), 0)
    deadline_s = parameters.get("deadline_s")
    if deadline_s is not None and not 0 < deadline_s < math.inf:
        raise ValueError(f"deadline_s={deadline_s} is out of range: allowed finite > 0 seconds")
    for name in ("flow_shift", "audio_flow_shift"):
        if name in parameters:
            check_flow_shift(name, parameters[name])
    check_choice("fit", parameters.get("fit", DEFAULT_FIT), FITS)
    return parameters


def check_request_id(name: str, request_id: str) -> None:
    """Raise ValueError naming `name` for a request id longer than MAX_REQUEST_ID_CHARS or holding
    a NUL character (Triton would cut it there)."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise ValueError(f"{name} has {len(request_id)} characters: allowed 1..{MAX_REQUEST_ID_CHARS}")
    if "\0" in request_id:
        raise ValueError(
            f"{name} holds a NUL character at index {request_id.index(chr(0))}: not allowed in a request id"
        )


def fault_seconds(fault: str, prefix: str) -> float | None:
    """S of an inject_fault "PREFIX:S" with 0 < S <= 600, else None."""
    try:
        seconds = float(fault.removeprefix(prefix)) if fault.startswith(prefix) else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds <= 600 else None


def read_request_json(elements: list) -> dict:
    """REQUEST's elements -> one JSON object with the allowed keys: a generation request holds
    only REQUEST_FIELDS, a cancel request CANCEL_FIELD alone, a non-empty string. Raises
    ValueError naming the input or the key."""
    if len(elements) != 1:
        raise ValueError(f"REQUEST must hold one JSON object, got {len(elements)} elements")
    try:
        fields = json.loads(elements[0])
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"REQUEST is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError("REQUEST is not valid JSON: nested too deeply") from None
    if not isinstance(fields, dict):
        raise ValueError(f"REQUEST must hold one JSON object, got {type(fields).__name__}")
    if CANCEL_FIELD in fields:
        extra = sorted(key for key in fields if key != CANCEL_FIELD)
        if extra:
            raise ValueError(
                f"REQUEST field {extra[0]!r} is not allowed beside {CANCEL_FIELD!r}: a cancel request "
                "holds that field alone"
            )
        target = fields[CANCEL_FIELD]
        if type(target) is str:
            check_request_id(CANCEL_FIELD, target)
        if type(target) is not str or not target:
            got = (
                "null"
                if target is None
                else "an empty string"
                if target == ""
                else f"{JSON_TYPES.get(type(target), type(target).__name__)} {json.dumps(target)}"
            )
            raise ValueError(f"{CANCEL_FIELD} must be a non-empty string, got {got}")
        return fields
    unknown = sorted(key for key in fields if key not in REQUEST_FIELDS)
    if unknown:
        raise ValueError(
            f"REQUEST field {unknown[0]!r} is unknown; allowed: {sorted(REQUEST_FIELDS)}, or "
            f"{CANCEL_FIELD!r} alone (a cancel request)"
        )
    return fields


def read_cancel_request(elements: list) -> str:
    """REQUEST's elements of a cancel-by-id control request ({CANCEL_FIELD: ID} alone) -> ID.
    Raises ValueError naming the input or the field (read_request_json), also for a generation
    request's fields."""
    fields = read_request_json(elements)
    if CANCEL_FIELD not in fields:
        raise ValueError(
            f"REQUEST must hold {CANCEL_FIELD!r} alone (a cancel request); generation goes to {PIPELINE_MODEL}"
        )
    return fields[CANCEL_FIELD]


def cancel_info(request_id: str, state: str) -> dict:
    """INFO of the answer to a cancel by id of `request_id` (kind "cancel"; `state` one of
    CANCEL_STATES), from h3_cancel or from h3_dit."""
    return {"kind": "cancel", "request_id": request_id, "state": state}


# LoRA control requests (h3_cancel; docs/lora.md §"Serving"): REQUEST holds one of these keys alone,
# {"lora_load": {"name": NAME, "path": PATH}}, {"lora_unload": {"name": NAME}} or {"lora_list": {}}; PATH a
# safetensors file on the server's disk (absolute, or relative to the folder above the model repository).
LORA_CONTROLS = {"lora_load": ("name", "path"), "lora_unload": ("name",), "lora_list": ()}
MAX_LORA_PATH_CHARS = 4096


def read_lora_control(elements: list) -> tuple[str, str | None, str | None] | None:
    """REQUEST's elements of a LoRA control request -> (action, name, path) with action a key of
    LORA_CONTROLS and None where it takes no name / path; None for another request (a cancel).
    Raises ValueError naming the key for a malformed one (another key beside it, a missing or
    unknown field, a name outside rules.LORA_NAME, an empty or over-long path)."""
    if len(elements) != 1:
        return None
    try:
        fields = json.loads(elements[0])
    except (ValueError, RecursionError):
        return None  # read_cancel_request words it
    if not isinstance(fields, dict) or not set(fields) & set(LORA_CONTROLS):
        return None
    if len(fields) != 1:
        raise ValueError(f"REQUEST must hold one LoRA control alone, got keys {sorted(fields)}")
    ((action, body),) = fields.items()
    wanted = LORA_CONTROLS[action]
    if not isinstance(body, dict) or sorted(body) != sorted(wanted):
        raise ValueError(f"{action} must be an object of {list(wanted)}, got {json.dumps(body)[:200]}")
    name = None if "name" not in body else check_lora_name(body["name"])
    path = body.get("path")
    if path is not None and (type(path) is not str or not 1 <= len(path) <= MAX_LORA_PATH_CHARS or "\0" in path):
        raise ValueError(f"{action} path must be a file's path of 1..{MAX_LORA_PATH_CHARS} characters")
    return action, name, path
