"""Model configurations and media constants (docs/model.md §1.1, §4, §8), defined once.

One dataclass describes every DiT size, from `tiny` (CI) and `demo` (the trained demo model)
to the full 50-layer `h3`. The media constants, and the clip lengths they imply (17n+5 frames,
5n+2 video latents, audio latents and samples), are fixed by the H3 design and shared by the
request, the layout, the VAEs and the writer; the wire contract (h3_core.protocol) re-exports
the ones a client needs. Torch-free at import (torch is imported where a dtype is asked for):
protocol imports this module, and the client installs without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Media contract (docs/model.md §4).
FPS = 24  # video frames per second; a request for another fps is refused
AUDIO_SAMPLE_RATE = 32000  # Hz, stereo
AUDIO_HOP = 800  # waveform samples per audio latent -> 40 Hz latent rate
AUDIO_LATENT_RATE = AUDIO_SAMPLE_RATE // AUDIO_HOP  # 40 Hz
AUDIO_CHANNELS = 2  # stereo
VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
VIDEO_SPATIAL_DOWNSAMPLE = 16  # pixels per latent cell along height and width
FRAMES_PER_LATENT = (1, 4, 4, 4, 4)  # frames covered by latent k: FRAMES_PER_LATENT[k % 5]
PATCH = 2  # spatial patch (1, 2, 2) over the video latent
VIDEO_ROW_WIDTH = VIDEO_LATENT_CHANNELS * PATCH * PATCH  # 96
AUDIO_ROW_WIDTH = AUDIO_LATENT_CHANNELS  # 32
ROW_ALIGN = 64  # every request's packed length is a multiple of this (docs/model.md §2.1)
CANVAS_MULTIPLE = 32  # height and width must be multiples of this (docs/model.md §4.2)
# The frame a keyframe conditions (fl2va): the first or the last frame of the served clip.
FIRST_FRAME, LAST_FRAME = 0, -1
MAX_KEYFRAMES = 2
# How a keyframe is fitted to the canvas (h3_core.inputs.images.fit_image): "crop" scales to cover
# the canvas and cuts the centre (the default: no distortion, nothing added), "pad" scales to fit
# inside and fills the rest, "stretch" resizes to the canvas whatever the aspect (the reference
# implementation's way).
FITS = ("crop", "pad", "stretch")
DEFAULT_FIT = "crop"


def aligned_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of ROW_ALIGN (64): a request's packed length, a text block's
    refiner length (docs/model.md §2.1)."""
    return -(-rows // ROW_ALIGN) * ROW_ALIGN


def align_num_frames(num_frames: int) -> int:
    """Smallest 17n+5 frame count >= num_frames (docs/model.md §4.2). align(200) = 209, align(10) = 22.

    The one clip-length rule of every path (h3_dit, the Videos API, the CLI): a request for
    num_frames frames is served as a clip of align_num_frames(num_frames) frames, as H3's own
    servers do; its audio follows the aligned length and its last frame is a LAST_FRAME keyframe's
    (h3_core.diffusion.engine.Engine.prepare, h3_core.diffusion.request.check_canvas)."""
    if num_frames <= 5:
        return 5
    return 5 + 17 * math.ceil((num_frames - 5) / 17)


def frames_for_seconds(seconds: float) -> int:
    """Frames asked for by a duration of `seconds` at FPS: round(seconds x 24). The one rule of the
    request formats that give seconds (SGLang's target.duration_seconds, vLLM-Omni's duration, the
    Videos API's seconds, a reference's audio length); the clip is align_num_frames of it."""
    return round(seconds * FPS)


def max_requested_frames(max_num_frames: int) -> int:
    """The largest num_frames whose aligned clip fits max_num_frames frames: the largest 17n+5
    <= max_num_frames (121 -> 107, 209 -> 209); 0 when max_num_frames < 5 (no clip fits)."""
    if max_num_frames < 5:
        return 0
    return 5 + (max_num_frames - 5) // 17 * 17


def latent_frames(num_frames: int) -> int:
    """Video latent frames T_lat = 5n+2 for an (aligned up) frame count. T_lat(209) = 62."""
    aligned = align_num_frames(num_frames)
    return (aligned - 5) // 17 * 5 + 2


def audio_latent_frames(num_frames: int) -> int:
    """Audio latents per stereo channel: round(num_frames / 24 fps x 40 Hz). T_a(209) = 348."""
    return round(num_frames / FPS * AUDIO_LATENT_RATE)


def audio_num_samples(num_frames: int) -> int:
    """Waveform samples per channel of a clip of num_frames frames: num_frames / 24 s at 32 kHz."""
    return round(num_frames * AUDIO_SAMPLE_RATE / FPS)


@dataclass(frozen=True)
class DiTConfig:
    """Sizes of one H3 DiT (docs/model.md §1.1 for `h3`, §8 for the scaled sizes).

    The structure is the same at every size: attention width A = heads x head_dim, rotary
    width 6 x rope_freqs_per_axis of head_dim, per-block 3-modality AdaLN (18 x hidden) and a
    2-block token refiner. `dtype` is the runtime dtype of everything except the fp32 patch
    projections, time embedder and output heads.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    ffn_size: int
    text_dim: int
    rope_freqs_per_axis: int
    time_embed_hidden_size: int
    time_embed_dim: int
    dtype: str = "float32"
    num_refiner_layers: int = 2
    timestep_freq_dim: int = 256
    rope_theta: float = 10000.0
    eps: float = 1e-5
    default_steps: int = 4
    default_height: int = 64
    default_width: int = 96
    default_num_frames: int = 22

    @property
    def attn_width(self) -> int:
        """Attention inner width A = num_heads x head_dim (7168 for H3, != hidden_size)."""
        return self.num_heads * self.head_dim

    @property
    def torch_dtype(self) -> torch.dtype:
        """The runtime torch dtype named by `dtype` (torch.float32 for "float32")."""
        import torch

        return getattr(torch, self.dtype)


# the full MiniMax-H3 DiT (docs/model.md §8); `bench` is its first 8 layers
H3 = DiTConfig(
    name="h3",
    num_layers=50,
    hidden_size=5376,
    num_heads=56,
    head_dim=128,
    ffn_size=14336,
    text_dim=5120,
    rope_freqs_per_axis=16,
    time_embed_hidden_size=5376,
    time_embed_dim=2688,
    dtype="bfloat16",
    default_steps=30,
    default_height=384,
    default_width=672,
    default_num_frames=209,
)

CONFIGS = {
    "tiny": DiTConfig(
        name="tiny",
        num_layers=2,
        hidden_size=96,
        num_heads=8,
        head_dim=16,
        ffn_size=256,
        text_dim=384,
        rope_freqs_per_axis=2,
        time_embed_hidden_size=96,
        time_embed_dim=48,
        default_steps=4,
        default_height=64,
        default_width=96,
        default_num_frames=22,
    ),
    "small": DiTConfig(
        name="small",
        num_layers=6,
        hidden_size=384,
        num_heads=8,
        head_dim=64,
        ffn_size=1024,
        text_dim=384,
        rope_freqs_per_axis=8,
        time_embed_hidden_size=384,
        time_embed_dim=192,
        default_steps=8,
        default_height=128,
        default_width=224,
        default_num_frames=39,
    ),
    # The trained demo model (h3_core/train, docs/demo_model.md): the H3 ratios (A = 4/3 H,
    # F = 8/3 H, rotary 0.75 of head_dim) at 6.1 M parameters, weights in weights/demo/.
    "demo": DiTConfig(
        name="demo",
        num_layers=6,
        hidden_size=192,
        num_heads=4,
        head_dim=64,
        ffn_size=512,
        text_dim=384,
        rope_freqs_per_axis=8,
        time_embed_hidden_size=192,
        time_embed_dim=96,
        default_steps=8,
        default_height=64,
        default_width=96,
        default_num_frames=22,
    ),
    "bench": replace(H3, name="bench", num_layers=8),
    "h3": H3,
}


def get_config(name: str) -> DiTConfig:
    """Return the named DiT config. Raises ValueError naming the allowed names."""
    if name not in CONFIGS:
        raise ValueError(f"config {name!r} is unknown; choose one of {sorted(CONFIGS)}")
    return CONFIGS[name]
