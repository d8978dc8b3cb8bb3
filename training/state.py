"""Resumable training state in safetensors (no pickle): model tensors, AdamW moments, metadata.

A state is one or more shard files `<prefix>-NN.safetensors`, each under `max_shard_bytes`
(so each can come back from the GPU machine, whose returned files are capped at 16 MiB). Model
tensors are kept in float32; the optimizer moments may be stored in bfloat16 (`moment_dtype`)
to halve the size, which a resumed AdamW does not notice in practice. Metadata (JSON) holds the
optimizer's param_groups and whatever the trainer passes (step, seconds trained, ...).
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

MAX_SHARD_BYTES = 15 * 2**20


def shard_paths(prefix: str | Path) -> list[Path]:
    prefix = Path(prefix)
    return sorted(prefix.parent.glob(f"{prefix.name}-[0-9][0-9].safetensors"))


def save_state(
    prefix: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict,
    moment_dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> list[Path]:
    """Write model + optimizer + meta as shards (old shards of the prefix are replaced)."""
    prefix = Path(prefix)
    tensors = {f"model.{k}": v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    groups = []
    if optimizer is not None:
        opt = optimizer.state_dict()
        groups = opt["param_groups"]
        for index, values in opt["state"].items():
            for key, value in values.items():
                dtype = torch.float32 if key == "step" else moment_dtype
                tensors[f"opt.{index}.{key}"] = value.detach().to(dtype).contiguous().cpu().reshape(value.shape)
    shards, current, size = [], {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    for old in shard_paths(prefix):
        old.unlink()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"meta": json.dumps(meta), "param_groups": json.dumps(groups), "num_shards": str(len(shards))}
    paths = []
    for i, shard in enumerate(shards):
        path = prefix.parent / f"{prefix.name}-{i:02d}.safetensors"
        save_file(shard, str(path), metadata=metadata)
        paths.append(path)
    return paths


def load_state(
    prefix: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict | None:
    """Load a state written by save_state into model (strict) and optimizer; returns its meta,
    or None when no shard of the prefix exists. Raises ValueError for an incomplete state."""
    paths = shard_paths(prefix)
    if not paths:
        return None
    with safe_open(str(paths[0]), "pt") as f:
        metadata = f.metadata()
    if int(metadata["num_shards"]) != len(paths):
        raise ValueError(f"state {prefix} has {len(paths)} shards, expected {metadata['num_shards']}")
    tensors = {}
    for path in paths:
        tensors.update(load_file(str(path)))
    model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(model_state, strict=True)
    if optimizer is not None:
        state: dict[int, dict] = {}
        for name, value in tensors.items():
            if name.startswith("opt."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = value
        if state:
            optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["param_groups"])})
    return json.loads(metadata["meta"])
