"""PackedBatch: the row description of N requests packed into one DiT forward (docs/model.md §2.5).

h3_core.diffusion.layout.pack_requests builds it; H3DiT.forward and the sequence-parallel ranks read it.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class PackedBatch:
    """N requests packed into one sequence for one DiT forward (docs/model.md §2.5).

    Row index tensors are int64 on the CPU and list rows of the packed sequence in request
    order. The text refiner runs on its own sequence in which each request's text block is
    padded to a multiple of 64 rows (so row-tiled linears are batch-invariant).
    """

    layouts: list  # each request's RequestLayout (h3_core.diffusion.layout), hashable
    offsets: list[int]  # first packed row of each request (multiples of 64)
    total_rows: int
    cu_seqlens: torch.Tensor  # int32 [documents + 1], no empty documents
    video_rows: torch.Tensor  # int64 [sum image rows]: each request's condition rows, then its target video rows
    audio_rows: torch.Tensor  # int64 [sum 2*T_a]
    text_rows: torch.Tensor  # int64 [sum L]: packed rows receiving refined text
    refiner_rows: int  # length of the refiner sequence (multiple of 64)
    refiner_text_rows: torch.Tensor  # int64 [sum L]: where each text token sits in it
    refiner_cu_seqlens: torch.Tensor  # int32
    position_ids: torch.Tensor  # float64 [total_rows, 3]
    token_tags: torch.Tensor  # int64 [total_rows]
    unique_timesteps: torch.Tensor  # float32 [M], sorted ascending
    inverse_indices: torch.Tensor  # int64 [total_rows]: row -> index into unique_timesteps
    # each request's LoRA composition ((adapter name, scale), ...) in pack order, () for none
    # (h3_core.model.lora); empty: no request has one
    loras: list[tuple[tuple[str, float], ...]] = field(default_factory=list)
