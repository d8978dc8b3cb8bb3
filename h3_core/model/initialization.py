"""Deterministic initialisation of any module's parameters from a seed (the DiT of `random:SEED`,
the VAEs of create_vaes, the trainers' starting points)."""

import math

import torch
from torch import nn


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
