"""LoRA files in the three formats users have, read into one in-memory form (docs/lora.md §"File formats").

A LoRA adapter adds, to a target linear y = x W^T of our DiT, the delta
scale * alpha / rank * (x A^T) B^T with A [rank, in] and B [out, rank]. `read_lora` reads a
safetensors file (tensors and metadata), detects its format from the tensor names and maps every
tensor onto one of our linears (lora_targets), in our layouts: qkv_proj rows [Q; K; V], fc1 rows
[gate; up].

- diffusers / PEFT: the official names (checkpoint.OFFICIAL_RENAMES), all with or all without a
  `transformer.` prefix, `<name>.lora_A[.default].weight` and `.lora_B[...]`; alpha from a
  `<name>.alpha` tensor, else the metadata (`lora_alpha`, also inside diffusers'
  `lora_adapter_metadata` JSON), else DEFAULT_ALPHA. to_q / to_k / to_v stack into one qkv
  target: A concatenated, B block-diagonal (a part absent from the file: zero rows), alpha and
  rank times the parts stacked (alpha / rank unchanged); ff.net.0.proj's B rows [up; gate] are
  swapped to [gate; up].
- ComfyUI: `diffusion_model.` + the official names with a fused `attn.qkv_proj` (its A already
  concatenated, B block-diagonal), `lora_A`/`lora_B` or `lora_down`/`lora_up`; alpha from a
  `<name>.alpha` tensor (3 x the parts' alpha on a fused qkv), else as for diffusers.
- FlashGen: our own names under `transformer.` (`final_layer.` as is), metadata `lora_rank`,
  `lora_alpha` (for a target of rank lora_rank; a target of k x lora_rank rows gets k x lora_alpha),
  `qkv_layout` ("qkv" or "grouped": head-grouped qkv B rows go through checkpoint.grouped_to_qkv),
  `base_schedule`.

FastH3's `fastvideo-lora-v2` (full-rank weight diffs and sparse-attention gates, no A/B pair) is
refused, as are unknown tensor names and shapes that do not fit the target linear.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import DiTConfig
from ..model.lora import QKV_PARTS, LoraTarget
from .checkpoint import grouped_to_qkv, official_sources

DEFAULT_ALPHA = 8.0  # alpha of a diffusers file without one (what LightX2V and the Turbo reference use)
FASTVIDEO_FORMAT = "fastvideo-lora-v2"
_PEFT_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>A|B|down|up)(?:\.default)?\.weight$")
_PART = {"A": "A", "down": "A", "B": "B", "up": "B"}


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA file mapped onto our DiT: format ("diffusers", "comfyui" or "flashgen"), targets
    (our module name, e.g. "blocks.0.attn.qkv_proj" -> LoraTarget), rank (the largest target
    rank), bytes (of all mapped A and B tensors, as held in memory), base_schedule (FlashGen's
    metadata, else None) and the file's metadata."""

    format: str
    targets: dict[str, LoraTarget]
    rank: int
    bytes: int
    base_schedule: str | None
    metadata: dict[str, str]


def lora_targets(cfg: DiTConfig) -> dict[str, tuple[int, int]]:
    """Our module name -> (out, in) of every linear a LoRA may target: each block's
    attn.qkv_proj, attn.out_proj, mlp.fc1, mlp.fc2, adaln_proj.linear; each refiner block's attn
    and mlp linears; final_layer.adaln_proj.linear."""
    hidden, width, ffn, temb = cfg.hidden_size, cfg.attn_width, cfg.ffn_size, cfg.time_embed_dim
    common = {
        "attn.qkv_proj": (3 * width, hidden),
        "attn.out_proj": (hidden, width),
        "mlp.fc1": (2 * ffn, hidden),
        "mlp.fc2": (hidden, ffn),
    }
    shapes = {}
    for i in range(cfg.num_layers):
        shapes.update({f"blocks.{i}.{k}": v for k, v in common.items()})
        shapes[f"blocks.{i}.adaln_proj.linear"] = (18 * hidden, temb)
    for i in range(cfg.num_refiner_layers):
        shapes.update({f"token_refiner.blocks.{i}.{k}": v for k, v in common.items()})
    shapes["final_layer.adaln_proj.linear"] = (2 * hidden, temb)
    return shapes


def reserve_bytes(cfg: DiTConfig, rank: int, element_bytes: int) -> int:
    """Bytes of one adapter of part rank `rank` targeting every linear of lora_targets(cfg), as
    the DiT holds it (A and B of `element_bytes` each; a qkv_proj stacked: A [3r, in], B
    [out, 3r]): what sizing reserves per adapter slot (server.sizing)."""
    total = 0
    for name, (out, inp) in lora_targets(cfg).items():
        held = rank * QKV_PARTS if name.endswith("attn.qkv_proj") else rank
        total += held * (inp + out)
    return total * element_bytes


def read_lora(path: str | Path, cfg: DiTConfig) -> LoraAdapter:
    """Read the LoRA safetensors file `path` for a DiT of `cfg` (module docstring).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: a fastvideo-lora-v2 file, an unknown tensor name, a lone A or B, a shape that
            does not fit its target linear, or stacked qkv parts of different ranks; the message
            names the tensor.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA file {path} not found")
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    return map_lora(tensors, metadata, cfg)


def map_lora(tensors: dict[str, torch.Tensor], metadata: dict[str, str], cfg: DiTConfig) -> LoraAdapter:
    """read_lora on tensors (file name -> tensor) and metadata already read; raises as read_lora."""
    if FASTVIDEO_FORMAT in metadata.values() or any(k.endswith((".diff", ".diff_b")) for k in tensors):
        raise ValueError(
            f"LoRA file is FastH3's {FASTVIDEO_FORMAT} (full-rank weight diffs and sparse-attention gates), "
            "not a LoRA of A/B pairs: unsupported"
        )
    names = list(tensors)
    if not names:
        raise ValueError("LoRA file holds no tensors")
    if all(n.startswith("diffusion_model.") for n in names):
        fmt, pairs = "comfyui", _comfyui(tensors, metadata, cfg)
    elif any(n.startswith(("transformer.blocks.", "transformer.token_refiner.blocks.", "final_layer.")) for n in names):
        fmt, pairs = "flashgen", _flashgen(tensors, metadata, cfg)
    else:
        fmt, pairs = "diffusers", _diffusers(tensors, metadata, cfg)
    shapes = lora_targets(cfg)
    for name, (source, target) in pairs.items():
        if name not in shapes:
            raise ValueError(f"LoRA module {source!r} targets no linear of the DiT ({name!r})")
        out, inp = shapes[name]
        if target.a.shape[1] != inp or target.b.shape[0] != out or target.b.shape[1] != target.rank:
            raise ValueError(
                f"LoRA module {source!r}: A {tuple(target.a.shape)} and B {tuple(target.b.shape)} "
                f"do not fit {name!r} of out={out}, in={inp}"
            )
    targets = {name: target for name, (_, target) in pairs.items()}
    return LoraAdapter(
        format=fmt,
        targets=targets,
        rank=max((t.rank for t in targets.values()), default=0),
        bytes=sum(t.a.nbytes + t.b.nbytes for t in targets.values()),
        base_schedule=metadata.get("base_schedule") if fmt == "flashgen" else None,
        metadata=metadata,
    )


def _pairs(tensors: dict[str, torch.Tensor], prefix: str) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    """File module name (prefix removed) -> {"A": tensor, "B": tensor}, and module -> alpha tensor
    value; raises ValueError naming an unknown key or a lone A or B."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    alphas = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(prefix)
        if name.endswith(".alpha") and tensor.numel() == 1:
            alphas[name.removesuffix(".alpha")] = float(tensor)
            continue
        match = _PEFT_KEY.match(name)
        if match is None or not key.startswith(prefix):
            raise ValueError(f"LoRA file has unknown tensor {key!r}")
        pairs.setdefault(match["module"], {})[_PART[match["part"]]] = tensor
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA module {prefix + module!r} has lora_{next(iter(pair))} without its pair")
    return pairs, alphas


def _file_alpha(metadata: dict[str, str]) -> float:
    """lora_alpha of the metadata (or of diffusers' lora_adapter_metadata JSON), else DEFAULT_ALPHA."""
    if "lora_alpha" in metadata:
        return float(metadata["lora_alpha"])
    adapter = json.loads(metadata.get("lora_adapter_metadata", "{}"))
    return float(adapter.get("lora_alpha", DEFAULT_ALPHA))


def _official_names(cfg: DiTConfig) -> dict[str, tuple[str, int | None]]:
    """Official (diffusers) module name -> (our module name, qkv part index or None)."""
    names = {}
    for target in lora_targets(cfg):
        for index, source in enumerate(official_sources(f"{target}.weight")):
            part = index if target.endswith("qkv_proj") else None
            names[source.removesuffix(".weight")] = (target, part)
    return names


def _fc1(target: str, b: torch.Tensor) -> torch.Tensor:
    """B rows [up; gate] -> our fc1's [gate; up] for an fc1 target, else b."""
    if not target.endswith("mlp.fc1"):
        return b
    up, gate = b.chunk(2)
    return torch.cat([gate, up])


def _block_diagonal(
    parts: list[tuple[int, str, torch.Tensor, torch.Tensor]], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(part index 0/1/2 for q/k/v, name, A_i [r, in], B_i [width, r]) per qkv part present, in
    part order -> A [k r, in] concatenated and B [3 width, k r] with B_i in part i's rows and in
    its own columns, zeros elsewhere (a missing part's rows are zero); raises ValueError for parts
    of different ranks or a B_i not [width, r]."""
    ranks = {a.shape[0] for _, _, a, _ in parts}
    if len(ranks) != 1:
        raise ValueError(f"LoRA qkv parts {[n for _, n, _, _ in parts]} have different ranks {sorted(ranks)}")
    rank = ranks.pop()
    b = torch.zeros(3 * width, rank * len(parts), dtype=parts[0][3].dtype)
    for column, (index, name, _, part_b) in enumerate(parts):
        if part_b.shape != (width, rank):
            raise ValueError(f"LoRA module {name!r}: B {tuple(part_b.shape)} does not fit ({width}, {rank})")
        b[index * width : (index + 1) * width, column * rank : (column + 1) * rank] = part_b
    return torch.cat([a for _, _, a, _ in parts]), b


def _diffusers(tensors: dict[str, torch.Tensor], metadata: dict[str, str], cfg: DiTConfig) -> dict:
    """A diffusers / PEFT file's targets: our module name -> (file module name, LoraTarget)."""
    pairs, alphas = _pairs(tensors, "transformer." if all(k.startswith("transformer.") for k in tensors) else "")
    alpha = _file_alpha(metadata)
    names = _official_names(cfg)
    out, qkv = {}, {}
    for module, pair in pairs.items():
        if module not in names:
            raise ValueError(f"LoRA file has unknown module {module!r}")
        target, part = names[module]
        if part is None:
            out[target] = (module, LoraTarget(pair["A"], _fc1(target, pair["B"]), alphas.get(module, alpha)))
        else:
            qkv.setdefault(target, []).append((part, module, pair))
    for target, parts in qkv.items():
        ordered = [(index, module, pair["A"], pair["B"]) for index, module, pair in sorted(parts, key=lambda p: p[0])]
        part_alphas = {alphas.get(module, alpha) for _, module, _, _ in ordered}
        if len(part_alphas) != 1:
            modules = [module for _, module, _, _ in ordered]
            raise ValueError(f"LoRA qkv parts {modules} have different alphas {sorted(part_alphas)}")
        a, b = _block_diagonal(ordered, cfg.attn_width)
        out[target] = (ordered[0][1], LoraTarget(a, b, part_alphas.pop() * len(ordered)))
    return out


def _comfyui(tensors: dict[str, torch.Tensor], metadata: dict[str, str], cfg: DiTConfig) -> dict:
    """A ComfyUI file's targets: our module name -> (file module name, LoraTarget)."""
    pairs, alphas = _pairs(tensors, "diffusion_model.")
    names = {}
    for target in lora_targets(cfg):
        name = official_sources(f"{target}.weight")[0].removesuffix(".weight")
        names[name.replace(".attn.to_q", ".attn.qkv_proj")] = target
    alpha = _file_alpha(metadata)
    out = {}
    for module, pair in pairs.items():
        source = "diffusion_model." + module
        if module not in names:
            raise ValueError(f"LoRA file has unknown module {source!r}")
        target = names[module]
        default = 3 * alpha if target.endswith("qkv_proj") else alpha
        out[target] = (source, LoraTarget(pair["A"], _fc1(target, pair["B"]), alphas.get(module, default)))
    return out


def _flashgen(tensors: dict[str, torch.Tensor], metadata: dict[str, str], cfg: DiTConfig) -> dict:
    """A FlashGen file's targets: our module name -> (file module name, LoraTarget)."""
    for key in ("lora_rank", "lora_alpha"):
        if key not in metadata:
            raise ValueError(f"FlashGen LoRA file lacks metadata {key!r}")
    rank, alpha = int(metadata["lora_rank"]), float(metadata["lora_alpha"])
    layout = metadata.get("qkv_layout", "qkv")
    if layout not in ("qkv", "grouped"):
        raise ValueError(f"FlashGen LoRA qkv_layout={layout!r} is unknown: allowed 'qkv', 'grouped'")
    pairs, alphas = _pairs(tensors, "")
    if alphas:
        raise ValueError(
            f"FlashGen LoRA file has unknown tensor {next(iter(alphas)) + '.alpha'!r}: alpha is lora_alpha"
        )
    out = {}
    for module, pair in pairs.items():
        target = module.removeprefix("transformer.")
        a, b = pair["A"], pair["B"]
        if a.shape[0] % rank:
            raise ValueError(f"LoRA module {module!r} has rank {a.shape[0]}, not a multiple of lora_rank={rank}")
        if layout == "grouped" and target.endswith("attn.qkv_proj") and b.shape[0] == 3 * cfg.attn_width:
            b = grouped_to_qkv(b, cfg.num_heads, cfg.head_dim)
        out[target] = (module, LoraTarget(a, b, alpha * (a.shape[0] // rank)))
    return out
