"""Our VAEs behind h3_core.weights.vae_hook's contract: the remote code of a synthetic official
checkpoint. vae_hook.write_official_vaes copies this file into the checkpoint's video_vae/ and
audio_vae/ folders as modeling_h3_vae.py, with config.json naming H3VideoVAE or H3AudioVAE in
auto_map and holding the latents_mean / latents_std of the VAE, and the encoder's and decoder's
weights in model.safetensors (tensor names encoder.*, decoder.*).

The classes work on raw latents: their encode returns them before normalisation (the hook
computes z_model = (z - latents_mean) / latents_std) and their decode takes them after the hook
has de-normalised (z = z_model * latents_std + latents_mean), docs/model.md §4.2, §4.3. They run
h3_core.model.vae's networks, so the hook's encode and decode equal VideoVAE's / AudioVAE's bit
for bit. The file needs h3_core importable (it is this project's stand-in for the official
modeling file).
"""

from pathlib import Path

import torch
from torch import nn

from h3_core.model.vae import AudioVAE, VideoVAE, frames_to_groups, groups_to_frames
from h3_core.weights.checkpoint import load_weights

WEIGHTS_FILE = "model.safetensors"


class PretrainedVAE(nn.Module):
    """A VAE whose weights live in a folder's model.safetensors (hook contract 3)."""

    @classmethod
    def from_pretrained(cls, folder: str) -> "PretrainedVAE":
        """The VAE with the weights of `folder`/model.safetensors, in eval mode on the CPU.
        Raises FileNotFoundError / ValueError as checkpoint.load_weights."""
        model = cls()
        load_weights(model, Path(folder) / WEIGHTS_FILE)
        return model.eval()


class H3VideoVAE(PretrainedVAE):
    """VideoVAE's networks: frames [1, 3, 17n + 5, H, W] <-> raw latents [1, 24, 5n + 2, H/16, W/16]."""

    def __init__(self):
        super().__init__()
        vae = VideoVAE()
        self.encoder, self.decoder = vae.encoder, vae.decoder

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """float32 frames [1, 3, 17n + 5, H, W] in [-1, 1] (H, W multiples of 16) -> raw float32
        latents [1, 24, 5n + 2, H/16, W/16]. VideoVAE's encoder reads 8-bit frames, so x is
        taken back to uint8 = round((x + 1) * 127.5) first: exact for the x = u / 127.5 - 1 the
        hook gives."""
        frames = ((x[0].permute(1, 2, 3, 0) + 1.0) * 127.5).round().to(torch.uint8)  # [F, H, W, 3]
        return self.encoder(frames_to_groups(frames)).transpose(0, 1)[None]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Raw (de-normalised) float32 latents [1, 24, T_lat, Hl, Wl] (T_lat = 5n + 2) -> float32
        frames [1, 3, 17n + 5, Hl*16, Wl*16], about [-1, 1] (not clamped)."""
        frames = groups_to_frames(self.decoder(z[0].transpose(0, 1)))  # [F, H, W, 3]
        return frames.permute(3, 0, 1, 2)[None]


class H3AudioVAE(PretrainedVAE):
    """AudioVAE's networks: waveforms [2, 1, 800 T_a] <-> raw latents [2, 32, T_a]."""

    def __init__(self):
        super().__init__()
        vae = AudioVAE()
        self.encoder, self.decoder = vae.encoder, vae.decoder

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """float32 waveforms [2, 1, N] at 32 kHz, each stereo channel a mono item (N a multiple of
        800) -> raw float32 latents [2, 32, N/800]."""
        return self.encoder(x)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Raw (de-normalised) float32 latents [2, 32, T_a], each stereo channel a mono item ->
        float32 waveforms [2, 1, T_a*800] in [-1, 1] at 32 kHz."""
        return self.decoder(z)
