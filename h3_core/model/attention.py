"""Variable-length attention backends behind one `cu_seqlens` interface (h3_spec §1.4, §2.6).

A backend computes, for every document [s, e) of cu_seqlens independently,
out[s:e] = softmax(q[s:e] k[s:e]^T / sqrt(head_dim)) v[s:e] (non-causal). No backend ever lets
a row attend across a document boundary. q, k, v: [rows, heads, head_dim] in any dtype; they
may be strided views of a fused projection (only the last dim must have stride 1).
"""
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_rows: int) -> list[int]:
    """Validate document boundaries and return them as Python ints.

    Raises ValueError unless cu_seqlens is a 1-D int32 tensor starting at 0, strictly
    increasing (no empty documents) and ending at total_rows (field case C12).
    """
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be 1-D int32, got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 and hold at least one document, got {bounds[:4]}")
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError("cu_seqlens must be strictly increasing (no empty documents)")
    if bounds[-1] != total_rows:
        raise ValueError(f"cu_seqlens ends at {bounds[-1]} but q has {total_rows} rows")
    return bounds


def sdpa_per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """Per-document `scaled_dot_product_attention`, one call per document (CPU and GPU).

    Parity rule: bitwise solo == packed, since each document is computed by the same call on
    the same data whatever its neighbours. Returns [rows, heads, head_dim] in q's dtype.
    """
    bounds = check_cu_seqlens(cu_seqlens, q.shape[0])
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    for start, end in zip(bounds, bounds[1:]):
        doc = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        out[start:end] = F.scaled_dot_product_attention(*doc)[0].transpose(0, 1)
    return out


BACKENDS: dict[str, AttentionFn] = {"sdpa": sdpa_per_document}


def get_attention_backend(name: str) -> AttentionFn:
    """Return the named attention backend. Raises ValueError naming the available ones."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown; available: {sorted(BACKENDS)}")
    return BACKENDS[name]
