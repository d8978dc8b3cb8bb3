"""Helpers for the end-to-end tests: a model repository copy with overridden DiT settings."""
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def model_repository_copy(target: Path, **dit_parameters) -> Path:
    """Copy model_repository/ to `target` with absolute checkpoint paths and the given h3_dit
    parameters overridden (values as strings); returns the new repository path."""
    shutil.copytree(ROOT / "model_repository", target)
    for config in target.glob("*/config.pbtxt"):
        text = config.read_text().replace('"checkpoints/', f'"{ROOT}/checkpoints/')
        if config.parent.name == "h3_dit":
            for key, value in dit_parameters.items():
                text, count = re.subn(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\1"{value}"', text)
                assert count == 1, key
        config.write_text(text)
    return target
