"""Packed variable-length layout: one request's rows and the batched packing of N requests.

One request occupies [ text L | condition blocks | audio 2*T_a | video V | padding to a multiple
of 64 ] rows (docs/model.md §2.1). t2va has no condition blocks. fl2va has one keyframe block per
keyframe (one latent frame at the target's spatial grid, its first or last frame). ref2va has
[ guide blocks | reference blocks in request order ]: guides are one latent frame at the target's
grid at a given frame; references are an image (one latent frame at its own grid), audio (2 x T_ref
rows), a video or a video with its audio (audio rows, then video rows). Condition rows are rows
the sampler never updates: they hold their anchor at every step (docs/model.md §3.3); visual condition
rows take the timestep max(t_video, CONDITION_TIMESTEP), reference audio rows
max(t_audio, AUDIO_CONDITION_TIMESTEP) = 1 (docs/model.md §1.9). A batch concatenates requests in batch
order, each keeping its own padded length, so every request starts at a multiple of 64 rows and
attention documents never cross requests (docs/model.md §2.5). Shape math follows docs/model.md §4.
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import (
    AUDIO_CHANNELS,
    FIRST_FRAME,
    FRAMES_PER_LATENT,
    LAST_FRAME,
    PATCH,
    ROW_ALIGN,
    VIDEO_LATENT_CHANNELS,
    VIDEO_SPATIAL_DOWNSAMPLE,
    align_num_frames,
    aligned_rows,
    audio_latent_frames,
    latent_frames,
)
from ..model.packed import PackedBatch

FRAME_TIME = 5.0 / 3.0  # RoPE time units per video frame: one unit = one 40 Hz audio latent
SPATIAL_EXTENT = 32.0  # RoPE spatial coordinates span about this range (docs/model.md §2.3)

TAG_PAD, TAG_VIDEO, TAG_TEXT, TAG_AUDIO = -1, 0, 1, 2  # token tags; also the AdaLN modality
CONDITION_TIMESTEP = 0.999  # visual condition rows' timestep is max(t_video, this) (docs/model.md §1.9)
AUDIO_CONDITION_TIMESTEP = 1.0  # reference audio rows' timestep is max(t_audio, this)
TIMELINE_KINDS = ("keyframe", "guide")  # condition blocks at the target's grid and timeline
REFERENCE_KINDS = ("image", "audio", "video", "video_audio")  # blocks that advance the target origin


def spatial_grid(latent_h: int, latent_w: int) -> tuple[list[float], list[float]]:
    """RoPE h and w coordinates of a latent's patch grid (docs/model.md §2.3), fp64 Python floats: for an
    axis of D latents, ratio = D / sqrt(Hl x Wl), coordinates 32 x (left + ratio x i / (D/2)),
    left = (1 - ratio) / 2."""
    area = math.sqrt(latent_h * latent_w)

    def axis(size: int) -> list[float]:
        ratio = size / area
        left = (1.0 - ratio) / 2.0
        count = size // PATCH
        return [SPATIAL_EXTENT * (left + ratio * i / count) for i in range(count)]

    return axis(latent_h), axis(latent_w)


def latent_times(origin: float, latent_t: int) -> list[float]:
    """RoPE time of each latent frame: origin + 5/3 x (the first frame it covers), summed in order."""
    times, t = [], float(origin)
    for k in range(latent_t):
        times.append(t)
        t += FRAME_TIME * FRAMES_PER_LATENT[k % len(FRAMES_PER_LATENT)]
    return times


def span(latent_t: int) -> float:
    """The RoPE time `latent_t` latent frames cover, sum over k < latent_t of 5/3 x
    FRAMES_PER_LATENT[k % 5], as numpy's pairwise float64 sum (the reference's arithmetic)."""
    frames = [FRAME_TIME * FRAMES_PER_LATENT[k % len(FRAMES_PER_LATENT)] for k in range(latent_t)]
    return float(np.sum(np.array(frames, dtype=np.float64)))


@dataclass(frozen=True)
class ConditionBlock:
    """One condition block of a request's rows (docs/model.md §2.1), hashable.

    kind: one of h3_core.protocol.CONDITION_KINDS. Visual kinds (keyframe, guide, image, video,
    video_audio) have latent_t x (latent_h/2) x (latent_w/2) video rows (keyframes and guides one
    latent frame at the target's grid; image one at its own; video latent_t); audio kinds (audio,
    video_audio) 2 x audio_t audio rows, placed before the block's video rows. frame: a keyframe's
    FIRST_FRAME / LAST_FRAME or a guide's frame index (0 .. num_frames - 1)."""

    kind: str
    latent_t: int = 0
    latent_h: int = 0
    latent_w: int = 0
    audio_t: int = 0
    frame: int = 0

    @property
    def video_rows(self) -> int:
        return self.latent_t * (self.latent_h // PATCH) * (self.latent_w // PATCH)

    @property
    def audio_rows(self) -> int:
        return AUDIO_CHANNELS * self.audio_t

    @property
    def rows(self) -> int:
        return self.audio_rows + self.video_rows

    def advance(self) -> float:
        """How far a reference moves the target origin (docs/model.md §2.3): image 1, audio T_ref, video
        span(T_lat), video with audio max(T_ref, span); keyframes and guides 0."""
        if self.kind == "image":
            return 1.0
        if self.kind == "audio":
            return float(self.audio_t)
        if self.kind in ("video", "video_audio"):
            return max(float(self.audio_t), span(self.latent_t))
        return 0.0


@dataclass(frozen=True)
class RequestLayout:
    """Row layout of one request: [text | condition blocks | audio (channel-major) | video | padding].

    All counts are rows. `seq_len` is the padded length (a multiple of 64, >= used). `conditions`:
    the condition blocks in row order (() for t2va; make_layout orders them). `vision_spans`:
    [start, end) text rows that are vision tokens of the text encoder's presentation (token tag
    0, docs/model.md §2.2; () with a text-only encoder).
    """

    text_len: int
    latent_t: int
    latent_h: int
    latent_w: int
    audio_t: int
    seq_len: int
    conditions: tuple[ConditionBlock, ...] = ()
    vision_spans: tuple[tuple[int, int], ...] = ()

    @property
    def frame_rows(self) -> int:
        """Rows of one latent frame of the target: (Hl/2) x (Wl/2) patches."""
        return (self.latent_h // PATCH) * (self.latent_w // PATCH)

    @property
    def condition_rows(self) -> int:
        return sum(block.rows for block in self.conditions)

    @property
    def condition_video_rows(self) -> int:
        """The condition blocks' video rows (they lead the DiT's video rows)."""
        return sum(block.video_rows for block in self.conditions)

    @property
    def condition_audio_rows(self) -> int:
        """The condition blocks' audio rows (they lead the DiT's audio rows)."""
        return sum(block.audio_rows for block in self.conditions)

    @property
    def audio_rows(self) -> int:
        """Target audio rows (the rows the sampler updates)."""
        return AUDIO_CHANNELS * self.audio_t

    @property
    def video_rows(self) -> int:
        """Target video rows (the rows the sampler updates)."""
        return self.latent_t * self.frame_rows

    @property
    def image_rows(self) -> int:
        """The DiT's video-token rows: condition video rows, then target video rows (img_pos)."""
        return self.condition_video_rows + self.video_rows

    @property
    def all_audio_rows(self) -> int:
        """The DiT's audio rows: condition audio rows, then target audio rows (audio_pos)."""
        return self.condition_audio_rows + self.audio_rows

    @property
    def reference_span(self) -> tuple[int, int]:
        """[start, end) rows of the reference blocks (image, audio, video references; they follow
        the keyframes and guides, so they are contiguous); (audio_start, audio_start) when none."""
        rows = sum(block.rows for block in self.conditions if block.kind in REFERENCE_KINDS)
        return self.audio_start - rows, self.audio_start

    @property
    def audio_start(self) -> int:
        return self.text_len + self.condition_rows

    @property
    def video_start(self) -> int:
        return self.audio_start + self.audio_rows

    @property
    def used(self) -> int:
        return self.video_start + self.video_rows

    @property
    def origin(self) -> float:
        """RoPE time where the targets start: text_len, advanced by every reference (docs/model.md §2.3)."""
        origin = float(self.text_len)
        for block in self.conditions:
            origin += block.advance()
        return origin

    def keyframe_time(self, frame: int) -> float:
        """RoPE time of a keyframe (docs/model.md §2.3): the origin for FIRST_FRAME; for LAST_FRAME the
        last frame's, origin + span(T_lat) - 5/3."""
        if frame == FIRST_FRAME:
            return self.origin
        return self.origin + span(self.latent_t) - FRAME_TIME

    def spatial_grid(self) -> tuple[list[float], list[float]]:
        """RoPE h and w coordinates of the target's patch grid (docs/model.md §2.3)."""
        return spatial_grid(self.latent_h, self.latent_w)

    def video_times(self) -> list[float]:
        """RoPE time of each target latent frame: origin + 5/3 x (first frame it covers)."""
        return latent_times(self.origin, self.latent_t)

    def blocks(self) -> list[tuple[ConditionBlock, int]]:
        """Each condition block with its first row."""
        placed, row = [], self.text_len
        for block in self.conditions:
            placed.append((block, row))
            row += block.rows
        return placed

    def position_ids(self) -> torch.Tensor:
        """RoPE coordinates (t, h, w) of every row, float64 [seq_len, 3] (docs/model.md §2.3).

        Text row i: (i, 0, 0). Audio channel c, latent tau at origin o with grid w: (o + tau, 0,
        w[0] for c = 0 or w[-1] for c = 1). Video latents at origin o: (o + latent time, h grid,
        w grid), t-major then h then w. The targets sit at `origin`, with the target's grid;
        keyframes at keyframe_time, guides at origin + 5/3 x frame, both on the target's grid;
        each reference at the cursor that the references before it advanced from text_len, on
        its own grid (an audio reference on the target's w extremes). Padding: (0, 0, 0).
        """
        pos = torch.zeros(self.seq_len, 3, dtype=torch.float64)
        pos[: self.text_len, 0] = torch.arange(self.text_len, dtype=torch.float64)
        target_grid = self.spatial_grid()
        origin, cursor = self.origin, float(self.text_len)
        for block, row in self.blocks():
            if block.kind == "keyframe":
                times, grid = [self.keyframe_time(block.frame)], target_grid
            elif block.kind == "guide":
                times, grid = [origin + FRAME_TIME * block.frame], target_grid
            else:
                times = latent_times(cursor, block.latent_t)
                grid = spatial_grid(block.latent_h, block.latent_w) if block.video_rows else target_grid
            _place_audio(pos, row, block.audio_t, cursor, grid[1])
            _place_video(pos, row + block.audio_rows, times, grid)
            cursor += block.advance()
        _place_audio(pos, self.audio_start, self.audio_t, origin, target_grid[1])
        _place_video(pos, self.video_start, self.video_times(), target_grid)
        return pos

    def token_tags(self) -> torch.Tensor:
        """Row modality tags, int64 [seq_len] (docs/model.md §2.2): -1 padding, 0 video (condition and
        target rows, and the text encoder's vision tokens), 1 text, 2 audio (condition and target)."""
        tags = torch.full((self.seq_len,), TAG_PAD, dtype=torch.int64)
        tags[: self.text_len] = TAG_TEXT
        for start, end in self.vision_spans:
            tags[start:end] = TAG_VIDEO
        for block, row in self.blocks():
            tags[row : row + block.audio_rows] = TAG_AUDIO
            tags[row + block.audio_rows : row + block.rows] = TAG_VIDEO
        tags[self.audio_start : self.video_start] = TAG_AUDIO
        tags[self.video_start : self.used] = TAG_VIDEO
        return tags

    def row_timesteps(self, t_video: float, t_audio: float) -> torch.Tensor:
        """Each row's model timestep, float32 [seq_len] (docs/model.md §1.9): t_video for every row,
        then max(t_video, CONDITION_TIMESTEP) on condition video rows,
        max(t_audio, AUDIO_CONDITION_TIMESTEP) on condition audio rows, t_audio on audio rows."""
        rows = torch.full((self.seq_len,), t_video, dtype=torch.float32)
        for block, row in self.blocks():
            rows[row : row + block.audio_rows] = max(t_audio, AUDIO_CONDITION_TIMESTEP)
            rows[row + block.audio_rows : row + block.rows] = max(t_video, CONDITION_TIMESTEP)
        rows[self.audio_start : self.video_start] = t_audio
        return rows

    def video_row_index(self) -> torch.Tensor:
        """The rows of the DiT's video tokens, int64 [image_rows]: condition video rows in block
        order, then target video rows (docs/model.md §2.2's img_pos)."""
        parts = [torch.arange(row + b.audio_rows, row + b.rows) for b, row in self.blocks()]
        return torch.cat([*parts, torch.arange(self.video_start, self.used)])

    def audio_row_index(self) -> torch.Tensor:
        """The rows of the DiT's audio tokens, int64 [all_audio_rows]: condition audio rows in
        block order, then target audio rows (docs/model.md §2.2's audio_pos)."""
        parts = [torch.arange(row, row + b.audio_rows) for b, row in self.blocks()]
        return torch.cat([*parts, torch.arange(self.audio_start, self.video_start)])


def _place_audio(pos: torch.Tensor, row: int, audio_t: int, origin: float, w_grid: list[float]) -> None:
    """Write the positions of 2 x audio_t channel-major audio rows from `row`: (origin + tau, 0,
    w_grid[0] for channel 0, w_grid[-1] for channel 1)."""
    tau = torch.arange(audio_t, dtype=torch.float64) + origin
    for channel, w_pin in enumerate((w_grid[0], w_grid[-1])):
        start = row + channel * audio_t
        pos[start : start + audio_t, 0] = tau
        pos[start : start + audio_t, 2] = w_pin


def _place_video(pos: torch.Tensor, row: int, times: list[float], grid: tuple[list[float], list[float]]) -> None:
    """Write the positions of len(times) latent frames of video rows from `row`, t-major then h then w."""
    if not times:
        return
    t, h, w = (torch.tensor(values, dtype=torch.float64) for values in (times, *grid))
    block = torch.stack(torch.meshgrid(t, h, w, indexing="ij"), dim=-1).reshape(-1, 3)
    pos[row : row + block.shape[0]] = block


def order_conditions(conditions) -> tuple[ConditionBlock, ...]:
    """The blocks in row order (docs/model.md §2.1): keyframes (first frame, then last), guides, then
    references, each group in the given order."""
    keyframes = sorted((b for b in conditions if b.kind == "keyframe"), key=lambda b: b.frame != FIRST_FRAME)
    guides = [b for b in conditions if b.kind == "guide"]
    references = [b for b in conditions if b.kind in REFERENCE_KINDS]
    return (*keyframes, *guides, *references)


def make_layout(
    text_len: int,
    height: int,
    width: int,
    num_frames: int,
    seq_len: int | None = None,
    conditions: tuple[ConditionBlock, ...] = (),
    vision_spans: tuple[tuple[int, int], ...] = (),
) -> RequestLayout:
    """Layout of a request. height/width in pixels (multiples of 32), num_frames as asked: the
    clip is aligned up to 17n+5 frames (config.align_num_frames, the served clip) and its latent
    and audio rows are the aligned clip's, so a LAST_FRAME keyframe sits at the served clip's
    last frame; guides are checked against 0..num_frames - 1. seq_len pins the padded length (a multiple of 64,
    >= used); None pads to the next multiple of 64. conditions: the request's condition blocks
    (check_conditions' rules; placed in order_conditions' order); vision_spans: see RequestLayout.

    672x384, 209 frames, 9 text tokens -> used 16,329, seq_len 16,384 (docs/model.md §4.4).

    Raises ValueError when seq_len is not a multiple of 64 or is below the used rows, for a vision
    span outside 0..text_len or empty, and as check_conditions.
    """
    for start, end in vision_spans:
        if not 0 <= start < end <= text_len:
            raise ValueError(f"vision span [{start}, {end}) is out of range: allowed within 0..{text_len} text rows")
    latent_h, latent_w = height // VIDEO_SPATIAL_DOWNSAMPLE, width // VIDEO_SPATIAL_DOWNSAMPLE
    check_conditions(conditions, num_frames, latent_h, latent_w)
    layout = RequestLayout(
        text_len=text_len,
        latent_t=latent_frames(num_frames),
        latent_h=latent_h,
        latent_w=latent_w,
        audio_t=audio_latent_frames(align_num_frames(num_frames)),
        seq_len=0,
        conditions=order_conditions(conditions),
        vision_spans=tuple((int(start), int(end)) for start, end in vision_spans),
    )
    used = layout.used
    if seq_len is None:
        seq_len = aligned_rows(used)
    if seq_len % ROW_ALIGN or seq_len < used:
        raise ValueError(f"seq_len {seq_len} must be a multiple of {ROW_ALIGN} and >= {used} used rows")
    return dataclasses.replace(layout, seq_len=seq_len)


def check_conditions(conditions, num_frames: int, latent_h: int, latent_w: int) -> None:
    """Raise ValueError naming the block unless every condition block is well formed: keyframes
    distinct FIRST_FRAME / LAST_FRAME, one latent frame at the target's latent grid; guides a
    frame in 0..num_frames - 1, one latent frame at the target's grid, distinct frames; images one
    latent frame with even latent sides; audio audio_t >= 1 and no video; video / video_audio
    latent_t = 5n + 2 with even sides (audio_t >= 1 for video_audio, 0 for video); no keyframes
    beside guides or references (fl2va and ref2va are different tasks)."""
    kinds = [block.kind for block in conditions]
    if "keyframe" in kinds and any(kind != "keyframe" for kind in kinds):
        raise ValueError(
            "keyframes cannot be mixed with guides or references: send guides at frames 0 and num_frames - 1"
        )
    frames = [block.frame for block in conditions if block.kind == "keyframe"]
    if any(frame not in (FIRST_FRAME, LAST_FRAME) for frame in frames) or len(set(frames)) != len(frames):
        raise ValueError(
            f"keyframes={frames} is not allowed: distinct frame indices {FIRST_FRAME} (first) or {LAST_FRAME} (last)"
        )
    guides = [block.frame for block in conditions if block.kind == "guide"]
    if len(set(guides)) != len(guides):
        raise ValueError(f"guide frames {guides} repeat a frame: one guide per frame")
    for index, block in enumerate(conditions):
        name = f"condition {index} ({block.kind})"
        if block.kind in TIMELINE_KINDS:
            good = (block.latent_t, block.latent_h, block.latent_w, block.audio_t) == (1, latent_h, latent_w, 0)
            if block.kind == "guide" and not 0 <= block.frame < num_frames:
                raise ValueError(
                    f"{name} frame={block.frame} is out of range: allowed 0..{num_frames - 1} (num_frames)"
                )
        elif block.kind == "image":
            good = block.latent_t == 1 and block.audio_t == 0 and _even(block)
        elif block.kind == "audio":
            good = block.audio_t >= 1 and block.latent_t == 0
        elif block.kind in ("video", "video_audio"):
            good = block.latent_t >= 2 and (block.latent_t - 2) % 5 == 0 and _even(block)
            good = good and (block.audio_t >= 1) == (block.kind == "video_audio")
        else:
            raise ValueError(f"{name}: kind {block.kind!r} is unknown")
        if not good:
            raise ValueError(
                f"{name} has latent shape t={block.latent_t} h={block.latent_h} w={block.latent_w} "
                f"audio_t={block.audio_t}, which its kind does not allow"
            )


def _even(block: ConditionBlock) -> bool:
    return (
        block.latent_h >= PATCH
        and block.latent_w >= PATCH
        and block.latent_h % PATCH == 0
        and block.latent_w % PATCH == 0
    )


def patchify_video(latent: torch.Tensor) -> torch.Tensor:
    """Video latent [24, T, Hl, Wl] -> rows [T*(Hl/2)*(Wl/2), 96], t-major then h then w;
    feature index = channel*4 + ph*2 + pw (docs/model.md §1.8)."""
    c, t, hl, wl = latent.shape
    x = latent.reshape(c, t, hl // PATCH, PATCH, wl // PATCH, PATCH)
    return x.permute(1, 2, 4, 0, 3, 5).reshape(t * (hl // PATCH) * (wl // PATCH), c * PATCH * PATCH)


def unpatchify_video(rows: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    """Inverse of patchify_video: rows [V, 96] -> latent [24, T_lat, Hl, Wl]."""
    t, hp, wp = layout.latent_t, layout.latent_h // PATCH, layout.latent_w // PATCH
    x = rows.reshape(t, hp, wp, VIDEO_LATENT_CHANNELS, PATCH, PATCH)
    return x.permute(3, 0, 1, 4, 2, 5).reshape(VIDEO_LATENT_CHANNELS, t, hp * PATCH, wp * PATCH)


def audio_rows_to_latent(rows: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    """Channel-major audio rows [2*T_a, 32] -> audio VAE latent [2, 32, T_a] (docs/model.md §1.8)."""
    return rows.reshape(AUDIO_CHANNELS, layout.audio_t, -1).permute(0, 2, 1)


def _documents(starts_ends: list[tuple[int, int, int]]) -> torch.Tensor:
    """cu_seqlens for blocks (start, used_end, padded_end), omitting empty padding documents
    (the attention's Documents derive the longest document from it)."""
    bounds = [0]
    for _, used_end, padded_end in starts_ends:
        bounds.append(used_end)
        if padded_end > used_end:
            bounds.append(padded_end)
    return torch.tensor(bounds, dtype=torch.int32)


def pack_requests(
    layouts: list[RequestLayout], t_video: list[float], t_audio: list[float], loras: list[tuple] | None = None
) -> PackedBatch:
    """Pack N requests (batch order kept) for one forward at per-request timesteps.

    t_video / t_audio: each request's model timestep t = 1 - sigma for its video and audio
    rows; each row's timestep is RequestLayout.row_timesteps' (docs/model.md §1.9). Unique timesteps
    are taken over the whole batch (torch.unique, sorted) with per-row inverse indices. The
    video rows of a request are its condition video rows, then its target rows (docs/model.md's
    img_pos); its audio rows likewise (audio_pos). loras: each request's LoRA composition
    ((adapter name, scale), ...; PackedBatch.loras), None for none.
    """
    if loras is not None and len(loras) != len(layouts):
        raise ValueError(f"loras has {len(loras)} compositions for {len(layouts)} requests")
    offsets, blocks, refiner_blocks = [], [], []
    video, audio, text, refiner_text, positions, tags, timesteps = [], [], [], [], [], [], []
    offset = refiner_offset = 0
    for layout, tv, ta in zip(layouts, t_video, t_audio, strict=True):
        offsets.append(offset)
        blocks.append((offset, offset + layout.used, offset + layout.seq_len))
        video.append(layout.video_row_index() + offset)
        audio.append(layout.audio_row_index() + offset)
        text.append(torch.arange(layout.text_len) + offset)
        refiner_len = aligned_rows(layout.text_len)
        refiner_blocks.append((refiner_offset, refiner_offset + layout.text_len, refiner_offset + refiner_len))
        refiner_text.append(torch.arange(layout.text_len) + refiner_offset)
        positions.append(layout.position_ids())
        tags.append(layout.token_tags())
        timesteps.append(layout.row_timesteps(tv, ta))
        offset += layout.seq_len
        refiner_offset += refiner_len
    cu, refiner_cu = _documents(blocks), _documents(refiner_blocks)
    unique, inverse = torch.unique(torch.cat(timesteps), sorted=True, return_inverse=True)
    return PackedBatch(
        layouts=list(layouts),
        offsets=offsets,
        total_rows=offset,
        cu_seqlens=cu,
        video_rows=torch.cat(video),
        audio_rows=torch.cat(audio),
        text_rows=torch.cat(text),
        refiner_rows=refiner_offset,
        refiner_text_rows=torch.cat(refiner_text),
        refiner_cu_seqlens=refiner_cu,
        position_ids=torch.cat(positions),
        token_tags=torch.cat(tags),
        unique_timesteps=unique,
        inverse_indices=inverse,
        loras=[()] * len(layouts) if loras is None else [tuple(composition) for composition in loras],
    )


def split_rows(batch: PackedBatch, video: torch.Tensor, audio: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of the packing for model outputs: video [sum image rows, 96] and audio
    [sum all audio rows, 32] -> one (target video [V, 96], target audio [2*T_a, 32]) pair per
    request, in batch order; the condition rows' outputs are dropped (the sampler never updates
    them)."""
    videos = video.split([layout.image_rows for layout in batch.layouts])
    audios = audio.split([layout.all_audio_rows for layout in batch.layouts])
    return [
        (video_rows[layout.condition_video_rows :], audio_rows[layout.condition_audio_rows :])
        for layout, video_rows, audio_rows in zip(batch.layouts, videos, audios, strict=True)
    ]
