"""A generation request, its limits and its validation (checked before anything runs)."""

import secrets
from dataclasses import dataclass

from ..config import CANVAS_MULTIPLE, FPS, align_num_frames, max_requested_frames
from ..rules import INT64_MAX, InvalidRequest, check_in_range, check_lora, check_prompt, check_prompt_bytes
from .sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, check_sigmas

# Peak memory one request adds, measured on the 2-core CPU in float32 with /proc VmHWM
# (docs/reliability.md): a DiT step needs about 75-88 bytes per packed row and unit of
# hidden_size (tiny 8.5 KB/row, small 29 KB/row); the video VAE decode about 144 bytes per
# decoded voxel (height x width x frames aligned to 17n+5). Rounded up:
DIT_BYTES_PER_ROW_AND_WIDTH = 96
DECODE_BYTES_PER_VOXEL = 160
# What a cached request (cache_threshold > 0) keeps between steps, per packed row: its last planned
# latents and last computed velocity, float32, at most 96 wide each (h3_core.diffusion.step_cache).
STEP_CACHE_BYTES_PER_ROW = 2 * 96 * 4


@dataclass(frozen=True)
class RequestLimits:
    """Serving limits; each request field must lie within them (units: pixels, frames, rows, MiB).
    The defaults are the shipped CPU repository's (h3_core.serving.shared.settings.DitSettings takes them)."""

    max_height: int = 256
    max_width: int = 256
    max_num_frames: int = 124  # 17n+5: NUM_FRAMES 1..124 (h3_core.config.align_num_frames)
    max_steps: int = 50
    max_outputs: int = 4
    max_rows: int = 4096  # padded packed rows of one request
    max_prompt_bytes: int = 4096
    max_request_mb: int = 2048  # request_memory_mb of one request
    max_cache_threshold: float = 0.5  # a request's cache_threshold (h3_core.diffusion.step_cache)
    max_ref_kv_refresh: int = 1  # a request's ref_kv_refresh (h3_core.model.reference_kv); 1 = off


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request. `seed` None means a random seed is drawn in prepare(). `task` is
    one of h3_core.rules.TASKS; its conditions (keyframes, guides, references) are
    Engine.prepare's argument, checked against it there (h3_core.rules.check_task).
    video_sigmas / audio_sigmas: the clock's own sigma list (num_inference_steps + 1 noise levels
    from exactly 1 down to exactly 0, e.g. a few-step student's), used as given instead of
    sigma_schedule(num_inference_steps, shift), the shift then unused for that clock; None: from
    the steps and the shift (docs/model.md §3.1)."""

    prompt: str
    height: int
    width: int
    num_frames: int
    num_inference_steps: int
    seed: int | None = None
    num_outputs: int = 1
    video_shift: float = DEFAULT_VIDEO_SHIFT
    audio_shift: float = DEFAULT_AUDIO_SHIFT
    fps: int = FPS
    request_id: str = ""
    task: str = "t2va"
    cache_threshold: float = 0.0  # step cache (h3_core.diffusion.step_cache); 0 = every step computed
    video_sigmas: tuple[float, ...] | None = None
    audio_sigmas: tuple[float, ...] | None = None
    lora: tuple[tuple[str, float], ...] = ()  # LoRA adapters (name, scale), composed in order (h3_core.model.lora)
    ref_kv_refresh: int = 1  # reference rows computed every k steps (h3_core.model.reference_kv); 1 = every step


def check_canvas(height: int, width: int, num_frames: int, limits: RequestLimits) -> None:
    """Raise InvalidRequest naming the field, the value and the allowed range unless height and
    width (pixels) are multiples of CANVAS_MULTIPLE in CANVAS_MULTIPLE..the maxima and the clip
    served for num_frames, align_num_frames(num_frames) frames (17n+5), is at most
    limits.max_num_frames: num_frames in 1..max_requested_frames(max_num_frames) (121 -> 1..107).
    validate_request applies it, and h3_vae to the INFO of a result (which a direct caller may
    forge)."""
    for field, value, maximum in (("height", height, limits.max_height), ("width", width, limits.max_width)):
        if not (CANVAS_MULTIPLE <= value <= maximum) or value % CANVAS_MULTIPLE:
            raise InvalidRequest(
                field,
                f"{field}={value} is out of range: allowed multiples of "
                f"{CANVAS_MULTIPLE} in {CANVAS_MULTIPLE}..{maximum}",
            )
    if not (1 <= num_frames and align_num_frames(num_frames) <= limits.max_num_frames):
        raise InvalidRequest(
            "num_frames",
            f"num_frames={num_frames} is out of range: allowed 1..{max_requested_frames(limits.max_num_frames)} "
            f"(NUM_FRAMES; the clip is aligned up to 17n+5 frames, at most max_num_frames={limits.max_num_frames})",
        )


def validate_request(request: GenerationRequest, limits: RequestLimits) -> None:
    """Check every field; raise InvalidRequest (h3_core.rules, a ValueError) naming the field, the
    value and the allowed range.

    Rules: prompt as check_prompt says (a non-empty str with a visible character), at most
    limits.max_prompt_bytes of UTF-8 (a leading byte-order mark counted);
    height/width positive multiples of 32 up to the maxima; 1 <= num_frames <= max;
    1 <= num_inference_steps <= max; 1 <= num_outputs <= max; seed in 0..2^63-1 with
    seed + num_outputs - 1 also in range; shifts > 0; fps must be the model's 24;
    0 <= cache_threshold <= limits.max_cache_threshold; a sigma list as check_sigmas says (2 to
    max_steps + 1 finite points, strictly decreasing from exactly 1 to exactly 0), both lists of
    the same length (one DiT forward advances both clocks one entry), and num_inference_steps equal
    to a given list's length - 1; lora as check_lora says;
    1 <= ref_kv_refresh <= limits.max_ref_kv_refresh.
    The padded row count is checked in Engine.prepare, once the prompt's token count is known.
    """
    check_prompt(request.prompt)
    check_prompt_bytes(len(request.prompt.encode("utf-8")), limits.max_prompt_bytes)
    check_canvas(request.height, request.width, request.num_frames, limits)
    check_in_range("num_inference_steps", request.num_inference_steps, 1, limits.max_steps)
    check_in_range("num_outputs", request.num_outputs, 1, limits.max_outputs)
    if request.seed is not None:
        check_in_range("seed", request.seed, 0, INT64_MAX - (request.num_outputs - 1))
    for field in ("video_shift", "audio_shift"):
        if not getattr(request, field) > 0:
            raise InvalidRequest(field, f"{field}={getattr(request, field)} is out of range: allowed > 0")
    check_in_range("cache_threshold", request.cache_threshold, 0, limits.max_cache_threshold, " (max_cache_threshold)")
    check_in_range("ref_kv_refresh", request.ref_kv_refresh, 1, limits.max_ref_kv_refresh, " (max_ref_kv_refresh)")
    if request.fps != FPS:
        raise InvalidRequest("fps", f"fps={request.fps} is not supported: the model generates {FPS} fps")
    _check_sigma_lists(request, limits)
    check_lora(request.lora)


def _check_sigma_lists(request: GenerationRequest, limits: RequestLimits) -> None:
    lists = {f: getattr(request, f) for f in ("video_sigmas", "audio_sigmas") if getattr(request, f) is not None}
    for field, sigmas in lists.items():
        check_sigmas(field, sigmas, limits.max_steps)
    if len(lists) == 2 and len(request.audio_sigmas) != len(request.video_sigmas):
        raise InvalidRequest(
            "audio_sigmas",
            f"audio_sigmas has {len(request.audio_sigmas)} points but video_sigmas has {len(request.video_sigmas)}: "
            "allowed the same number (one DiT forward advances both clocks)",
        )
    for field, sigmas in lists.items():
        if request.num_inference_steps != len(sigmas) - 1:
            raise InvalidRequest(
                "num_inference_steps",
                f"num_inference_steps={request.num_inference_steps} does not match {field} ({len(sigmas)} points): "
                f"allowed {len(sigmas) - 1}, the list's number of forwards",
            )


def request_memory_mb(
    height: int,
    width: int,
    num_frames: int,
    rows: int,
    hidden_size: int,
    bytes_per_row_and_width: int = DIT_BYTES_PER_ROW_AND_WIDTH,
    step_cache: bool = False,
    reference_kv_bytes: int = 0,
) -> int:
    """Estimated peak memory (MiB, rounded up) one request adds to the server: the DiT step
    activations for its packed rows (all outputs) plus the video VAE decoding one output
    (outputs are decoded one at a time), plus with `step_cache` (cache_threshold > 0) what its
    step caches keep, STEP_CACHE_BYTES_PER_ROW a row (768 B: 12 MiB for one H3 output at its
    default canvas, 16,384 rows). The largest tiny request the default limits allow
    (256 x 256 x 121 frames, one output, 2816 rows; 3072 with a 256-token prompt) needs
    25 + 1240 = 1265 MiB (1267). reference_kv_bytes: what its reference key / value caches keep
    (ref_kv_refresh > 1: reference rows x outputs x h3_core.model.reference_kv.bytes_per_reference_row,
    2 KiB a row for tiny, 1.37 MiB for H3 in bf16). bytes_per_row_and_width: the DiT's activation bytes per packed
    row and unit of hidden_size; the default is the CPU float32 measurement, the one
    Engine.prepare applies (server.sizing plugs in a GPU figure)."""
    total = bytes_per_row_and_width * rows * hidden_size + DECODE_BYTES_PER_VOXEL * height * width * align_num_frames(
        num_frames
    )
    if step_cache:
        total += STEP_CACHE_BYTES_PER_ROW * rows
    total += reference_kv_bytes
    return -(-total // 2**20)


def random_seed() -> int:
    """A fresh random seed in 0..2^31-1 (reported back with the output)."""
    return secrets.randbelow(2**31)
