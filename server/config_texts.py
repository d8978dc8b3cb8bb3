"""The config.pbtxt texts of a repository, with the comments that explain them: `config_texts`
turns a server.planner.Repository into the five texts (h3_encoder, h3_dit, h3_vae, h3_pipeline,
h3_cancel); `COMMENTS` is each model's table of parameter comments (a key without one is written
bare). Pure: server.repository writes the texts into folders.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from h3_core.config import get_config
from h3_core.diffusion.layout import make_layout
from h3_core.diffusion.request import request_memory_mb
from h3_core.protocol import CANCEL_MODEL
from h3_core.serving.shared.settings import CONTROL_SLOTS, DitSettings, EncoderSettings, VaeSettings

from .planner import Repository

PIPELINE = "h3_pipeline"
CPU_THREADS_COMMENT = """\
torch CPU threads of this model's process. The model processes share the machine's cores
(server.sizing.cpu_threads divides them); more OpenMP threads than free cores makes every
parallel region wait for a descheduled thread (a tiny step went from 4 ms to 700 ms with 2
threads under load)."""
FAULTS_COMMENT = '"true" lets the test-only request parameter inject_fault act in this model (tests only)'
COMMENTS = {
    EncoderSettings.MODEL: {
        "cpu_threads": CPU_THREADS_COMMENT,
        "allow_fault_injection": FAULTS_COMMENT,
        "encoder_path": '"" = the MiniLM-L6 package folder',
        "encoder_weights": '"" = the encoder folder\'s safetensors; "random:SEED" = seeded random weights '
        "(Qwen3-VL folders)",
        "tokenizer_path": '"" = encoder_path',
        "checkpoint_dir": "the video VAE that encodes keyframes: h3_vae's (checkpoint_dir, trust_remote_code)",
        "config_name": "h3_dit's: a canvas inferred from a keyframe has about its default canvas area",
        "max_height": "h3_dit's limits: a canvas inferred from a keyframe stays within them",
        "max_reference_images": "ref2va: files per kind and references + guides in all; audio seconds per file "
        "and in all; video seconds (h3_core.inputs.references); a request refused with INVALID_ARG before any VAE runs",
        "max_batch_rows": "h3_dit's, with max_request_mb: a request whose rows or memory (conditions included) pass "
        "them is refused here",
        "media_workers": "threads decoding requests' files apart from the text encoder (one request each: a request "
        "without files never waits behind another's); with max_decoded_pixels (images and video frames at their "
        "stored size) and max_decoded_samples (audio per channel at 32 kHz), one request's decode budget, they bound "
        "the decoded media held at once: media_workers x (3 B x pixels + 8 B x samples), 1.5 GB as shipped",
        "max_image_bytes": "a keyframe file beyond these limits is refused with INVALID_ARG before any model "
        "runs (h3_core.inputs.images): bytes, pixels (width x height, read from the header: no decompression bomb is "
        "decoded), each side's pixels, long side / short side",
    },
    DitSettings.MODEL: {
        "cpu_threads": CPU_THREADS_COMMENT,
        "loras": '"" or NAME=PATH pairs, comma-separated: LoRA adapters loaded at start (safetensors files on the '
        "server's disk, relative to the folder above this repository); load and unload more at run time with the "
        "control requests of h3_cancel (docs/lora.md)",
        "max_loras": "LoRA adapters held at once (a load beyond them is refused); -1: as many as loras names (none "
        "without); server.sizing reserves their memory",
        "max_lora_rank": "the largest LoRA rank a load may have (a qkv_proj's per part); sizing reserves max_loras "
        "adapters of this rank on every linear",
        "allow_fault_injection": '"true" lets the test-only request parameter inject_fault act; "false" refuses it '
        "(INVALID_ARG)",
        "execute_budget_s": "seconds one execute() may keep taking steps while nothing announced is headed for the "
        "DiT, and at least 2 steps (0 = one step per execute): the Triton round trip between executes is paid once "
        "for them; newcomers and cancels (h3_cancel's, h3_vae's) are announced and wait at most the step in flight, "
        "a control request sent straight to h3_dit up to this long plus one step, or 2 steps where those are longer",
        "heartbeat_s": "seconds of silence toward a live request after which it gets a heartbeat (h3_vae notices a "
        "gone client only when a response for it arrives): a client that asked for no progress is noticed gone "
        "within this plus one step",
        "max_wait_s": "seconds a request may wait for a step (since its arrival or its last step) before it ranks "
        "before every request that has not waited that long, whatever the policy and the priorities: the longest "
        "wait, h3_core.serving.dit.scheduler",
        "max_batch_rows_by_gpu": '"" or GPU:ROWS pairs: the h3_dit instance on a listed GPU packs up to its own rows '
        "(sized from that GPU's memory); max_batch_rows stays the largest request, which every instance takes",
        "priority_max": "request_priority lies in -priority_max..priority_max (higher runs first under srpt)",
        "tasks": "the tasks this instance's transformer serves (comma-separated t2va, fl2va, ref2va); a request of "
        "another task is refused with INVALID_ARG: one instance loads one transformer, so requests of different "
        "transformers never share a pack",
        "sp_degree": "devices each packed forward runs on (sequence parallelism, h3_core.parallel): 1 = in "
        "this instance's process; N > 1 = N worker processes this instance starts, on cuda its own GPU and the next "
        "N - 1; N must divide the config's attention heads",
        "quantization": "none, or fp8: the DiT blocks' linears in float8 e4m3 (per-channel weight and per-row "
        "activation scales, h3_core.model.fp8; about 44 GiB of weights instead of 62 for the h3 config; needs a GPU "
        "of compute capability >= 8.9, or the CPU for tests)",
        "adaln_weights": "device, or host: the AdaLN projection weights (24.3 GiB for the h3 config) stay in pinned "
        "host memory, streamed to the GPU once per AdaLN table fill, a request's whole schedule at its admission "
        "(h3_core.model.adaln_table); host needs sp_degree 1 and adaln_table_values of at least 2 x max_steps + 2",
        "adaln_table_values": "timestep values whose AdaLN projections the DiT keeps (sp_degree 1; about 9.7 MB a "
        "value for the h3 config, h3_core.model.adaln_table): each distinct timestep's projections are computed once, "
        "not once per step; 0 = off",
        "gpu_turns": '"true" (cuda, sp_degree 1): each packed step takes its GPU\'s turn, so that an h3_vae with '
        "gpu_turns on the same GPU decodes only between steps (h3_core.serving.shared.gpu_turns)",
        "ref_kv_refresh": "a request's k when it sends none: a ref2va request computes its reference rows on its "
        "steps s with s % k == 0 and reuses their keys and values on the others (h3_core.model.reference_kv); "
        "1 = every step computed (exact)",
        "max_ref_kv_refresh": "the largest ref_kv_refresh a request may send (sp_degree 1); 1 = off. Above 1 every "
        "held request may keep num_layers x 2 x attn_width values a reference row (1.37 MiB for the h3 config in "
        "bf16), which server.sizing counts against max_batch_rows",
    },
    VaeSettings.MODEL: {
        "cpu_threads": CPU_THREADS_COMMENT,
        "allow_fault_injection": FAULTS_COMMENT,
        "decode_workers": "threads decoding different requests at once (one request's outputs stay in order)",
        "max_queued_decodes": "results that may wait for a decode worker; one beyond is refused at once with "
        "UNAVAILABLE",
        "max_height": "the canvas a result may have (h3_dit's limits; a direct caller's INFO is checked too)",
        "heartbeat_s": "seconds without a response after which a decode (queued or running) sends its client a "
        "keep-alive response; keep it under the idle timeout of any proxy in front of the server",
        "gpu_turns": '"true" (a CUDA device): decode in tiles that take turns with the steps of the h3_dit '
        "instances on the same GPU (which set gpu_turns too) instead of time-slicing it with them "
        "(h3_core.serving.shared.gpu_turns)",
        "turn_share": "the fraction of the last DiT step's seconds that a turn of decode tiles may last while a "
        "DiT step waits for the GPU",
    },
}
PROMPT_INPUTS = """\
  # PROMPT is required; it is marked optional so that h3_encoder refuses a missing one with
  # INVALID_ARG (for a missing required input the 2.51 ensemble sends an empty final response)
  { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "HEIGHT" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "WIDTH" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "NUM_FRAMES" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "NUM_INFERENCE_STEPS" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "SEED" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "NUM_OUTPUTS" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  # a request's own sigma lists, NUM_INFERENCE_STEPS + 1 values from 1 down to 0 (docs/model.md 3.1)
  { name: "VIDEO_SIGMAS" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
  { name: "AUDIO_SIGMAS" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
  # the request's LoRA adapters, a JSON array of {"name", "scale"} (docs/lora.md)
  { name: "LORA" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  # fl2va: KEYFRAMES = 1 or 2 encoded images (PNG, JPEG, WebP files), KEYFRAME_INDICES the frame each
  # conditions (0 first, -1 last); TASK t2va | fl2va (without it the task follows the inputs)
  { name: "TASK" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "KEYFRAMES" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "KEYFRAME_INDICES" data_type: TYPE_INT64 dims: [ -1 ] optional: true },
  # ref2va: REFERENCE_IMAGES (PNG, JPEG, WebP), REFERENCE_VIDEOS (MP4), REFERENCE_AUDIO (WAV, FLAC,
  # MP3) files, GUIDES (images) with GUIDE_FRAMES, the frame each should appear at
  { name: "REFERENCE_IMAGES" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "REFERENCE_VIDEOS" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "REFERENCE_AUDIO" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "GUIDES" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "GUIDE_FRAMES" data_type: TYPE_INT64 dims: [ -1 ] optional: true },
  # REFERENCES: the reference files' block order, each video's start_time_seconds and whether its
  # audio is used (JSON, h3_core.protocol.reference_list)
  { name: "REFERENCES" data_type: TYPE_STRING dims: [ 1 ] optional: true }
"""
MEDIA_OUTPUTS = """\
  { name: "VIDEO_MP4" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "FRAMES" data_type: TYPE_UINT8 dims: [ -1, -1, -1, 3 ] },
  { name: "AUDIO" data_type: TYPE_FP32 dims: [ -1, -1 ] },
"""
DIT_OUTPUTS = """\
  { name: "VIDEO_LATENT" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1 ] },
  { name: "AUDIO_LATENT" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] },
  { name: "PROGRESS" data_type: TYPE_INT32 dims: [ 3 ] },
  { name: "PREVIEW" data_type: TYPE_UINT8 dims: [ -1, -1, 3 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
"""
PASSED_ON = """\
  { name: "PROGRESS" data_type: TYPE_INT32 dims: [ 3 ] },
  { name: "PREVIEW" data_type: TYPE_UINT8 dims: [ -1, -1, 3 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
"""
ENCODER_HEAD = f"""\
# Text encoder: PROMPT -> TEXT_EMBEDS [L, width] (MiniLM-L6 token states), and the optional
# request fields -> REQUEST (JSON: the fields present + encode_seconds). The DiT thus always
# receives the same two inputs: Triton batches only requests with identical input sets, so
# optional inputs passed to the DiT directly would split the pack.
name: "h3_encoder"
backend: "python"
max_batch_size: 1
input [
{PROMPT_INPUTS}]
output [
  {{ name: "TEXT_EMBEDS" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "CONDITION_LATENTS" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "REQUEST" data_type: TYPE_STRING dims: [ 1 ] }}
]
# Decoupled: a request with files is decoded by a media worker (media_workers) while requests
# without files are encoded at once; each request gets one response, its final one.
model_transaction_policy {{ decoupled: true }}
"""
DIT_INTRO = """\
# The H3 DiT with diffusion continuous batching. Decoupled; Triton's iterative sequence batcher
# hands every live request to each execute(), which runs packed steps, each ONE forward for the
# requests the scheduling policy advances, as many as fit execute_budget_s while no newcomer or
# cancel is announced (h3_core.serving.shared.registry), and reschedules the unfinished ones.
#
# REQUEST is JSON: the request fields present (height, width, num_frames, num_inference_steps,
# seed, num_outputs, video_sigmas, audio_sigmas), encode_seconds, received_unix_s and for fl2va /
# ref2va task, conditions, vision_spans, geometry, and outside_training when the prompt has words
# the weights were not trained on (the keys h3_encoder writes; any other key is refused), or
# {"cancel_request_id": ID} (ID a non-empty string, no other key) for a control request that cancels
# the request with that id. Every request has the same three inputs because Triton batches only
# requests with identical input sets; TEXT_EMBEDS is ragged (prompts differ in token count):
# [1, L >= 1, text_dim] for a generation request, [1, 0, 0] for a control request;
# CONDITION_LATENTS [1, N], the condition blocks' clean latents flattened, [1, 0] without any.
#
"""
DIT_IDLE = (
    "max_sequence_idle_microseconds must exceed the longest execute(), or Triton reaps the other live "
    "sequences during it and their clients hang: in step mode that is execute_budget_s or 2 steps, whichever "
    "is longer, plus one step at max_batch_rows (the settings refuse a budget of half the timeout or more); in request "
    "mode a whole generation, max_steps x the worst single-request step (waiting requests are only "
    "rescheduled when it ends). A larger value delays the release of slots whose clients vanished. Here "
    "(server.sizing.idle_timeout): "
)
DIT_IO = f"""\
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "TEXT_EMBEDS" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }},
  {{ name: "CONDITION_LATENTS" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "REQUEST" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [
{DIT_OUTPUTS}]
"""
VAE_HEAD = f"""\
# VAE: final VIDEO_LATENT + AUDIO_LATENT -> VIDEO_MP4 (H.264 + AAC), plus raw FRAMES / AUDIO when the
# request parameters return_frames / return_audio are true (through the ensemble, Triton 2.51 asks
# a composing model for every mapped output, so the client's output list cannot be seen here).
# Empty latents (a progress response) give empty outputs at once. PROGRESS, PREVIEW and INFO pass
# through: every output of a 2.51 ensemble must come from one decoupled model (this one).
name: "h3_vae"
backend: "python"
max_batch_size: 1
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "VIDEO_LATENT" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1 ] }},
  {{ name: "AUDIO_LATENT" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }},
{PASSED_ON}]
output [
{MEDIA_OUTPUTS}{PASSED_ON}]
"""
CANCEL_TEXT = """\
# Cancel by id, answered at once from the registry shared by the DiT instances
# (h3_core.serving.shared.registry): clients send their cancels here, not to h3_dit, whose execute may run
# a whole generation (execution mode "request"). REQUEST is {"cancel_request_id": ID} (ID a
# non-empty string, no other key); INFO is {"kind": "cancel", "request_id": ID, "state":
# "cancelled" | "finished" | "unknown"}. One CPU instance on every device: it computes nothing.
name: "h3_cancel"
backend: "python"
max_batch_size: 1
input [
  { name: "REQUEST" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PIPELINE_TEXT = f"""\
# The entry point users call: h3_encoder -> h3_dit -> h3_vae. Stream it over gRPC.
# Every DiT response (progress or result) reaches h3_vae; progress responses carry empty
# VIDEO_LATENT / AUDIO_LATENT and come back at once with empty VIDEO_MP4 / FRAMES / AUDIO.
# h3_vae passes PROGRESS / PREVIEW / INFO through: 2.51 requires all outputs of an ensemble to
# come from one decoupled model.
name: "h3_pipeline"
platform: "ensemble"
max_batch_size: 1
input [
{PROMPT_INPUTS}]
output [
{MEDIA_OUTPUTS}{PASSED_ON}]
ensemble_scheduling {{
  step [
    {{
      model_name: "h3_encoder"
      model_version: -1
      input_map {{ key: "PROMPT" value: "PROMPT" }}
      input_map {{ key: "HEIGHT" value: "HEIGHT" }}
      input_map {{ key: "WIDTH" value: "WIDTH" }}
      input_map {{ key: "NUM_FRAMES" value: "NUM_FRAMES" }}
      input_map {{ key: "NUM_INFERENCE_STEPS" value: "NUM_INFERENCE_STEPS" }}
      input_map {{ key: "SEED" value: "SEED" }}
      input_map {{ key: "NUM_OUTPUTS" value: "NUM_OUTPUTS" }}
      input_map {{ key: "VIDEO_SIGMAS" value: "VIDEO_SIGMAS" }}
      input_map {{ key: "AUDIO_SIGMAS" value: "AUDIO_SIGMAS" }}
      input_map {{ key: "LORA" value: "LORA" }}
      input_map {{ key: "TASK" value: "TASK" }}
      input_map {{ key: "KEYFRAMES" value: "KEYFRAMES" }}
      input_map {{ key: "KEYFRAME_INDICES" value: "KEYFRAME_INDICES" }}
      input_map {{ key: "REFERENCE_IMAGES" value: "REFERENCE_IMAGES" }}
      input_map {{ key: "REFERENCE_VIDEOS" value: "REFERENCE_VIDEOS" }}
      input_map {{ key: "REFERENCE_AUDIO" value: "REFERENCE_AUDIO" }}
      input_map {{ key: "GUIDES" value: "GUIDES" }}
      input_map {{ key: "GUIDE_FRAMES" value: "GUIDE_FRAMES" }}
      input_map {{ key: "REFERENCES" value: "REFERENCES" }}
      output_map {{ key: "TEXT_EMBEDS" value: "text_embeds" }}
      output_map {{ key: "CONDITION_LATENTS" value: "condition_latents" }}
      output_map {{ key: "REQUEST" value: "request" }}
    }},
    {{
      model_name: "h3_dit"
      model_version: -1
      input_map {{ key: "TEXT_EMBEDS" value: "text_embeds" }}
      input_map {{ key: "CONDITION_LATENTS" value: "condition_latents" }}
      input_map {{ key: "REQUEST" value: "request" }}
      output_map {{ key: "VIDEO_LATENT" value: "video_latent" }}
      output_map {{ key: "AUDIO_LATENT" value: "audio_latent" }}
      output_map {{ key: "PROGRESS" value: "dit_progress" }}
      output_map {{ key: "PREVIEW" value: "dit_preview" }}
      output_map {{ key: "INFO" value: "dit_info" }}
    }},
    {{
      model_name: "h3_vae"
      model_version: -1
      input_map {{ key: "VIDEO_LATENT" value: "video_latent" }}
      input_map {{ key: "AUDIO_LATENT" value: "audio_latent" }}
      input_map {{ key: "PROGRESS" value: "dit_progress" }}
      input_map {{ key: "PREVIEW" value: "dit_preview" }}
      input_map {{ key: "INFO" value: "dit_info" }}
      output_map {{ key: "VIDEO_MP4" value: "VIDEO_MP4" }}
      output_map {{ key: "FRAMES" value: "FRAMES" }}
      output_map {{ key: "AUDIO" value: "AUDIO" }}
      output_map {{ key: "PROGRESS" value: "PROGRESS" }}
      output_map {{ key: "PREVIEW" value: "PREVIEW" }}
      output_map {{ key: "INFO" value: "INFO" }}
    }}
  ]
}}
"""


def _comment(text: str, indent: str = "") -> str:
    """`text` as '# ' comment lines of at most 100 characters (its own line breaks kept)."""
    lines = []
    for paragraph in text.split("\n"):
        lines += textwrap.wrap(paragraph, 100 - len(indent) - 2, break_on_hyphens=False) or [""]
    return "".join(f"{indent}# {line}".rstrip() + "\n" for line in lines)


def _quoted(value: str) -> str:
    """A protobuf text-format string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parameters(settings, comments: Mapping[str, str]) -> str:
    """The parameters block: every settings key in field order, each after its comment."""
    items = list(settings.to_parameters().items())
    lines = "".join(
        f"{_comment(comments[key], '  ') if key in comments else ''}"
        f"  {{ key: {_quoted(key)} value: {{ string_value: {_quoted(value)} }} }}"
        f"{',' if index < len(items) - 1 else ''}\n"
        for index, (key, value) in enumerate(items)
    )
    return f"parameters [\n{lines}]\n"


def _request_mb_comment(dit: DitSettings, encoder: EncoderSettings) -> str:
    """The max_request_mb comment: what the largest canvas the limits allow needs."""
    hidden = get_config(dit.config_name).hidden_size
    rows = make_layout(encoder.max_tokens, dit.max_height, dit.max_width, dit.max_num_frames).seq_len
    cached = dit.max_cache_threshold > 0
    one = request_memory_mb(dit.max_height, dit.max_width, dit.max_num_frames, rows, hidden, step_cache=cached)
    every = request_memory_mb(
        dit.max_height, dit.max_width, dit.max_num_frames, rows * dit.max_outputs, hidden, step_cache=cached
    )
    return (
        "estimated peak MiB one request may add (h3_core.diffusion.request.request_memory_mb: DiT rows + one "
        f"output's VAE decode{' + its step cache' if cached else ''}); the largest canvas the limits above allow "
        f"({dit.max_width} x {dit.max_height} px, "
        f"{dit.max_num_frames} frames, a {encoder.max_tokens}-token prompt: {rows:,} rows) needs {one} with one "
        f"output, {every} with {dit.max_outputs}"
    )


def config_texts(repository: Repository) -> dict[str, str]:
    """Model name -> its config.pbtxt text (h3_encoder, h3_dit, h3_vae, h3_pipeline, h3_cancel).
    Pure."""
    dit, encoder, groups = repository.dit, repository.encoder, repository.groups
    slots = (
        f"max_batch_size = sequence slots = max_num_seqs + max_waiting + {CONTROL_SLOTS} control slots "
        f"({dit.max_num_seqs} + {dit.max_waiting} + {CONTROL_SLOTS}): the scheduler holds at most max_num_seqs + "
        "max_waiting requests (h3_core/serving/dit/scheduler.py, Admission). Requests beyond the slots wait in "
        "Triton's backlog, which the model cannot see."
    )
    dit_text = (
        DIT_INTRO
        + _comment(slots)
        + _comment(DIT_IDLE + repository.idle_reason)
        + f'name: "{DitSettings.MODEL}"\nbackend: "python"\nmax_batch_size: {dit.sequence_slots}\n'
        + DIT_IO
        + "sequence_batching {\n  iterative_sequence: true\n"
        + f"  max_sequence_idle_microseconds: {repository.idle_microseconds}\n  direct {{ }}\n}}\n"
        + groups[DitSettings.MODEL].text()
        + "\n"
        + _parameters(dit, {**COMMENTS[DitSettings.MODEL], "max_request_mb": _request_mb_comment(dit, encoder)})
    )
    return {
        EncoderSettings.MODEL: ENCODER_HEAD
        + groups[EncoderSettings.MODEL].text()
        + "\n"
        + _parameters(encoder, COMMENTS[EncoderSettings.MODEL]),
        DitSettings.MODEL: dit_text,
        VaeSettings.MODEL: VAE_HEAD
        + groups[VaeSettings.MODEL].text()
        + "\n"
        + _parameters(repository.vae, COMMENTS[VaeSettings.MODEL]),
        PIPELINE: PIPELINE_TEXT,
        CANCEL_MODEL: CANCEL_TEXT,
    }
