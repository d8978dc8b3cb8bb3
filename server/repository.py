"""Copies of model_repository/ with changed model parameters: the demo model, the tests' and the
benchmarks' settings.

    python -m server.repository out/demo_model_repository [--config demo] [--weights weights/demo]

model_repository/ itself keeps the `tiny` config on seeded random weights (the test server's
default). A copy's relative `checkpoint_dir` values are made absolute (a model resolves a
relative path against the folder holding its repository, which is another folder for a copy),
then the given parameters are set. `demo_repository` (used by `make demo`) points h3_dit's
config_name and checkpoint_dir and h3_vae's checkpoint_dir at a config and a weights folder.
"""
import argparse
import re
import shutil
from pathlib import Path

from h3_core.settings import DitSettings

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = "demo"
DEMO_WEIGHTS = ROOT / "weights" / "demo"
CHECKPOINT_DIR = re.compile(r'(key: "checkpoint_dir" value: \{ string_value: )"([^"]*)"')
PARAMETER = re.compile(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}')
MAX_BATCH_SIZE = re.compile(r"^max_batch_size: \d+$", re.MULTILINE)


def set_parameter(text: str, key: str, value: str) -> str:
    """Replace the string_value of parameter `key` in a config.pbtxt text. Raises ValueError
    unless the parameter occurs exactly once."""
    text, count = re.subn(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\g<1>"{value}"', text)
    if count != 1:
        raise ValueError(f"parameter {key!r} occurs {count} times, expected once")
    return text


def set_sequence_slots(text: str) -> str:
    """h3_dit's config.pbtxt text with max_batch_size set to its sequence slots (max_num_seqs +
    max_waiting + 2). Raises ValueError for parameters DitSettings refuses."""
    settings = DitSettings.from_parameters(dict(PARAMETER.findall(text)))
    return MAX_BATCH_SIZE.sub(f"max_batch_size: {settings.sequence_slots}", text)


def repository_copy(target: str | Path, overrides: dict[str, dict[str, str]] | None = None,
                    source: Path = ROOT / "model_repository") -> Path:
    """Copy `source` to `target` (without __pycache__), make relative checkpoint_dir values
    absolute (against source's parent folder, where the models resolve them), then set the
    parameters in overrides = {model name: {key: value}} (values as given, str() applied) and
    h3_dit's max_batch_size to its sequence slots.
    Returns the target path. Raises FileExistsError when `target` exists, ValueError for a
    model not in `source` or a key that does not occur exactly once in its config.pbtxt."""
    target, base, overrides = Path(target), Path(source).resolve().parent, overrides or {}
    unknown = sorted(set(overrides) - {config.parent.name for config in Path(source).glob("*/config.pbtxt")})
    if unknown:
        raise ValueError(f"no model {unknown} in {source}")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for config in target.glob("*/config.pbtxt"):
        text = CHECKPOINT_DIR.sub(lambda m: f'{m[1]}"{base / m[2]}"', config.read_text())
        for key, value in overrides.get(config.parent.name, {}).items():
            text = set_parameter(text, key, str(value))
        if config.parent.name == DitSettings.MODEL:
            text = set_sequence_slots(text)
        config.write_text(text)
    return target


def demo_repository(target: str | Path, config: str = DEMO_CONFIG, weights: str | Path = DEMO_WEIGHTS,
                    replace: bool = False, **dit_parameters: str) -> Path:
    """A repository copy serving `config` with the weights folder `weights`; extra keyword
    arguments override h3_dit parameters. replace=True removes an existing target first.
    Raises FileNotFoundError when a weights file is missing."""
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
