"""Sigma schedules and the Euler flow-matching update (docs/model.md §3).

Convention: num_inference_steps = number of DiT forwards; base = linspace(1, 0, steps + 1).
The model is fed t = 1 - sigma; its output v satisfies x0_hat = x_t + sigma * v.
A request may instead give its own sigma lists (check_sigmas), and a few-step adapter its base
positions (default_sigmas).
"""

import itertools
import json
import math
from numbers import Real

import torch

from ..rules import InvalidRequest

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


def check_sigmas(field: str, sigmas, max_steps: int | None = None) -> None:
    """Raise InvalidRequest(field, ...) unless `sigmas` (a list or tuple of real numbers, noise
    levels in [0, 1]) is a schedule the sampler can step: at least 2 points (1 forward) and at
    most max_steps + 1 (no bound for None), finite, exactly 1 first (pure noise), exactly 0 last
    (clean), strictly decreasing. The message names the field, the value and what is allowed,
    e.g. `video_sigmas[2]=0.5 is not below video_sigmas[1]=0.5: allowed strictly decreasing
    values from exactly 1 to exactly 0`."""
    if not isinstance(sigmas, (list, tuple)) or not all(
        isinstance(value, Real) and not isinstance(value, bool) for value in sigmas
    ):
        shown = repr(sigmas) if len(repr(sigmas)) <= 80 else f"{repr(sigmas)[:80]}..."
        raise InvalidRequest(field, f"{field} must be a list of numbers, got {shown}")
    points = len(sigmas)
    if points < 2 or (max_steps is not None and points > max_steps + 1):
        allowed = "at least 2" if max_steps is None else f"2..{max_steps + 1}"
        bound = "" if max_steps is None else f", at most max_steps={max_steps}"
        raise InvalidRequest(
            field,
            f"{field} has {points} point{'s' * (points != 1)}: allowed {allowed} (one more than the forwards{bound})",
        )
    for index, value in enumerate(sigmas):
        if not math.isfinite(value):
            raise InvalidRequest(
                field, f"{field}[{index}]={value} is not finite: allowed values from exactly 1 down to exactly 0"
            )
    if sigmas[0] != 1:
        raise InvalidRequest(field, f"{field}[0]={sigmas[0]} is out of range: allowed exactly 1 first (pure noise)")
    if sigmas[-1] != 0:
        raise InvalidRequest(
            field, f"{field}[{points - 1}]={sigmas[-1]} is out of range: allowed exactly 0 last (clean)"
        )
    for index in range(1, points):
        if not sigmas[index] < sigmas[index - 1]:
            raise InvalidRequest(
                field,
                f"{field}[{index}]={sigmas[index]} is not below {field}[{index - 1}]={sigmas[index - 1]}: "
                "allowed strictly decreasing values from exactly 1 to exactly 0",
            )


def default_sigmas(
    base_schedule: str, video_shift: float = DEFAULT_VIDEO_SHIFT, audio_shift: float = DEFAULT_AUDIO_SHIFT
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The default (video_sigmas, audio_sigmas) of a request naming a few-step adapter whose FlashGen
    metadata pins `base_schedule` (docs/lora.md, docs/model.md §3.1): a JSON array of the base
    positions b, strictly decreasing from exactly 1 to exactly 0 (e.g. "[1, 0.75, 0.5, 0.25, 0]",
    the uniform 4-forward base). Each clock gets shift_sigma(b, its shift) in fp32, as
    sigma_schedule does, so the uniform base gives exactly sigma_schedule's lists; the request's
    num_inference_steps is then len(b) - 1. Returns two tuples of len(b) Python floats.

    Raises InvalidRequest (a ValueError) with field "base_schedule" when the string is not a JSON
    array of numbers or the positions break check_sigmas' rules, or when a shift is <= 0 or makes
    two neighbouring sigmas equal in fp32 (a step of zero length)."""
    try:
        base = json.loads(base_schedule)
    except (TypeError, ValueError) as error:
        raise InvalidRequest(
            "base_schedule", f"base_schedule={base_schedule!r} is not JSON: allowed an array of positions 1 to 0"
        ) from error
    check_sigmas("base_schedule", base)
    lists = []
    for field, shift in (("video_shift", video_shift), ("audio_shift", audio_shift)):
        if not shift > 0:
            raise InvalidRequest("base_schedule", f"{field}={shift} is out of range: allowed > 0")
        sigmas = tuple(shift_sigma(torch.tensor(base, dtype=torch.float32), shift).tolist())
        if any(later >= earlier for earlier, later in itertools.pairwise(sigmas)):
            raise InvalidRequest(
                "base_schedule",
                f"base_schedule={base_schedule} at {field}={shift} gives sigmas {list(sigmas)} with equal "
                "neighbours in float32: allowed positions that stay strictly decreasing once shifted",
            )
        lists.append(sigmas)
    return lists[0], lists[1]
