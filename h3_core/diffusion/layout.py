"""Packed variable-length layout: one request's rows and the batched packing of N requests.

One request occupies [ text L | condition rows C | audio 2*T_a | video V | padding to a multiple
of 64 ] rows (h3_spec §2.1). t2va has no condition rows; fl2va has one block of (Hl/2) x (Wl/2)
rows per keyframe (its first or last frame), at the target's spatial grid. Condition rows are
video rows the sampler never updates: they hold their anchor at every step (h3_spec §3.3) and take
the timestep max(t_video, CONDITION_TIMESTEP) (h3_spec §1.9). A batch concatenates requests in batch order, each
keeping its own padded length, so every request starts at a multiple of 64 rows and attention
documents never cross requests (h3_spec §2.5). Shape math follows h3_spec §4.
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import (
    AUDIO_CHANNELS,
    FRAMES_PER_LATENT,
    PATCH,
    ROW_ALIGN,
    VIDEO_LATENT_CHANNELS,
    VIDEO_SPATIAL_DOWNSAMPLE,
    audio_latent_frames,
    latent_frames,
)
from ..model.packed import PackedBatch

FRAME_TIME = 5.0 / 3.0  # RoPE time units per video frame: one unit = one 40 Hz audio latent
SPATIAL_EXTENT = 32.0  # RoPE spatial coordinates span about this range (h3_spec §2.3)

TAG_PAD, TAG_VIDEO, TAG_TEXT, TAG_AUDIO = -1, 0, 1, 2  # token tags; also the AdaLN modality
CONDITION_TIMESTEP = 0.999  # condition rows' timestep is max(t_video, this) (h3_spec §1.9)
FIRST_FRAME, LAST_FRAME = 0, -1  # a keyframe's frame index (h3_core.protocol's)


@dataclass(frozen=True)
class RequestLayout:
    """Row layout of one request: [text | condition rows | audio (channel-major) | video | padding].

    All counts are rows. `seq_len` is the padded length (a multiple of 64, >= used). `keyframes`:
    the frame index of each keyframe condition block, in row order (FIRST_FRAME before
    LAST_FRAME; () for t2va). `vision_spans`: [start, end) text rows that are vision tokens of the
    text encoder's presentation (token tag 0, h3_spec §2.2; () with a text-only encoder).
    """

    text_len: int
    latent_t: int
    latent_h: int
    latent_w: int
    audio_t: int
    seq_len: int
    keyframes: tuple[int, ...] = ()
    vision_spans: tuple[tuple[int, int], ...] = ()

    @property
    def frame_rows(self) -> int:
        """Rows of one latent frame: (Hl/2) x (Wl/2) patches."""
        return (self.latent_h // PATCH) * (self.latent_w // PATCH)

    @property
    def condition_rows(self) -> int:
        return len(self.keyframes) * self.frame_rows

    @property
    def audio_rows(self) -> int:
        return AUDIO_CHANNELS * self.audio_t

    @property
    def video_rows(self) -> int:
        """Target video rows (the rows the sampler updates)."""
        return self.latent_t * self.frame_rows

    @property
    def image_rows(self) -> int:
        """The DiT's video-token rows: condition rows, then target video rows (h3_spec's img_pos)."""
        return self.condition_rows + self.video_rows

    @property
    def audio_start(self) -> int:
        return self.text_len + self.condition_rows

    @property
    def video_start(self) -> int:
        return self.audio_start + self.audio_rows

    @property
    def used(self) -> int:
        return self.video_start + self.video_rows

    def keyframe_time(self, frame: int) -> float:
        """RoPE time of a keyframe (h3_spec §2.3): text_len for FIRST_FRAME; for LAST_FRAME the last
        frame's, text_len + span(T_lat) - 5/3, with span(n) = sum over k < n of 5/3 x
        FRAMES_PER_LATENT[k % 5] as numpy's pairwise float64 sum (the reference's arithmetic)."""
        if frame == FIRST_FRAME:
            return float(self.text_len)
        frames = [FRAME_TIME * FRAMES_PER_LATENT[k % len(FRAMES_PER_LATENT)] for k in range(self.latent_t)]
        return float(self.text_len + np.sum(np.array(frames, dtype=np.float64)) - FRAME_TIME)

    def spatial_grid(self) -> tuple[list[float], list[float]]:
        """RoPE h and w coordinates of the patch grid (h3_spec §2.3), fp64 Python floats."""
        area = math.sqrt(self.latent_h * self.latent_w)

        def axis(size: int) -> list[float]:
            ratio = size / area
            left = (1.0 - ratio) / 2.0
            count = size // PATCH
            return [SPATIAL_EXTENT * (left + ratio * i / count) for i in range(count)]

        return axis(self.latent_h), axis(self.latent_w)

    def video_times(self) -> list[float]:
        """RoPE time of each latent frame: text_len + 5/3 x (first frame it covers)."""
        times, t = [], float(self.text_len)
        for k in range(self.latent_t):
            times.append(t)
            t += FRAME_TIME * FRAMES_PER_LATENT[k % len(FRAMES_PER_LATENT)]
        return times

    def position_ids(self) -> torch.Tensor:
        """RoPE coordinates (t, h, w) of every row, float64 [seq_len, 3] (h3_spec §2.3).

        Text row i: (i, 0, 0). Keyframe rows: (keyframe_time, h grid, w grid), h then w. Audio
        channel c, latent tau: (text_len + tau, 0, w_grid[0] for c = 0 or w_grid[-1] for c = 1).
        Video rows: (latent time, h grid, w grid), t-major then h then w. Padding: (0, 0, 0).
        """
        pos = torch.zeros(self.seq_len, 3, dtype=torch.float64)
        pos[: self.text_len, 0] = torch.arange(self.text_len, dtype=torch.float64)
        h_grid, w_grid = self.spatial_grid()
        h = torch.tensor(h_grid, dtype=torch.float64)
        w = torch.tensor(w_grid, dtype=torch.float64)
        for index, frame in enumerate(self.keyframes):
            t = torch.tensor([self.keyframe_time(frame)], dtype=torch.float64)
            start = self.text_len + index * self.frame_rows
            grid = torch.stack(torch.meshgrid(t, h, w, indexing="ij"), dim=-1).reshape(-1, 3)
            pos[start : start + self.frame_rows] = grid
        tau = torch.arange(self.audio_t, dtype=torch.float64) + self.text_len
        for channel, w_pin in enumerate((w_grid[0], w_grid[-1])):
            start = self.audio_start + channel * self.audio_t
            pos[start : start + self.audio_t, 0] = tau
            pos[start : start + self.audio_t, 2] = w_pin
        t = torch.tensor(self.video_times(), dtype=torch.float64)
        grid = torch.stack(torch.meshgrid(t, h, w, indexing="ij"), dim=-1).reshape(-1, 3)
        pos[self.video_start : self.used] = grid
        return pos

    def token_tags(self) -> torch.Tensor:
        """Row modality tags, int64 [seq_len] (h3_spec §2.2): -1 padding, 0 video (condition and
        target rows, and the text encoder's vision tokens), 1 text, 2 audio."""
        tags = torch.full((self.seq_len,), TAG_PAD, dtype=torch.int64)
        tags[: self.text_len] = TAG_TEXT
        for start, end in self.vision_spans:
            tags[start:end] = TAG_VIDEO
        tags[self.text_len : self.audio_start] = TAG_VIDEO
        tags[self.audio_start : self.video_start] = TAG_AUDIO
        tags[self.video_start : self.used] = TAG_VIDEO
        return tags

    def row_timesteps(self, t_video: float, t_audio: float) -> torch.Tensor:
        """Each row's model timestep, float32 [seq_len] (h3_spec §1.9): t_video for every row,
        then max(t_video, CONDITION_TIMESTEP) on condition rows and t_audio on audio rows."""
        rows = torch.full((self.seq_len,), t_video, dtype=torch.float32)
        rows[self.text_len : self.audio_start] = max(t_video, CONDITION_TIMESTEP)
        rows[self.audio_start : self.video_start] = t_audio
        return rows


def make_layout(
    text_len: int,
    height: int,
    width: int,
    num_frames: int,
    seq_len: int | None = None,
    keyframes: tuple[int, ...] = (),
    vision_spans: tuple[tuple[int, int], ...] = (),
) -> RequestLayout:
    """Layout of a request. height/width in pixels (multiples of 32), num_frames as asked
    (aligned up to 17n+5 for the latent). seq_len pins the padded length (a multiple of 64,
    >= used); None pads to the next multiple of 64. keyframes: frame indices (FIRST_FRAME,
    LAST_FRAME; any order, placed first then last); vision_spans: see RequestLayout.

    672x384, 209 frames, 9 text tokens -> used 16,329, seq_len 16,384 (h3_spec §4.4).

    Raises ValueError when seq_len is not a multiple of 64 or is below the used rows, for a
    keyframe index other than FIRST_FRAME / LAST_FRAME or a repeated one, and for a vision span
    outside 0..text_len or empty.
    """
    if any(frame not in (FIRST_FRAME, LAST_FRAME) for frame in keyframes) or len(set(keyframes)) != len(keyframes):
        raise ValueError(
            f"keyframes={list(keyframes)} is not allowed: distinct frame indices {FIRST_FRAME} (first) or "
            f"{LAST_FRAME} (last)"
        )
    for start, end in vision_spans:
        if not 0 <= start < end <= text_len:
            raise ValueError(f"vision span [{start}, {end}) is out of range: allowed within 0..{text_len} text rows")
    layout = RequestLayout(
        text_len=text_len,
        latent_t=latent_frames(num_frames),
        latent_h=height // VIDEO_SPATIAL_DOWNSAMPLE,
        latent_w=width // VIDEO_SPATIAL_DOWNSAMPLE,
        audio_t=audio_latent_frames(num_frames),
        seq_len=0,
        keyframes=tuple(sorted(keyframes, key=lambda frame: frame != FIRST_FRAME)),
        vision_spans=tuple((int(start), int(end)) for start, end in vision_spans),
    )
    used = layout.used
    if seq_len is None:
        seq_len = math.ceil(used / ROW_ALIGN) * ROW_ALIGN
    if seq_len % ROW_ALIGN or seq_len < used:
        raise ValueError(f"seq_len {seq_len} must be a multiple of {ROW_ALIGN} and >= {used} used rows")
    return dataclasses.replace(layout, seq_len=seq_len)


def patchify_video(latent: torch.Tensor) -> torch.Tensor:
    """Video latent [24, T, Hl, Wl] -> rows [T*(Hl/2)*(Wl/2), 96], t-major then h then w;
    feature index = channel*4 + ph*2 + pw (h3_spec §1.8)."""
    c, t, hl, wl = latent.shape
    x = latent.reshape(c, t, hl // PATCH, PATCH, wl // PATCH, PATCH)
    return x.permute(1, 2, 4, 0, 3, 5).reshape(t * (hl // PATCH) * (wl // PATCH), c * PATCH * PATCH)


def unpatchify_video(rows: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    """Inverse of patchify_video: rows [V, 96] -> latent [24, T_lat, Hl, Wl]."""
    t, hp, wp = layout.latent_t, layout.latent_h // PATCH, layout.latent_w // PATCH
    x = rows.reshape(t, hp, wp, VIDEO_LATENT_CHANNELS, PATCH, PATCH)
    return x.permute(3, 0, 1, 4, 2, 5).reshape(VIDEO_LATENT_CHANNELS, t, hp * PATCH, wp * PATCH)


def audio_rows_to_latent(rows: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    """Channel-major audio rows [2*T_a, 32] -> audio VAE latent [2, 32, T_a] (h3_spec §1.8)."""
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


def pack_requests(layouts: list[RequestLayout], t_video: list[float], t_audio: list[float]) -> PackedBatch:
    """Pack N requests (batch order kept) for one forward at per-request timesteps.

    t_video / t_audio: each request's model timestep t = 1 - sigma for its video and audio
    rows; each row's timestep is RequestLayout.row_timesteps' (h3_spec §1.9). Unique timesteps
    are taken over the whole batch (torch.unique, sorted) with per-row inverse indices. The
    video rows of a request are its condition rows, then its target rows (h3_spec's img_pos).
    """
    offsets, blocks, refiner_blocks = [], [], []
    video, audio, text, refiner_text, positions, tags, timesteps = [], [], [], [], [], [], []
    offset = refiner_offset = 0
    for layout, tv, ta in zip(layouts, t_video, t_audio, strict=True):
        offsets.append(offset)
        blocks.append((offset, offset + layout.used, offset + layout.seq_len))
        video.append(torch.arange(layout.text_len, layout.audio_start) + offset)
        video.append(torch.arange(layout.video_start, layout.used) + offset)
        audio.append(torch.arange(layout.audio_start, layout.video_start) + offset)
        text.append(torch.arange(layout.text_len) + offset)
        refiner_len = math.ceil(layout.text_len / ROW_ALIGN) * ROW_ALIGN
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
    )


def split_rows(batch: PackedBatch, video: torch.Tensor, audio: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of the packing for model outputs: video [sum image rows, 96] and audio
    [sum 2*T_a, 32] -> one (target video [V, 96], audio [2*T_a, 32]) pair per request, in batch
    order; the condition rows' outputs are dropped (the sampler never updates them)."""
    videos = video.split([layout.image_rows for layout in batch.layouts])
    audios = audio.split([layout.audio_rows for layout in batch.layouts])
    return [
        (rows[layout.condition_rows :], audio_rows)
        for layout, rows, audio_rows in zip(batch.layouts, videos, audios, strict=True)
    ]
