"""Reference rows' keys and values reused between refreshes (docs/model.md §3.6; opt-in, off by default).

A ref2va request's reference rows (image, audio and video references: RequestLayout.reference_span)
hold a fixed timestep, but their keys and values still change from step to step from block 2 on,
as they attend to the noisy target rows. With refresh every k steps (`ref_kv_refresh` = k > 1) a
request computes all its rows on its own steps s with s % k == 0 (its own step index, so the
schedule is the same solo, co-batched and in request mode) and keeps every block's keys and values
of its reference rows (a ReferenceKV); on its other steps the forward leaves its reference rows out
of the pack: its other rows are the queries, and its attention document takes keys and values
[rows before the references ; the cached reference keys / values ; its other rows], in the full
document's row order, through per-document `scaled_dot_product_attention` (which takes query and
key lengths that differ on every device, so this works whatever the server's attention backend).
k = 1 computes every step (the default): no cache, the forward unchanged.

What it keeps: per request output and reference row, num_layers x 2 (keys, values) x attn_width
values of the model dtype (bytes_per_reference_row), freed when the request finishes or leaves.
"""

from dataclasses import dataclass, field

import torch

from ..config import DiTConfig, aligned_rows
from .attention import AttentionFn, Documents, sdpa_document
from .lora import lora_scope
from .packed import PackedBatch

MAX_REF_KV_REFRESH = 16  # the largest k a server may allow (h3_dit max_ref_kv_refresh)


def check_refresh(ref_kv_refresh: int, max_ref_kv_refresh: int, sp_degree: int) -> None:
    """h3_dit's rules (h3_core.serving.shared.settings.DitSettings): 1 <= max_ref_kv_refresh <=
    MAX_REF_KV_REFRESH (1 by default: off unless the server allows it, since above 1 server.sizing
    counts a cache for every held request), 1 <= ref_kv_refresh <= max_ref_kv_refresh, and
    ref_kv_refresh 1 unless sp_degree is 1 (a request's k above 1 is refused there too). Raises
    ValueError naming the parameter and the allowed range."""
    if not 1 <= max_ref_kv_refresh <= MAX_REF_KV_REFRESH:
        raise ValueError(
            f"h3_dit parameter max_ref_kv_refresh={max_ref_kv_refresh} is out of range: allowed 1..{MAX_REF_KV_REFRESH}"
        )
    if not 1 <= ref_kv_refresh <= max_ref_kv_refresh:
        raise ValueError(
            f"h3_dit parameter ref_kv_refresh={ref_kv_refresh} is out of range: allowed "
            f"1..{max_ref_kv_refresh} (max_ref_kv_refresh)"
        )
    if ref_kv_refresh > 1 and sp_degree > 1:
        raise ValueError(
            f"h3_dit parameter ref_kv_refresh={ref_kv_refresh} needs sp_degree 1: reference reuse runs the DiT "
            "in the instance's process"
        )


def bytes_per_reference_row(cfg: DiTConfig) -> int:
    """Bytes a ReferenceKV keeps per reference row: num_layers x 2 x attn_width x dtype bytes
    (tiny float32: 2 x 2 x 128 x 4 = 2,048; H3 bf16: 50 x 2 x 7,168 x 2 = 1,433,600)."""
    return cfg.num_layers * 2 * cfg.attn_width * torch.tensor([], dtype=cfg.torch_dtype).element_size()


@dataclass(eq=False)
class ReferenceKV:
    """One request output's cached reference keys and values.

    refresh: k (1 = every step computed, nothing kept). keys / values: per block [R, heads,
    head_dim] in the model dtype (RoPE applied to the keys), from the last refresh step
    (`step`), [] when nothing is kept. `held` counts the ReferenceKV objects that keep tensors
    (in this process), for the tests and the logs.
    """

    refresh: int = 1
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    step: int = -1
    held = 0  # class-wide: ReferenceKV objects holding tensors now

    def reuses(self, step: int) -> bool:
        """Whether the request's step `step` reuses the cache: k > 1, something kept and step % k != 0
        (a refresh step the step cache skipped leaves the older keys in use until the next one)."""
        return self.refresh > 1 and bool(self.keys) and step % self.refresh != 0

    def refreshes(self, step: int) -> bool:
        """Whether step `step` computes the reference rows and keeps their keys and values."""
        return self.refresh > 1 and not self.reuses(step)

    def keep(self, step: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Replace what is kept by one forward's keys and values (one tensor per block)."""
        if not self.keys:
            ReferenceKV.held += 1
        self.keys, self.values, self.step = keys, values, step

    def clear(self) -> None:
        """Free the kept tensors (the request finished or left)."""
        if self.keys:
            ReferenceKV.held -= 1
        self.keys, self.values, self.step = [], [], -1

    @property
    def nbytes(self) -> int:
        """Bytes kept now."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True)
class ReferencePlan:
    """One request's part in a forward with reference reuse: its cache, its reference rows
    [start, end) within its rows (RequestLayout.reference_span) and its step."""

    cache: ReferenceKV
    start: int
    end: int
    step: int

    @property
    def reuses(self) -> bool:
        return self.cache.reuses(self.step)


class ReferenceAttention:
    """The DiT blocks' attention for a pack with reference reuse, called once per block in block
    order (H3DiT.transformer): keeps the reference keys and values of the refreshing requests
    (`captures`: (first row, end row, plan) in the pack) and computes the reusing requests'
    documents (`reuses`: (document start, reference insertion row, document end, plan)) over
    [cached ; fresh] keys and values with sdpa; every other document runs through `base` (the
    DiT's backend), gathered into one call, as it would without reuse."""

    def __init__(self, base: AttentionFn, captures: list, reuses: list):
        self.base, self.captures, self.reuses, self.layer = base, captures, reuses, 0
        self.kept = {id(plan): ([], []) for _, _, plan in captures}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents) -> torch.Tensor:
        layer, self.layer = self.layer, self.layer + 1
        for start, end, plan in self.captures:
            keys, values = self.kept[id(plan)]
            keys.append(k[start:end].clone())
            values.append(v[start:end].clone())
        if not self.reuses:
            return self.base(q, k, v, documents)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        reused = {start for start, _, _, _ in self.reuses}
        others = tuple(span for span in documents.spans if span[0] not in reused)
        if others:
            rows, gathered = documents.gathered(others)
            out[rows] = self.base(q[rows], k[rows], v[rows], gathered)
        for start, insert, end, plan in self.reuses:
            cache = plan.cache
            keys = torch.cat([k[start:insert], cache.keys[layer], k[insert:end]])
            values = torch.cat([v[start:insert], cache.values[layer], v[insert:end]])
            out[start:end] = sdpa_document(q[start:end], keys, values)
        return out

    def commit(self) -> None:
        """After the forward: each refreshing request keeps what this forward computed."""
        for _, _, plan in self.captures:
            plan.cache.keep(plan.step, *self.kept[id(plan)])


@dataclass
class CompactPack:
    """A PackedBatch without the reusing requests' reference rows (compact_pack): `batch`, the
    masks of the full pack's video / audio input rows it keeps (bool [sum image rows], [sum
    audio rows]), and the ReferenceAttention's captures and reuses (rows of `batch`)."""

    batch: PackedBatch
    keep_video: torch.Tensor
    keep_audio: torch.Tensor
    captures: list
    reuses: list


def compact_pack(batch: PackedBatch, plans: list[ReferencePlan | None]) -> CompactPack:
    """Leave the reference rows of every reusing request (plans[i].reuses) out of `batch` (one
    plan or None per request, in batch order). A reusing request keeps its rows before and after
    its references in order, with their positions, tags and timesteps, padded again to a multiple
    of 64 rows (a padding document); every other request keeps its rows as packed. Raises
    ValueError when the plans do not match the pack's requests."""
    if len(plans) != len(batch.layouts):
        raise ValueError(f"{len(plans)} reference plans for a pack of {len(batch.layouts)} requests")
    timesteps = batch.unique_timesteps[batch.inverse_indices]
    new_index = torch.full((batch.total_rows,), -1, dtype=torch.int64)
    offsets, bounds, positions, tags, row_timesteps = [], [0], [], [], []
    captures, reuses, offset = [], [], 0
    for layout, start, plan in zip(batch.layouts, batch.offsets, plans, strict=True):
        if plan is not None and plan.reuses:
            kept = torch.cat(
                [torch.arange(start, start + plan.start), torch.arange(start + plan.end, start + layout.used)]
            )
            length = aligned_rows(len(kept))
            reuses.append((offset, offset + plan.start, offset + len(kept), plan))
        else:
            kept, length = torch.arange(start, start + layout.used), layout.seq_len
            if plan is not None and plan.cache.refreshes(plan.step):
                captures.append((offset + plan.start, offset + plan.end, plan))
        used, padding = len(kept), length - len(kept)
        new_index[kept] = torch.arange(offset, offset + used)
        positions += [batch.position_ids[kept], torch.zeros(padding, 3, dtype=batch.position_ids.dtype)]
        tags += [batch.token_tags[kept], torch.full((padding,), -1, dtype=batch.token_tags.dtype)]
        row_timesteps += [timesteps[kept], timesteps[start + layout.used - 1].expand(padding)]  # padding: t_video
        offsets.append(offset)
        bounds += [offset + used] + ([offset + length] if padding else [])
        offset += length
    video_rows, audio_rows = new_index[batch.video_rows], new_index[batch.audio_rows]
    keep_video, keep_audio = video_rows >= 0, audio_rows >= 0
    unique, inverse = torch.unique(torch.cat(row_timesteps), sorted=True, return_inverse=True)
    compact = PackedBatch(
        layouts=batch.layouts,
        offsets=offsets,
        total_rows=offset,
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        video_rows=video_rows[keep_video],
        audio_rows=audio_rows[keep_audio],
        text_rows=new_index[batch.text_rows],
        refiner_rows=batch.refiner_rows,
        refiner_text_rows=batch.refiner_text_rows,
        refiner_cu_seqlens=batch.refiner_cu_seqlens,
        position_ids=torch.cat(positions),
        token_tags=torch.cat(tags),
        unique_timesteps=unique,
        inverse_indices=inverse,
        loras=batch.loras,
    )
    return CompactPack(compact, keep_video, keep_audio, captures, reuses)


@torch.inference_mode()
def forward(
    dit, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, batch: PackedBatch, plans: list
) -> tuple[torch.Tensor, torch.Tensor]:
    """H3DiT.forward with reference reuse (eager: no CUDA graph): arguments as forward's, plus
    one ReferencePlan or None per request of `batch`. The reusing requests' reference rows are
    left out (compact_pack), the refreshing ones' keys and values kept (ReferenceAttention).
    Returns (video float32 [sum image rows, 96], audio float32 [sum audio rows, 32]) in the full
    pack's row order, as H3DiT.forward; the rows left out hold 0 (h3_core.diffusion.layout.split_rows
    drops every condition row's output). `dit` must be an H3DiT (its embed_rows and transformer)."""
    pack = compact_pack(batch, plans)
    timesteps, inverse, rows = dit.device_batch(pack.batch)
    # the kept input rows as indices made on the CPU: no read-back of a device mask
    keep_video = pack.keep_video.nonzero().squeeze(1).to(video.device)
    keep_audio = pack.keep_audio.nonzero().squeeze(1).to(audio.device)
    e = dit.embed_rows(video[keep_video], audio[keep_audio], text, timesteps, inverse, rows)
    attention = ReferenceAttention(dit.attention, pack.captures, pack.reuses)
    with lora_scope(rows.lora):  # each request's LoRA deltas on its kept rows (h3_core.model.lora)
        video_out, audio_out = dit.transformer(
            e.x, e.t_emb, e.mod_index, e.timestep_index, attention, rows.documents, rows.rope
        )
    attention.commit()
    video_full = video_out.new_zeros(pack.keep_video.shape[0], video_out.shape[1])
    audio_full = audio_out.new_zeros(pack.keep_audio.shape[0], audio_out.shape[1])
    video_full.index_copy_(0, keep_video, video_out[rows.video_rows])
    audio_full.index_copy_(0, keep_audio, audio_out[rows.audio_rows])
    return video_full, audio_full
