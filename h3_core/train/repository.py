"""A copy of model_repository/ that serves the trained demo model (or any config + weights).

    python -m h3_core.train.repository out/demo_model_repository [--config demo] [--weights weights/demo]

model_repository/ itself keeps the `tiny` config on seeded random weights (the test server's
default); `make demo` and the evaluation serve a copy made here, whose h3_dit config_name and
checkpoint_dir and h3_vae checkpoint_dir point at the demo config and the shipped weights
(absolute paths). Any other h3_dit / h3_vae / h3_encoder parameter can be overridden too.
"""
import argparse
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = "demo"
DEMO_WEIGHTS = ROOT / "weights" / "demo"


def set_parameter(text: str, key: str, value: str) -> str:
    """Replace the string_value of parameter `key` in a config.pbtxt text (it must occur once)."""
    text, count = re.subn(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\g<1>"{value}"', text)
    if count != 1:
        raise ValueError(f"parameter {key!r} occurs {count} times, expected once")
    return text


def repository_copy(target: str | Path, overrides: dict[str, dict[str, str]] | None = None,
                    source: Path = ROOT / "model_repository") -> Path:
    """Copy `source` to `target` (which must not exist) and set the parameters in
    overrides = {model name: {key: value}}; returns the target path."""
    target = Path(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for model, params in (overrides or {}).items():
        config = target / model / "config.pbtxt"
        text = config.read_text()
        for key, value in params.items():
            text = set_parameter(text, key, str(value))
        config.write_text(text)
    return target


def demo_repository(target: str | Path, config: str = DEMO_CONFIG, weights: str | Path = DEMO_WEIGHTS,
                    replace: bool = False, **dit_parameters: str) -> Path:
    """A repository copy serving `config` with the weights folder `weights`; extra keyword
    arguments override h3_dit parameters. replace=True removes an existing target first."""
    target, weights = Path(target), Path(weights).resolve()
    for name in ("dit.safetensors", "video_vae.safetensors", "audio_vae.safetensors"):
        if not (weights / name).is_file():
            raise FileNotFoundError(f"{weights / name} not found")
    if replace and target.exists():
        shutil.rmtree(target)
    return repository_copy(target, {
        "h3_dit": {"config_name": config, "checkpoint_dir": str(weights), **dit_parameters},
        "h3_vae": {"checkpoint_dir": str(weights)},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--config", default=DEMO_CONFIG)
    parser.add_argument("--weights", type=Path, default=DEMO_WEIGHTS)
    args = parser.parse_args()
    path = demo_repository(args.target, args.config, args.weights, replace=True)
    print(f"model repository {path}: h3_dit config {args.config}, weights {args.weights.resolve()}")


if __name__ == "__main__":
    main()
