"""Create the seeded random checkpoints used by tests and the server (idempotent).

    python -m h3_core.weights.checkpoint_setup [--configs tiny small] [--root checkpoints] [--force]
                                       [--device cuda]

Each folder <root>/<config>/ gets dit.safetensors, video_vae.safetensors and
audio_vae.safetensors, initialised from fixed seeds (DiT seed 0, VAEs seed 1): the weights of
the source `random:0` (h3_core.weights.checkpoint), stored. Nothing is downloaded. --device cuda draws
the DiT's numbers on the GPU (seconds instead of minutes for the 6 B-parameter `bench` DiT; the
values differ from a CPU draw, see h3_core.model.initialization.init_weights).
"""

import argparse
from pathlib import Path

from ..config import get_config
from ..model import H3DiT
from ..model.initialization import init_weights
from ..model.vae import create_vaes
from .checkpoint import AUDIO_VAE_FILE, DIT_FILE, VAE_SEED_OFFSET, VIDEO_VAE_FILE, save_weights

DIT_SEED = 0
VAE_SEED = DIT_SEED + VAE_SEED_OFFSET  # so the folder holds the weights of the source random:DIT_SEED
CHECKPOINT_FILES = (DIT_FILE, VIDEO_VAE_FILE, AUDIO_VAE_FILE)
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "checkpoints"


def create_checkpoint(config_name: str, folder: str | Path, force: bool = False, device: str = "cpu") -> bool:
    """Write the seeded checkpoint of `config_name` into `folder`, the DiT drawn on `device`;
    returns False (and writes nothing) when all files exist already and force is False."""
    folder = Path(folder)
    if not force and all((folder / name).is_file() for name in CHECKPOINT_FILES):
        return False
    dit = H3DiT(get_config(config_name), device=device)
    init_weights(dit, DIT_SEED)
    video_vae, audio_vae = create_vaes(VAE_SEED)
    for module, name in zip((dit, video_vae, audio_vae), CHECKPOINT_FILES, strict=True):
        save_weights(module, folder / name)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["tiny", "small"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--force", action="store_true", help="rewrite existing checkpoints")
    parser.add_argument("--device", default="cpu", help="torch device that draws the DiT's weights")
    args = parser.parse_args()
    for name in args.configs:
        made = create_checkpoint(name, args.root / name, args.force, args.device)
        print(f"checkpoint {name}: {'created' if made else 'present'} in {args.root / name}")


if __name__ == "__main__":
    main()
