"""Video and audio VAEs (docs/model.md §4.2, §4.3): small trainable convolutional autoencoders.

They honour the H3 media contracts, so every latent the DiT sees has the real shape:

- video: uint8 frames [T, H, W, 3] with T = 17n + 5 <-> float32 latents [24, 5n + 2, H/16, W/16].
  Latent k covers config.FRAMES_PER_LATENT[k % 5] consecutive frames (1, 4, 4, 4, 4: latent 0 is
  frame 0, latent 1 frames 1-4, latent 2 frames 5-8, ...). Each latent's frames are stacked as
  4 RGB frames = 12 channels (a 1-frame group repeats its frame 4 times) and coded by a 2D conv
  net, 16x down in space; the decoder predicts 4 frames per latent and keeps the first
  FRAMES_PER_LATENT[k % 5].
- audio: float32 stereo [2, N] at 32 kHz <-> float32 latents [2, 32, N / 800] (40 Hz). The two
  channels are coded independently as mono signals (a batch of 2 through the same weights).

Both models normalise their latents per channel with persistent `latents_mean` / `latents_std`
buffers (saved with the weights; 0 and 1 at init): z_model = (z - mean) / std on encode and
z = z_model * std + mean before decode. `encode` / `decode` are the inference entry points (one
clip, no batch dim, run under torch.inference_mode on the module's device); training calls
`self.encoder` / `self.decoder` directly on `frames_to_groups` / float waveforms.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from h3_core import config
from h3_core.config import (
    AUDIO_CHANNELS,
    AUDIO_LATENT_CHANNELS,
    VIDEO_LATENT_CHANNELS,
    align_num_frames,
    audio_latent_frames,
    audio_num_samples,
    latent_frames,
)
from h3_core.model.initialization import init_weights

GROUP_FRAMES = max(config.FRAMES_PER_LATENT)  # 4 frames decoded per video latent
VIDEO_GROUP_CHANNELS = 3 * GROUP_FRAMES  # 12: 4 RGB frames stacked on the channel axis
VIDEO_WIDTHS = (32, 48, 64, 64)  # conv widths at 1/2, 1/4, 1/8, 1/16 resolution
DECODE_TILE_LATENTS = 5  # latent frames decoded at a time (17 video frames; VideoVAE.decode)
AUDIO_ENCODER_RATES = (2, 4, 4, 5, 5)  # conv1d strides, product 800 = config.AUDIO_HOP
AUDIO_ENCODER_WIDTHS = (32, 64, 64, 128, 128)  # channels after each strided conv
AUDIO_DECODER_RATES = (5, 5, 2, 2, 2, 2, 2)  # transposed-conv1d strides, product 800
AUDIO_DECODER_WIDTHS = (128, 64, 64, 32, 32, 16, 16)  # channels after each upsampling conv
AUDIO_STEM_WIDTH = 16  # channels of the first (full-rate) encoder conv


def num_video_latents(num_frames: int) -> int:
    """Latent frames for `num_frames` video frames: 17n + 5 frames -> 5n + 2 latents.

    Raises ValueError if num_frames is not of the form 17n + 5 (n >= 0)."""
    if num_frames != align_num_frames(num_frames):
        raise ValueError(f"num_frames must be 17n + 5 (5, 22, 39, ...), got {num_frames}")
    return latent_frames(num_frames)


def num_video_frames(num_latents: int) -> int:
    """Video frames decoded from `num_latents` latent frames: 5n + 2 latents -> 17n + 5 frames.

    Raises ValueError if num_latents is not of the form 5n + 2 (n >= 0)."""
    if num_latents < 2 or (num_latents - 2) % 5:
        raise ValueError(f"latent frame count must be 5n + 2 (2, 7, 12, ...), got {num_latents}")
    return (num_latents - 2) // 5 * 17 + 5


def _group_index(num_latents: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Frame indices int64 [T_lat, 4] of each latent's group (1-frame groups repeat their frame)
    and the bool mask [T_lat, 4] of the frames that group really covers."""
    counts = torch.tensor([config.FRAMES_PER_LATENT[k % 5] for k in range(num_latents)])
    starts = torch.cumsum(counts, 0) - counts
    offsets = torch.arange(GROUP_FRAMES)
    keep = offsets[None, :] < counts[:, None]
    index = starts[:, None] + torch.where(keep, offsets[None, :], 0)
    return index, keep


def frames_to_groups(frames: torch.Tensor) -> torch.Tensor:
    """Stack each latent's frames: uint8 [T, H, W, 3] (T = 17n + 5) -> float32
    [T_lat, 12, H, W] in [-1, 1], channels ordered frame-major (f0 RGB, f1 RGB, ...).

    This is the video encoder's input (and the decoder's training target). Raises ValueError as
    check_video_frames."""
    check_video_frames(frames)
    num_frames, height, width, _ = frames.shape
    index, _ = _group_index(num_video_latents(num_frames))
    groups = frames[index.to(frames.device)]  # [T_lat, 4, H, W, 3]
    groups = groups.permute(0, 1, 4, 2, 3).reshape(-1, VIDEO_GROUP_CHANNELS, height, width)
    return groups.float() / 127.5 - 1.0


def check_video_frames(frames: torch.Tensor) -> None:
    """The input check of every video encoder (VideoVAE.encode, h3_core.weights.vae_hook): raise ValueError
    unless `frames` is uint8 [T, H, W, 3] with T = 17n + 5 and H, W positive multiples of 16."""
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[3] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    num_frames, height, width, _ = frames.shape
    step = config.VIDEO_SPATIAL_DOWNSAMPLE
    if height % step or width % step or height == 0 or width == 0:
        raise ValueError(f"frames height and width must be positive multiples of {step}, got {height}x{width}")
    num_video_latents(num_frames)


def check_audio(audio: torch.Tensor) -> None:
    """The input check of every audio encoder (AudioVAE.encode, h3_core.weights.vae_hook): raise ValueError
    unless `audio` is float32 [2, N] with N a positive multiple of 800."""
    stereo, hop = config.AUDIO_CHANNELS, config.AUDIO_HOP
    if audio.dtype != torch.float32 or audio.dim() != 2 or audio.shape[0] != stereo:
        raise ValueError(f"audio must be float32 [{stereo}, N], got {audio.dtype} {list(audio.shape)}")
    if audio.shape[1] == 0 or audio.shape[1] % hop:
        raise ValueError(f"audio length must be a positive multiple of {hop} samples, got {audio.shape[1]}")


def groups_to_frames(groups: torch.Tensor) -> torch.Tensor:
    """Inverse of `frames_to_groups` for decoder output: float [T_lat, 12, H, W] (T_lat = 5n + 2)
    -> same dtype [T, H, W, 3], keeping the first FRAMES_PER_LATENT[k % 5] of latent k's 4 frames.
    Values are passed through unchanged."""
    num_latents, _, height, width = groups.shape
    _, keep = _group_index(num_latents)
    frames = groups.reshape(num_latents, GROUP_FRAMES, 3, height, width)[keep.to(groups.device)]
    return frames.permute(0, 2, 3, 1)


def check_video_latent(latent: torch.Tensor) -> None:
    """The input check of every video decoder (VideoVAE.decode, h3_core.weights.vae_hook): raise ValueError
    unless `latent` is float32 [24, T_lat, Hl, Wl] with T_lat = 5n + 2 and Hl, Wl >= 1."""
    channels = config.VIDEO_LATENT_CHANNELS
    if latent.dtype != torch.float32 or latent.dim() != 4 or latent.shape[0] != channels:
        raise ValueError(f"latent must be float32 [{channels}, T_lat, Hl, Wl], got {latent.dtype} {list(latent.shape)}")
    num_video_frames(latent.shape[1])
    if latent.shape[2] == 0 or latent.shape[3] == 0:
        raise ValueError(f"latent height and width must be positive, got {list(latent.shape)}")


def check_audio_latent(latent: torch.Tensor) -> None:
    """The input check of every audio decoder (AudioVAE.decode, h3_core.weights.vae_hook): raise ValueError
    unless `latent` is float32 [2, 32, T_a] with T_a >= 1."""
    stereo, channels = config.AUDIO_CHANNELS, config.AUDIO_LATENT_CHANNELS
    shape = list(latent.shape)
    if latent.dtype != torch.float32 or len(shape) != 3 or shape[:2] != [stereo, channels] or shape[2] == 0:
        raise ValueError(
            f"latent must be float32 [{stereo}, {channels}, T_a] with T_a >= 1, got {latent.dtype} {shape}"
        )


def frames_to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """Decoded frames in [-1, 1] (any shape, channels last) -> uint8 in [0, 255]: clamp((x + 1) / 2,
    0, 1) x 255, rounded (docs/model.md §4.2)."""
    return ((frames + 1.0) * 0.5).clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8).contiguous()


class VideoVAE(nn.Module):
    """Video autoencoder: uint8 [17n + 5, H, W, 3] <-> float32 [24, 5n + 2, H/16, W/16].

    Encoder: 4 stride-2 3x3 convs (widths VIDEO_WIDTHS, SiLU) over each latent's 12-channel frame
    group, then a 3x3 conv to 24 channels. Decoder mirrors it with nearest 2x upsampling + 3x3
    convs back to 12 channels (4 RGB frames in [-1, 1] before clamping).
    """

    def __init__(self):
        super().__init__()
        channels = config.VIDEO_LATENT_CHANNELS
        encoder, width = [], VIDEO_GROUP_CHANNELS
        for out in VIDEO_WIDTHS:
            encoder += [nn.Conv2d(width, out, 3, stride=2, padding=1), nn.SiLU()]
            width = out
        encoder.append(nn.Conv2d(width, channels, 3, padding=1))
        self.encoder = nn.Sequential(*encoder)
        decoder = [nn.Conv2d(channels, VIDEO_WIDTHS[-1], 3, padding=1), nn.SiLU()]
        width = VIDEO_WIDTHS[-1]
        for out in reversed(VIDEO_WIDTHS):
            decoder += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(width, out, 3, padding=1), nn.SiLU()]
            width = out
        decoder.append(nn.Conv2d(width, VIDEO_GROUP_CHANNELS, 3, padding=1))
        self.decoder = nn.Sequential(*decoder)
        self.register_buffer("latents_mean", torch.zeros(channels))
        self.register_buffer("latents_std", torch.ones(channels))

    @torch.inference_mode()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Encode one clip: uint8 [T, H, W, 3] (T = 17n + 5; H, W multiples of 16) -> normalised
        float32 latents [24, 5n + 2, H/16, W/16] on the module's device.

        Raises ValueError for a wrong dtype, shape or frame count (check_video_frames)."""
        device = self.latents_mean.device
        z = self.encoder(frames_to_groups(frames.to(device)))  # [T_lat, 24, Hl, Wl]
        z = (z - self.latents_mean[:, None, None]) / self.latents_std[:, None, None]
        return z.transpose(0, 1).contiguous()

    @torch.inference_mode()
    def decode(self, latent: torch.Tensor, tile: Callable[[], AbstractContextManager] = nullcontext) -> torch.Tensor:
        """Decode one clip: normalised float32 latents [24, T_lat, Hl, Wl] (T_lat = 5n + 2) ->
        uint8 frames [17n + 5, Hl*16, Wl*16, 3] on the module's device (clamped to [0, 1], x255,
        rounded).

        The decoder runs over DECODE_TILE_LATENTS latent frames at a time, each tile inside
        `with tile():` (h3_core.serving.shared.gpu_turns gives the GPU to a DiT step between tiles).
        Latents are decoded independently, so the tiles change no value; the peak memory is a
        tile's.

        Raises ValueError for a wrong dtype, shape or latent frame count (check_video_latent)."""
        check_video_latent(latent)
        z = latent.to(self.latents_mean.device).transpose(0, 1)
        z = z * self.latents_std[:, None, None] + self.latents_mean[:, None, None]
        groups = []
        for start in range(0, z.shape[0], DECODE_TILE_LATENTS):
            with tile():
                groups.append(frames_to_uint8(self.decoder(z[start : start + DECODE_TILE_LATENTS])))
        return groups_to_frames(torch.cat(groups)).contiguous()


def _encoder_conv(width: int, out: int, stride: int) -> nn.Conv1d:
    """Strided conv1d mapping length L (a multiple of stride) to exactly L / stride."""
    return nn.Conv1d(width, out, 2 * stride, stride=stride, padding=(stride + 1) // 2)


def _decoder_conv(width: int, out: int, stride: int) -> nn.ConvTranspose1d:
    """Transposed conv1d mapping length L to exactly L * stride."""
    return nn.ConvTranspose1d(
        width, out, 2 * stride, stride=stride, padding=(stride + 1) // 2, output_padding=stride % 2
    )


class AudioVAE(nn.Module):
    """Audio autoencoder: float32 stereo [2, N] at 32 kHz <-> float32 [2, 32, N / 800] (40 Hz).

    Each stereo channel is a mono signal through shared weights. Encoder: a 7-tap conv, then
    strided convs with rates AUDIO_ENCODER_RATES (SiLU), then a 3-tap conv to 32 channels.
    Decoder: a 7-tap conv, transposed convs with rates AUDIO_DECODER_RATES (SiLU), a 7-tap conv
    to 1 channel and tanh.
    """

    def __init__(self):
        super().__init__()
        channels = config.AUDIO_LATENT_CHANNELS
        width = AUDIO_STEM_WIDTH
        encoder = [nn.Conv1d(1, width, 7, padding=3), nn.SiLU()]
        for stride, out in zip(AUDIO_ENCODER_RATES, AUDIO_ENCODER_WIDTHS, strict=True):
            encoder += [_encoder_conv(width, out, stride), nn.SiLU()]
            width = out
        encoder.append(nn.Conv1d(width, channels, 3, padding=1))
        self.encoder = nn.Sequential(*encoder)
        width = AUDIO_DECODER_WIDTHS[0]
        decoder = [nn.Conv1d(channels, width, 7, padding=3), nn.SiLU()]
        for stride, out in zip(AUDIO_DECODER_RATES, AUDIO_DECODER_WIDTHS, strict=True):
            decoder += [_decoder_conv(width, out, stride), nn.SiLU()]
            width = out
        decoder += [nn.Conv1d(width, 1, 7, padding=3), nn.Tanh()]
        self.decoder = nn.Sequential(*decoder)
        self.register_buffer("latents_mean", torch.zeros(channels))
        self.register_buffer("latents_std", torch.ones(channels))

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """Encode stereo audio: float32 [2, N] (N a positive multiple of 800) -> normalised
        float32 latents [2, 32, N / 800] on the module's device.

        Raises ValueError for a wrong dtype, shape or length (check_audio)."""
        check_audio(audio)
        z = self.encoder(audio.to(self.latents_mean.device)[:, None, :])
        return (z - self.latents_mean[:, None]) / self.latents_std[:, None]

    @torch.inference_mode()
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """Decode stereo latents: normalised float32 [2, 32, T_a] -> float32 waveform
        [2, T_a * 800] in [-1, 1] at 32 kHz on the module's device.

        Raises ValueError for a wrong dtype or shape (check_audio_latent)."""
        check_audio_latent(latent)
        z = latent.to(self.latents_mean.device) * self.latents_std[:, None] + self.latents_mean[:, None]
        return self.decoder(z)[:, 0, :]


KEYFRAME_CLIP_FRAMES = 5  # the shortest clip the video VAE takes (17 x 0 + 5 frames)


def keyframe_latent(video_vae, image: torch.Tensor) -> torch.Tensor:
    """The clean normalised latent of a keyframe, float32 [24, H/16, W/16] on the VAE's device
    (docs/model.md §3.3): the still repeated over KEYFRAME_CLIP_FRAMES frames, encoded, latent 0 kept
    (latent 0 covers frame 0 alone, docs/model.md §4.2). `video_vae`: a VideoVAE or the official VAE
    hook's (same `encode`, deterministic: no posterior sample, so the reference's fixed encode
    seed 42 has nothing to seed). image: uint8 [H, W, 3] RGB, H and W multiples of 16 (the
    canvas). Raises ValueError as VideoVAE.encode for a wrong dtype or shape."""
    if image.dtype != torch.uint8 or image.dim() != 3:
        raise ValueError(f"a keyframe must be uint8 [H, W, 3], got {image.dtype} {list(image.shape)}")
    frames = image[None].expand(KEYFRAME_CLIP_FRAMES, *image.shape).contiguous()
    return video_vae.encode(frames)[:, 0]


def create_vaes(seed: int) -> tuple[VideoVAE, AudioVAE]:
    """Build both VAEs on the CPU in eval mode, initialised with `init_weights(vae, seed)`."""
    video, audio = VideoVAE(), AudioVAE()
    init_weights(video, seed)
    init_weights(audio, seed)
    return video.eval(), audio.eval()


def decode_clip(
    video_vae: VideoVAE,
    audio_vae: AudioVAE,
    num_frames: int,
    video_latent: torch.Tensor,
    audio_latent: torch.Tensor,
    tile: Callable[[], AbstractContextManager] = nullcontext,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final latents -> (frames uint8 [num_frames, H, W, 3], audio float32 [2, samples]); see
    Engine.decode. video_latent: float32 [24, T_lat, Hl, Wl] with T_lat = latent_frames(num_frames);
    audio_latent: float32 [2, 32, T_a] with T_a = audio_latent_frames(num_frames). The video decode
    runs in tiles (VideoVAE.decode), the audio decode in one more, each inside `with tile():`.
    Shared by the engine and the Triton VAE model. Raises ValueError for latents that do not fit
    num_frames."""
    if video_latent.dim() != 4 or video_latent.shape[1] != latent_frames(num_frames):
        raise ValueError(
            f"video latent has shape {tuple(video_latent.shape)}; num_frames={num_frames} needs "
            f"[{VIDEO_LATENT_CHANNELS}, {latent_frames(num_frames)}, Hl, Wl]"
        )
    audio_shape = (AUDIO_CHANNELS, AUDIO_LATENT_CHANNELS, audio_latent_frames(num_frames))
    if tuple(audio_latent.shape) != audio_shape:
        raise ValueError(
            f"audio latent has shape {tuple(audio_latent.shape)}; num_frames={num_frames} needs {list(audio_shape)}"
        )
    frames = video_vae.decode(video_latent, tile)[:num_frames]
    with tile():
        audio = audio_vae.decode(audio_latent)
    samples = audio_num_samples(num_frames)
    audio = torch.nn.functional.pad(audio[:, :samples], (0, max(0, samples - audio.shape[1])))
    return frames, audio
