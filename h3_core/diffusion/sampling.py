"""Sigma schedules and the Euler flow-matching update (docs/model.md §3).

Convention: num_inference_steps = number of DiT forwards; base = linspace(1, 0, steps + 1).
The model is fed t = 1 - sigma; its output v satisfies x0_hat = x_t + sigma * v.
"""

import torch

DEFAULT_VIDEO_SHIFT = 12.0
DEFAULT_AUDIO_SHIFT = 3.0


def shift_sigma(base: torch.Tensor, shift: float) -> torch.Tensor:
    """The shifted sigma s*b / (1 + (s-1)*b) of base values b in [0, 1] (docs/model.md §3.1), elementwise
    in b's dtype and shape: b = 0 and 1 stay, shift > 1 moves the values in between towards 1.
    The one formula of the sampler's schedule (sigma_schedule) and of training's sigma draws."""
    return shift * base / (1 + (shift - 1) * base)


def sigma_schedule(num_steps: int, shift: float) -> list[float]:
    """Shifted sigmas shift_sigma(b, shift) over b = linspace(1, 0, num_steps + 1) in fp32
    (docs/model.md §3.1). Returns num_steps + 1 Python floats from 1.0 down to 0.0.

    Example: num_steps=5, shift=12 -> [1, 0.97959, 0.94737, 0.88889, 0.75, 0].
    Raises ValueError when num_steps < 1 or shift <= 0.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps {num_steps} must be >= 1")
    if shift <= 0:
        raise ValueError(f"shift {shift} must be > 0")
    base = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)
    return shift_sigma(base, shift).tolist()


def euler_step(x: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
    """Deterministic Euler update x_next = x + (sigma - sigma_next) * v in fp32 (docs/model.md §3.2,
    Euler ancestral with eta 0). x, velocity: float32 [rows, width]; returns the same shape."""
    return x + (sigma - sigma_next) * velocity
