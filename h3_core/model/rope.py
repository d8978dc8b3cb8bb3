"""3-axis half-split rotary position embedding (docs/model.md §1.5)."""

import torch


def rope_table(position_ids: torch.Tensor, freqs_per_axis: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    """Rotary table [rows, 6R] = [cos(angles) (3R) | sin(angles) (3R)] in `dtype`.

    position_ids: float64 [rows, 3] (t, h, w). inv_freq_i = theta^(-i/R), i = 0..R-1 (fp32);
    angles = [t*inv_freq | h*inv_freq | w*inv_freq] computed in fp32 (positions cast fp64->fp32).
    """
    inv_freq = theta ** (-torch.arange(freqs_per_axis, dtype=torch.float32) / freqs_per_axis)
    pos = position_ids.to(torch.float32)
    angles = (pos[:, :, None] * inv_freq.to(pos.device)).reshape(pos.shape[0], 3 * freqs_per_axis)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate the first 6R head dims of x [rows, heads, head_dim] (NeoX half-split).

    For d < 3R: x'_d = x_d cos - x_{d+3R} sin; x'_{d+3R} = x_{d+3R} cos + x_d sin; dims >= 6R
    pass through. Math in fp32 with the table's values; result in x's dtype.
    """
    half = table.shape[-1] // 2
    cos = table[:, None, :half].float()
    sin = table[:, None, half:].float()
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1).to(x.dtype)
