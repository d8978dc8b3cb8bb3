"""Per-request LoRA adapters inside the packed step (issue 50 item 4; docs/lora.md §"In the packed step").

A request names a composition: adapters by name with a scale each, `((name, scale), ...)`, applied
in that order (PackedBatch.loras). Each targeted linear of the DiT runs its base GEMM over all
rows as it does without LoRA (model dtype or fp8), then for every request whose composition
targets it adds, on that request's rows only,

    delta = sum over its adapters of  (x_rows A^T * (scale * alpha / rank)) B^T

with A [rank, in] and B [out, rank] in the model dtype, the two GEMMs run in the Linear's row
tiles over the request's own rows (on CUDA, row_tile 0: one GEMM over them), the sum taken in
float32 onto the base output and rounded once to its dtype (`LoraSlot`). A request's rows are the
same rows of the same values solo and co-batched (it starts at a multiple of 64, tiles never mix
requests), so its delta does not depend on the pack: solo == co-batched == request mode, bit for
bit. Requests without adapters, and scale-0 entries, take no delta at all: the bits of a DiT with
no adapter loaded.

Sequences. The blocks' linears see the pack's rows (a request: [offset, offset + seq_len)); the
text refiner's see the refiner sequence (a request: its text block padded to a multiple of 64,
as layout.pack_requests places it); a sequence-parallel rank sees its share (`LoraPlan.window`).

AdaLN. An AdaLN projection (blocks' `adaln_proj.linear`, `final_layer.adaln_proj.linear`) is
computed per timestep value and shared by every request at that value (the AdaLN table keeps
it). A request whose composition targets any AdaLN projection gets an AdaLN group g >= 1: every
projection returns, after its M shared rows (group 0, untouched), M rows per group holding the
shared value plus that request's delta on the same one-row input (one call per value), and the
request's rows read group g (`LoraPlan.adaln_rows` offsets their timestep index by g x M). The
shared value is never changed, so other requests read exactly what they read without LoRA.

The adapters are held by `LoraAdapters` (H3DiT.loras): objects shaped like
h3_core.weights.lora_formats.LoraAdapter (`targets`: module name -> a [rank, in], b [out, rank],
alpha), copied to the DiT's device and dtype when added. `merge_lora` folds one adapter into the
weights instead (a server using one adapter for every request).
"""

import threading
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from ..config import aligned_rows
from .adaln_table import AdaLNSlots
from .packed import PackedBatch

ADALN_SUFFIX = "adaln_proj.linear"  # the AdaLN projections' linears end in this
REFINER_PREFIX = "token_refiner."  # the linears on the refiner sequence start with this
QKV_PARTS = 3  # a qkv_proj target stacks the Q, K and V parts: rank and B's columns x 3


def row_tiled(gemm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int) -> torch.Tensor:
    """gemm over x [rows, k] in calls of exactly `tile` rows (the last tile zero-padded), or in one
    call when tile <= 0 or rows == 1: dit.Linear's tiling (docs/model.md §3.5 (3)). Returns
    gemm's rows for x's rows, [rows, n]."""
    rows = x.shape[0]
    if tile <= 0 or rows == 1:
        return gemm(x)
    tiles = list(x.split(tile))
    if tiles[-1].shape[0] < tile:
        tiles[-1] = F.pad(tiles[-1], (0, 0, 0, tile - tiles[-1].shape[0]))
    return torch.cat([gemm(part) for part in tiles])[:rows]


def lora_gemm(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, factor: float) -> torch.Tensor:
    """One tile's delta: (x A^T * factor) B^T for x [rows, in], a [rank, in], b [out, rank] (x's
    dtype) -> [rows, out]."""
    return F.linear(F.linear(x, a) * factor, b)


@dataclass(frozen=True)
class LoraTarget:
    """One target linear's LoRA pair: a float [rank, in], b float [out, rank], alpha (the delta's
    scaling is alpha / rank): as read from a file (its dtype, h3_core.weights.lora_formats) or as
    the DiT holds it (on its device in its dtype, LoraAdapters.add)."""

    a: torch.Tensor
    b: torch.Tensor
    alpha: float

    @property
    def rank(self) -> int:
        """Rows of A."""
        return self.a.shape[0]

    def delta(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """scale * alpha / rank * (x A^T) B^T for x [..., in] (A's dtype); returns [..., out]."""
        return F.linear(F.linear(x, self.a), self.b) * (scale * self.alpha / self.rank)

    def merged(self) -> torch.Tensor:
        """The delta's weight alpha / rank * B A, [out, in]: W + merged() is the merged linear."""
        return (self.b @ self.a) * (self.alpha / self.rank)


@dataclass(frozen=True)
class HeldAdapter:
    """An adapter as the DiT holds it: targets (module name -> LoraTarget), rank (the file's
    largest) and bytes (its A and B on the device)."""

    targets: dict[str, LoraTarget]
    rank: int
    bytes: int


@dataclass(frozen=True)
class LoraRun:
    """One request's part of a plan: its rows [start, end) in the pack (or a rank's share), its
    text block's rows in the refiner sequence, its adapters (adapter, scale) in order (scale != 0)
    and its AdaLN group (0: no adapter of it targets an AdaLN projection)."""

    rows: tuple[int, int]
    refiner_rows: tuple[int, int]
    terms: tuple[tuple[HeldAdapter, float], ...]
    group: int


@dataclass(frozen=True, eq=False)
class LoraPlan:
    """The LoRA work of one pack (LoraAdapters.plan): the adapters' holder, the runs of its
    requests with adapters, in pack order, the number of AdaLN groups and, when there are any,
    each pack row's group (int64 [S] on the DiT's device; 0 for rows of requests without AdaLN
    adapters)."""

    owner: "LoraAdapters"
    runs: tuple[LoraRun, ...]
    groups: int
    row_groups: torch.Tensor | None

    def adaln_rows(self, timestep_index: torch.Tensor, timesteps: int) -> torch.Tensor:
        """Each row's row of the AdaLN projections' extended output: timestep_index int64 [S]
        (into the pack's `timesteps` unique values) plus group x timesteps; unchanged without groups."""
        return timestep_index if self.groups == 0 else timestep_index + self.row_groups * timesteps

    def window(self, first: int, end: int) -> "LoraPlan":
        """The plan for a sequence-parallel rank holding pack rows [first, end) as its rows
        0..end-first: block rows clipped to the share and shifted (a run outside it gets an empty
        range); refiner rows and groups unchanged (every rank runs the whole refiner and AdaLN)."""

        def clip(start: int, stop: int) -> tuple[int, int]:
            low, high = max(start, first) - first, min(stop, end) - first
            return (low, max(low, high))

        runs = tuple(LoraRun(clip(*run.rows), run.refiner_rows, run.terms, run.group) for run in self.runs)
        return LoraPlan(self.owner, runs, self.groups, self.row_groups)


class LoraSlot:
    """What a targeted Linear calls after its base GEMM (dit.Linear.lora; `apply` is add_deltas,
    `extend` is extend_rows for an AdaLN projection): adds the active plan's deltas of this
    module (`name`) onto its output. Attached by LoraAdapters while adapters are loaded;
    outside a pack's forward (no active plan) it returns the output unchanged."""

    def __init__(self, owner: "LoraAdapters", name: str, linear: torch.nn.Module):
        self.owner, self.name, self.linear = owner, name, linear
        self.refiner = name.startswith(REFINER_PREFIX)
        # What the DiT calls, run outside torch.compile's tracing (the plan is Python state). Wrapped
        # here, not by a decorator: torch.compiler loads torch.distributed, which h3_vae must not import.
        self.apply = torch.compiler.disable(self.add_deltas)
        self.extend = torch.compiler.disable(self.extend_rows)

    def terms(self, run: LoraRun) -> list[tuple[LoraTarget, float]]:
        """(LoraTarget of this module, scale x alpha / rank) of the run's adapters that target it."""
        found = [(adapter.targets.get(self.name), scale) for adapter, scale in run.terms]
        return [(target, scale * target.alpha / target.rank) for target, scale in found if target is not None]

    def add_deltas(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [rows, out] (the base output of x [rows, in]) with every active run's delta added on
        its own rows, in float32, rounded once to y's dtype (in place; returns y)."""
        plan = self.owner.active
        if plan is None:
            return y
        for run in plan.runs:
            start, end = run.refiner_rows if self.refiner else run.rows
            terms = self.terms(run)
            if start >= end or not terms:
                continue
            total = y[start:end].to(torch.float32, copy=True)
            for target, factor in terms:
                gemm = partial(lora_gemm, a=target.a, b=target.b, factor=factor)
                total += row_tiled(gemm, x[start:end], self.linear.row_tile).float()
            y[start:end] = total.to(y.dtype)
        return y

    def extend_rows(self, projection, t_emb, shared: torch.Tensor) -> torch.Tensor:
        """An AdaLN projection's output for the active plan: `shared` [M, n x hidden] (its value
        per unique timestep) followed, per AdaLN group, by M rows of shared + the group's delta
        (one one-row call per value, on the projection's input: the AdaLN table's stored inputs
        for AdaLNSlots, else projection.project_input of each row of t_emb). Without groups: `shared`."""
        plan = self.owner.active
        if plan is None or plan.groups == 0:
            return shared
        if isinstance(t_emb, AdaLNSlots):
            x = t_emb.projection_inputs()
        else:  # row by row, as AdaLNProj.forward: a vectorised SiLU may round a row by how many share the call
            x = torch.cat([projection.project_input(e) for e in t_emb.split(1)])
        parts = [shared]
        for run in (run for run in plan.runs if run.group):
            total = shared.to(torch.float32, copy=True)
            for target, factor in self.terms(run):
                total += torch.cat([lora_gemm(row, target.a, target.b, factor) for row in x.split(1)]).float()
            parts.append(total.to(shared.dtype))
        return torch.cat(parts)


def lora_scope(plan: LoraPlan | None):
    """A context in which `plan` (PackRows.lora, or None) is the one its adapters' slots apply
    on this thread; nothing for None."""
    return nullcontext() if plan is None else plan.owner.scope(plan)


class LoraAdapters:
    """The LoRA adapters a DiT holds by name (H3DiT.loras), on its device in its dtype, and on
    each thread the plan of the pack being computed.

    `add` takes an h3_core.weights.lora_formats.LoraAdapter (any object with its `targets`:
    module name -> a [rank, in], b [out, rank], alpha; and `rank`) and holds a HeldAdapter.
    While at least one adapter is held, every module any adapter targets and every AdaLN
    projection gets a LoraSlot (dit.Linear.lora); with none held the DiT runs without any.
    """

    def __init__(self, dit: torch.nn.Module):
        self.dit = dit
        self.adapters: dict[str, HeldAdapter] = {}
        self.local = threading.local()

    @property
    def active(self) -> LoraPlan | None:
        """This thread's current plan (None outside a pack's forward)."""
        return getattr(self.local, "plan", None)

    @contextmanager
    def scope(self, plan: LoraPlan):
        """Make `plan` this thread's current plan for the block (the previous one after)."""
        previous, self.local.plan = self.active, plan
        try:
            yield
        finally:
            self.local.plan = previous

    def add(self, name: str, adapter) -> None:
        """Hold `adapter` as `name`, its A and B copied to the DiT's device and dtype. Raises
        ValueError for an empty name, a name already held, a target that is no linear of the DiT
        or A and B that do not fit it (an adapter mapped for another config), naming it."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a LoRA adapter needs a non-empty name, got {name!r}")
        if name in self.adapters:
            raise ValueError(f"LoRA adapter {name!r} is already loaded: remove it first")
        modules = dict(self.dit.named_modules())
        device, dtype = self.dit.device, self.dit.cfg.torch_dtype
        targets = {}
        for target_name, target in adapter.targets.items():
            linear = modules.get(target_name)
            if not hasattr(linear, "row_tile"):  # a dit.Linear
                raise ValueError(f"LoRA adapter {name!r} targets {target_name!r}, which is no linear of the DiT")
            a_shape, b_shape = tuple(target.a.shape), tuple(target.b.shape)
            if a_shape[1:] != (linear.in_features,) or b_shape != (linear.out_features, a_shape[0]):
                raise ValueError(
                    f"LoRA adapter {name!r}: A {a_shape} and B {b_shape} do not fit {target_name!r} of "
                    f"out={linear.out_features}, in={linear.in_features}"
                )
            targets[target_name] = LoraTarget(target.a.to(device, dtype), target.b.to(device, dtype), target.alpha)
        self.adapters[name] = HeldAdapter(targets, adapter.rank, sum(t.a.nbytes + t.b.nbytes for t in targets.values()))
        self.attach()

    def remove(self, name: str) -> None:
        """Drop adapter `name` and the CUDA graphs of packs that used it. Raises ValueError when
        it is not held. (Engine.remove_lora refuses an adapter a live request uses.)"""
        if name not in self.adapters:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        del self.adapters[name]
        if getattr(self.dit, "graphs", None) is not None:
            self.dit.graphs.forget_lora(name)
        self.attach()

    def attach(self) -> None:
        """Give every module a held adapter targets, and every AdaLN projection, its LoraSlot;
        take every slot away when no adapter is held."""
        wanted = {name for adapter in self.adapters.values() for name in adapter.targets}
        for name, module in self.dit.named_modules():
            if hasattr(module, "row_tile"):  # a dit.Linear
                held = self.adapters and (name in wanted or name.endswith(ADALN_SUFFIX))
                module.lora = LoraSlot(self, name, module) if held else None

    def plan(self, batch: PackedBatch) -> LoraPlan | None:
        """The LoRA work of `batch`, or None when no request of it has an
        adapter with a scale other than 0. Raises ValueError naming an adapter not held (a
        request is never computed without an adapter it names, e.g. on a rank that lacks it)."""
        if not any(batch.loras):
            return None
        runs, groups, refiner = [], 0, 0
        ends = [*batch.offsets[1:], batch.total_rows]  # a request's rows: up to the next one's (its padding
        # included); fewer than layout.seq_len where reference rows are left out (h3_core.model.reference_kv)
        for layout, offset, end, composition in zip(batch.layouts, batch.offsets, ends, batch.loras, strict=True):
            refiner_len = aligned_rows(layout.text_len)  # as layout.pack_requests
            for name, _ in composition:
                if name not in self.adapters:
                    raise ValueError(f"LoRA adapter {name!r} is not loaded")
            terms = tuple((self.adapters[name], scale) for name, scale in composition if scale != 0)
            adaln = any(target.endswith(ADALN_SUFFIX) for adapter, _ in terms for target in adapter.targets)
            groups += adaln
            if terms:
                runs.append(LoraRun((offset, end), (refiner, refiner + refiner_len), terms, groups if adaln else 0))
            refiner += refiner_len
        if not runs:
            return None
        row_groups = None
        if groups:
            row_groups = torch.zeros(batch.total_rows, dtype=torch.int64)
            for run in runs:
                row_groups[run.rows[0] : run.rows[1]] = run.group
            row_groups = row_groups.to(self.dit.device)
        return LoraPlan(self, tuple(runs), groups, row_groups)


def part_rank(adapter) -> int:
    """The rank of `adapter` (a LoraAdapter or HeldAdapter) as a serving limit compares it (h3_dit
    max_lora_rank): the largest target rank, a qkv_proj's divided by QKV_PARTS (rounded up: its
    stacked parts' rank)."""
    return max(
        (-(-t.rank // QKV_PARTS) if name.endswith("attn.qkv_proj") else t.rank for name, t in adapter.targets.items()),
        default=0,
    )


@torch.no_grad()
def merge_lora(dit, adapter, scale: float = 1.0) -> None:
    """Fold `adapter` (a LoraAdapter) at `scale` into the DiT's weights: W += scale x alpha / rank
    x B A per target, computed in float32 and rounded once to the weight's dtype (host-held AdaLN
    weights included); an AdaLN table in use is rebuilt (its values were of the old weights). For
    a server using one adapter for every request: merge after loading and before fp8 quantisation
    (h3_core.model.fp8.quantize_blocks). Equal to the per-request path within rounding
    (docs/lora.md §"In the packed step": tests/test_lora_step.py states the tolerance).

    Raises ValueError, before changing anything, for a target the DiT lacks or whose weight is
    fp8 already (a DiT quantised while loading cannot merge: its model-dtype weights are gone)."""
    modules = dict(dit.named_modules())
    weights = {}
    for name in adapter.targets:
        module = modules.get(name)
        if module is None:
            raise ValueError(f"merge_lora: the DiT has no {name!r}")
        parent = modules.get(name.removesuffix(".linear"))
        host = getattr(parent, "host", None) if name.endswith(ADALN_SUFFIX) else None
        weight = module.weight if host is None else host[0]
        if weight.dtype == torch.float8_e4m3fn:
            raise ValueError(
                f"merge_lora: {name!r} is fp8 already; merge into the model-dtype weights, then quantise "
                "(h3_dit quantization = fp8 quantises while loading: a merged adapter needs the bf16 load)"
            )
        weights[name] = weight
    for name, target in adapter.targets.items():
        weight = weights[name]
        delta = target.b.float() @ target.a.float() * (scale * target.alpha / target.rank)
        weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))
    if getattr(dit, "adaln_table", None) is not None:
        dit.use_adaln_table(dit.adaln_table.capacity)
