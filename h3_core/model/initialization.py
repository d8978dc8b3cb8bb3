"""Deterministic initialisation of any module's parameters from a seed (the DiT of `random:SEED`,
the VAEs of create_vaes, the trainers' starting points)."""

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

RANDOM_PREFIX = "random:"
MAX_SEED = 2**63 - 2  # SEED + VAE_SEED_OFFSET must fit torch's int64 seeds


def drawn_values(
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], seed: int, device: str | torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, values) for `shapes` (name -> (shape, dtype)) in name order, one tensor at a time,
    drawn as init_weights draws them (its docstring) on `device` and cast to each dtype."""
    generator = torch.Generator(device=device).manual_seed(seed)
    for name in sorted(shapes):
        shape, dtype = shapes[name]
        if len(shape) >= 2:
            std = 1.0 / math.sqrt(math.prod(shape) // shape[0])
            values = torch.randn(shape, generator=generator, device=device) * std
        elif "norm" in name and name.endswith("weight"):
            values = torch.ones(shape, device=device)
        else:
            values = torch.randn(shape, generator=generator, device=device) * 0.02
        yield name, values.to(dtype)


def init_weights(module: nn.Module, seed: int) -> None:
    """Fill every parameter of `module` deterministically from `seed`, in parameter-name order.

    Matrices and convolution kernels (dim >= 2) get N(0, 1/fan_in) (fan_in = numel / out
    features), so activations stay O(1) at every width; norm weights (names containing "norm")
    get 1; other vectors (biases) get N(0, 0.02^2). Nothing is zero, so outputs depend on the
    timestep and the modality (docs/model.md §1.6, §8); norm biases are treated like other biases. The
    random numbers come from one torch.Generator on the parameters' device (CPU values differ from CUDA values).
    drawn_values draws the same numbers one tensor at a time.
    """
    params = dict(module.named_parameters())
    if not params:
        return
    device = next(iter(params.values())).device
    if device.type == "meta":
        return
    shapes = {name: (tuple(p.shape), p.dtype) for name, p in params.items()}
    with torch.no_grad():
        for name, values in drawn_values(shapes, seed, device):
            params[name].copy_(values)


def source_seed(source: str | Path) -> int | None:
    """SEED of a `random:SEED` weight source; None for a folder (h3_core.weights.checkpoint's module
    docstring).

    Raises ValueError when `source` starts with "random:" but SEED is not an integer in 0..MAX_SEED."""
    text = str(source)
    if not text.startswith(RANDOM_PREFIX):
        return None
    digits = text[len(RANDOM_PREFIX) :]
    if not (digits.isascii() and digits.isdigit() and int(digits) <= MAX_SEED):
        raise ValueError(
            f"weight source {text!r} is not {RANDOM_PREFIX}SEED with SEED an integer in 0..{MAX_SEED} "
            f"(e.g. {RANDOM_PREFIX}0), nor a checkpoint folder"
        )
    return int(digits)


def weights_seed(field: str, value: str) -> int | None:
    """The seed of a weights setting that is "" (read the weights from their files: None) or
    `random:SEED` (SEED, as source_seed parses it). Raises ValueError naming `field` and both
    allowed forms for any other value."""
    if not value:
        return None
    try:
        seed = source_seed(value)
    except ValueError:
        seed = None
    if seed is None:
        raise ValueError(
            f'{field}={value!r} is not allowed: "" (read the weights from the folder\'s safetensors) or '
            f"{RANDOM_PREFIX}SEED (seeded random weights) with SEED an integer in 0..{MAX_SEED}, e.g. {RANDOM_PREFIX}0"
        )
    return seed
