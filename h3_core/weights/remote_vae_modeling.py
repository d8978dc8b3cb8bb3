"""Our VAE decoders behind h3_core.weights.vae_hook's contract: the remote code of a synthetic official
checkpoint. vae_hook.write_official_vaes copies this file into the checkpoint's video_vae/ and
audio_vae/ folders as modeling_h3_vae.py, with config.json naming H3VideoDecoder or
H3AudioDecoder in auto_map and holding the latents_mean / latents_std of the VAE, and the
decoder's weights in model.safetensors (tensor names decoder.*).

The classes decode the raw latents that the hook has already de-normalised
(z = z_model * latents_std + latents_mean, h3_spec §4.2, §4.3) with h3_core.model.vae's decoders, so the
hook's output equals VideoVAE.decode / AudioVAE.decode of the normalised latents bit for bit. The
file needs h3_core importable (it is this project's stand-in for the official modeling file).
"""

from pathlib import Path

import torch
from torch import nn

from h3_core.model.vae import AudioVAE, VideoVAE, groups_to_frames
from h3_core.weights.checkpoint import load_weights

WEIGHTS_FILE = "model.safetensors"


class PretrainedDecoder(nn.Module):
    """A decoder whose weights live in a folder's model.safetensors (hook contract 3)."""

    @classmethod
    def from_pretrained(cls, folder: str) -> "PretrainedDecoder":
        """The decoder with the weights of `folder`/model.safetensors, in eval mode on the CPU.
        Raises FileNotFoundError / ValueError as checkpoint.load_weights."""
        model = cls()
        load_weights(model, Path(folder) / WEIGHTS_FILE)
        return model.eval()


class H3VideoDecoder(PretrainedDecoder):
    """VideoVAE's decoder: raw latents [1, 24, T_lat, Hl, Wl] -> frames [1, 3, 17n + 5, 16 Hl, 16 Wl]."""

    def __init__(self):
        super().__init__()
        self.decoder = VideoVAE().decoder

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Raw (de-normalised) float32 latents [1, 24, T_lat, Hl, Wl] (T_lat = 5n + 2) -> float32
        frames [1, 3, 17n + 5, Hl*16, Wl*16], about [-1, 1] (not clamped)."""
        frames = groups_to_frames(self.decoder(z[0].transpose(0, 1)))  # [F, H, W, 3]
        return frames.permute(3, 0, 1, 2)[None]


class H3AudioDecoder(PretrainedDecoder):
    """AudioVAE's decoder: raw latents [2, 32, T_a] -> waveforms [2, 1, 800 T_a]."""

    def __init__(self):
        super().__init__()
        self.decoder = AudioVAE().decoder

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Raw (de-normalised) float32 latents [2, 32, T_a], each stereo channel a mono item ->
        float32 waveforms [2, 1, T_a*800] in [-1, 1] at 32 kHz."""
        return self.decoder(z)
