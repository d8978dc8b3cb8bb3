"""The settings of each served model: one frozen dataclass per Triton model, built from its
config.pbtxt `parameters` (string values) by `from_parameters`, which refuses unknown and missing
keys and values of the wrong type, and checks the rules that tie fields together. The defaults
here are the shipped CPU repository's values (model_repository/*/config.pbtxt holds the same).
Triton-free: the step loop and the tests build them from plain dicts.
"""

import dataclasses
import math
from dataclasses import dataclass

from h3_core.config import AUDIO_SAMPLE_RATE, get_config
from h3_core.diffusion.request import RequestLimits
from h3_core.inputs.images import ImageLimits
from h3_core.inputs.references import DecodeBudget, MediaLimits
from h3_core.model.adaln_table import DEFAULT_CAPACITY, check_adaln_weights
from h3_core.model.fp8 import QUANTIZATIONS
from h3_core.model.initialization import weights_seed
from h3_core.model.reference_kv import check_refresh
from h3_core.protocol import (
    DIT_MODEL,
    ENCODER_MODEL,
    MAX_REFERENCE_AUDIO,
    MAX_REFERENCE_IMAGES,
    MAX_REFERENCE_VIDEOS,
    MAX_REFERENCES,
    TASKS,
    VAE_MODEL,
)
from h3_core.serving.shared.gpu_turns import DEFAULT_SHARE
from h3_core.serving.shared.lora_control import lora_setting

# the scheduling policies of h3_dit (h3_core.serving.dit.scheduler), its default, the longest wait (seconds)
POLICIES = ("request", "fifo", "srpt")
DEFAULT_POLICY = "srpt"
DEFAULT_MAX_WAIT_S = 30.0


CONTROL_SLOTS = 2  # h3_dit sequence slots kept for cancel requests (max_batch_size = seqs + waiting + 2)
# Seconds one h3_dit execute() may keep taking steps (execute_budget_s) while nothing is headed
# for the DiT (h3_core.serving.dit.step_loop.StepLoop.another_step). Every execute costs a Triton round trip
# and the loop's per-execute work (about 2.3 ms on the 2-core CPU against a 5 ms tiny step of
# 128 rows); 0.03 s shares it among 5 such steps. Announced newcomers and cancels (through the
# encoder; clients' cancels through h3_cancel, h3_vae's for gone clients) end an execute at its
# next step boundary whatever the budget; what the budget still delays is the unannounced: a
# control request sent straight to h3_dit waits at most the budget plus one step. The CPU repository keeps 0.03 s
# (the tests on 2 cores were tuned with it); the GPU repository sets server.sizing's
# GPU_EXECUTE_BUDGET_S.
EXECUTE_BUDGET_S = 0.03
# With execute_budget_s > 0 an execute takes at least this many steps while nothing is announced,
# however long they are: with steps longer than the budget each step paid a Triton round trip
# (about 30 ms on the H200 host, benchmark (c): step mode at 0.997 of request mode). The cost: an
# unannounced cancel (a control request straight to h3_dit) waits up to 2 steps instead of 1
# (docs/reliability.md); announced ones still end the execute after the step in flight.
MIN_EXECUTE_STEPS = 2
EXECUTION_MODES = ("step", "request")
# Seconds of silence toward a request after which h3_dit sends it a heartbeat and h3_vae a decode
# keep-alive (both models' heartbeat_s). h3_vae forwards each to the client as a keep-alive response
# (protocol.KEEPALIVE): well under the 60 s idle timeout of nginx's gRPC proxy and of most load
# balancers, which cut a stream that carries no DATA frame for that long (HTTP/2 pings are hop by
# hop and do not count). h3_vae notices a client that is gone only when a response for it arrives,
# so 15 s also bounds that notice for a request that asked for no progress (plus one step); a
# heartbeat costs h3_vae about 1.1 ms under its lock, so one every step to each silent request
# (12 at 5-7 ms steps) made it fall behind.
HEARTBEAT_S = 15.0
# Estimated seconds of one DiT step, by device kind: (seconds, rows, layers) of a measured step,
# scaled linearly by rows and layers (step_estimate_s). cuda: the bench DiT's 16,384-row step on
# the H200 (benchmarks/results/h200.json); cpu: tiny steps 4,096 rows in under 0.2 s on the 2-core
# CPU. In execution mode "request" an execute() runs a whole generation, up to max_steps steps of
# up to max_batch_rows rows, and every live sequence is reaped when one lasts the idle timeout.
STEP_ESTIMATES = {"cuda": (0.355, 16_384, 8), "cpu": (0.2, 4_096, get_config("tiny").num_layers)}
REQUEST_IDLE_FACTOR = 1.5  # request mode: max_sequence_idle_microseconds >= 1.5 x the longest generation


def step_estimate_s(device: str, rows: int, num_layers: int) -> float:
    """Estimated seconds of one step of `rows` packed rows of a `num_layers` DiT on `device`
    ("cpu", "cuda" or "cuda:N"): STEP_ESTIMATES scaled by rows and layers."""
    seconds, measured_rows, measured_layers = STEP_ESTIMATES[device.split(":")[0]]
    return seconds * rows / measured_rows * num_layers / measured_layers


def served_tasks(model: str, tasks: str) -> list[str]:
    """The comma-separated `tasks` parameter of `model` as a list. Raises ValueError unless it
    lists some of h3_core.protocol.TASKS and nothing else."""
    served = [task for task in tasks.split(",") if task]
    if not served or any(task not in TASKS for task in served):
        raise ValueError(f"{model} parameter tasks={tasks!r} must list some of {list(TASKS)}, comma-separated")
    return served


def check_served(task: str, served: list[str]) -> None:
    """Raise ValueError unless `task` is among h3_dit's served tasks (its `tasks` parameter)."""
    if task not in served:
        raise ValueError(
            f"task {task!r} is not served by this h3_dit: it serves {served} (h3_dit parameter tasks; one instance "
            "loads one transformer: serve another's tasks from another model repository)"
        )


# The settings several models carry, which must be equal in all of them: {key: the models that
# carry it, the first the one whose value the writer copies to the others}. A difference would let
# one model accept what another refuses (h3_encoder infers a canvas or admits rows h3_dit refuses,
# h3_vae refuses a result h3_dit made). Each model checks its siblings' config.pbtxt at load
# (h3_core.serving.shared.agreement); server.planner keeps them equal and refuses given values that differ.
SHARED_SETTINGS = {
    "config_name": (DIT_MODEL, ENCODER_MODEL),
    "max_height": (DIT_MODEL, ENCODER_MODEL, VAE_MODEL),
    "max_width": (DIT_MODEL, ENCODER_MODEL, VAE_MODEL),
    "max_num_frames": (DIT_MODEL, VAE_MODEL),
    "max_batch_rows": (DIT_MODEL, ENCODER_MODEL),
    "max_request_mb": (DIT_MODEL, ENCODER_MODEL),
    "tasks": (DIT_MODEL, ENCODER_MODEL),
    "heartbeat_s": (DIT_MODEL, VAE_MODEL),
    "checkpoint_dir": (VAE_MODEL, ENCODER_MODEL),
    "trust_remote_code": (VAE_MODEL, ENCODER_MODEL),
}


def _parse(cls, parameters: dict[str, str]):
    """An instance of the settings dataclass `cls` from string parameters. Every field must be
    given, nothing else; ints, floats and booleans ("true" / "false") are parsed. Raises
    ValueError naming the model, the key and what was expected."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(parameters) - set(fields))
    missing = sorted(set(fields) - set(parameters))
    if unknown or missing:
        raise ValueError(
            f"{cls.MODEL} parameters: unknown {unknown}, missing {missing}; expected exactly {sorted(fields)}"
        )
    return cls(**{name: parse_value(cls, name, text) for name, text in parameters.items()})


def parse_value(cls, name: str, text: str):
    """The value of parameter `name` of the settings dataclass `cls` from its string: an int, a
    float, a bool ("true" / "false") or a str, by the field's type. Raises ValueError naming the
    model, the key and what was expected."""
    kind = next(field.type for field in dataclasses.fields(cls) if field.name == name)
    try:
        if kind is bool:
            if text not in ("true", "false"):
                raise ValueError
            return text == "true"
        return kind(text)
    except ValueError:
        expected = "'true' or 'false'" if kind is bool else f"a valid {kind.__name__}"
        raise ValueError(f"{cls.MODEL} parameter {name}={text!r} is not {expected}") from None


def _to_parameters(settings) -> dict[str, str]:
    """The inverse of _parse: every field as a config.pbtxt string value."""

    def text(value) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    return {field.name: text(getattr(settings, field.name)) for field in dataclasses.fields(settings)}


@dataclass(frozen=True)
class EncoderSettings:
    """h3_encoder: cpu_threads (torch threads of the model's process); encoder_path ("" = the
    MiniLM-L6 package folder; a Qwen3-VL folder such as an official checkpoint's text_encoder/);
    encoder_weights ("" = the encoder folder's safetensors; "random:SEED" = seeded random weights
    drawn on `device` for a Qwen3-VL folder's config.json, no weights file read: TextEncoder);
    tokenizer_path ("" = encoder_path); device ("cpu", "cuda", "cuda:N"); hidden_layer (index into
    hidden_states: -1 = last for MiniLM, the number of decoder layers run for Qwen3-VL, 50 for
    H3, h3_core.model.encoder); max_tokens (prompt tokens, special tokens included, vision tokens
    too); max_prompt_bytes (UTF-8 bytes). For keyframes (fl2va): checkpoint_dir and
    trust_remote_code (the video VAE whose encoder makes their latents: h3_vae's, on `device`);
    config_name (its default canvas area is the area of a canvas inferred from a keyframe);
    max_height, max_width (pixels: h3_dit's limits, the inferred canvas stays within them);
    max_image_bytes, max_image_pixels, min_image_side, max_image_side (pixels), max_image_aspect
    (long side / short side): a keyframe, guide or reference image beyond them is refused
    (h3_core.inputs.images.ImageLimits). For references (ref2va): max_reference_images, _videos, _audio
    and max_references (counts per kind and in all, guides included); min_audio_s, max_audio_s
    (seconds of one audio file), max_total_audio_s (of all), max_video_s (of one video; videos and
    audio files may be twice max_image_bytes, h3_core.inputs.references.MediaLimits); max_reference_aspect
    (long side / short side of a reference image or video: 2.5, the reference implementation's
    0.4..2.5; guides, fitted to the canvas, take max_image_aspect); max_batch_rows and
    max_request_mb (h3_dit's: a request whose rows or memory, conditions included, pass them is
    refused before any VAE runs); tasks (h3_dit's: a request of another task is refused before its
    media are read); allow_fault_injection (tests only: lets request parameter inject_fault act
    here, h3_core.protocol.ENCODER_FAULTS). media_workers (>= 1): the threads that decode
    requests' media files apart from the text encoder, one request each, so a request without
    files never waits behind another's;
    max_decoded_pixels, max_decoded_samples (>= 1): one request's decode budget
    (h3_core.inputs.references.DecodeBudget); media_workers x the budget bounds the decoded media held at
    once (docs/reliability.md)."""

    MODEL = ENCODER_MODEL
    cpu_threads: int = 1
    encoder_path: str = ""
    encoder_weights: str = ""
    tokenizer_path: str = ""
    device: str = "cpu"
    hidden_layer: int = -1
    max_tokens: int = 256
    max_prompt_bytes: int = RequestLimits.max_prompt_bytes
    checkpoint_dir: str = "checkpoints/tiny"
    trust_remote_code: bool = False
    config_name: str = "tiny"
    max_height: int = RequestLimits.max_height
    max_width: int = RequestLimits.max_width
    max_image_bytes: int = ImageLimits.max_bytes
    max_image_pixels: int = ImageLimits.max_pixels
    min_image_side: int = ImageLimits.min_side
    max_image_side: int = ImageLimits.max_side
    max_image_aspect: float = ImageLimits.max_aspect
    max_reference_images: int = MAX_REFERENCE_IMAGES
    max_reference_videos: int = MAX_REFERENCE_VIDEOS
    max_reference_audio: int = MAX_REFERENCE_AUDIO
    max_references: int = MAX_REFERENCES
    min_audio_s: float = MediaLimits.min_audio_s
    max_audio_s: float = MediaLimits.max_audio_s
    max_total_audio_s: float = MediaLimits.max_audio_s
    max_video_s: float = MediaLimits.max_video_s
    max_reference_aspect: float = 2.5
    max_batch_rows: int = RequestLimits.max_rows
    max_request_mb: int = RequestLimits.max_request_mb
    tasks: str = ",".join(TASKS)
    allow_fault_injection: bool = False
    media_workers: int = 2
    max_decoded_pixels: int = 250_000_000  # 750 MB as RGB: six 40 MP images, 120 frames of 1080p
    max_decoded_samples: int = 45 * AUDIO_SAMPLE_RATE  # 45 s a channel: 15 s of audio files + 3 video tracks of 10 s

    def __post_init__(self):
        weights_seed("h3_encoder parameter encoder_weights", self.encoder_weights)
        for name in ("media_workers", "max_decoded_pixels", "max_decoded_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"h3_encoder parameter {name}={getattr(self, name)} is out of range: allowed >= 1")
        self.served_tasks()
        self.image_limits()
        self.media_limits()
        for name in ("max_reference_images", "max_reference_videos", "max_reference_audio", "max_references"):
            if getattr(self, name) < 0:
                raise ValueError(f"h3_encoder parameter {name}={getattr(self, name)} is out of range: allowed >= 0")
        if not self.max_total_audio_s > 0 or self.max_batch_rows < 1:
            raise ValueError("h3_encoder parameters max_total_audio_s and max_batch_rows must be > 0")

    def served_tasks(self) -> list[str]:
        """The tasks h3_dit serves (the `tasks` parameter, split)."""
        return served_tasks(self.MODEL, self.tasks)

    def media_limits(self) -> MediaLimits:
        """The reference audio and video limits as h3_core.inputs.references takes them (ValueError when
        out of range)."""
        return MediaLimits(
            max_bytes=self.max_image_bytes * 2,
            min_audio_s=self.min_audio_s,
            max_audio_s=self.max_audio_s,
            max_video_s=self.max_video_s,
            max_side=self.max_image_side,
            max_aspect=self.max_reference_aspect,
        )

    def decode_budget(self) -> DecodeBudget:
        """A fresh decode budget for one request (max_decoded_pixels, max_decoded_samples)."""
        return DecodeBudget(self.max_decoded_pixels, self.max_decoded_samples)

    def reference_image_limits(self) -> ImageLimits:
        """image_limits with max_reference_aspect: a reference keeps its aspect (no fit)."""
        return dataclasses.replace(self.image_limits(), max_aspect=self.max_reference_aspect)

    def image_limits(self) -> ImageLimits:
        """The keyframe limits as h3_core.inputs.images takes them (ValueError when out of range)."""
        return ImageLimits(
            max_bytes=self.max_image_bytes,
            max_pixels=self.max_image_pixels,
            min_side=self.min_image_side,
            max_side=self.max_image_side,
            max_aspect=self.max_image_aspect,
        )

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> "EncoderSettings":
        return _parse(cls, parameters)

    def to_parameters(self) -> dict[str, str]:
        return _to_parameters(self)


@dataclass(frozen=True)
class VaeSettings:
    """h3_vae: cpu_threads; checkpoint_dir (holding video_vae / audio_vae .safetensors, or an
    official checkpoint's video_vae/ and audio_vae/ folders; relative to the folder above the model
    repository); device ("cpu", "cuda", "cuda:N"); decode_workers (threads decoding different
    requests at once, >= 1; docs/reliability.md measures them); trust_remote_code (run the Python
    code an official checkpoint's VAE folders ship, h3_core.weights.vae_hook; off by default);
    heartbeat_s (seconds, finite > 0: a decode, queued or running, sends its client a keep-alive
    response after this long without a response, h3_core.serving.vae.decodes; h3_dit's,
    SHARED_SETTINGS; under the idle timeout of any proxy in front of the server);
    max_queued_decodes (>= 0: results that may wait for a decode worker; one beyond is refused at
    once with UNAVAILABLE); max_height, max_width (pixels), max_num_frames: the canvas a result
    may have (INFO can be forged by a direct caller; h3_dit's, SHARED_SETTINGS);
    gpu_turns (on a CUDA device: decode in turns with the h3_dit instances of the same GPU, which
    must set it too, h3_core.serving.shared.gpu_turns; the writer sets it where h3_vae shares a GPU with
    h3_dit); turn_share (finite > 0: the fraction of the last DiT step's seconds a turn of decode
    tiles may last while a DiT step waits); allow_fault_injection (tests only: lets request
    parameter inject_fault act here, h3_core.protocol.VAE_FAULTS)."""

    MODEL = VAE_MODEL
    cpu_threads: int = 1
    checkpoint_dir: str = "checkpoints/tiny"
    device: str = "cpu"
    decode_workers: int = 2
    trust_remote_code: bool = False
    heartbeat_s: float = HEARTBEAT_S
    max_queued_decodes: int = 32
    max_height: int = RequestLimits.max_height
    max_width: int = RequestLimits.max_width
    max_num_frames: int = RequestLimits.max_num_frames
    gpu_turns: bool = False
    turn_share: float = DEFAULT_SHARE
    allow_fault_injection: bool = False

    def __post_init__(self):
        if not 0 < self.turn_share < math.inf:
            raise ValueError(f"h3_vae parameter turn_share={self.turn_share} is out of range: allowed finite > 0")
        if self.gpu_turns and not self.device.startswith("cuda"):
            raise ValueError(f"h3_vae parameter gpu_turns=true needs a CUDA device, got device={self.device!r}")
        for name in ("decode_workers", "max_height", "max_width", "max_num_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"h3_vae parameter {name}={getattr(self, name)} is out of range: allowed >= 1")
        if self.max_queued_decodes < 0:
            raise ValueError(
                f"h3_vae parameter max_queued_decodes={self.max_queued_decodes} is out of range: allowed >= 0"
            )
        if not 0 < self.heartbeat_s < math.inf:
            raise ValueError(
                f"h3_vae parameter heartbeat_s={self.heartbeat_s} is out of range: allowed finite > 0 seconds"
            )

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> "VaeSettings":
        return _parse(cls, parameters)

    def to_parameters(self) -> dict[str, str]:
        return _to_parameters(self)

    def limits(self) -> RequestLimits:
        """The canvas limits a result must keep (the other limits are the defaults, unused here)."""
        return RequestLimits(max_height=self.max_height, max_width=self.max_width, max_num_frames=self.max_num_frames)


@dataclass(frozen=True)
class DitSettings:
    """h3_dit. Model: config_name, checkpoint_dir, device, attention_backend, cpu_threads,
    sp_degree (devices one instance runs each packed forward on, sequence parallelism through
    worker processes, h3_core.parallel.workers: 1 = in the instance's own process; on cuda the
    instance's GPU and the next sp_degree - 1; it must divide the config's attention heads,
    checked at load and by the writer); quantization (h3_core.model.fp8.QUANTIZATIONS: "none", or
    "fp8": the block linears in float8 e4m3, on GPUs of compute capability >= 8.9 or the CPU,
    checked at load); adaln_table_values (timestep values whose AdaLN projections the DiT keeps,
    h3_core.model.adaln_table, with sp_degree 1; 0 = project per step, as sp_degree > 1 does);
    adaln_weights (ADALN_WEIGHTS: "device", or "host": the AdaLN projection weights stay in pinned
    host memory, streamed to the device once per table fill pass; needs sp_degree 1 and
    adaln_table_values >= 2 x max_steps + 2, a whole schedule's values, filled at admission);
    tasks (comma-separated h3_core.protocol.TASKS this
    instance's transformer serves; a request of another task is refused with INVALID_ARG: one
    instance loads one transformer, so requests of different transformers never share a pack).
    Step loop: execution_mode ("step": packed steps, each over the requests the policy picks;
    "request": run to completion), execute_budget_s (step mode: seconds one execute() may keep
    taking steps while nothing announced is headed for the DiT, and at least MIN_EXECUTE_STEPS,
    h3_core.serving.dit.step_loop.StepLoop.another_step; 0 = one step per execute; announced newcomers and
    cancels wait at most the step in flight, unannounced ones such as a control request sent
    straight to h3_dit up to this long plus one step, or MIN_EXECUTE_STEPS steps where those are longer, as they
    reach the DiT only between executes),
    heartbeat_s (seconds of silence toward a live request, on the step loop's clock, after which
    it gets a heartbeat at the next answer pass: h3_vae notices a gone client only when a response
    for it arrives, h3_core.serving.dit.step_loop.StepLoop.answer),
    scheduling_policy / row_budget (rows) (h3_core.serving.dit.scheduler), max_wait_s (seconds a request may
    wait for a step before it ranks before every request that has not waited that long, under
    every policy: the longest wait, h3_core.serving.dit.scheduler), priority_max (request_priority lies in
    -priority_max..priority_max), max_num_seqs (documents per forward), max_waiting (live
    requests beyond a full pack), max_batch_rows (rows per forward and per request; h3_encoder
    refuses a request beyond it, so it is the largest request the server takes),
    max_batch_rows_by_gpu ("" or GPU:ROWS pairs, comma-separated, such as "0:7616,1:65536": the
    instance on a listed CUDA device packs up to its own rows instead, sized by server.sizing from
    that GPU's memory; each at least max_batch_rows, for_gpu). Request
    limits: max_height, max_width (pixels), max_num_frames, max_steps, max_outputs,
    max_request_mb (MiB, h3_core.diffusion.request.request_memory_mb). Step cache
    (h3_core.diffusion.step_cache): cache_threshold (a request's when it sends none; 0 = off),
    max_cache_threshold (the largest a request may send; with sp_degree > 1 a request's
    cache_threshold above 0 is refused: the metric runs the DiT's first block in this process).
    Reference reuse: ref_kv_refresh (a request's k when it sends none), max_ref_kv_refresh (the
    largest it may send), rules: h3_core.model.reference_kv.check_refresh. allow_fault_injection:
    lets the test-only request parameter inject_fault act. gpu_turns (on
    cuda with sp_degree 1: each packed step takes the GPU's turn, so that an h3_vae decoding on
    the same GPU with gpu_turns computes only between steps, h3_core.serving.shared.gpu_turns; steps
    then do not overlap the next step's host work). LoRA (docs/lora.md): loras (adapters loaded at start,
    lora_setting), max_loras (held at once; -1: as many as loras names), max_lora_rank (model.lora.part_rank).

    Rules checked by check(): execution_mode in EXECUTION_MODES, scheduling_policy in POLICIES,
    1 <= row_budget <= max_batch_rows, max_wait_s and heartbeat_s finite > 0, priority_max >= 0,
    0 <= cache_threshold <= max_cache_threshold (finite), cache_threshold 0 unless sp_degree is 1,
    execute_budget_s >= 0, positive sizes, and (with Triton's max_batch_size) max_batch_size ==
    max_num_seqs + max_waiting + CONTROL_SLOTS, (with its max_sequence_idle_microseconds as
    idle_s) execute_budget_s < idle_s / 2: an execute lasts about its budget or MIN_EXECUTE_STEPS
    steps, whichever is longer, plus the step that ends it, which the sized idle timeout exceeds
    several times (server.sizing.idle_timeout); in execution mode "request", idle_s >=
    REQUEST_IDLE_FACTOR x the longest generation, max_steps steps of max_batch_rows rows
    (step_estimate_s on this device), which one execute runs."""

    MODEL = DIT_MODEL
    cpu_threads: int = 1
    config_name: str = "tiny"
    checkpoint_dir: str = "checkpoints/tiny"
    device: str = "cpu"
    attention_backend: str = "sdpa"
    sp_degree: int = 1
    quantization: str = "none"
    adaln_table_values: int = DEFAULT_CAPACITY
    adaln_weights: str = "device"
    tasks: str = ",".join(TASKS)
    execution_mode: str = "step"
    execute_budget_s: float = EXECUTE_BUDGET_S
    heartbeat_s: float = HEARTBEAT_S
    scheduling_policy: str = DEFAULT_POLICY
    row_budget: int = RequestLimits.max_rows
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    priority_max: int = 100
    max_num_seqs: int = 4
    max_waiting: int = 8
    max_batch_rows: int = RequestLimits.max_rows
    max_batch_rows_by_gpu: str = ""
    max_height: int = RequestLimits.max_height
    max_width: int = RequestLimits.max_width
    max_num_frames: int = RequestLimits.max_num_frames
    max_steps: int = RequestLimits.max_steps
    max_outputs: int = RequestLimits.max_outputs
    max_request_mb: int = RequestLimits.max_request_mb
    cache_threshold: float = 0.0
    max_cache_threshold: float = RequestLimits.max_cache_threshold
    ref_kv_refresh: int = 1
    max_ref_kv_refresh: int = RequestLimits.max_ref_kv_refresh
    allow_fault_injection: bool = False
    gpu_turns: bool = False
    loras: str = ""
    max_loras: int = -1
    max_lora_rank: int = 128

    @property
    def lora_slots(self) -> int:
        """Adapters held at once: max_loras, or with -1 the number `loras` names."""
        return len(lora_setting(self.loras)) if self.max_loras < 0 else self.max_loras

    def __post_init__(self):
        self.check()

    def served_tasks(self) -> list[str]:
        """The tasks this instance serves (the `tasks` parameter, split)."""
        return served_tasks(self.MODEL, self.tasks)

    def check(self, max_batch_size: int | None = None, idle_s: float | None = None) -> None:
        """Raise ValueError naming the first broken rule (see the class docstring)."""
        self.served_tasks()
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"h3_dit parameter quantization={self.quantization!r} is not one of {QUANTIZATIONS}")
        if self.execution_mode not in EXECUTION_MODES:
            raise ValueError(f"h3_dit parameter execution_mode={self.execution_mode!r} is not one of {EXECUTION_MODES}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"h3_dit parameter scheduling_policy={self.scheduling_policy!r} is not one of {POLICIES}")
        positive = "cpu_threads sp_degree max_num_seqs max_batch_rows max_height max_width max_num_frames max_steps"
        for name in (*positive.split(), "max_outputs", "max_request_mb", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"h3_dit parameter {name}={getattr(self, name)} is out of range: allowed >= 1")
        for name in ("max_waiting", "priority_max", "adaln_table_values"):
            if getattr(self, name) < 0:
                raise ValueError(f"h3_dit parameter {name}={getattr(self, name)} is out of range: allowed >= 0")
        if self.lora_slots < len(lora_setting(self.loras)) or self.max_loras < -1:
            raise ValueError(
                f"h3_dit parameter max_loras={self.max_loras} is out of range: allowed -1 or >= the loras named"
            )
        self.rows_by_gpu()
        check_adaln_weights(self.adaln_weights)
        schedule = 2 * self.max_steps + 2  # a schedule's video, audio and condition values
        if self.adaln_weights == "host" and (self.sp_degree != 1 or self.adaln_table_values < schedule):
            raise ValueError(
                f"h3_dit parameter adaln_weights=host needs sp_degree 1 and adaln_table_values >= 2 x max_steps + 2 = "
                f"{schedule} (a schedule's values, filled at admission), got sp_degree={self.sp_degree} and "
                f"adaln_table_values={self.adaln_table_values}"
            )
        if not 0 <= self.max_cache_threshold < math.inf:
            raise ValueError(
                f"h3_dit parameter max_cache_threshold={self.max_cache_threshold} is out of range: allowed finite >= 0"
            )
        if not 0 <= self.cache_threshold <= self.max_cache_threshold:
            raise ValueError(
                f"h3_dit parameter cache_threshold={self.cache_threshold} is out of range: allowed "
                f"0..{self.max_cache_threshold} (max_cache_threshold)"
            )
        if self.cache_threshold > 0 and self.sp_degree > 1:
            raise ValueError(
                f"h3_dit parameter cache_threshold={self.cache_threshold} needs sp_degree 1: the step cache's "
                "metric runs the DiT's first block in the instance's process"
            )
        check_refresh(self.ref_kv_refresh, self.max_ref_kv_refresh, self.sp_degree)
        if self.gpu_turns and (not self.device.startswith("cuda") or self.sp_degree != 1):
            raise ValueError(
                f"h3_dit parameter gpu_turns=true needs device cuda and sp_degree 1, got device={self.device!r} "
                f"and sp_degree={self.sp_degree}"
            )
        if not 1 <= self.row_budget <= self.max_batch_rows:
            raise ValueError(
                f"h3_dit parameter row_budget={self.row_budget} is out of range: allowed "
                f"1..{self.max_batch_rows} (max_batch_rows)"
            )
        for name in ("max_wait_s", "heartbeat_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(
                    f"h3_dit parameter {name}={getattr(self, name)} is out of range: allowed finite > 0 seconds"
                )
        if not (0 <= self.execute_budget_s < math.inf):
            raise ValueError(
                f"h3_dit parameter execute_budget_s={self.execute_budget_s} is out of range: allowed finite >= 0"
            )
        if idle_s is not None and self.execution_mode == "request":
            step = step_estimate_s(self.device, self.max_batch_rows, get_config(self.config_name).num_layers)
            needed = self.max_steps * step * REQUEST_IDLE_FACTOR
            if needed > idle_s:
                raise ValueError(
                    f"h3_dit max_sequence_idle_microseconds ({idle_s:g} s) is below the longest generation of "
                    f"execution mode 'request' (one execute): max_steps {self.max_steps} x {step:.3f} s (a step of "
                    f"{self.max_batch_rows:,} rows on {self.device}, estimated) x {REQUEST_IDLE_FACTOR} = "
                    f"{needed:.0f} s; the requests waiting behind it would be reaped: raise the idle timeout "
                    "(server.repository sizes it) or lower max_steps"
                )
        if idle_s is not None and not self.execute_budget_s < idle_s / 2:
            raise ValueError(
                f"h3_dit parameter execute_budget_s={self.execute_budget_s} must be below half of "
                f"max_sequence_idle_microseconds ({idle_s:g} s): an execute() that outlasts it loses every live request"
            )
        slots = self.max_num_seqs + self.max_waiting + CONTROL_SLOTS
        if max_batch_size is not None and max_batch_size != slots:
            raise ValueError(
                f"h3_dit max_batch_size={max_batch_size} must equal max_num_seqs + max_waiting + "
                f"{CONTROL_SLOTS} = {slots} (its sequence slots)"
            )

    def rows_by_gpu(self) -> dict[int, int]:
        """max_batch_rows_by_gpu as {CUDA device index: rows} ({} for ""). Raises ValueError for
        another form than GPU:ROWS pairs, a GPU listed twice, or rows below max_batch_rows (every
        instance must take the largest request h3_encoder lets through)."""
        rows: dict[int, int] = {}
        for item in filter(None, self.max_batch_rows_by_gpu.split(",")):
            gpu, _, value = item.partition(":")
            if not (gpu.isdigit() and value.isdigit()) or int(gpu) in rows:
                raise ValueError(
                    f"h3_dit parameter max_batch_rows_by_gpu={self.max_batch_rows_by_gpu!r} is not comma-separated "
                    "GPU:ROWS pairs, each GPU once (e.g. '0:7616,1:65536')"
                )
            rows[int(gpu)] = int(value)
            if rows[int(gpu)] < self.max_batch_rows:
                raise ValueError(
                    f"h3_dit parameter max_batch_rows_by_gpu={self.max_batch_rows_by_gpu!r}: GPU {gpu}'s {value} rows "
                    f"are out of range: allowed >= max_batch_rows ({self.max_batch_rows}), the largest request "
                    "every instance takes"
                )
        return rows

    def for_gpu(self, gpu: int) -> "DitSettings":
        """The settings of the h3_dit instance on CUDA device `gpu` (Triton's
        model_instance_device_id): max_batch_rows its max_batch_rows_by_gpu entry where it has one
        (its scheduler's rows per forward, and the rows of one request it steps), else unchanged."""
        rows = self.rows_by_gpu().get(gpu)
        return self if rows is None else dataclasses.replace(self, max_batch_rows=rows, max_batch_rows_by_gpu="")

    @classmethod
    def from_parameters(
        cls, parameters: dict[str, str], max_batch_size: int | None = None, idle_s: float | None = None
    ) -> "DitSettings":
        """Settings from config.pbtxt parameters; max_batch_size and idle_s (the config's
        max_sequence_idle_microseconds in seconds) are checked too."""
        settings = _parse(cls, parameters)
        settings.check(max_batch_size, idle_s)
        return settings

    def to_parameters(self) -> dict[str, str]:
        return _to_parameters(self)

    @property
    def sequence_slots(self) -> int:
        """Triton's max_batch_size for h3_dit."""
        return self.max_num_seqs + self.max_waiting + CONTROL_SLOTS

    def limits(self) -> RequestLimits:
        """The request limits these settings impose (max_rows = max_batch_rows)."""
        return RequestLimits(
            max_height=self.max_height,
            max_width=self.max_width,
            max_num_frames=self.max_num_frames,
            max_steps=self.max_steps,
            max_outputs=self.max_outputs,
            max_rows=self.max_batch_rows,
            max_request_mb=self.max_request_mb,
            max_cache_threshold=self.max_cache_threshold,
            max_ref_kv_refresh=self.max_ref_kv_refresh,
        )


SETTINGS = {cls.MODEL: cls for cls in (EncoderSettings, DitSettings, VaeSettings)}  # model name -> its settings
