"""Per-request step caching (TeaCache, Liu et al. 2024, arXiv:2411.19108): a request whose
velocity barely changes from one step to the next skips the DiT forward and takes its Euler step
with the velocity of its last computed step.

The decision is made before a step, from the request's own state only, so a cached request is
bit-identical solo, co-batched and in request mode, and a request with threshold 0 runs exactly
as without caching. At step k (not the first or the last, which are always computed) the
request's change metric is

    rel_k = mean |m_k - m_{k-1}| / mean |m_{k-1}|

m_k being the first DiT block's AdaLN-modulated input of its noisy video and audio rows
(`modulated_input`; condition rows stay out). `accumulated += polynomial(rel_k)`, where the
polynomial (numpy.polyval coefficients, highest power first) maps the input's relative change to
the estimated relative change of the model's output (fitted per model, benchmarks/cache_quality.py
--fit; CACHE_FILE beside the weights; IDENTITY_POLYNOMIAL where the weights have none). While
accumulated < threshold the step is skipped; otherwise it is computed and accumulated restarts at 0.
All of it lives in the request's StepCache (docs/failure_classes.md §K6: nothing is kept per model).

Memory: the cache keeps only what the decision needs between steps, the last planned step's
latents and timesteps (`inputs`, [V, 96] + [2*T_a, 32] float32) and the last computed velocity
(the same shapes), not the modulated input itself: Engine.plan_step recomputes the previous
step's modulated input from `inputs` (the same function of the same tensors: the same values).
For H3 at its default canvas (672 x 384 px, 209 frames: 15,624 video + 696 audio rows, hidden
5376, bf16) that is 2 x 5.8 MiB an output instead of 167 MiB of modulated input plus 5.8 MiB;
request_memory_mb counts it (STEP_CACHE_BYTES_PER_ROW) and server.sizing for every held request.
"""

from dataclasses import dataclass

import torch

from ..model import H3DiT
from .layout import TAG_AUDIO, TAG_VIDEO

# numpy.polyval coefficients, highest power first: the estimated output change is the input's.
IDENTITY_POLYNOMIAL = (1.0, 0.0)


@torch.inference_mode()
def modulated_input(
    dit: H3DiT, video: torch.Tensor, audio: torch.Tensor, t_video: float, t_audio: float
) -> torch.Tensor:
    """The first block's AdaLN-modulated input norm1(x) (1 + scale_msa) + shift_msa of one
    request's noisy rows, embedded as H3DiT.embed_rows embeds them (the patch projections, the
    time embedding of each of its timesteps, the block's video / audio modulation rows): the
    change metric's quantity (TeaCache, Liu et al. 2024, arXiv:2411.19108, §3.3). It runs on the
    request's rows alone, so the result cannot depend on a pack.

    dit: an H3DiT (AttributeError for a DiT without its modules, e.g. a SequenceParallelDiT).
    video: float32 [V, 96] target video rows; audio: float32 [2*T_a, 32] audio rows (no condition
    rows); t_video, t_audio: their model timesteps t = 1 - sigma. Returns [V + 2*T_a, hidden] in
    the model dtype, video rows first."""
    cfg, dtype, block = dit.cfg, dit.cfg.torch_dtype, dit.blocks[0]
    timesteps = torch.tensor([t_video, t_audio], dtype=torch.float32, device=dit.device)
    t_emb = torch.cat([dit.time_embedder(t) for t in timesteps.split(1)])
    table = block.adaln_proj(t_emb).view(-1, 6 * cfg.hidden_size)  # rows timestep * 3 + modality
    shift, scale = table[:, : cfg.hidden_size], table[:, cfg.hidden_size : 2 * cfg.hidden_size]
    rows = []
    for index, (x, proj, tag) in enumerate(
        ((video, dit.video_patch_proj, TAG_VIDEO), (audio, dit.audio_patch_proj, TAG_AUDIO))
    ):
        h, row = proj(x.to(dit.device)).to(dtype), index * 3 + tag
        rows.append(block.norm1(h) * (1 + scale[row]) + shift[row])
    return torch.cat(rows)


def polyval(coefficients: tuple[float, ...], x: float) -> float:
    """sum_i c_i x^(n-1-i) by Horner's rule in Python floats (float64), as numpy.polyval."""
    value = 0.0
    for c in coefficients:
        value = value * x + c
    return value


def relative_change(current: torch.Tensor, previous: torch.Tensor) -> float:
    """mean |current - previous| / mean |previous| of two same-shape tensors, computed in
    float32 (a Python float; reading it synchronises with the device)."""
    current, previous = current.float(), previous.float()
    return ((current - previous).abs().mean() / previous.abs().mean()).item()


@dataclass(eq=False)  # a cache is itself: compared by identity (its fields hold tensors)
class StepCache:
    """One request output's step cache (module docstring).

    threshold: the request's cache_threshold (0 = off: every step computed, nothing kept).
    planned_step: the step index whose decision `skip` holds (-1: none planned yet).
    accumulated: sum of polynomial(rel) since the last computed step.
    inputs: (video float32 [V, 96], audio float32 [2*T_a, 32], t_video, t_audio) of the last
        planned step, from which its modulated input is recomputed (None after the last step).
    velocity: (video float32 [V, 96], audio float32 [2*T_a, 32]) of the last computed step.
    skipped: steps taken with the cached velocity so far.
    """

    threshold: float = 0.0
    planned_step: int = -1
    skip: bool = False
    accumulated: float = 0.0
    inputs: tuple[torch.Tensor, torch.Tensor, float, float] | None = None
    velocity: tuple[torch.Tensor, torch.Tensor] | None = None
    skipped: int = 0

    def plan(
        self,
        step: int,
        total_steps: int,
        modulated: torch.Tensor | None,
        previous: torch.Tensor | None,
        polynomial: tuple[float, ...],
    ) -> bool:
        """Decide step `step` (0-based) of `total_steps` from its modulated input [rows, hidden]
        and the previous planned step's (`previous`, recomputed from `inputs`; None for the
        first); returns whether it is skipped. The first and the last steps are computed (their
        inputs may be None); a computed step restarts the accumulation. Call once per step
        (Engine.plan_step does: planned_step)."""
        skip = False
        if 0 < step < total_steps - 1 and self.velocity is not None:
            self.accumulated += polyval(polynomial, relative_change(modulated, previous))
            skip = self.accumulated < self.threshold
        if not skip:
            self.accumulated = 0.0
        self.planned_step, self.skip = step, skip
        return skip

    def skips(self, step: int) -> bool:
        """Whether step `step` was planned and is skipped."""
        return self.planned_step == step and self.skip
