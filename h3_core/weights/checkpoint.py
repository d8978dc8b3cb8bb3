"""Weights: deterministic initialisation from a seed, safetensors save/load, and the DiT's weight
sources.

Only safetensors is used (no pickle anywhere). Loading is strict: a missing, unexpected or
mis-shaped tensor raises ValueError naming the tensor.

A DiT weight source (`load_dit`; DitSettings.checkpoint_dir, factory.load_engine, the writer's
--checkpoint) is one string:
- a native folder holding dit.safetensors (DIT_FILE; checkpoint_setup writes one);
- an official MiniMax-H3 checkpoint folder, told apart by its `transformer/` folder: a diffusers
  config.json (checked against our config: `diffusers_config`, docs/model.md §1.1) and
  diffusion_pytorch_model.safetensors, or shards diffusion_pytorch_model-0000i-of-0000N.safetensors
  with diffusion_pytorch_model.safetensors.index.json whose "weight_map" maps tensor name -> shard
  file (`save_official_transformer` writes one);
- `random:SEED` (SEED an integer in 0..MAX_SEED): `init_weights(dit, SEED)` on the DiT's device,
  no file; for the VAEs the same string means create_vaes(SEED + VAE_SEED_OFFSET)
  (h3_core.weights.vae_hook), so `random:0` is what checkpoint_setup writes, drawn on the same device. A
  folder whose name starts with "random:" cannot be a source.

DiT tensors come in two layouts (docs/model.md §1.3); dit.safetensors may hold either, told apart by
the tensor names; transformer/ holds the official one:
- native (vllm-omni names, as in the stock MiniMax release, and what save_weights writes): our
  parameter names, with every `attn.qkv_proj.weight` stored head-grouped, [q_h; k_h; v_h] for
  each head h, which the loader reorders to our [Q; K; V];
- official diffusers: the names of OFFICIAL_RENAMES, separate attn.to_q / to_k / to_v weights
  stacked in q, k, v order into qkv_proj, and `ff.net.0.proj.weight` stored [up; gate], whose
  halves the loader swaps to our fc1 [gate; up].
"""

import json
import math
import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import AUDIO_LATENT_CHANNELS, CONFIGS, PATCH, VIDEO_LATENT_CHANNELS, DiTConfig
from ..model import H3DiT
from ..model.dit import AdaLNProj
from ..model.fp8 import Fp8Linear
from ..model.initialization import drawn_values, source_seed
from ..model.preview import FEATURES, RANDOM_PREVIEW, PreviewMap
from ..model.training_metadata import TRAINING_FILE, TrainingMetadata

DIT_FILE, VIDEO_VAE_FILE, AUDIO_VAE_FILE = "dit.safetensors", "video_vae.safetensors", "audio_vae.safetensors"
PREVIEW_FILE = "preview.safetensors"  # optional: the previews' fitted latent-to-RGB map (load_preview)
CACHE_FILE = "step_cache.json"  # optional: the step cache's fitted polynomial (load_cache_polynomial)
VAE_SEED_OFFSET = 1  # the VAEs of `random:SEED` are create_vaes(SEED + VAE_SEED_OFFSET)
TRANSFORMER_FOLDER = "transformer"
OFFICIAL_CONFIG = "config.json"
OFFICIAL_WEIGHTS = "diffusion_pytorch_model.safetensors"
OFFICIAL_INDEX = "diffusion_pytorch_model.safetensors.index.json"

# Native -> official (diffusers) DiT tensor names (docs/model.md §1.3, vllm-omni
# _MINIMAX_H3_TRANSFORMER_MAPPER): regex substitutions applied in order to a native name.
OFFICIAL_RENAMES = (
    (r"^video_patch_proj\.", "proj_in."),
    (r"^audio_patch_proj\.", "audio_proj_in."),
    (r"^condition_proj\.", "context_embedder."),
    (r"^time_embedder\.proj_in\.", "time_embedder.linear_1."),
    (r"^time_embedder\.proj_out\.", "time_embedder.linear_2."),
    (r"^token_refiner\.blocks\.", "token_refiner.refiner_blocks."),
    (r"^blocks\.", "transformer_blocks."),
    (r"\.attn\.q_norm\.", ".attn.norm_q."),
    (r"\.attn\.k_norm\.", ".attn.norm_k."),
    (r"\.attn\.out_proj\.", ".attn.to_out.0."),
    (r"\.mlp\.fc1\.", ".ff.net.0.proj."),
    (r"\.mlp\.fc2\.", ".ff.net.2."),
    (r"^final_layer\.norm\.", "norm_out.norm."),
    (r"^final_layer\.adaln_proj\.linear\.", "norm_out.linear."),
    (r"^final_layer\.video_out\.", "proj_out."),
    (r"^final_layer\.audio_out\.", "audio_proj_out."),
)
QKV_WEIGHT, FC1_WEIGHT = "attn.qkv_proj.weight", "mlp.fc1.weight"


@dataclass
class WeightSlot:
    """One native DiT tensor as the loaders fill it: its shape and dtype as a checkpoint holds
    it, and fill(value) (value in any dtype, on any device)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: Callable[[torch.Tensor], None]


def weight_slots(dit: H3DiT) -> dict[str, WeightSlot]:
    """Native name -> WeightSlot of every tensor of `dit`, in state-dict order: a tensor of its
    state dict is copied into (cast to its dtype); the weight of an Fp8Linear
    (h3_core.model.fp8.build_dit) comes in the model dtype and is quantised as it arrives
    (Fp8Linear.quantize_; its weight_scale is no checkpoint tensor); an AdaLN projection with host
    weights (H3DiT(adaln_weights="host"), AdaLNProj.host) is copied into its host tensors, never
    through the DiT's device."""
    dtype = dit.cfg.torch_dtype
    fp8 = {name: module for name, module in dit.named_modules() if isinstance(module, Fp8Linear)}
    host = {
        f"{name}.linear": dict(zip(("weight", "bias"), module.host, strict=True))
        for name, module in dit.named_modules()
        if isinstance(module, AdaLNProj) and module.host is not None
    }
    slots = {}
    for name, tensor in dit.state_dict().items():
        owner, _, attribute = name.rpartition(".")
        if owner in host:
            target = host[owner][attribute]
            slots[name] = WeightSlot(tuple(target.shape), target.dtype, lambda v, t=target: t.copy_(v.to(t.dtype)))
        elif owner not in fp8:
            slots[name] = WeightSlot(tuple(tensor.shape), tensor.dtype, lambda v, t=tensor: t.copy_(v.to(t.dtype)))
        elif attribute == "weight":
            slots[name] = WeightSlot(tuple(tensor.shape), dtype, lambda v, m=fp8[owner]: m.quantize_(v.to(dtype)))
    return slots


def save_weights(module: nn.Module, path: str | Path) -> None:
    """Write `module`'s state dict (parameters and persistent buffers) to a .safetensors file;
    a DiT in the native layout (qkv_proj head-grouped, see the module docstring)."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    if isinstance(module, H3DiT):
        heads, head_dim = module.cfg.num_heads, module.cfg.head_dim
        state = {k: qkv_to_grouped(v, heads, head_dim) if k.endswith(QKV_WEIGHT) else v for k, v in state.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))


def load_weights(module: nn.Module, path: str | Path) -> None:
    """Load a .safetensors file into `module`, casting each tensor to the module's dtype. A DiT
    checkpoint may be native or official (module docstring).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a tensor is missing, unexpected or has the wrong shape, or a DiT checkpoint
            mixes native and official names (the message names the tensor).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} not found")
    state = load_file(str(path))
    if not isinstance(module, H3DiT):
        load_state_dict_strict(module, state)
        return
    state = dit_state_from_checkpoint(module, state)
    with torch.no_grad():
        for name, slot in weight_slots(module).items():
            slot.fill(state.pop(name))


def grouped_to_qkv(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Fused qkv rows [q_h; k_h; v_h for each head h] -> [Q; K; V] (docs/model.md §1.3, vllm-omni
    `_reorder_grouped_qkv_to_qkv` with one head per group). weight: [3 * heads * head_dim, in]."""
    return weight.reshape(heads, 3, head_dim, -1).transpose(0, 1).reshape(weight.shape)


def qkv_to_grouped(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Inverse of grouped_to_qkv: [Q; K; V] -> [q_h; k_h; v_h for each head h]."""
    return weight.reshape(3, heads, head_dim, -1).transpose(0, 1).reshape(weight.shape)


def official_sources(native_name: str) -> list[str]:
    """Official tensor names making up the native tensor `native_name`: to_q, to_k, to_v for a
    fused qkv_proj weight, else the one renamed tensor (OFFICIAL_RENAMES)."""
    name = native_name
    for pattern, replacement in OFFICIAL_RENAMES:
        name = re.sub(pattern, replacement, name)
    if native_name.endswith(QKV_WEIGHT):
        return [name.replace("qkv_proj", part) for part in ("to_q", "to_k", "to_v")]
    return [name]


def official_shapes(dit: H3DiT) -> dict[str, tuple[int, ...]]:
    """Official tensor name -> shape of every tensor of `dit` in the official layout (docs/model.md §1.3):
    a fused qkv_proj weight [3A, H] gives to_q / to_k / to_v of [A, H] each."""
    shapes = {}
    for name, slot in weight_slots(dit).items():
        names = official_sources(name)
        for source in names:
            shapes[source] = (slot.shape[0] // len(names), *slot.shape[1:])
    return shapes


def native_from_official(native_name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Our tensor `native_name` from its official tensors (official_sources order): to_q, to_k,
    to_v stacked to [Q; K; V]; an fc1 weight's official [up; gate] halves swapped to [gate; up]."""
    tensor = torch.cat(tensors)
    if native_name.endswith(FC1_WEIGHT):
        up, gate = tensor.chunk(2)
        tensor = torch.cat([gate, up])
    return tensor


def official_tensors(dit: H3DiT) -> dict[str, torch.Tensor]:
    """`dit`'s weights under their official names, on the CPU (the inverse of native_from_official):
    qkv_proj [Q; K; V] split into to_q / to_k / to_v, fc1 [gate; up] stored [up; gate]."""
    state = {}
    for name, tensor in dit.state_dict().items():
        tensor = tensor.detach().cpu()
        if name.endswith(FC1_WEIGHT):
            gate, up = tensor.chunk(2)
            tensor = torch.cat([up, gate])
        sources = official_sources(name)
        for source, part in zip(sources, tensor.chunk(len(sources)), strict=True):
            state[source] = part.contiguous()
    return state


def dit_state_from_checkpoint(dit: H3DiT, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DiT checkpoint's tensors in our parameter layout (qkv as [Q; K; V], fc1 as [gate; up]).

    The layout is official when any name is one only the official layout uses, else native.
    Raises ValueError when the checkpoint mixes native-only and official-only names, or (for
    the detected layout) a tensor is missing, unexpected or mis-shaped; the message names it.
    """
    shapes = {name: slot.shape for name, slot in weight_slots(dit).items()}
    expected = official_shapes(dit)
    official = sorted(set(state) & (set(expected) - set(shapes)))
    native = sorted(set(state) & (set(shapes) - set(expected)))
    if official and native:
        raise ValueError(f"checkpoint mixes native and official tensor names: {native[0]!r} and {official[0]!r}")
    found = {name: tuple(t.shape) for name, t in state.items()}
    if not official:
        check_state(found, shapes)
        heads, head_dim = dit.cfg.num_heads, dit.cfg.head_dim
        return {k: grouped_to_qkv(v, heads, head_dim) if k.endswith(QKV_WEIGHT) else v for k, v in state.items()}
    check_state(found, expected)
    return {name: native_from_official(name, [state[s] for s in official_sources(name)]) for name in shapes}


def check_state(found: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError naming the first tensor of `found` (name -> shape) that is missing from,
    not in, or shaped unlike `shapes` (name -> shape)."""
    missing = sorted(set(shapes) - set(found))
    if missing:
        raise ValueError(f"checkpoint is missing tensor {missing[0]!r} ({len(missing)} missing)")
    unexpected = sorted(set(found) - set(shapes))
    if unexpected:
        raise ValueError(f"checkpoint has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)")
    for name, shape in sorted(found.items()):
        if tuple(shape) != tuple(shapes[name]):
            raise ValueError(f"tensor {name!r} has shape {tuple(shape)}, expected {tuple(shapes[name])}")


def load_state_dict_strict(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `module`; every tensor must exist with the same shape, and none may be
    missing. Raises ValueError naming the first offending tensor."""
    expected = module.state_dict()
    check_state(
        {name: tuple(t.shape) for name, t in state.items()}, {name: tuple(t.shape) for name, t in expected.items()}
    )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))


# ---- weight sources ------------------------------------------------------------------------------


def load_dit(dit: H3DiT, source: str | Path) -> None:
    """Fill `dit` from a weight source (module docstring), one tensor at a time (weight_slots: a DiT
    of h3_core.model.fp8.build_dit gets each block linear quantised as it arrives, so its load
    never holds the bf16 block weights): `random:SEED` -> init_weights(dit, SEED)'s values
    (drawn_values) on the DiT's device; a folder with transformer/ -> load_official_transformer; any other folder
    -> its dit.safetensors (load_weights, native or official tensor names).

    Raises:
        ValueError: a malformed random:SEED, a transformer/config.json that disagrees with
            dit.cfg, or a missing, unexpected or mis-shaped tensor (named).
        FileNotFoundError: a weights file, config.json, index or shard is missing (named).
    """
    seed = source_seed(source)
    if seed is not None:
        slots = weight_slots(dit)
        with torch.no_grad():
            for name, values in drawn_values({n: (s.shape, s.dtype) for n, s in slots.items()}, seed, dit.device):
                slots[name].fill(values)
    elif (Path(source) / TRANSFORMER_FOLDER).is_dir():
        load_official_transformer(dit, Path(source) / TRANSFORMER_FOLDER)
    else:
        load_weights(dit, Path(source) / DIT_FILE)


def save_preview(preview: PreviewMap, path: str | Path) -> None:
    """Write a preview map to a .safetensors file: "weight" [3, p, p, C, n, n] and "bias"
    [3, p, p] (PreviewMap), stored as float16 (halves the file; load_preview reads float32)."""
    save_file({"weight": preview.weight.half().contiguous(), "bias": preview.bias.half().contiguous()}, path)


def load_cache_polynomial(source: str | Path) -> tuple[float, ...] | None:
    """The step cache's output-change polynomial of a weight source (numpy.polyval coefficients,
    highest power first; h3_core.diffusion.step_cache): "polynomial" of the folder's CACHE_FILE
    (benchmarks/cache_quality.py --fit writes it, with its "source"), else None (also for
    `random:SEED`; h3_core.factory.load_engine then uses the identity polynomial).

    Raises ValueError when "polynomial" is not a non-empty list of finite numbers."""
    path = Path(source) / CACHE_FILE
    if source_seed(source) is not None or not path.is_file():
        return None
    polynomial = json.loads(path.read_text()).get("polynomial")
    if not (
        isinstance(polynomial, list)
        and polynomial
        and all(type(c) in (int, float) and math.isfinite(c) for c in polynomial)
    ):
        raise ValueError(f"{path}: 'polynomial' must be a non-empty list of finite numbers, got {polynomial!r}")
    return tuple(float(c) for c in polynomial)


def load_preview(source: str | Path) -> PreviewMap:
    """The previews' latent-to-RGB map of a weight source: the folder's PREVIEW_FILE
    (training.preview_fit writes one for trained weights), else RANDOM_PREVIEW (an arbitrary
    colour map of the latent: motion visible, colours meaningless), also for `random:SEED`.
    Loaded on the CPU as float32 (h3_dit reads it; it loads no VAE).

    Raises ValueError when the file does not hold exactly "weight" [3, p, p, C, n, n] (p >= 1,
    C 24 or 324, n odd) and "bias" [3, p, p]."""
    path = Path(source) / PREVIEW_FILE
    if source_seed(source) is not None or not path.is_file():
        return RANDOM_PREVIEW
    tensors = load_file(path)
    weight = tuple(tensors["weight"].shape) if "weight" in tensors else ()
    if not (
        len(weight) == 6
        and weight[0] == 3
        and weight[1] == weight[2] >= 1
        and weight[3] in FEATURES
        and weight[4] == weight[5]
        and weight[4] % 2 == 1
    ):
        raise ValueError(
            f"{path}: tensor 'weight' must be [3, p, p, C, n, n] with C in {FEATURES}, n odd, got {weight}"
        )
    check_state({name: tuple(tensor.shape) for name, tensor in tensors.items()}, {"weight": weight, "bias": weight[:3]})
    return PreviewMap(tensors["weight"].float(), tensors["bias"].float())


def diffusers_config(cfg: DiTConfig) -> dict:
    """The official transformer/config.json keys and values (docs/model.md §1.1's diffusers column) of
    `cfg`: what a checkpoint's config.json must hold for our `cfg` to run it."""
    return {
        "num_layers": cfg.num_layers,
        "num_refiner_layers": cfg.num_refiner_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "attention_head_dim": cfg.head_dim,
        "ffn_dim": cfg.ffn_size,
        "in_channels": VIDEO_LATENT_CHANNELS,
        "audio_in_channels": AUDIO_LATENT_CHANNELS,
        "patch_size": [1, PATCH, PATCH],
        "text_dim": cfg.text_dim,
        "freq_dim": cfg.timestep_freq_dim,
        "time_embed_hidden_dim": cfg.time_embed_hidden_size,
        "time_embed_dim": cfg.time_embed_dim,
        "rope_freq_dim": cfg.rope_freqs_per_axis,
        "rope_theta": cfg.rope_theta,
        "norm_eps": cfg.eps,
        "qk_norm_eps": cfg.eps,
        "final_norm_eps": cfg.eps,
    }


def read_json_object(path: Path) -> dict:
    """The JSON object in the file `path`. Raises FileNotFoundError when it is missing, ValueError
    when it is not a JSON object."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        value = json.loads(path.read_text())
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def load_training_metadata(source: str | Path) -> TrainingMetadata | None:
    """The TRAINING_FILE beside a weight source's files (h3_core.model.training_metadata), or None
    (no file, or `random:SEED`). Raises ValueError naming the file and the key when it is not a
    JSON object or its values are wrong (TrainingMetadata.from_fields)."""
    path = Path(source) / TRAINING_FILE
    if source_seed(source) is not None or not path.is_file():
        return None
    return TrainingMetadata.from_fields(read_json_object(path), path)


def check_transformer_config(folder: str | Path, cfg: DiTConfig) -> None:
    """Check an official `transformer/` folder's config.json against `cfg` (the config chosen with
    --config): every key of diffusers_config(cfg) must be there with the same value; other keys
    (_class_name, _diffusers_version, ...) are ignored.

    Raises FileNotFoundError (no config.json) or ValueError naming the key, the checkpoint's value
    and the config's value."""
    path = Path(folder) / OFFICIAL_CONFIG
    found = read_json_object(path)
    fitting = [n for n, c in CONFIGS.items() if all(found.get(k) == v for k, v in diffusers_config(c).items())]
    hint = f" (it is the {fitting[0]} config's: --config {fitting[0]})" if fitting else ""
    for key, value in diffusers_config(cfg).items():
        if key not in found:
            raise ValueError(f"{path} has no key {key!r}; the {cfg.name} config has {key}={value!r}{hint}")
        if found[key] != value:
            raise ValueError(f"{path} has {key}={found[key]!r} but the {cfg.name} config has {key}={value!r}{hint}")


def safetensors_names(path: Path) -> list[str]:
    """The tensor names in the header of the safetensors file `path` (no tensor is read).
    Raises ValueError naming the file when its header cannot be read (a truncated or corrupt
    file, e.g. an incomplete download)."""
    try:
        with safe_open(str(path), framework="pt") as file:
            return list(file.keys())
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error}); is it incomplete?") from None


def official_tensor_files(folder: str | Path) -> dict[str, Path]:
    """Official tensor name -> the safetensors file of `folder` (a transformer/ folder) holding it:
    every tensor of diffusion_pytorch_model.safetensors, else the index's weight_map (each shard a
    file name inside `folder`).

    Raises FileNotFoundError naming a missing file (neither weights file nor index; a shard the
    index names), ValueError for a malformed index or a shard that lacks a tensor the index places
    there (named)."""
    folder = Path(folder)
    single = folder / OFFICIAL_WEIGHTS
    if single.is_file():
        return dict.fromkeys(safetensors_names(single), single)
    index = folder / OFFICIAL_INDEX
    if not index.is_file():
        raise FileNotFoundError(f"{folder} holds neither {OFFICIAL_WEIGHTS} nor {OFFICIAL_INDEX}")
    weight_map = read_json_object(index).get("weight_map")
    if not (
        isinstance(weight_map, dict)
        and weight_map
        and all(isinstance(file, str) and file == Path(file).name for file in weight_map.values())
    ):
        raise ValueError(f'{index} needs a non-empty "weight_map" of tensor name -> shard file name in {folder}')
    files = {name: folder / file for name, file in weight_map.items()}
    for shard in sorted(set(files.values())):
        if not shard.is_file():
            raise FileNotFoundError(f"{shard} not found (a shard named by {index.name})")
        held = set(safetensors_names(shard))
        lacking = sorted(name for name, path in files.items() if path == shard and name not in held)
        if lacking:
            raise ValueError(f"{shard} lacks tensor {lacking[0]!r}, which {index.name} places there")
    return files


def load_official_transformer(dit: H3DiT, folder: str | Path) -> None:
    """Load an official checkpoint's `transformer/` folder into `dit`, one tensor at a time (the
    host holds one of our tensors at once, not the 66 GB state), cast to each parameter's dtype.
    config.json is checked first (check_transformer_config).

    Raises FileNotFoundError / ValueError as check_transformer_config and official_tensor_files,
    and ValueError naming a missing, unexpected or mis-shaped tensor."""
    check_transformer_config(folder, dit.cfg)
    files = official_tensor_files(folder)
    with ExitStack() as stack:
        handles = {path: stack.enter_context(safe_open(str(path), framework="pt")) for path in set(files.values())}
        found = {name: tuple(handles[path].get_slice(name).get_shape()) for name, path in files.items()}
        check_state(found, official_shapes(dit))
        with torch.no_grad():
            for name, slot in weight_slots(dit).items():
                tensors = [handles[files[source]].get_tensor(source) for source in official_sources(name)]
                slot.fill(native_from_official(name, tensors))


def save_official_transformer(dit: H3DiT, folder: str | Path, max_shard_bytes: int) -> Path:
    """Write `dit` as an official checkpoint's `folder/transformer/` (the exact inverse of
    load_official_transformer; tensors keep their dtypes): config.json = diffusers_config(dit.cfg),
    official tensor names (official_tensors), one diffusion_pytorch_model.safetensors when the
    tensors total at most `max_shard_bytes` bytes, else shards of at most max_shard_bytes each (a
    larger tensor alone) and the index. Returns the transformer folder.

    Raises ValueError for max_shard_bytes < 1, FileExistsError when folder/transformer exists."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} is out of range: allowed >= 1")
    target = Path(folder) / TRANSFORMER_FOLDER
    target.mkdir(parents=True, exist_ok=False)
    (target / OFFICIAL_CONFIG).write_text(json.dumps(diffusers_config(dit.cfg), indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = total = 0
    for name, tensor in official_tensors(dit).items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size, total = size + nbytes, total + nbytes
    if len(shards) == 1:
        save_file(shards[0], str(target / OFFICIAL_WEIGHTS))
        return target
    weight_map = {}
    for number, shard in enumerate(shards, 1):
        file = f"diffusion_pytorch_model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(target / file))
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / OFFICIAL_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return target
