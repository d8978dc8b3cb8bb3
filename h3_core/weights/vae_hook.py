"""The VAEs of a weight source (h3_core.weights.checkpoint's module docstring), and the hook that runs the
remote-code VAEs an official MiniMax-H3 checkpoint ships.

`load_vaes(source, device, trust_remote_code)` gives a (video, audio) pair with VideoVAE's and
AudioVAE's encode and decode signatures and errors (h3_core.model.vae.decode_clip takes either) from:
- a native folder: video_vae.safetensors and audio_vae.safetensors (our VideoVAE / AudioVAE);
- `random:SEED`: create_vaes(SEED + 1), drawn on the CPU (what checkpoint_setup writes for SEED 0);
- an official checkpoint folder, told apart by a `video_vae/` or `audio_vae/` folder: the code
  in those folders runs only with trust_remote_code (h3_vae's model parameter of that name),
  else ValueError names the folder and the parameter.

Hook contract, for each of video_vae/ and audio_vae/ (write_official_vaes writes such folders
with h3_core.weights.remote_vae_modeling as their module):
1. config.json holds "auto_map": {"AutoModel": "<module file stem>.<ClassName>"} (the Hugging Face
   key) and "latents_mean", "latents_std": 24 numbers for video, 32 for audio.
2. <folder>/<module file stem>.py is imported from the folder itself, as a module of a package
   made of the folder (it may import sibling files relatively; nothing is copied to a cache).
3. ClassName.from_pretrained(folder: str) returns a torch.nn.Module; we move it to the device and
   call eval(), and run its encode and decode under torch.inference_mode on raw latents: we
   normalise what encode returns, z_model = (z - latents_mean) / latents_std, and de-normalise
   before decode, z = z_model * latents_std + latents_mean (per channel, docs/model.md §4.2, §4.3).
4. video: decode(z float32 [1, 24, T_lat, Hl, Wl]) returns [1, 3, 17n + 5, Hl*16, Wl*16] in
   [-1, 1] (T_lat = 5n + 2); we give uint8 [17n + 5, Hl*16, Wl*16, 3] =
   round(clamp((x + 1) / 2, 0, 1) * 255), as VideoVAE.decode. encode(x float32 [1, 3, 17n + 5,
   H, W], x = frames / 127.5 - 1 in [-1, 1]) returns raw latents [1, 24, 5n + 2, H/16, W/16];
   we give them normalised, [24, 5n + 2, H/16, W/16], as VideoVAE.encode.
5. audio: decode(z float32 [2, 32, T_a]) (each stereo channel an independent mono item) returns
   [2, 1, T_a*800] or [2, T_a*800] in [-1, 1]; we give float32 [2, T_a*800], as AudioVAE.decode.
   encode(x float32 [2, 1, N]) (the same mono items, N a multiple of 800) returns raw latents
   [2, 32, N/800]; we give them normalised, as AudioVAE.encode.
6. Every encode and decode returns a tensor, or an object with a .sample tensor, of finite
   values: any other output, shape or a NaN or infinity raises ValueError naming the folder (and
   the expected shape).
"""

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import shutil
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import AUDIO_HOP, AUDIO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS, VIDEO_SPATIAL_DOWNSAMPLE
from ..model.vae import (
    AudioVAE,
    VideoVAE,
    check_audio,
    check_audio_latent,
    check_video_frames,
    check_video_latent,
    create_vaes,
    frames_to_uint8,
    num_video_frames,
    num_video_latents,
)
from . import remote_vae_modeling
from .checkpoint import (
    AUDIO_VAE_FILE,
    VAE_SEED_OFFSET,
    VIDEO_VAE_FILE,
    load_weights,
    read_json_object,
    save_weights,
    source_seed,
)

VIDEO_FOLDER, AUDIO_FOLDER = "video_vae", "audio_vae"
CONFIG_FILE = "config.json"
REMOTE_MODULE_FILE = "modeling_h3_vae.py"  # what write_official_vaes names the copied module


@dataclass(frozen=True)
class RemoteCode:
    """What one official VAE folder's config.json says (hook contract 1): the folder, its module
    file, the class name and the per-channel latents_mean / latents_std."""

    folder: Path
    module: Path
    class_name: str
    latents_mean: tuple[float, ...]
    latents_std: tuple[float, ...]


def read_remote_code(folder: str | Path, channels: int) -> RemoteCode:
    """Read and check the hook contract of `folder` (video_vae/ with channels 24, audio_vae/ with 32)
    without running any of its code.

    Raises FileNotFoundError naming a missing config.json or module file; ValueError when auto_map
    does not name "<module file stem>.<ClassName>" or latents_mean / latents_std are not
    `channels` numbers."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    config = read_json_object(config_path)
    auto_map = config.get("auto_map")
    name = auto_map.get("AutoModel") if isinstance(auto_map, dict) else None
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 2 or not all(part.isidentifier() for part in parts):
        raise ValueError(
            f'{config_path} needs "auto_map": {{"AutoModel": "<module file stem>.<ClassName>"}} naming the VAE '
            f"class, got auto_map {auto_map!r}"
        )
    module = folder / f"{parts[0]}.py"
    if not module.is_file():
        raise FileNotFoundError(f"{module} not found; {config_path} names it in auto_map.AutoModel {name!r}")
    latents = {}
    for key in ("latents_mean", "latents_std"):
        values = config.get(key)
        if not (
            isinstance(values, list)
            and len(values) == channels
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        ):
            raise ValueError(f"{config_path} {key} must be a list of {channels} numbers, got {values!r}")
        latents[key] = tuple(float(v) for v in values)
    return RemoteCode(folder, module, parts[1], latents["latents_mean"], latents["latents_std"])


def is_official_vae_folder(folder: str | Path) -> bool:
    """Whether `folder` is an official checkpoint's VAE source: it has video_vae/ or audio_vae/."""
    return any((Path(folder) / name).is_dir() for name in (VIDEO_FOLDER, AUDIO_FOLDER))


def check_official_vaes(folder: str | Path, trust_remote_code: bool) -> tuple[RemoteCode, RemoteCode]:
    """The hook contracts of `folder`/video_vae and `folder`/audio_vae (read_remote_code), refused
    unless trust_remote_code: nothing of the folders runs here.

    Raises FileNotFoundError / ValueError as read_remote_code, and ValueError naming the folder
    and the parameter when trust_remote_code is false."""
    folder = Path(folder)
    codes = (
        read_remote_code(folder / VIDEO_FOLDER, VIDEO_LATENT_CHANNELS),
        read_remote_code(folder / AUDIO_FOLDER, AUDIO_LATENT_CHANNELS),
    )
    if not trust_remote_code:
        code = codes[0]
        raise ValueError(
            f"{code.folder} holds remote code ({code.module.name}); the h3_vae model parameter trust_remote_code "
            'must be "true" to run it (python -m server.launch ... --set h3_vae.trust_remote_code=true)'
        )
    return codes


def remote_model(code: RemoteCode, device: str | torch.device) -> nn.Module:
    """Import code.module from its folder (hook contract 2) and return
    ClassName.from_pretrained(folder) on `device` in eval mode. Raises ValueError when the module
    has no such class with from_pretrained, or it returns no torch.nn.Module."""
    folder = code.folder.resolve()
    package = "h3_remote_code_" + hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        sys.modules[package] = importlib.util.module_from_spec(spec)
    module = importlib.import_module(f"{package}.{code.module.stem}")
    cls = getattr(module, code.class_name, None)
    if not hasattr(cls, "from_pretrained"):
        raise ValueError(f"{code.module} defines no class {code.class_name!r} with from_pretrained")
    model = cls.from_pretrained(str(code.folder))
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"{code.folder}: {code.class_name}.from_pretrained returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model.to(device).eval()


def hook_tensor(folder: Path, method: str, output, expected: list[list[int]]) -> torch.Tensor:
    """The tensor a hook's `method` ("encode" or "decode") returned (itself or its .sample),
    float32 (hook contract 6). Raises ValueError naming `folder` and the expected shape(s) unless
    it has one of the `expected` shapes, and naming `folder` when a value is NaN or infinite."""
    tensor = output if isinstance(output, torch.Tensor) else getattr(output, "sample", None)
    if not isinstance(tensor, torch.Tensor) or list(tensor.shape) not in expected:
        got = f"shape {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(output).__name__
        shapes = " or ".join(str(shape) for shape in expected)
        raise ValueError(f"{folder}: {method} returned {got}; expected a tensor (or .sample) of shape {shapes}")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{folder}: {method} returned values that are not finite (NaN or infinity)")
    return tensor.float()


class RemoteVAE:
    """An official VAE folder's model and its latent statistics (hook contract 1-3).

    Args:
        code: the folder's contract (check_official_vaes).
        device: where the model, the latents and the outputs live.
    """

    def __init__(self, code: RemoteCode, device: str | torch.device):
        self.folder, self.model = code.folder, remote_model(code, device)
        self.latents_mean = torch.tensor(code.latents_mean, device=device)
        self.latents_std = torch.tensor(code.latents_std, device=device)


class RemoteVideoVAE(RemoteVAE):
    """An official video_vae/ folder's model behind VideoVAE.encode and .decode (hook contract 3, 4, 6)."""

    @torch.inference_mode()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Encode one clip: uint8 frames [T, H, W, 3] (T = 17n + 5; H, W multiples of 16) ->
        normalised float32 latents [24, 5n + 2, H/16, W/16] on the device.

        Raises ValueError for a wrong dtype, shape or frame count (vae.check_video_frames), or
        an encode output of another shape than [1, 24, 5n + 2, H/16, W/16] or not finite (naming
        the folder)."""
        check_video_frames(frames)
        num_frames, height, width, _ = frames.shape
        x = (frames.to(self.latents_mean.device).float() / 127.5 - 1.0).permute(3, 0, 1, 2)[None]
        step = VIDEO_SPATIAL_DOWNSAMPLE
        expected = [1, VIDEO_LATENT_CHANNELS, num_video_latents(num_frames), height // step, width // step]
        z = hook_tensor(self.folder, "encode", self.model.encode(x), [expected])[0]
        std, mean = self.latents_std[:, None, None, None], self.latents_mean[:, None, None, None]
        return ((z - mean) / std).contiguous()

    @torch.inference_mode()
    def decode(self, latent: torch.Tensor, tile: Callable[[], AbstractContextManager] = nullcontext) -> torch.Tensor:
        """Decode one clip: normalised float32 latents [24, T_lat, Hl, Wl] (T_lat = 5n + 2) ->
        uint8 frames [17n + 5, Hl*16, Wl*16, 3] on the device (clamped to [0, 1], x255, rounded),
        in one tile (`with tile():`, as VideoVAE.decode's): the hook decodes a whole clip.

        Raises ValueError for a wrong dtype, shape or latent frame count (vae.check_video_latent),
        or a decode output of another shape than [1, 3, 17n + 5, Hl*16, Wl*16] or not finite
        (naming the folder)."""
        check_video_latent(latent)
        std, mean = self.latents_std[:, None, None, None], self.latents_mean[:, None, None, None]
        z = latent.to(self.latents_mean.device) * std + mean
        _, num_latents, height, width = latent.shape
        step = VIDEO_SPATIAL_DOWNSAMPLE
        expected = [1, 3, num_video_frames(num_latents), height * step, width * step]
        with tile():
            return frames_to_uint8(
                hook_tensor(self.folder, "decode", self.model.decode(z[None]), [expected])[0].permute(1, 2, 3, 0)
            )


class RemoteAudioVAE(RemoteVAE):
    """An official audio_vae/ folder's model behind AudioVAE.encode and .decode (hook contract 3, 5, 6)."""

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """Encode stereo audio: float32 [2, N] at 32 kHz (N a positive multiple of 800) ->
        normalised float32 latents [2, 32, N / 800] on the device.

        Raises ValueError for a wrong dtype, shape or length (vae.check_audio), or an encode
        output of another shape than [2, 32, N / 800] or not finite (naming the folder)."""
        check_audio(audio)
        x = audio.to(self.latents_mean.device)[:, None, :]
        expected = [audio.shape[0], AUDIO_LATENT_CHANNELS, audio.shape[1] // AUDIO_HOP]
        z = hook_tensor(self.folder, "encode", self.model.encode(x), [expected])
        return (z - self.latents_mean[:, None]) / self.latents_std[:, None]

    @torch.inference_mode()
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """Decode stereo latents: normalised float32 [2, 32, T_a] -> float32 waveform
        [2, T_a * 800] in [-1, 1] at 32 kHz on the device.

        Raises ValueError for a wrong dtype or shape (vae.check_audio_latent), or a decode output
        of another shape than [2, 1, T_a*800] or [2, T_a*800] or not finite (naming the folder)."""
        check_audio_latent(latent)
        z = latent.to(self.latents_mean.device) * self.latents_std[:, None] + self.latents_mean[:, None]
        samples = latent.shape[2] * AUDIO_HOP
        expected = [[latent.shape[0], 1, samples], [latent.shape[0], samples]]
        return hook_tensor(self.folder, "decode", self.model.decode(z), expected).reshape(latent.shape[0], samples)


def load_vaes(
    source: str | Path, device: str | torch.device = "cpu", trust_remote_code: bool = False
) -> tuple[VideoVAE | RemoteVideoVAE, AudioVAE | RemoteAudioVAE]:
    """The video and audio VAEs of a weight source (module docstring), in eval mode on `device`.

    Raises:
        ValueError: a malformed random:SEED; an official folder without trust_remote_code, or
            one that breaks the hook contract; a native file with a missing, unexpected or
            mis-shaped tensor (named).
        FileNotFoundError: a native weights file, or an official config.json or module file, is
            missing (named).
    """
    seed = source_seed(source)
    if seed is not None:
        video_vae, audio_vae = create_vaes(seed + VAE_SEED_OFFSET)
        return video_vae.to(device), audio_vae.to(device)
    folder = Path(source)
    if is_official_vae_folder(folder):
        video_code, audio_code = check_official_vaes(folder, trust_remote_code)
        return RemoteVideoVAE(video_code, device), RemoteAudioVAE(audio_code, device)
    video_vae, audio_vae = VideoVAE().to(device), AudioVAE().to(device)
    load_weights(video_vae, folder / VIDEO_VAE_FILE)
    load_weights(audio_vae, folder / AUDIO_VAE_FILE)
    return video_vae.eval(), audio_vae.eval()


def write_official_vaes(folder: str | Path, video_vae: VideoVAE, audio_vae: AudioVAE) -> None:
    """Write `folder`/video_vae/ and `folder`/audio_vae/ in the hook contract's layout: config.json
    (auto_map naming remote_vae_modeling's H3VideoVAE / H3AudioVAE, the VAE's latents_mean and
    latents_std), model.safetensors (the encoder's and decoder's weights, named encoder.* and
    decoder.*) and remote_vae_modeling.py copied as modeling_h3_vae.py. Raises FileExistsError
    when either folder exists."""
    models = (
        (VIDEO_FOLDER, video_vae, remote_vae_modeling.H3VideoVAE),
        (AUDIO_FOLDER, audio_vae, remote_vae_modeling.H3AudioVAE),
    )
    for name, vae, cls in models:
        target = Path(folder) / name
        target.mkdir(parents=True, exist_ok=False)
        networks = nn.ModuleDict({"encoder": vae.encoder, "decoder": vae.decoder})
        save_weights(networks, target / remote_vae_modeling.WEIGHTS_FILE)
        shutil.copyfile(remote_vae_modeling.__file__, target / REMOTE_MODULE_FILE)
        config = {
            "auto_map": {"AutoModel": f"{Path(REMOTE_MODULE_FILE).stem}.{cls.__name__}"},
            "latents_mean": vae.latents_mean.tolist(),
            "latents_std": vae.latents_std.tolist(),
        }
        (target / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
