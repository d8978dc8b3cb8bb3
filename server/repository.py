"""The one model-repository writer. Every repository is written here: model_repository/ itself (the
shipped CPU repository, the writer's output for the defaults: tests/test_repository.py checks it
byte for byte), the demo repository (`make demo`), the tests' copies (tests/serving.py), the
benchmarks' copies (benchmarks/served_bench.py) and the GPU repositories (`make serve-gpu`).

    python -m server.repository TARGET [--config NAME] [--checkpoint DIR] [--device {cpu,cuda,auto}]
                                [--gpus all|0,1] [--placement shared|own|cpu] [--dit-instances N]
                                [--set MODEL.KEY=VALUE ...] [--unsized]
    python -m server.repository model_repository --unsized     # rewrites the shipped repository
    python -m server.repository --plan     # the official checkpoint on 1, 2, 4, 8 H200s (server.deploy_plan)

A repository is a `Repository`: the settings of h3_encoder, h3_dit and h3_vae (h3_core.serving.settings;
each config.pbtxt gets every key of its model's `parameters`), each model's instance group
(`instance_groups`, the one function that places the models) and h3_dit's
max_sequence_idle_microseconds; h3_dit's max_batch_size is its sequence slots. `plan` builds one
from a config name, a checkpoint folder, a device, the GPUs, the number of CPU DiT instances and
explicit overrides, and sizes from a `server.sizing.Machine` what was not given (cpu_threads, on
cuda max_batch_rows and max_request_mb); without a machine (the tests' copies, the shipped
repository) the settings' defaults stay. On cuda it also raises h3_dit's canvas limits to the
config's default canvas, sets execute_budget_s to sizing.GPU_EXECUTE_BUDGET_S (1 s) and derives
the idle timeout from the longest step (server.sizing).
`config_texts` turns a Repository into config.pbtxt texts, with their explanatory comments;
`write_repository` writes a folder.

Checkpoint paths: the models resolve a relative checkpoint_dir against the folder above their
repository (server.adapter.resolve_path), so a relative path is relative to the project root
(ROOT); model_repository/ keeps it relative, every other repository gets it absolute. The CLI
reads a relative --checkpoint against the current directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from h3_core.config import get_config
from h3_core.diffusion.layout import make_layout
from h3_core.diffusion.request import request_memory_mb
from h3_core.model.dit import GRAPH_MAX_ROWS
from h3_core.model.encoder import (
    QWEN3VL,
    QWEN3VL_H3_LAYER,
    drawn_weight_bytes,
    minilm_path,
    model_type,
    text_width,
    weight_bytes,
)
from h3_core.parallel.ulysses import check_sp_degree
from h3_core.parallel.workers import SP_TIMEOUT_FRACTION
from h3_core.protocol import CANCEL_MODEL
from h3_core.serving.settings import CONTROL_SLOTS, DitSettings, EncoderSettings, VaeSettings
from h3_core.weights.checkpoint import (
    AUDIO_VAE_FILE,
    DIT_FILE,
    TRANSFORMER_FOLDER,
    VIDEO_VAE_FILE,
    check_transformer_config,
    official_tensor_files,
    source_seed,
)
from h3_core.weights.official_checkpoint import TEXT_ENCODER, TOKENIZER, is_official
from h3_core.weights.vae_hook import check_official_vaes, is_official_vae_folder

from . import sizing
from .options import DEVICES, PLACEMENTS, add_arguments, given_options

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "model_repository"
DEMO_CONFIG = "demo"  # the trained demo model's config
DEMO_WEIGHTS = ROOT / "weights" / DEMO_CONFIG
SETTINGS = {cls.MODEL: cls for cls in (EncoderSettings, DitSettings, VaeSettings)}
CANVAS_KEYS = ("max_height", "max_width", "max_num_frames")  # h3_vae's are h3_dit's unless given
PIPELINE = "h3_pipeline"
MINILM_WIDTH = 384  # width of the token states of h3_core.model.encoder's default text encoder
CPU_GROUP, GPU_GROUP = "KIND_CPU", "KIND_GPU"


@dataclass(frozen=True)
class InstanceGroup:
    """One Triton instance_group entry: `count` instances of `kind`, on each GPU of `gpus`."""

    kind: str
    count: int = 1
    gpus: tuple[int, ...] = ()

    @property
    def instances(self) -> int:
        """Model instances (processes) this group starts: count on each listed GPU."""
        return self.count * max(1, len(self.gpus))

    def text(self) -> str:
        gpus = f" gpus: [ {', '.join(map(str, self.gpus))} ]" if self.gpus else ""
        return f"instance_group [ {{ kind: {self.kind} count: {self.count}{gpus} }} ]"


@dataclass(frozen=True)
class Repository:
    """What varies between repositories. `notes`: what plan() sized and why (not written)."""

    encoder: EncoderSettings
    dit: DitSettings
    vae: VaeSettings
    groups: Mapping[str, InstanceGroup]
    idle_microseconds: int
    idle_reason: str
    notes: tuple[str, ...] = field(default=(), compare=False)


def side_gpu(gpus: Sequence[int], placement: str) -> int | None:
    """The GPU h3_encoder and h3_vae run on under `placement` (PLACEMENTS): gpus[0] shared,
    gpus[-1] own, None for cpu."""
    return {"shared": gpus[0], "own": gpus[-1], "cpu": None}[placement]


def dit_gpus(gpus: Sequence[int], placement: str) -> list[int]:
    """The GPUs of `gpus` that h3_dit runs on: all but the last under placement own."""
    return list(gpus[:-1] if placement == "own" else gpus)


def instance_groups(
    device: str, gpus: Sequence[int] = (), dit_instances: int = 1, sp_degree: int = 1, placement: str = "shared"
) -> dict[str, InstanceGroup]:
    """Where each python model runs. cpu: KIND_CPU, `dit_instances` of h3_dit (each running its
    steps over sp_degree worker processes when sp_degree > 1), one h3_encoder and one h3_vae.
    cuda: h3_dit's GPUs (dit_gpus: every GPU, or all but the last under placement own) in groups
    of sp_degree consecutive indices, one h3_dit instance on the first GPU of each group (count 1
    with the gpus list means one instance per listed GPU), which drives its group
    (h3_core.parallel.workers.rank_devices: its own GPU and the next sp_degree - 1), so instances
    x sp_degree = h3_dit's GPUs; one h3_encoder and one h3_vae, KIND_GPU on side_gpu (shared:
    gpus[0], beside an h3_dit instance; own: gpus[-1], alone) or KIND_CPU (placement cpu). Their
    device settings follow the group (plan()).
    Raises ValueError for an unknown device or placement, dit_instances < 1, GPUs on the CPU, no
    GPU, placement own with one GPU, dit_instances != 1 on cuda (there the DiT instances are the
    GPUs), or GPUs that do not fall into groups of sp_degree consecutive indices."""
    if device == "cpu":
        if gpus:
            raise ValueError("GPUs were given for --device cpu; use --device cuda")
        if dit_instances < 1:
            raise ValueError(f"dit_instances={dit_instances} is out of range: allowed >= 1")
        return {
            EncoderSettings.MODEL: InstanceGroup(CPU_GROUP),
            DitSettings.MODEL: InstanceGroup(CPU_GROUP, dit_instances),
            VaeSettings.MODEL: InstanceGroup(CPU_GROUP),
        }
    if device != "cuda":
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    if not gpus:
        raise ValueError("--device cuda needs at least one GPU")
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r} is not one of {PLACEMENTS}")
    if placement == "own" and len(gpus) < 2:
        raise ValueError(
            f"--placement own needs at least 2 GPUs (h3_encoder and h3_vae take the last, h3_dit the others), "
            f"got {list(gpus)}"
        )
    side, gpus = side_gpu(gpus, placement), dit_gpus(gpus, placement)
    if dit_instances != 1:
        raise ValueError(
            f"dit_instances={dit_instances}: on cuda h3_dit has one instance per GPU; choose them with --gpus"
        )
    if len(gpus) % sp_degree:
        raise ValueError(
            f"h3_dit parameter sp_degree={sp_degree} does not divide the {len(gpus)} GPUs {list(gpus)}: each "
            "h3_dit instance drives sp_degree GPUs"
        )
    groups = [list(gpus[start : start + sp_degree]) for start in range(0, len(gpus), sp_degree)]
    for group in groups:
        if group != list(range(group[0], group[0] + sp_degree)):
            raise ValueError(
                f"GPUs {group} are not consecutive: with sp_degree={sp_degree} an h3_dit instance drives "
                f"{sp_degree} consecutive GPUs from its own; list the GPUs in such groups (e.g. --gpus all)"
            )
    beside = InstanceGroup(CPU_GROUP) if side is None else InstanceGroup(GPU_GROUP, 1, (side,))
    return {
        EncoderSettings.MODEL: beside,
        DitSettings.MODEL: InstanceGroup(GPU_GROUP, 1, tuple(group[0] for group in groups)),
        VaeSettings.MODEL: beside,
    }


def _text(value) -> str:
    """An override value as a config.pbtxt string (booleans as "true" / "false")."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def plan(
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    device: str = "cpu",
    gpus: Sequence[int] = (),
    dit_instances: int = 1,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    machine: sizing.Machine | None = None,
    idle_timeout_s: float | None = None,
    placement: str | None = None,
    text_encoder_bytes: int | None = None,
) -> Repository:
    """The Repository serving DiT config `config` (h3_core.config) from `checkpoint` (a folder
    holding CHECKPOINT_FILES; default checkpoints/<config>, relative to ROOT) on `device` ("cpu"
    or "cuda" with the CUDA indices `gpus`), with `dit_instances` CPU DiT instances.

    overrides = {model: {key: value}} set any settings key of h3_encoder, h3_dit or h3_vae
    (str() applied, booleans as "true" / "false") and win over everything sized. With `machine`,
    cpu_threads = sizing.cpu_threads(cores, model processes) and, on cuda, max_batch_rows from
    each GPU's free memory (server.sizing). On cuda, also without a machine: h3_dit's
    max_height, max_width and max_num_frames become at least the config's default canvas
    (the larger of its default height and width on both axes; h3_vae's canvas limits are always
    h3_dit's unless given, CANVAS_KEYS), row_budget at most
    max_batch_rows, and max_request_mb = request_memory_mb of a max_batch_rows request at the
    largest canvas, with the CPU constant that Engine.prepare applies, so that it refuses no
    request the row and canvas limits admit, and execute_budget_s = sizing.GPU_EXECUTE_BUDGET_S
    (several steps per execute while nothing is announced for the DiT). idle_timeout_s replaces the sized
    max_sequence_idle_microseconds (sizing.idle_timeout). h3_dit.sp_degree (an override; it must
    divide the config's heads) makes each h3_dit instance drive that many devices
    (instance_groups places them; cpu_threads counts each instance's workers).

    placement (cuda only, PLACEMENTS): where h3_encoder and h3_vae run, their instance groups and
    device settings: shared (the first GPU, beside an h3_dit instance), own (the last GPU, without
    one) or cpu. None chooses (default_placement, its reason the first note). With a machine each
    h3_dit instance's rows come from its own GPU (the text encoder's weights and the decode
    reserve taken off the GPU holding them): max_batch_rows is the least over the instances (the
    largest request, which every instance must take), max_batch_rows_by_gpu each instance's where
    they differ. text_encoder_bytes: the text encoder's weight bytes where its folder is not at hand
    (server.repository --plan); None reads them from its safetensors headers
    (h3_core.model.encoder.weight_bytes), and only then is its width checked.
    Raises ValueError for an unknown config, device, model or key, a value the settings refuse
    (h3_core.serving.settings messages), bad GPUs or instances, a text encoder of another width than the
    config's text_dim (check_text_width), or a GPU where the DiT does not fit."""
    cfg = get_config(config)
    unknown = sorted(set(overrides or {}) - set(SETTINGS))
    if unknown:
        raise ValueError(f"no model {unknown[0]!r} to set: choose one of {sorted(SETTINGS)}")
    given = {
        model: {key: _text(value) for key, value in (overrides or {}).get(model, {}).items()} for model in SETTINGS
    }
    try:
        sp_degree = int(given[DitSettings.MODEL].get("sp_degree", "1"))
    except ValueError:
        raise ValueError(
            f"h3_dit parameter sp_degree={given[DitSettings.MODEL]['sp_degree']!r} is not a valid int"
        ) from None
    check_sp_degree(cfg, sp_degree)
    if device != "cuda" and placement is not None:
        raise ValueError(f"--placement {placement} places h3_encoder and h3_vae beside GPUs: it needs --device cuda")
    if device == "cuda" and placement is None:
        return default_placement(
            gpus,
            machine,
            request_rows(cfg),
            lambda chosen: plan(
                config,
                checkpoint,
                device,
                gpus,
                dit_instances,
                overrides,
                machine,
                idle_timeout_s,
                chosen,
                text_encoder_bytes,
            ),
        )
    groups = instance_groups(device, gpus, dit_instances, sp_degree, placement or "shared")
    checkpoint = str(Path("checkpoints") / config if checkpoint is None else checkpoint)
    side = None if device == "cpu" else side_gpu(gpus, placement)
    vae_device = "cpu" if side is None else f"cuda:{side}"
    values = {
        EncoderSettings.MODEL: EncoderSettings().to_parameters(),
        DitSettings.MODEL: DitSettings(config_name=config, checkpoint_dir=checkpoint, device=device).to_parameters(),
        VaeSettings.MODEL: VaeSettings(checkpoint_dir=checkpoint, device=vae_device).to_parameters(),
    }
    notes, dit_values = [], values[DitSettings.MODEL]

    def size(model: str, key: str, value, why: str) -> None:
        if key in given[model]:
            notes.append(f"{model}.{key} {given[model][key]}: given (sized it would be {value}: {why})")
        else:
            values[model][key] = _text(value)
            notes.append(f"{model}.{key} {_text(value)}: {why}")

    if device == "cuda":
        side = max(int(dit_values["max_height"]), cfg.default_height, cfg.default_width)
        frames = max(int(dit_values["max_num_frames"]), cfg.default_num_frames)
        canvas = (
            f"at least the {config} config's default canvas ({cfg.default_width} x {cfg.default_height} px, "
            f"{cfg.default_num_frames} frames) on both axes"
        )
        size(DitSettings.MODEL, "max_height", side, canvas)
        size(DitSettings.MODEL, "max_width", max(int(dit_values["max_width"]), side), canvas)
        size(DitSettings.MODEL, "max_num_frames", frames, canvas)
    if device == "cuda":
        size(EncoderSettings.MODEL, "device", vae_device, f"placement {placement}: {PLACED[placement]}")
        vae_on_gpu = given[VaeSettings.MODEL].get("device", vae_device).startswith("cuda")
        if placement == "shared" and sp_degree == 1 and vae_on_gpu:
            turns = (
                "h3_vae shares its GPU with an h3_dit instance: its decode tiles take turns with the DiT steps "
                "there instead of time-slicing the GPU, which made those steps 2.1x slower "
                "(h3_core.serving.gpu_turns, docs/deploy_h200.md)"
            )
            size(VaeSettings.MODEL, "gpu_turns", True, turns)
            size(DitSettings.MODEL, "gpu_turns", True, turns)
        size(
            DitSettings.MODEL,
            "execute_budget_s",
            sizing.GPU_EXECUTE_BUDGET_S,
            "steps per execute while nothing is announced for the DiT: the Triton round trip costs at most 1.2% "
            "of the step time; a control request sent straight to h3_dit waits at most this plus one step "
            "(server.sizing)",
        )
    folder = Path(checkpoint) if Path(checkpoint).is_absolute() else ROOT / checkpoint
    if is_official(folder):
        official = "the official checkpoint's"
        size(EncoderSettings.MODEL, "encoder_path", str(folder / TEXT_ENCODER), f"{official} text encoder (Qwen3-VL)")
        size(EncoderSettings.MODEL, "tokenizer_path", str(folder / TOKENIZER), f"{official} tokenizer")
        size(
            EncoderSettings.MODEL,
            "hidden_layer",
            QWEN3VL_H3_LAYER,
            "H3 conditions on hidden_states[50], the residual stream after Qwen3-VL decoder layer 49"
            " (docs/model.md §4.1)",
        )
    if config == DEMO_CONFIG:  # the demo model's clips last under a second (docs/demo_model.md)
        for key, value in (
            ("min_audio_s", 0.25),
            ("max_audio_s", 2.0),
            ("max_total_audio_s", 2.0),
            ("max_video_s", 2.0),
        ):
            size(EncoderSettings.MODEL, key, value, "reference media of the length of the demo model's clips (< 1 s)")
    dit_instances = groups[DitSettings.MODEL].instances
    if sp_degree > 1:
        drives = "; ".join(
            f"the instance on GPU {first} drives GPUs {list(range(first, first + sp_degree))}"
            for first in groups[DitSettings.MODEL].gpus
        )
        notes.append(
            f"h3_dit.sp_degree {sp_degree}: each of the {dit_instances} h3_dit instances runs its steps over "
            f"{sp_degree} worker processes (sequence parallelism)" + (f": {drives}" if device == "cuda" else "")
        )
    if machine is not None:  # a sequence-parallel h3_dit instance computes in its sp_degree workers
        processes = sum(group.instances for group in groups.values()) + dit_instances * (sp_degree - 1)
        threads = sizing.cpu_threads(machine.cores, processes)
        for model in SETTINGS:
            size(model, "cpu_threads", threads, f"{machine.cores} cores / {processes} model processes")
    for model in SETTINGS:
        values[model].update(given[model])
    for key in CANVAS_KEYS:  # h3_vae checks each result's canvas against the DiT's limits
        if key not in given[VaeSettings.MODEL]:
            values[VaeSettings.MODEL][key] = dit_values[key]
    # h3_encoder infers a keyframe request's canvas within the DiT's limits and encodes keyframes with
    # h3_vae's video VAE
    copied = {
        "max_height": dit_values["max_height"],
        "max_width": dit_values["max_width"],
        "max_batch_rows": dit_values["max_batch_rows"],
        "max_request_mb": dit_values["max_request_mb"],
        "tasks": dit_values["tasks"],
        "config_name": dit_values["config_name"],
        "checkpoint_dir": values[VaeSettings.MODEL]["checkpoint_dir"],
        "trust_remote_code": values[VaeSettings.MODEL]["trust_remote_code"],
    }
    for key, value in copied.items():
        if key not in given[EncoderSettings.MODEL]:
            values[EncoderSettings.MODEL][key] = value
    encoder = EncoderSettings.from_parameters(values[EncoderSettings.MODEL])
    if is_official(folder):  # a checkpoint of another config is named as such, before its text width
        check_transformer_config(folder / TRANSFORMER_FOLDER, cfg)
    if text_encoder_bytes is None:
        check_text_width(config, encoder.encoder_path)
        if encoder.encoder_weights and model_type(encoder.encoder_path or minilm_path()) != QWEN3VL:
            raise ValueError(
                f"h3_encoder parameter encoder_weights={encoder.encoder_weights!r} draws a Qwen3-VL's weights: "
                f"encoder_path {encoder.encoder_path or '(the MiniLM default)'!s} is not a Qwen3-VL folder; "
                'leave encoder_weights "" to read the folder\'s weights'
            )
    vae = VaeSettings.from_parameters(values[VaeSettings.MODEL])
    typed = DitSettings.from_parameters({**dit_values, "row_budget": "1"})  # every value typed; row_budget below
    rows = typed.max_batch_rows
    if device == "cuda" and machine is not None:
        by_gpu = _gpu_rows(cfg, typed, vae, encoder, groups, sp_degree, machine, notes, text_encoder_bytes)
        size(
            DitSettings.MODEL,
            "max_batch_rows",
            min(by_gpu.values()),
            f"the largest request, which every h3_dit instance takes: the least over the instances' GPUs "
            f"{list(by_gpu)}, a multiple of 64, at most {sizing.MAX_BATCH_ROWS:,}",
        )
        if len(set(by_gpu.values())) > 1 and "max_batch_rows" not in given[DitSettings.MODEL]:
            size(
                DitSettings.MODEL,
                "max_batch_rows_by_gpu",
                ",".join(f"{gpu}:{rows}" for gpu, rows in by_gpu.items()),
                "each h3_dit instance packs up to what its own GPU holds (read through model_instance_device_id)",
            )
        rows = int(dit_values["max_batch_rows"])
    if "row_budget" not in given[DitSettings.MODEL] and int(dit_values["row_budget"]) > rows:
        size(DitSettings.MODEL, "row_budget", rows, "at most max_batch_rows")
    if device == "cuda":
        size(
            DitSettings.MODEL,
            "max_request_mb",
            request_memory_mb(
                typed.max_height,
                typed.max_width,
                typed.max_num_frames,
                rows,
                cfg.hidden_size,
                step_cache=typed.max_cache_threshold > 0,
            ),
            f"request_memory_mb of a {rows:,}-row request at {typed.max_width} x {typed.max_height} px, "
            f"{typed.max_num_frames} frames, with the CPU float32 constant Engine.prepare applies"
            + (" and its step cache" if typed.max_cache_threshold > 0 else ""),
        )
    dit = DitSettings.from_parameters(dit_values)
    longest = max([dit.max_batch_rows, *dit.rows_by_gpu().values()])  # the largest pack of any instance
    idle, reason = sizing.idle_timeout(
        device, dit.execution_mode, longest, cfg.num_layers, dit.max_steps, sp_degree, dit.gpu_turns
    )
    if idle_timeout_s is not None:
        idle, reason = round(idle_timeout_s * 1e6), f"{idle_timeout_s:g} s, given."
    dit.check(idle_s=idle / 1e6)  # a given one too: request mode's longest generation must fit in it
    if sp_degree > 1:
        reason += (
            f" A sequence-parallel worker that has not answered a step after a quarter of it "
            f"({idle / 1e6 / SP_TIMEOUT_FRACTION:g} s) is replaced and the step retried, within the rest."
        )
    dit.check(idle_s=idle / 1e6)
    for model in SETTINGS:
        notes += [
            f"{model}.{key} {value}: given"
            for key, value in given[model].items()
            if not any(note.startswith(f"{model}.{key} ") for note in notes)
        ]
    return Repository(encoder, dit, vae, groups, idle, reason, tuple(notes))


def check_text_width(config: str, encoder_path: str) -> None:
    """Raise ValueError when the text encoder at `encoder_path` ("" = MiniLM-L6, MINILM_WIDTH wide;
    a folder: h3_core.model.encoder.text_width, when it has a config.json) gives states of another
    width than the DiT config's text_dim: every request would fail."""
    text_dim = get_config(config).text_dim
    if not encoder_path:
        width, name = MINILM_WIDTH, 'the default text encoder (MiniLM-L6, encoder_path "")'
    else:
        width, name = text_width(encoder_path), f"the text encoder {encoder_path}"
        if width is None:
            return
    if width != text_dim:
        raise ValueError(
            f"config {config} reads {text_dim}-wide text states but {name} gives {width}: set "
            f"h3_encoder.encoder_path to an encoder of width {text_dim} (python "
            f"benchmarks/bench_text_encoder.py DIR --width {text_dim} writes a weight-free one)"
        )


def _gpu_rows(
    cfg,
    dit: DitSettings,
    vae: VaeSettings,
    encoder: EncoderSettings,
    groups: Mapping[str, InstanceGroup],
    sp_degree: int,
    machine: sizing.Machine,
    notes: list[str],
    text_encoder_bytes: int | None = None,
) -> dict[int, int]:
    """{first GPU of each h3_dit instance: its rows}: sizing.gpu_max_batch_rows of each GPU it
    drives (its own and the next sp_degree - 1), the least of them; the decode reserve for dit's
    largest canvas taken off h3_vae's GPU, the text encoder's weights (text_encoder_bytes, else
    read from its folder) off h3_encoder's. One note per GPU, also for a GPU that holds only
    h3_encoder and h3_vae (what is left there). Raises ValueError for a GPU without a free-memory
    figure, one where the DiT does not fit, or one where h3_encoder and h3_vae do not."""
    weights = sizing.dit_gpu_weight_bytes(cfg, dit)
    per_row = sizing.gpu_bytes_per_row_and_width(cfg, dit.quantization)
    height, width, frames = dit.max_height, dit.max_width, dit.max_num_frames
    decode = sizing.decode_reserve_bytes(height, width, frames, vae.decode_workers)
    folder = encoder.encoder_path or minilm_path()
    if text_encoder_bytes is not None:
        text, text_what = text_encoder_bytes, "text encoder weights"
    elif encoder.encoder_weights:
        text = drawn_weight_bytes(folder, encoder.hidden_layer)
        text_what = f"text encoder weights (drawn, encoder_weights {encoder.encoder_weights})"
    else:
        try:
            text, text_what = weight_bytes(folder, encoder.hidden_layer), "text encoder weights"
        except OSError:  # h3_encoder will refuse to load it, naming the folder
            text, text_what = 0, f"text encoder weights (none found in {folder})"
    firsts = groups[DitSettings.MODEL].gpus
    driven = {first + rank: first for first in firsts for rank in range(sp_degree)}
    beside = {int(device.split(":")[1]) for device in (vae.device, encoder.device) if device.startswith("cuda:")}
    gpu_rows: dict[int, int] = {}
    for gpu in sorted(set(driven) | beside):
        if gpu not in machine.gpu_free_bytes:
            raise ValueError(f"no free-memory figure for GPU {gpu}")
        reserves = []
        if vae.device in ("cuda", f"cuda:{gpu}"):
            workers = f"{vae.decode_workers} decode workers"
            reserves.append((decode, f"decode reserve ({workers} x a {width} x {height} px, {frames}-frame decode)"))
        if encoder.device in ("cuda", f"cuda:{gpu}"):
            reserves.append((text, text_what))
        if gpu in driven and sp_degree == 1:  # a sequence-parallel group's DiT runs without graphs
            pool = sizing.graph_pool_bytes(cfg.hidden_size, per_row)
            reserves.append((pool, f"CUDA graph pool ({GRAPH_MAX_ROWS:,} graphed rows)"))
        free, kept = machine.gpu_free_bytes[gpu], sum(size for size, _ in reserves)
        reserved = "".join(f" - {size // sizing.MIB:,} MiB {what}" for size, what in reserves)
        if gpu not in driven:
            left = (free - kept) // sizing.MIB
            if left < 0:
                raise ValueError(
                    f"h3_encoder and h3_vae do not fit GPU {gpu}: {free // sizing.MIB:,} MiB free{reserved}"
                )
            notes.append(f"GPU {gpu}: {free // sizing.MIB:,} MiB free{reserved} -> {left:,} MiB left (no h3_dit)")
            continue
        held = dit.max_num_seqs + dit.max_waiting
        cached = sizing.held_cache_bytes_per_row(held, dit.max_cache_threshold > 0 and sp_degree == 1)
        rows = sizing.gpu_max_batch_rows(free, weights, kept, cfg.hidden_size, per_row, cached)
        notes.append(
            f"GPU {gpu}: {free // sizing.MIB:,} MiB free - {weights // sizing.MIB:,} MiB DiT weights "
            f"(quantization {dit.quantization}, AdaLN table of {dit.adaln_table_values} values"
            f"{sizing.host_adaln_note(cfg, dit)}){reserved} -> "
            f"{rows:,} rows at {per_row} bytes per row and unit of hidden_size {cfg.hidden_size} (measured on an "
            f"H200 in {'fp8' if dit.quantization == 'fp8' else 'bf16'}, server.sizing)"
            + (f" + {cached:,} bytes per row of {held} held requests' step caches" if cached else "")
        )
        gpu_rows[driven[gpu]] = min(rows, gpu_rows.get(driven[gpu], rows))
    return gpu_rows


PLACED = {
    "shared": "h3_encoder and h3_vae on the first GPU, beside its h3_dit instance",
    "own": "h3_encoder and h3_vae on a GPU of their own, the last; h3_dit on the others",
    "cpu": "h3_encoder and h3_vae on the CPU; h3_dit on every GPU",
}
REQUEST_PROMPT_TOKENS = 64  # the prompt of request_rows: 672 x 384 px, 209 frames and 64 tokens are 16,384 rows


def request_rows(cfg) -> int:
    """Packed rows of a request at the config's default canvas with a REQUEST_PROMPT_TOKENS-token
    prompt (h3: 672 x 384 px, 209 frames: 16,384 rows, the benchmarks' request)."""
    return make_layout(REQUEST_PROMPT_TOKENS, cfg.default_height, cfg.default_width, cfg.default_num_frames).seq_len


def default_placement(
    gpus: Sequence[int], machine: sizing.Machine | None, rows: int, plan_with: Callable[[str], Repository]
) -> Repository:
    """The Repository of the placement chosen for `gpus` (plan_with(placement) builds one), with
    the choice and its reason as its first note. One GPU, or no machine to size from: shared
    (everything on the first GPU). Several GPUs with a machine: of shared and own, the one with the
    more h3_dit instances when every instance takes a request of `rows` rows (request_rows; an
    instance that cannot makes the server refuse it), shared on a tie: with the text encoder and
    two decodes beside it, the first GPU of an H200 host keeps 7,616 rows of the bf16 h3 DiT, under
    one 16,384-row request, and 65,536 in fp8 (docs/deploy_h200.md). The cpu placement is never
    chosen: the Qwen3-VL encode and the VAE decode are slow there. Raises the shared placement's
    ValueError when neither placement can be planned."""
    if len(gpus) == 1 or machine is None:
        chosen, why = "shared", "one GPU" if len(gpus) == 1 else "no machine to size the others from"
        repository = plan_with(chosen)
    else:
        plans, errors, said = {}, {}, []
        for candidate in ("shared", "own"):
            try:
                plans[candidate] = plan_with(candidate)
            except ValueError as error:
                errors[candidate] = error
        if not plans:
            raise errors["shared"]
        score = {}
        for candidate, repository in plans.items():
            instances = repository.groups[DitSettings.MODEL].instances
            takes = repository.dit.max_batch_rows >= rows
            score[candidate] = instances if takes else 0
            said.append(
                f"{candidate}: {instances} h3_dit instances, the largest request {repository.dit.max_batch_rows:,} rows"
                + ("" if takes else f", under a {rows:,}-row request")
            )
        said += [f"{candidate}: {error}" for candidate, error in errors.items()]
        chosen = max(plans, key=lambda candidate: (score[candidate], candidate == "shared"))
        repository = plans[chosen]
        why = (
            f"the most h3_dit instances that each take a {rows:,}-row request of the default canvas ({'; '.join(said)})"
        )
    count = f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"
    note = f"placement {chosen} (chosen for {count}: {why}): {PLACED[chosen]}"
    return dataclasses.replace(repository, notes=(note, *repository.notes))


# ---- config.pbtxt texts ------------------------------------------------------------------------

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
        "and in all; video seconds (h3_core.references); a request refused with INVALID_ARG before any VAE runs",
        "max_batch_rows": "h3_dit's, with max_request_mb: a request whose rows or memory (conditions included) pass "
        "them is refused here",
        "media_workers": "threads decoding requests' files apart from the text encoder (one request each: a request "
        "without files never waits behind another's); with max_decoded_pixels (images and video frames at their "
        "stored size) and max_decoded_samples (audio per channel at 32 kHz), one request's decode budget, they bound "
        "the decoded media held at once: media_workers x (3 B x pixels + 8 B x samples), 1.5 GB as shipped",
        "max_image_bytes": "a keyframe file beyond these limits is refused with INVALID_ARG before any model "
        "runs (h3_core.images): bytes, pixels (width x height, read from the header: no decompression bomb is "
        "decoded), each side's pixels, long side / short side",
    },
    DitSettings.MODEL: {
        "cpu_threads": CPU_THREADS_COMMENT,
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
        "wait, h3_core.serving.scheduler",
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
        "adaln_table_values": "timestep values whose AdaLN projections the DiT keeps (sp_degree 1; about 9.7 MB a "
        "value for the h3 config, h3_core.model.adaln_table): each distinct timestep's projections are computed once, "
        "not once per step; 0 = off",
        "adaln_weights": "device, or host: the AdaLN projection weights (24.3 GiB for the h3 config) stay in pinned "
        "host memory, streamed to the GPU once per AdaLN table fill, a request's whole schedule at its admission "
        "(h3_core.model.adaln_table); host needs sp_degree 1 and adaln_table_values of at least 2 x max_steps + 2",
        "gpu_turns": '"true" (cuda, sp_degree 1): each packed step takes its GPU\'s turn, so that an h3_vae with '
        "gpu_turns on the same GPU decodes only between steps (h3_core.serving.gpu_turns)",
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
        "(h3_core.serving.gpu_turns)",
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
# cancel is announced (h3_core.serving.registry), and reschedules the unfinished ones.
#
# REQUEST is JSON: the request fields present (height, width, num_frames, num_inference_steps,
# seed, num_outputs), encode_seconds, received_unix_s and for fl2va / ref2va task, conditions,
# vision_spans, geometry, and outside_training when the prompt has words the weights were not
# trained on (the keys h3_encoder writes; any other key is refused), or
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
# (h3_core.serving.registry): clients send their cancels here, not to h3_dit, whose execute may run
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
        "max_waiting requests (h3_core/serving/scheduler.py, Admission). Requests beyond the slots wait in Triton's "
        "backlog, which the model cannot see."
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


# ---- folders -------------------------------------------------------------------------------------


def checkpoint_for(checkpoint: str, target: Path) -> str:
    """checkpoint_dir as written into the repository at `target`: `random:SEED` unchanged (no
    path); a folder relative (to ROOT) only in model_repository/ itself, where the models resolve
    it against ROOT; absolute elsewhere. Raises ValueError for a malformed random:SEED."""
    if source_seed(checkpoint) is not None:
        return checkpoint
    path = Path(checkpoint) if Path(checkpoint).is_absolute() else ROOT / checkpoint
    if target.resolve() == SHIPPED and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(path)


def write_repository(target: str | Path, repository: Repository) -> Path:
    """Write `repository` to the folder `target` and return its path: model_repository/ itself gets
    its config.pbtxt files rewritten; any other target becomes a copy of model_repository/'s
    model code (without __pycache__) with the written config.pbtxt files, replacing an earlier
    repository there. Checkpoint paths as checkpoint_for says.
    Raises FileExistsError when `target` is a non-empty folder that holds no h3_dit/config.pbtxt
    (it is not replaced)."""
    target = Path(target).resolve()
    checkpoint = checkpoint_for(repository.dit.checkpoint_dir, target)
    repository = dataclasses.replace(
        repository,
        dit=dataclasses.replace(repository.dit, checkpoint_dir=checkpoint),
        vae=dataclasses.replace(repository.vae, checkpoint_dir=checkpoint_for(repository.vae.checkpoint_dir, target)),
        encoder=dataclasses.replace(
            repository.encoder, checkpoint_dir=checkpoint_for(repository.encoder.checkpoint_dir, target)
        ),
    )
    if target != SHIPPED:
        if target.exists():
            if any(target.iterdir()) and not (target / DitSettings.MODEL / "config.pbtxt").is_file():
                raise FileExistsError(f"{target} is not empty and holds no model repository; not replacing it")
            shutil.rmtree(target)
        shutil.copytree(SHIPPED, target, ignore=shutil.ignore_patterns("__pycache__", "config.pbtxt"))
    for model, text in config_texts(repository).items():
        (target / model / "config.pbtxt").write_text(text)
    return target


def check_checkpoint(dit: DitSettings, vae: VaeSettings, encoder: EncoderSettings) -> None:
    """Refuse, before a repository is written, what h3_dit, h3_vae or h3_encoder would refuse at
    load (weight sources: h3_core.weights.checkpoint's module docstring; a relative folder is relative to
    ROOT), so that the launcher stops in seconds with one line:
    - random:SEED: nothing to check (a malformed one raises ValueError naming the allowed form);
    - a folder that does not exist, or holds neither layout: FileNotFoundError saying so and naming
      both layouts and the commands that write each;
    - an official checkpoint folder: transformer/'s weights (one file or the index and its shards,
      headers readable), and video_vae/ and audio_vae/ following the hook contract with h3_vae's
      trust_remote_code (vae_hook.check_official_vaes); its config.json is checked by plan();
    - a native folder: FileNotFoundError naming the first missing of dit.safetensors (the DiT's
      folder), video_vae.safetensors and audio_vae.safetensors (the VAEs' folder), with the command
      that writes seeded random weights of the config there;
    - the text encoder and tokenizer folders h3_encoder names, when given: they must exist.
    Raises FileNotFoundError or ValueError with the message of the first problem."""

    def seeded(folder: Path) -> str:
        command = f"python -m h3_core.weights.checkpoint_setup --configs {dit.config_name} --root"
        if folder.name == dit.config_name:
            return f"seeded random weights: {command} {folder.parent}"
        return f"seeded random weights: {command} DIR writes them to DIR/{dit.config_name}"

    def folder_of(source: str) -> Path | None:
        if source_seed(source) is not None:
            return None
        folder = Path(source) if Path(source).is_absolute() else ROOT / source
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist; {seeded(folder)}")
        layouts = (is_official(folder), is_official_vae_folder(folder), (folder / DIT_FILE).is_file())
        if not any(layouts) and not (folder / VIDEO_VAE_FILE).is_file():
            raise FileNotFoundError(
                f"{folder} is not a checkpoint: it holds neither {DIT_FILE}, {VIDEO_VAE_FILE} and {AUDIO_VAE_FILE} "
                f"(python -m h3_core.weights.checkpoint_setup writes seeded random ones) nor an official MiniMax-H3 "
                f"checkpoint's transformer/, text_encoder/, tokenizer/, video_vae/ and audio_vae/ (python -m "
                f"h3_core.weights.official_checkpoint writes a synthetic one); or serve seeded random weights with "
                f"--checkpoint random:0"
            )
        return folder

    needed = []
    dit_folder, vae_folder = folder_of(dit.checkpoint_dir), folder_of(vae.checkpoint_dir)
    if dit_folder is not None and is_official(dit_folder):
        official_tensor_files(dit_folder / TRANSFORMER_FOLDER)
    elif dit_folder is not None:
        needed.append(dit_folder / DIT_FILE)
    if vae_folder is not None and is_official_vae_folder(vae_folder):
        check_official_vaes(vae_folder, vae.trust_remote_code)
    elif vae_folder is not None:
        needed += [vae_folder / VIDEO_VAE_FILE, vae_folder / AUDIO_VAE_FILE]
    for path in needed:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; {seeded(path.parent)}")
    for name, path in (("text encoder", encoder.encoder_path), ("tokenizer", encoder.tokenizer_path)):
        if path and not Path(path).is_dir():
            raise FileNotFoundError(f"h3_encoder's {name} folder {path} does not exist")


# ---- command line ------------------------------------------------------------------------------


def parse_overrides(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """{model: {key: value}} from MODEL.KEY=VALUE strings. Raises ValueError for another form."""
    overrides: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        model, dot, key = name.partition(".")
        if not (sep and dot and model and key):
            raise ValueError(f"--set {item!r} is not MODEL.KEY=VALUE (e.g. h3_dit.max_waiting=2)")
        overrides.setdefault(model, {})[key] = value
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring): write TARGET, print what was sized and why. Returns 0, or 2
    after printing the error for a bad option, setting, GPU or checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m server.repository", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "target", type=Path, nargs="?", help="repository folder to write (model_repository: the shipped one)"
    )
    add_arguments(parser)
    parser.add_argument(
        "--unsized",
        action="store_true",
        help="size nothing from this machine (how model_repository/ itself is written)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="write nothing: print what the official checkpoint gets on 1, 2, 4 and 8 H200s (server.deploy_plan)",
    )
    args = parser.parse_args(argv)
    if args.plan:
        if args.target is not None or given_options(args) or args.unsized:
            parser.error("--plan takes no other option")
        from .deploy_plan import plan_table

        print(plan_table())
        return 0
    if args.target is None:
        parser.error("the target folder is required (or --plan)")
    try:
        repository = _plan_from_args(args)
        check_checkpoint(repository.dit, repository.vae, repository.encoder)
        path = write_repository(args.target, repository)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"python -m server.repository: {error}", file=sys.stderr)
        return 2
    dit, groups = repository.dit, repository.groups
    checkpoint = dit.checkpoint_dir if source_seed(dit.checkpoint_dir) is not None else Path(ROOT, dit.checkpoint_dir)
    print(f"model repository {path}: config {dit.config_name}, checkpoint {checkpoint}, device {dit.device}")
    for model, group in groups.items():
        print(f"  {model}: {group.text()}")
    print(
        f"  h3_dit.max_batch_size {dit.sequence_slots}: max_num_seqs {dit.max_num_seqs} + max_waiting "
        f"{dit.max_waiting} + {CONTROL_SLOTS} control slots"
    )
    for note in repository.notes:
        print(f"  {note}")
    print(f"  h3_dit.max_sequence_idle_microseconds {repository.idle_microseconds}: {repository.idle_reason}")
    return 0


def _plan_from_args(args: argparse.Namespace) -> Repository:
    """plan() for parsed CLI options: device auto resolved, GPUs and the machine probed unless
    --unsized, a relative --checkpoint read against the current directory."""
    device, gpus = args.device or "cpu", []
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"--device auto: {device} ({torch.cuda.device_count()} CUDA GPUs visible)")
    if device == "cuda":
        import torch

        gpus = sizing.parse_gpus(args.gpus or "all", torch.cuda.device_count())
    elif args.gpus is not None and args.device != "auto":
        raise ValueError("--gpus needs --device cuda")
    checkpoint = args.checkpoint  # random:SEED is no path
    if checkpoint is not None and source_seed(checkpoint) is None:
        checkpoint = Path(checkpoint).resolve()
    overrides = parse_overrides(args.set or [])
    encoder = overrides.get(EncoderSettings.MODEL, {})
    for key in ("encoder_path", "tokenizer_path"):  # the h3_encoder stub reads them against its own directory
        if encoder.get(key):
            encoder[key] = str(Path(encoder[key]).resolve())
    machine = None if args.unsized else sizing.probe(gpus)
    return plan(
        args.config or "tiny",
        checkpoint,
        device,
        gpus,
        args.dit_instances or 1,
        overrides,
        machine,
        placement=args.placement,
    )


if __name__ == "__main__":
    sys.exit(main())
