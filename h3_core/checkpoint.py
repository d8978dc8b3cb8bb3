"""Weights: deterministic initialisation from a seed and safetensors save/load.

Only safetensors is used (no pickle anywhere). `load_weights` is strict: a missing,
unexpected or mis-shaped tensor raises ValueError naming the tensor.
"""
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


def init_weights(module: nn.Module, seed: int) -> None:
    """Fill every parameter of `module` deterministically from `seed`, in parameter-name order.

    Matrices and convolution kernels (dim >= 2) get N(0, 1/fan_in) (fan_in = numel / out
    features), so activations stay O(1) at every width; norm weights (names containing "norm")
    get 1; other vectors (biases) get N(0, 0.02^2). Nothing is zero, so outputs depend on the
    timestep and the modality (h3_spec §1.6, §8); norm biases are treated like other biases. The random numbers come from one
    torch.Generator on the parameters' device (CPU values differ from CUDA values).
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
    """Write `module`'s state dict (parameters and persistent buffers) to a .safetensors file."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))


def load_weights(module: nn.Module, path: str | Path) -> None:
    """Load a .safetensors file into `module`, casting each tensor to the module's dtype.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a tensor is missing, unexpected or has the wrong shape (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} not found")
    load_state_dict_strict(module, load_file(str(path)))


def load_state_dict_strict(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `module`; every tensor must exist with the same shape, and none may be
    missing. Raises ValueError naming the first offending tensor."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint is missing tensor {missing[0]!r} ({len(missing)} missing)")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"checkpoint has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))
