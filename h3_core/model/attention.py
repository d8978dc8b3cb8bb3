"""Variable-length attention backends behind one `cu_seqlens` interface (docs/model.md §1.4, §2.6).

A backend computes, for every document [s, e) of a pack's `Documents` independently,
out[s:e] = softmax(q[s:e] k[s:e]^T / sqrt(head_dim)) v[s:e] (non-causal). No backend ever lets
a row attend across a document boundary. q, k, v: [rows, heads, head_dim]; they may be strided
views of a fused projection (only the last dim must have stride 1). Every backend returns
[rows, heads, head_dim] in q's dtype. `Documents` is built once per forward from cu_seqlens
(int32 [docs + 1]) and holds its bounds as Python ints and its device tensors, so no layer
reads a device tensor back (no synchronisation); what a backend derives from it (auto's gathers,
flex's block mask) is built on its first call and kept, so a CUDA graph, whose capture follows
an uncaptured first call (h3_core.model.dit.GraphedForward), copies nothing to the device.

Each backend's docstring states its parity rule (solo == packed: a document's output does not
change when other documents share the call, its offset changes or padding documents are added),
as measured by benchmarks/gpu_backends.py on the GPU (docs/gpu_backends.md) and by
tests/test_attention_backends.py on the CPU. `get_attention_backend` checks that a backend can
run on a device and dtype before it is used.
"""

import functools
import importlib.metadata
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_rows: int) -> list[int]:
    """Validate document boundaries and return them as Python ints.

    Raises ValueError unless cu_seqlens is a 1-D int32 tensor starting at 0, strictly
    increasing (no empty documents) and ending at total_rows (docs/failure_classes.md §C12).
    """
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be 1-D int32, got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 and hold at least one document, got {bounds[:4]}")
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError("cu_seqlens must be strictly increasing (no empty documents)")
    if bounds[-1] != total_rows:
        raise ValueError(f"cu_seqlens ends at {bounds[-1]} but q has {total_rows} rows")
    return bounds


class Documents:
    """The attention documents of one pack, prepared once per forward and shared by every layer.

    Args:
        cu_seqlens: int32 [docs + 1] document boundaries in rows (check_cu_seqlens' rules), best
            on the CPU (on a GPU reading it back synchronises once).
        total_rows: the pack's rows (q's first dim in every call).
        device: where the attention runs.
    Attributes: bounds (cu_seqlens as Python ints), cu_seqlens (int32 on `device`), max_seqlen
    (rows of the longest document). Raises ValueError as check_cu_seqlens.
    """

    def __init__(self, cu_seqlens: torch.Tensor, total_rows: int, device: str | torch.device):
        self.bounds = tuple(check_cu_seqlens(cu_seqlens, total_rows))
        self.cu_seqlens = cu_seqlens.to(device)
        self.max_seqlen = max(end - start for start, end in itertools.pairwise(self.bounds))
        self.device = torch.device(device)
        self._gathered: dict[tuple, tuple[torch.Tensor, Documents]] = {}  # gathered()

    @property
    def spans(self) -> list[tuple[int, int]]:
        """[(start, end)] rows of every document."""
        return list(itertools.pairwise(self.bounds))

    def gathered(self, spans: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, "Documents"]:
        """The documents `spans` (start, end) as one pack, built once per Documents: (their rows,
        int64 [sum of their lengths] on the device; their Documents in that order)."""
        if spans not in self._gathered:
            rows = torch.cat([torch.arange(start, end) for start, end in spans])
            lengths = [end - start for start, end in spans]
            cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
            self._gathered[spans] = rows.to(self.device), Documents(cu, len(rows), self.device)
        return self._gathered[spans]

    @functools.cached_property
    def block_mask(self) -> BlockMask:
        """flex's document_block_mask of these documents, built on first use and kept."""
        return document_block_mask(self.bounds, self.device)

    def check(self, q: torch.Tensor) -> None:
        """Raise ValueError unless q has the pack's rows."""
        if q.shape[0] != self.bounds[-1]:
            raise ValueError(f"cu_seqlens ends at {self.bounds[-1]} but q has {q.shape[0]} rows")


AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Documents], torch.Tensor]


def sdpa_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`scaled_dot_product_attention` over one document: q, k, v [rows, heads, head_dim]."""
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)))
    return out[0].transpose(0, 1)


def sdpa_per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """Per-document `scaled_dot_product_attention`, one call per document (CPU and GPU; on the
    H200 in bf16 it runs cuDNN's sm90 flash kernel).

    Parity rule: bitwise solo == packed, since each document is computed by the same call on
    the same data whatever its neighbours (measured on the CPU and the H200, also for strided
    vs contiguous q/k/v).
    """
    documents.check(q)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    for start, end in documents.spans:
        out[start:end] = sdpa_document(q[start:end], k[start:end], v[start:end])
    return out


def document_block_mask(bounds: tuple[int, ...], device: torch.device) -> BlockMask:
    """Flex-attention BlockMask letting row i see row j only when both lie in the same
    document of `bounds` (cu_seqlens as ints). Documents.block_mask builds it once per pack (a
    DiT forward reuses it in every layer; a CUDA graph keeps it with the pack's Documents)."""
    cu = torch.tensor(bounds, device=device)
    document = torch.repeat_interleave(torch.arange(len(bounds) - 1, device=device), cu[1:] - cu[:-1])

    def same_document(batch, head, q_index, kv_index):
        return document[q_index] == document[kv_index]

    return create_block_mask(same_document, None, None, bounds[-1], bounds[-1], device=device)


@functools.cache
def compiled_flex_attention() -> Callable:
    """flex_attention compiled once per process (a fused Triton kernel on the GPU)."""
    return torch.compile(flex_attention)


def flex_documents(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """`flex_attention` over the whole pack with a block-diagonal document mask.

    Compiled on the GPU (torch.compile's default automatic dynamic shapes: the first shape gets
    a static kernel, later shapes share one dynamic kernel). On the CPU it runs eagerly:
    correct, but it materialises the [heads, rows, rows] score matrix, so it is for tests only.
    Parity rule, measured. H200, so compiled: bitwise solo == packed for documents of
    128..16,384 rows, strided == contiguous q/k/v; but not by construction: with a kernel
    compiled for each shape (automatic dynamic shapes off) the same check differed by up to
    4.9e-4 in bf16 (and ran 2.1x faster: 23.8 vs 50.7 ms for 3 x 16,384 rows, 24 heads;
    docs/gpu_backends.md). CPU, eager: solo vs packed differ by up to about 6e-8 in float32
    (the softmax runs over whole pack rows). Never a default.
    """
    documents.check(q)
    attend = compiled_flex_attention() if q.is_cuda else flex_attention
    out = attend(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), block_mask=documents.block_mask)
    return out[0].transpose(0, 1)


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """`torch.nn.attention.varlen.varlen_attn` (PyTorch's flash-attention 2 varlen kernel): one
    call for the whole pack. CUDA, bf16/fp16 only.

    Parity rule: bitwise solo == packed, measured on the H200 (PyTorch 2.11) for documents of
    128..16,384 rows behind a 16,384-row document (so with another max_seqlen) and before a
    padding document; strided == contiguous q/k/v bitwise.
    """
    from torch.nn.attention.varlen import varlen_attn

    documents.check(q)
    cu, longest = documents.cu_seqlens, documents.max_seqlen
    return varlen_attn(q, k, v, cu, cu, longest, longest)


def flash_attn2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """`flash_attn.flash_attn_varlen_func` of the flash_attn 2.x package, which neither
    scripts/setup.sh nor the Dockerfile installs (`pip install flash-attn` on a CUDA host).
    CUDA, bf16/fp16 only.

    Parity rule: not measured (the package is not installed on the H200 machine).
    """
    from flash_attn import flash_attn_varlen_func

    documents.check(q)
    cu, longest = documents.cu_seqlens, documents.max_seqlen
    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest)


def flash_attn4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """`flash_attn.cute.flash_attn_varlen_func` of the flash-attn-4 package (CuTe DSL kernels,
    written against 4.0.0b36, which returns (out, lse)). Hopper or newer GPU, bf16/fp16 only.

    Parity rule: bitwise solo == packed (documents of 128..16,384 rows behind a 16,384-row
    document and before a padding document) and strided == contiguous, measured on the H200
    with 4.0.0b36 (docs/gpu_backends.md); its first call compiles its kernel (about 5 s).
    """
    from flash_attn.cute import flash_attn_varlen_func

    documents.check(q)
    cu, longest = documents.cu_seqlens, documents.max_seqlen
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest
    )[0]


# auto's thresholds. Documents of at most AUTO_VARLEN_MAX_ROWS rows are gathered into one `varlen`
# call, which pays off for 128-row documents (from about 12 a pack), not for 512. Documents of at
# least AUTO_FLASH_ATTN4_MIN_ROWS rows are gathered into one `flash_attn4` call where flash-attn-4
# is installed: 8,192 rows 2.98 vs 3.35 ms (SDPA), 3 x 8,192 8.90 vs 9.91, 16,384 12.18 vs 12.77,
# 3 x 16,384 36.28 vs 40.11 (56 heads); at 2,048 rows it loses alone (0.301 vs 0.263 ms). H200
# tables in docs/gpu_backends.md.
AUTO_VARLEN_MAX_ROWS = 128
AUTO_FLASH_ATTN4_MIN_ROWS = 8192


def auto_route(rows: int, device: torch.device, dtype: torch.dtype) -> str:
    """The backend auto runs a document of `rows` rows with: varlen up to AUTO_VARLEN_MAX_ROWS,
    flash_attn4 from AUTO_FLASH_ATTN4_MIN_ROWS, where each can run; else sdpa."""
    if rows <= AUTO_VARLEN_MAX_ROWS and unavailable_reason("varlen", device, dtype) is None:
        return "varlen"
    if rows >= AUTO_FLASH_ATTN4_MIN_ROWS and unavailable_reason("flash_attn4", device, dtype) is None:
        return "flash_attn4"
    return "sdpa"


def auto(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
    """Per document, by its length (auto_route): documents of at most AUTO_VARLEN_MAX_ROWS rows
    are gathered into one `varlen` call (faster than SDPA once a pack holds about 12 of them,
    about 0.3 ms slower for one to three), documents of at least AUTO_FLASH_ATTN4_MIN_ROWS rows
    into one `flash_attn4` call where flash-attn-4 is installed (4 to 11 % faster than SDPA
    there), the others run through per-document SDPA (the fastest measured from 512 to 2,048
    rows). Where varlen or flash_attn4 cannot run (the CPU, float32, no package) their documents
    run through SDPA.

    The choice depends on each document's own length, never on the rest of the pack (a choice
    per pack shape would compute a document with different kernels solo and co-batched).
    Parity rule: bitwise solo == packed, as all three backends it uses are; measured on the
    H200, also in the bench DiT (docs/gpu_backends.md).
    """
    documents.check(q)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    routes: dict[str, list[tuple[int, int]]] = {}
    for start, end in documents.spans:
        routes.setdefault(auto_route(end - start, q.device, q.dtype), []).append((start, end))
    for start, end in routes.pop("sdpa", []):
        out[start:end] = sdpa_document(q[start:end], k[start:end], v[start:end])
    for name, spans in routes.items():
        rows, gathered = documents.gathered(tuple(spans))
        out[rows] = BACKENDS[name](q[rows], k[rows], v[rows], gathered)
    return out


BACKENDS: dict[str, AttentionFn] = {
    "sdpa": sdpa_per_document,
    "auto": auto,
    "flex": flex_documents,
    "varlen": varlen,
    "flash_attn": flash_attn2,
    "flash_attn4": flash_attn4,
}


def installed_version(distribution: str) -> str | None:
    """Version of an installed Python distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def unavailable_reason(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why backend `name` cannot run on `device` with `dtype`, or None when it can.

    sdpa, auto and flex run everywhere; varlen needs CUDA and bf16/fp16; flash_attn also needs the
    flash_attn 2.x package; flash_attn4 needs the flash-attn-4 package and a GPU of compute
    capability 9 (Hopper) or newer. Cached: auto asks for every document of every layer.
    """
    if name in ("sdpa", "auto", "flex"):
        return None
    if name == "flash_attn" and not (installed_version("flash_attn") or "").startswith("2."):
        return "the flash_attn 2.x package is not installed"
    if name == "flash_attn4" and installed_version("flash-attn-4") is None:
        return "the flash-attn-4 package is not installed"
    if device.type != "cuda":
        return f"it needs a CUDA device, not {device.type}"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"it needs bfloat16 or float16, not {dtype}"
    if name == "flash_attn4" and torch.cuda.get_device_capability(device)[0] < 9:
        return "it needs a GPU of compute capability 9.0 (Hopper) or newer"
    return None


def get_attention_backend(name: str, device: str | torch.device, dtype: torch.dtype) -> AttentionFn:
    """Return the named backend after checking it can run on `device` with `dtype`.

    Raises:
        ValueError: the name is unknown (the message lists the known ones).
        RuntimeError: the backend cannot run here; the message says why (a package is
            missing, it needs CUDA, it needs bf16/fp16, it needs a newer GPU).
    """
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown; available: {sorted(BACKENDS)}")
    reason = unavailable_reason(name, torch.device(device), dtype)
    if reason:
        raise RuntimeError(f"attention backend {name!r} is unavailable: {reason}")
    return BACKENDS[name]
