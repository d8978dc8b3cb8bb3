"""Write the shipped weights from a training work folder, and plot the loss curves.

    python -m training.export --work build/demo/train --out weights/demo \
        --plot docs/demo_model_loss.png --csv-dir docs/demo_model

weights: dit.safetensors (the DiT state's parameters in float16, native layout, loaded by
checkpoint.load_weights into the float32 demo config), video_vae.safetensors and
audio_vae.safetensors (float32 as trained, with their latents_mean / latents_std) and
training.json (what they were trained on: training.data.training_metadata). The previews'
preview.safetensors is fitted afterwards to the exported video VAE (training.preview_fit). The loss
CSVs are copied to --csv-dir and drawn into one PNG (matplotlib).
"""

import argparse
import json
import shutil
from pathlib import Path

from h3_core.config import get_config
from h3_core.model import H3DiT
from h3_core.model.training_metadata import TRAINING_FILE
from h3_core.weights.checkpoint import save_weights

from . import data
from .loop import read_loss_csv
from .state import load_state

MAX_FILE_BYTES, MAX_TOTAL_BYTES = 16 * 10**6, 25 * 10**6


def export_weights(work: Path, out: Path, config: str = "demo") -> list[Path]:
    dit = H3DiT(get_config(config), device="cpu")
    if load_state(work / "dit_state", dit) is None:
        raise FileNotFoundError(f"no DiT state under {work}")
    out.mkdir(parents=True, exist_ok=True)
    save_weights(dit.half(), out / "dit.safetensors")
    for name in ("video_vae.safetensors", "audio_vae.safetensors"):
        shutil.copyfile(work / name, out / name)
    write_training_metadata(out)
    files = [out / n for n in ("dit.safetensors", "video_vae.safetensors", "audio_vae.safetensors")]
    sizes = [f.stat().st_size for f in files]
    if max(sizes) > MAX_FILE_BYTES or sum(sizes) > MAX_TOTAL_BYTES:
        raise ValueError(f"weights too large: {dict(zip([f.name for f in files], sizes, strict=True))}")
    return files


def write_training_metadata(out: Path) -> Path:
    """Write out/training.json (training.data.training_metadata, h3_core.model.training_metadata)."""
    path = out / TRAINING_FILE
    path.write_text(json.dumps(data.training_metadata(), indent=1) + "\n")
    return path


def plot_losses(work: Path, png: Path, csv_dir: Path | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("video_vae", ["loss"], "video VAE (weighted L1 + MSE)"),
        ("audio_vae", ["loss", "wave_l1"], "audio VAE (100 x MSE + L1 on the waveform)"),
        ("dit", ["loss", "video", "audio"], "DiT flow matching (velocity MSE)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (name, columns, title) in zip(axes, panels, strict=True):
        path = work / f"{name}_loss.csv"
        if not path.exists():
            ax.set_title(f"{title}: no log")
            continue
        if csv_dir is not None:
            csv_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, csv_dir / path.name)
        rows = read_loss_csv(path)
        steps = [int(r["step"]) for r in rows]
        for column in columns:
            ax.plot(steps, [float(r[column]) for r in rows], label=column)
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("build/demo/train"))
    parser.add_argument("--out", type=Path, default=Path("weights/demo"))
    parser.add_argument("--config", default="demo")
    parser.add_argument("--plot", type=Path, default=Path("docs/demo_model_loss.png"))
    parser.add_argument("--csv-dir", type=Path, default=Path("docs/demo_model"))
    args = parser.parse_args()
    for f in export_weights(args.work, args.out, args.config):
        print(f"wrote {f} ({f.stat().st_size / 2**20:.2f} MiB)")
    plot_losses(args.work, args.plot, args.csv_dir)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
