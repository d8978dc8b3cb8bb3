"""Weights: deterministic initialisation from a seed and safetensors save/load.

Only safetensors is used (no pickle anywhere). `load_weights` is strict: a missing,
unexpected or mis-shaped tensor raises ValueError naming the tensor.

DiT checkpoints come in two layouts (h3_spec §1.3), told apart by their tensor names:
- native (vllm-omni names, as in the stock MiniMax release, and what save_weights writes): our
  parameter names, with every `attn.qkv_proj.weight` stored head-grouped, [q_h; k_h; v_h] for
  each head h, which the loader reorders to our [Q; K; V];
- official diffusers: the names of OFFICIAL_RENAMES, separate attn.to_q / to_k / to_v weights
  stacked in q, k, v order into qkv_proj, and `ff.net.0.proj.weight` stored [up; gate], whose
  halves the loader swaps to our fc1 [gate; up].
"""

import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .model import H3DiT

# Native -> official (diffusers) DiT tensor names (h3_spec §1.3, vllm-omni
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


def init_weights(module: nn.Module, seed: int) -> None:
    """Fill every parameter of `module` deterministically from `seed`, in parameter-name order.

    Matrices and convolution kernels (dim >= 2) get N(0, 1/fan_in) (fan_in = numel / out
    features), so activations stay O(1) at every width; norm weights (names containing "norm")
    get 1; other vectors (biases) get N(0, 0.02^2). Nothing is zero, so outputs depend on the
    timestep and the modality (h3_spec §1.6, §8); norm biases are treated like other biases. The
    random numbers come from one torch.Generator on the parameters' device (CPU values differ from CUDA values).
    """
    params = dict(module.named_parameters())
    if not params:
        return
    device = next(iter(params.values())).device
    if device.type == "meta":
        return
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if p.dim() >= 2:
                std = 1.0 / math.sqrt(p.numel() // p.shape[0])
                values = torch.randn(p.shape, generator=generator, device=device) * std
            elif "norm" in name and name.endswith("weight"):
                values = torch.ones(p.shape, device=device)
            else:
                values = torch.randn(p.shape, generator=generator, device=device) * 0.02
            p.copy_(values.to(p.dtype))


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
    if isinstance(module, H3DiT):
        state = dit_state_from_checkpoint(module, state)
    load_state_dict_strict(module, state)


def grouped_to_qkv(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Fused qkv rows [q_h; k_h; v_h for each head h] -> [Q; K; V] (h3_spec §1.3, vllm-omni
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


def dit_state_from_checkpoint(dit: H3DiT, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DiT checkpoint's tensors in our parameter layout (qkv as [Q; K; V], fc1 as [gate; up]).

    The layout is official when any name is one only the official layout uses, else native.
    Raises ValueError when the checkpoint mixes native-only and official-only names, or (for
    the detected layout) a tensor is missing, unexpected or mis-shaped; the message names it.
    """
    shapes = {name: tuple(t.shape) for name, t in dit.state_dict().items()}
    sources = {name: official_sources(name) for name in shapes}
    official_names = {source for names in sources.values() for source in names}
    official = sorted(set(state) & (official_names - set(shapes)))
    native = sorted(set(state) & (set(shapes) - official_names))
    if official and native:
        raise ValueError(f"checkpoint mixes native and official tensor names: {native[0]!r} and {official[0]!r}")
    heads, head_dim = dit.cfg.num_heads, dit.cfg.head_dim
    if not official:
        check_state(state, shapes)
        return {k: grouped_to_qkv(v, heads, head_dim) if k.endswith(QKV_WEIGHT) else v for k, v in state.items()}
    expected = {}
    for name, names in sources.items():
        for source in names:
            expected[source] = (shapes[name][0] // len(names), *shapes[name][1:])
    check_state(state, expected)
    converted = {}
    for name, names in sources.items():
        tensor = torch.cat([state[source] for source in names])
        if name.endswith(FC1_WEIGHT):
            up, gate = tensor.chunk(2)
            tensor = torch.cat([gate, up])
        converted[name] = tensor
    return converted


def check_state(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError naming the first tensor of `state` that is missing from, not in, or
    shaped unlike `shapes` (name -> shape)."""
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise ValueError(f"checkpoint is missing tensor {missing[0]!r} ({len(missing)} missing)")
    unexpected = sorted(set(state) - set(shapes))
    if unexpected:
        raise ValueError(f"checkpoint has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)")
    for name, tensor in sorted(state.items()):
        if tuple(tensor.shape) != tuple(shapes[name]):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(shapes[name])}")


def load_state_dict_strict(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `module`; every tensor must exist with the same shape, and none may be
    missing. Raises ValueError naming the first offending tensor."""
    expected = module.state_dict()
    check_state(state, {name: tuple(t.shape) for name, t in expected.items()})
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))
