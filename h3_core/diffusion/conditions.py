"""A request's condition inputs (fl2va keyframes, ref2va guides and references) and their anchors.

A Condition holds one condition block's clean normalised latents, as the encoders made them
(h3_encoder: h3_core.serving.encoder.conditioning). `condition_rows` turns a request's conditions into
the fixed rows the DiT sees beside the noisy target rows (docs/model.md §3.3): visual conditions an
anchor 0.999 x clean + 0.001 x noise seeded by the request's seed, reference audio its clean rows
(noise_aug 1.0). The sampler never updates them.
"""

from dataclasses import dataclass

import torch

from ..config import AUDIO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS, VIDEO_ROW_WIDTH
from . import layout as L

CONDITION_AUG = 0.999  # visual anchor = a x clean + (1 - a) x noise (docs/model.md §3.3)


@dataclass
class Condition:
    """One condition block's inputs.

    kind: h3_core.protocol.CONDITION_KINDS. frame: a keyframe's FIRST_FRAME / LAST_FRAME or a
    guide's frame index. video: float32 [24, T, h, w], the clean normalised video-VAE latent of a
    visual kind (T = 1 for keyframes, guides and images; 5n + 2 for videos), None otherwise.
    audio: float32 [2, 32, T_ref], the clean normalised audio-VAE latent of an audio kind, None
    otherwise."""

    kind: str
    frame: int = 0
    video: torch.Tensor | None = None
    audio: torch.Tensor | None = None

    def block(self) -> L.ConditionBlock:
        """Its ConditionBlock (shapes from the latents). Raises ValueError when a latent's rank
        or channels are wrong, or a latent its kind needs is missing or one it must not have is
        given, or it holds non-finite values."""
        visual = self.kind in ("keyframe", "guide", "image", "video", "video_audio")
        audible = self.kind in ("audio", "video_audio")
        for name, latent, needed, channels in (
            ("video", self.video, visual, (VIDEO_LATENT_CHANNELS,)),
            ("audio", self.audio, audible, (2, AUDIO_LATENT_CHANNELS)),
        ):
            if (latent is not None) != needed:
                raise ValueError(f"a {self.kind} condition {'needs' if needed else 'takes no'} {name} latent")
            if latent is None:
                continue
            rank = len(channels) + (3 if name == "video" else 1)
            if latent.dim() != rank or tuple(latent.shape[: len(channels)]) != channels or 0 in latent.shape:
                expected = "[24, T, h, w]" if name == "video" else "[2, 32, T]"
                raise ValueError(
                    f"a {self.kind} condition's {name} latent has shape {list(latent.shape)}; expected {expected}"
                )
            if not torch.isfinite(latent).all():
                raise ValueError(f"a {self.kind} condition's {name} latent holds non-finite values")
        t, h, w = self.video.shape[1:] if self.video is not None else (0, 0, 0)
        audio_t = self.audio.shape[2] if self.audio is not None else 0
        return L.ConditionBlock(self.kind, t, h, w, audio_t, self.frame)


def condition_rows(
    conditions: list[Condition], layout: L.RequestLayout, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed rows of a request's condition blocks, on the CPU (docs/model.md §3.3):
    (video float32 [layout.condition_video_rows, 96], audio float32 [layout.condition_audio_rows, 32]),
    in the layout's block order (`conditions` must be in it: L.order_conditions).

    Visual block: anchor = a x c + (1 - a) x n, a = CONDITION_AUG, c its clean latent
    [24, T_c, h, w] and n = randn(1, 24, max(T_lat + V, T_c), h, w)[:, :, :T_c] from a fresh CPU
    generator seeded with `seed` (V: the number of visual blocks; the reference draws T_lat + V
    frames, more only for a reference video longer than that), patchified in float32. Audio
    block: its clean latent as channel-major rows [2 x T_ref, 32] (noise_aug 1.0)."""
    visual_count = sum(1 for c in conditions if c.video is not None)
    video, audio = [], []
    for condition in conditions:
        if condition.audio is not None:
            audio.append(condition.audio.float().cpu().permute(0, 2, 1).reshape(-1, AUDIO_LATENT_CHANNELS))
        if condition.video is None:
            continue
        clean = condition.video.float().cpu()
        frames, h, w = clean.shape[1:]
        generator = torch.Generator("cpu").manual_seed(seed)
        drawn = max(layout.latent_t + visual_count, frames)
        noise = torch.randn(1, VIDEO_LATENT_CHANNELS, drawn, h, w, generator=generator)[0, :, :frames]
        video.append(L.patchify_video(CONDITION_AUG * clean + (1.0 - CONDITION_AUG) * noise))
    return (
        torch.cat(video) if video else torch.zeros(0, VIDEO_ROW_WIDTH),
        torch.cat(audio) if audio else torch.zeros(0, AUDIO_LATENT_CHANNELS),
    )
