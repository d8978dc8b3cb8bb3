"""A repository's settings, planned: `Repository` (what varies between repositories) and `plan`,
which builds one from a config name, a checkpoint folder, a device, the GPUs, the number of CPU DiT
instances and explicit overrides, sizing from a `server.sizing.Machine` what was not given
(server.repository's docstring says what; server.placement places the models, server.gpu_rows sizes
h3_dit's rows per GPU). `default_placement` chooses where h3_encoder and h3_vae run on several GPUs.
Writes nothing: server.repository writes a Repository, server.deploy_plan tabulates plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from h3_core.config import get_config
from h3_core.diffusion.layout import make_layout
from h3_core.diffusion.request import request_memory_mb
from h3_core.model.encoder import QWEN3VL, QWEN3VL_H3_LAYER, minilm_path, model_type, text_width
from h3_core.model.reference_kv import bytes_per_reference_row
from h3_core.parallel.ulysses import check_sp_degree
from h3_core.parallel.workers import SP_TIMEOUT_FRACTION
from h3_core.serving.shared.agreement import check_agreement
from h3_core.serving.shared.settings import SETTINGS, SHARED_SETTINGS, DitSettings, EncoderSettings, VaeSettings
from h3_core.weights.checkpoint import TRANSFORMER_FOLDER, check_transformer_config
from h3_core.weights.official_checkpoint import TEXT_ENCODER, TOKENIZER, is_official

from . import sizing
from .gpu_rows import gpu_rows
from .placement import PLACED, InstanceGroup, instance_groups, side_gpu

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = "demo"  # the trained demo model's config
MINILM_WIDTH = 384  # width of the token states of h3_core.model.encoder's default text encoder
REQUEST_PROMPT_TOKENS = 64  # the prompt of request_rows: 672 x 384 px, 209 frames and 64 tokens are 16,384 rows


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


@dataclass
class _Sizing:
    """A plan in the making: {model: {key: value string}} for every settings key, what was given
    ({model: {key: value string}}) and the notes of what was sized and why, in order."""

    values: dict[str, dict[str, str]]
    given: Mapping[str, Mapping[str, str]]
    notes: list[str] = field(default_factory=list)

    def size(self, model: str, key: str, value, why: str) -> None:
        """Set model.key to `value` unless given (then only note what it would be), noting `why`."""
        if key in self.given[model]:
            self.notes.append(f"{model}.{key} {self.given[model][key]}: given (sized it would be {value}: {why})")
        else:
            self.values[model][key] = _text(value)
            self.notes.append(f"{model}.{key} {_text(value)}: {why}")


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
    (the larger of its default height and width on both axes), row_budget at most
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
    The settings several models carry (SHARED_SETTINGS) are kept equal: each takes its owner's
    value, sized or given, and a value given on one model is given on every model carrying it.
    Raises ValueError for two models given different values of a shared setting
    (check_agreement's message), an unknown config, device, model or key, a value the settings refuse
    (h3_core.serving.shared.settings messages), bad GPUs or instances, a text encoder of another width than the
    config's text_dim (check_text_width), or a GPU where the DiT does not fit."""
    cfg = get_config(config)
    stated = _given(overrides)
    given = _shared_given(stated)
    sp_degree = _sp_degree(cfg, given)
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
    sized = _Sizing(
        {
            EncoderSettings.MODEL: EncoderSettings().to_parameters(),
            DitSettings.MODEL: DitSettings(
                config_name=config, checkpoint_dir=checkpoint, device=device
            ).to_parameters(),
            VaeSettings.MODEL: VaeSettings(checkpoint_dir=checkpoint, device=vae_device).to_parameters(),
        },
        given,
    )
    if device == "cuda":
        _size_for_gpus(sized, config, placement, vae_device, sp_degree)
    folder = Path(checkpoint) if Path(checkpoint).is_absolute() else ROOT / checkpoint
    _size_for_checkpoint(sized, config, folder)
    _size_processes(sized, groups, sp_degree, device, machine)
    _apply_given(sized)
    encoder = EncoderSettings.from_parameters(sized.values[EncoderSettings.MODEL])
    _check_encoder(config, folder, encoder, text_encoder_bytes)
    vae = VaeSettings.from_parameters(sized.values[VaeSettings.MODEL])
    _size_rows(sized, config, device, machine, encoder, vae, groups, sp_degree, text_encoder_bytes)
    _share(sized.values)  # h3_encoder takes the sized rows and request memory
    encoder = EncoderSettings.from_parameters(sized.values[EncoderSettings.MODEL])
    dit = DitSettings.from_parameters(sized.values[DitSettings.MODEL])
    idle, reason = _idle_timeout(dit, config, device, sp_degree, idle_timeout_s)
    notes = sized.notes
    for model in SETTINGS:
        notes += [
            f"{model}.{key} {value}: given"
            for key, value in stated[model].items()
            if not any(note.startswith(f"{model}.{key} ") for note in notes)
        ]
    return Repository(encoder, dit, vae, groups, idle, reason, tuple(notes))


def _given(overrides: Mapping[str, Mapping[str, object]] | None) -> dict[str, dict[str, str]]:
    """{model: {key: value string}} of plan()'s overrides, every model of SETTINGS present.
    Raises ValueError for a model not in SETTINGS."""
    unknown = sorted(set(overrides or {}) - set(SETTINGS))
    if unknown:
        raise ValueError(f"no model {unknown[0]!r} to set: choose one of {sorted(SETTINGS)}")
    return {model: {key: _text(value) for key, value in (overrides or {}).get(model, {}).items()} for model in SETTINGS}


def _shared_given(stated: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """The given values with each shared setting (SHARED_SETTINGS) given on one model given on
    every model that carries it. Raises ValueError (check_agreement's message) where two models
    are given different values of one."""
    for model in SETTINGS:
        check_agreement(model, stated[model], stated)
    given = {model: dict(values) for model, values in stated.items()}
    for key, models in SHARED_SETTINGS.items():
        values = [stated[model][key] for model in models if key in stated[model]]
        if values:
            for model in models:
                given[model][key] = values[0]
    return given


def _sp_degree(cfg, given: Mapping[str, Mapping[str, str]]) -> int:
    """h3_dit's given sp_degree (1 unless given). Raises ValueError for a non-integer or one that
    does not divide the config's heads (check_sp_degree)."""
    try:
        sp_degree = int(given[DitSettings.MODEL].get("sp_degree", "1"))
    except ValueError:
        raise ValueError(
            f"h3_dit parameter sp_degree={given[DitSettings.MODEL]['sp_degree']!r} is not a valid int"
        ) from None
    check_sp_degree(cfg, sp_degree)
    return sp_degree


def _size_for_gpus(sized: _Sizing, config: str, placement: str, vae_device: str, sp_degree: int) -> None:
    """On cuda: h3_dit's canvas limits at least the config's default canvas, h3_encoder's device
    (the placement's), GPU turns for an h3_vae sharing an h3_dit instance's GPU, execute_budget_s."""
    cfg, dit_values = get_config(config), sized.values[DitSettings.MODEL]
    side = max(int(dit_values["max_height"]), cfg.default_height, cfg.default_width)
    frames = max(int(dit_values["max_num_frames"]), cfg.default_num_frames)
    canvas = (
        f"at least the {config} config's default canvas ({cfg.default_width} x {cfg.default_height} px, "
        f"{cfg.default_num_frames} frames) on both axes"
    )
    sized.size(DitSettings.MODEL, "max_height", side, canvas)
    sized.size(DitSettings.MODEL, "max_width", max(int(dit_values["max_width"]), side), canvas)
    sized.size(DitSettings.MODEL, "max_num_frames", frames, canvas)
    sized.size(EncoderSettings.MODEL, "device", vae_device, f"placement {placement}: {PLACED[placement]}")
    vae_on_gpu = sized.given[VaeSettings.MODEL].get("device", vae_device).startswith("cuda")
    if placement == "shared" and sp_degree == 1 and vae_on_gpu:
        turns = (
            "h3_vae shares its GPU with an h3_dit instance: its decode tiles take turns with the DiT steps "
            "there instead of time-slicing the GPU, which made those steps 2.1x slower "
            "(h3_core.serving.shared.gpu_turns, docs/deploy_h200.md)"
        )
        sized.size(VaeSettings.MODEL, "gpu_turns", True, turns)
        sized.size(DitSettings.MODEL, "gpu_turns", True, turns)
    sized.size(
        DitSettings.MODEL,
        "execute_budget_s",
        sizing.GPU_EXECUTE_BUDGET_S,
        "steps per execute while nothing is announced for the DiT: the Triton round trip costs at most 1.2% "
        "of the step time; a control request sent straight to h3_dit waits at most this plus one step "
        "(server.sizing)",
    )


def _size_for_checkpoint(sized: _Sizing, config: str, folder: Path) -> None:
    """An official checkpoint's text encoder, tokenizer and hidden layer; the demo model's
    reference media lengths."""
    if is_official(folder):
        official = "the official checkpoint's"
        encoder_path = str(folder / TEXT_ENCODER)
        sized.size(EncoderSettings.MODEL, "encoder_path", encoder_path, f"{official} text encoder (Qwen3-VL)")
        sized.size(EncoderSettings.MODEL, "tokenizer_path", str(folder / TOKENIZER), f"{official} tokenizer")
        sized.size(
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
            sized.size(
                EncoderSettings.MODEL, key, value, "reference media of the length of the demo model's clips (< 1 s)"
            )


def _size_processes(
    sized: _Sizing,
    groups: Mapping[str, InstanceGroup],
    sp_degree: int,
    device: str,
    machine: sizing.Machine | None,
) -> None:
    """A note on sequence parallelism's worker processes; with a machine, every model's
    cpu_threads (its cores over the model processes, sequence-parallel workers counted)."""
    dit_instances = groups[DitSettings.MODEL].instances
    if sp_degree > 1:
        drives = "; ".join(
            f"the instance on GPU {first} drives GPUs {list(range(first, first + sp_degree))}"
            for first in groups[DitSettings.MODEL].gpus
        )
        sized.notes.append(
            f"h3_dit.sp_degree {sp_degree}: each of the {dit_instances} h3_dit instances runs its steps over "
            f"{sp_degree} worker processes (sequence parallelism)" + (f": {drives}" if device == "cuda" else "")
        )
    if machine is not None:  # a sequence-parallel h3_dit instance computes in its sp_degree workers
        processes = sum(group.instances for group in groups.values()) + dit_instances * (sp_degree - 1)
        threads = sizing.cpu_threads(machine.cores, processes)
        for model in SETTINGS:
            sized.size(model, "cpu_threads", threads, f"{machine.cores} cores / {processes} model processes")


def _apply_given(sized: _Sizing) -> None:
    """The given values over the sized ones; then every model carries the owner's value of each
    shared setting (SHARED_SETTINGS: a value given on any carrier is given on all, _shared_given)."""
    values = sized.values
    for model in SETTINGS:
        values[model].update(sized.given[model])
    _share(values)


def _share(values: dict[str, dict[str, str]]) -> None:
    """Copy each shared setting (SHARED_SETTINGS) from the model that owns it to the others."""
    for key, (owner, *carriers) in SHARED_SETTINGS.items():
        for model in carriers:
            values[model][key] = values[owner][key]


def _check_encoder(config: str, folder: Path, encoder: EncoderSettings, text_encoder_bytes: int | None) -> None:
    """Raise ValueError for an official checkpoint of another config, a text encoder of another
    width (check_text_width) or drawn weights (encoder_weights) for a folder that is no Qwen3-VL;
    the last two only when the text encoder's folder is at hand (text_encoder_bytes None)."""
    if is_official(folder):  # a checkpoint of another config is named as such, before its text width
        check_transformer_config(folder / TRANSFORMER_FOLDER, get_config(config))
    if text_encoder_bytes is None:
        check_text_width(config, encoder.encoder_path)
        if encoder.encoder_weights and model_type(encoder.encoder_path or minilm_path()) != QWEN3VL:
            raise ValueError(
                f"h3_encoder parameter encoder_weights={encoder.encoder_weights!r} draws a Qwen3-VL's weights: "
                f"encoder_path {encoder.encoder_path or '(the MiniLM default)'!s} is not a Qwen3-VL folder; "
                'leave encoder_weights "" to read the folder\'s weights'
            )


def _size_rows(
    sized: _Sizing,
    config: str,
    device: str,
    machine: sizing.Machine | None,
    encoder: EncoderSettings,
    vae: VaeSettings,
    groups: Mapping[str, InstanceGroup],
    sp_degree: int,
    text_encoder_bytes: int | None,
) -> None:
    """h3_dit's rows: on cuda with a machine max_batch_rows (and max_batch_rows_by_gpu where the
    instances' GPUs differ) from gpu_rows; row_budget at most max_batch_rows; on cuda
    max_request_mb of a max_batch_rows request at the largest canvas."""
    cfg, dit_values = get_config(config), sized.values[DitSettings.MODEL]
    typed = DitSettings.from_parameters({**dit_values, "row_budget": "1"})  # every value typed; row_budget below
    rows = typed.max_batch_rows
    if device == "cuda" and machine is not None:
        by_gpu = gpu_rows(cfg, typed, vae, encoder, groups, sp_degree, machine, sized.notes, text_encoder_bytes)
        sized.size(
            DitSettings.MODEL,
            "max_batch_rows",
            min(by_gpu.values()),
            f"the largest request, which every h3_dit instance takes: the least over the instances' GPUs "
            f"{list(by_gpu)}, a multiple of 64, at most {sizing.MAX_BATCH_ROWS:,}",
        )
        if len(set(by_gpu.values())) > 1 and "max_batch_rows" not in sized.given[DitSettings.MODEL]:
            sized.size(
                DitSettings.MODEL,
                "max_batch_rows_by_gpu",
                ",".join(f"{gpu}:{rows}" for gpu, rows in by_gpu.items()),
                "each h3_dit instance packs up to what its own GPU holds (read through model_instance_device_id)",
            )
        rows = int(dit_values["max_batch_rows"])
    if "row_budget" not in sized.given[DitSettings.MODEL] and int(dit_values["row_budget"]) > rows:
        sized.size(DitSettings.MODEL, "row_budget", rows, "at most max_batch_rows")
    if device == "cuda":
        sized.size(
            DitSettings.MODEL,
            "max_request_mb",
            request_memory_mb(
                typed.max_height,
                typed.max_width,
                typed.max_num_frames,
                rows,
                cfg.hidden_size,
                step_cache=typed.max_cache_threshold > 0,
                reference_kv_bytes=rows * bytes_per_reference_row(cfg) if typed.max_ref_kv_refresh > 1 else 0,
            ),
            f"request_memory_mb of a {rows:,}-row request at {typed.max_width} x {typed.max_height} px, "
            f"{typed.max_num_frames} frames, with the CPU float32 constant Engine.prepare applies"
            + (" and its step cache" if typed.max_cache_threshold > 0 else "")
            + (" and its reference keys and values (all rows)" if typed.max_ref_kv_refresh > 1 else ""),
        )


def _idle_timeout(
    dit: DitSettings, config: str, device: str, sp_degree: int, idle_timeout_s: float | None
) -> tuple[int, str]:
    """h3_dit's max_sequence_idle_microseconds and its reason: sizing.idle_timeout of the largest
    pack of any instance, or idle_timeout_s given. Raises ValueError (DitSettings.check) when the
    settings do not fit in it."""
    longest = max([dit.max_batch_rows, *dit.rows_by_gpu().values()])  # the largest pack of any instance
    idle, reason = sizing.idle_timeout(
        device, dit.execution_mode, longest, get_config(config).num_layers, dit.max_steps, sp_degree, dit.gpu_turns
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
    return idle, reason


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
