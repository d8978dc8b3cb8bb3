"""Ulysses sequence parallelism inside one packed DiT forward: how a pack's rows are split over
sp_degree ranks and what one rank computes (docs/model.md §1.2, §2.5-2.6, §5.3; the worker processes
that run it: h3_core.parallel.workers).

The split. A pack holds S rows, S a multiple of 64 (every request is padded to a multiple of
ROW_ALIGN, docs/model.md §2.1). Rank r of sp holds the rows [r x share, (r + 1) x share), share = S / sp
rounded up to a multiple of 64 (`Shares`); the pack is padded with zero rows to sp x share, so a
last share may be part padding or all padding (an "empty" tail share). Documents (requests) are
cut wherever the boundaries fall: a rank may hold several small documents, part of one, or parts
of two.

One step, on every rank at once (`forward_share`):
1. H3DiT.embed over the WHOLE pack, then the rank keeps its share of the rows. This part is
   replicated rather than split: it is under 1 % of a step (two thin patch projections, the
   2-block token refiner over the text rows only, one 1-row time embedding per timestep, the
   RoPE table), the refiner's documents are the requests' text blocks, which do not follow the
   row split, and being the same code over the same data it gives every rank the bits one
   device computes, with no collective before the first block.
2. The blocks on the share. Everything in a block is row-wise except attention, which
   `ulysses_attention` runs as: an all-to-all that gives each rank ALL rows for heads / sp of the
   heads, per-document attention over them with the pack's own cu_seqlens and the configured
   backend, and an all-to-all back. Two all-to-alls per layer, nothing else is exchanged. A
   request's LoRA deltas apply to its rows in the share (h3_core.model.lora.LoraPlan.window).
3. The final layer on the share (row-wise); each rank sends the driver its share's video and
   audio rows, which the driver concatenates in rank order (the pack's video and audio rows are
   in ascending row order, so this is the pack's order).

A rank whose own computation raises makes the step's remaining all-to-alls with zeros
(`release_peers`), so its peers finish the step rather than wait in a collective and the workers
serve on (h3_core.parallel.workers: a request's error costs no restart).

Parity with one device. On the CPU bitwise equal (tests/test_sequence_parallel.py, the end-to-end
test in tests/test_serving_sequence_parallel.py): share boundaries are multiples of 64, so each
rank's 64-row GEMM tiles are the ones the whole pack runs, and a head's attention over a document
is the same call on the same rows whatever other heads share it. Measured exception there: with
more than one torch thread, SDPA over ONE head of a short document (7-10 rows) differed by up to
2.4e-7 from the same head among others (one head per rank: sp_degree = heads); with cpu_threads 1,
the shipped setting, every case tried is bitwise. On CUDA NOT bitwise: on two H200s
(benchmarks/sequence_parallel_bench.py, benchmarks/results/h200x2_sequence_parallel*.json) sp_degree
2 against 1 differed by up to 0.026 max abs in a step's velocities and 0.011 in the latents after
30 steps, with Inductor's deterministic mode too, although every GEMM is row-invariant there (one
GEMM per linear with the cuBLAS workspace off, h3_core.model.dit) and attention over a subset of
the heads measured bitwise; docs/parity.md has every check. Solo == co-batched holds within one
sp_degree (the same code runs for every pack).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import ROW_ALIGN, DiTConfig
from ..model.attention import AttentionFn
from ..model.dit import H3DiT
from ..model.lora import lora_scope
from ..model.packed import PackedBatch

Exchange = Callable[[torch.Tensor], torch.Tensor]  # all-to-all: [sp, ...] -> [sp, ...] (chunk i to rank i)


def check_sp_degree(cfg: DiTConfig, sp_degree: int) -> None:
    """Raise ValueError unless sp_degree >= 1 divides the config's attention heads (Ulysses gives
    each rank heads / sp_degree of them)."""
    if sp_degree < 1:
        raise ValueError(f"h3_dit parameter sp_degree={sp_degree} is out of range: allowed >= 1")
    if cfg.num_heads % sp_degree:
        raise ValueError(
            f"h3_dit parameter sp_degree={sp_degree} does not divide the {cfg.num_heads} attention heads of "
            f"config {cfg.name}: choose a divisor of {cfg.num_heads}"
        )


# -- the split and the step of one rank --------------------------------------------------------


@dataclass(frozen=True)
class Shares:
    """How a pack of `rows` rows (a multiple of 64) is split over `world` ranks: rank r holds
    the padded rows [r x share, (r + 1) x share); rows >= `rows` are zero padding."""

    rows: int
    world: int

    @property
    def share(self) -> int:
        """Rows per rank: rows / world rounded up to a multiple of ROW_ALIGN."""
        return -(-self.rows // (self.world * ROW_ALIGN)) * ROW_ALIGN

    @property
    def padded(self) -> int:
        return self.world * self.share

    def bounds(self, rank: int) -> tuple[int, int]:
        """(first, end) padded rows of `rank`."""
        return rank * self.share, (rank + 1) * self.share

    def take(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor holding `rank`'s share of `tensor` [rows, ...] (zeros past `rows`)."""
        first, end = self.bounds(rank)
        part = tensor.new_zeros(self.share, *tensor.shape[1:])
        kept = max(0, min(end, self.rows) - first)
        part[:kept] = tensor[first : first + kept]
        return part


def layer_exchanges(shares: Shares, heads: int, head_dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of what a rank sends in the two all-to-alls of one layer's `ulysses_attention`:
    its rows' q, k, v [world, 3, share, heads / world, head_dim], then the attention of its heads
    over every row [world, share, heads / world, head_dim] (both in the DiT's dtype)."""
    world, share, mine = shares.world, shares.share, heads // shares.world
    return (world, 3, share, mine, head_dim), (world, share, mine, head_dim)


def ulysses_attention(exchange: Exchange, shares: Shares, backend: AttentionFn) -> AttentionFn:
    """An AttentionFn for the blocks of one rank: q, k, v [share, heads, head_dim] of the rank's
    rows -> all-to-all -> [padded rows, heads / sp] -> `backend` per document over the pack's rows
    (its Documents are the whole pack's) -> all-to-all back ->
    [share, heads, head_dim] in q's dtype. Padding rows (>= shares.rows) get zeros."""
    world, share = shares.world, shares.share

    def attention(q, k, v, documents):
        heads, head_dim = q.shape[1], q.shape[2]
        mine = heads // world
        # chunk j = my rows' q, k, v for heads [j x mine, (j + 1) x mine): [world, 3, share, mine, head_dim]
        send = torch.stack((q, k, v)).view(3, share, world, mine, head_dim).permute(2, 0, 1, 3, 4).contiguous()
        received = exchange(send)  # chunk i = rank i's rows for my heads
        q, k, v = received.permute(1, 0, 2, 3, 4).reshape(3, world * share, mine, head_dim)[:, : shares.rows]
        out = q.new_zeros(world * share, mine, head_dim)
        out[: shares.rows] = backend(q, k, v, documents)
        back = exchange(out.view(world, share, mine, head_dim))  # chunk j = my rows for rank j's heads
        return back.permute(1, 0, 2, 3).reshape(share, heads, head_dim)

    return attention


@torch.inference_mode()
def forward_share(
    dit: H3DiT,
    video: torch.Tensor,
    audio: torch.Tensor,
    text: torch.Tensor,
    batch: PackedBatch,
    rank: int,
    world: int,
    exchange: Exchange,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s part of one packed forward (the module docstring's steps 1-3); every rank of
    the `world` calls it at once with the same arguments but its rank and exchange.

    Args:
        dit: this rank's H3DiT (weights equal on every rank).
        video, audio, text, batch: the whole pack, as H3DiT.forward takes them (any device).
        exchange: the all-to-all among the ranks ([world, ...] in, [world, ...] out).
    Returns:
        (video float32 [v, 96], audio float32 [a, 32]): the velocities of the pack's video and audio
        rows that lie in this rank's share, in row order, on the rank's device.
    """
    e = dit.embed(*(t.to(dit.device) for t in (video, audio, text)), batch)
    shares = Shares(batch.total_rows, world)
    attention = ulysses_attention(exchange, shares, dit.attention)
    first, end = shares.bounds(rank)
    with lora_scope(None if e.rows.lora is None else e.rows.lora.window(first, end)):  # the share's rows
        video_out, audio_out = dit.transformer(
            shares.take(rank, e.x),
            e.t_emb,
            shares.take(rank, e.mod_index),
            shares.take(rank, e.timestep_index),
            attention,
            e.rows.documents,
            shares.take(rank, e.rows.rope),
        )

    def local(rows: torch.Tensor) -> torch.Tensor:
        return rows[(rows >= first) & (rows < end)] - first

    return video_out[local(e.rows.video_rows)], audio_out[local(e.rows.audio_rows)]


@torch.inference_mode()
def release_peers(dit: H3DiT, batch: PackedBatch, world: int, exchange: Exchange, done: int) -> int:
    """Make the all-to-alls of one step that this rank's `forward_share` did not reach, sending
    zeros, after its own computation raised having made `done` of them: its peers then finish the
    step instead of waiting in a collective until its timeout, so the process group stays usable
    and the step can fail for its requests without a restart of the workers (their rows of this
    step are garbage; the driver discards the step). A step makes 2 all-to-alls per layer
    (`layer_exchanges`), whatever the pack. Returns how many were made here; raises what
    `exchange` raises (a peer gone)."""
    cfg = dit.cfg
    sends = layer_exchanges(Shares(batch.total_rows, world), cfg.num_heads, cfg.head_dim) * cfg.num_layers
    for shape in sends[done:]:
        exchange(torch.zeros(shape, dtype=cfg.torch_dtype, device=dit.device))
    return len(sends) - min(done, len(sends))
