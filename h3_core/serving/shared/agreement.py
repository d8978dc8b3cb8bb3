"""The settings the served models share (settings.SHARED_SETTINGS), checked for agreement: each
model, at load, reads the config.pbtxt of the sibling models in its model repository
(sibling_parameters) and refuses to load on a difference (check_agreement), so a hand-edited
repository fails whatever order Triton loads the models in; server.planner refuses given values
that differ with the same message. A config.pbtxt is read by
h3_core.serving.shared.triton.config_parameters."""

from collections.abc import Mapping
from pathlib import Path

from h3_core.serving.shared.settings import SETTINGS, SHARED_SETTINGS, parse_value
from h3_core.serving.shared.triton import config_parameters


def sibling_parameters(model_folder: str | Path, model: str) -> dict[str, dict[str, str]]:
    """{sibling: its config.pbtxt parameters} of the models that share a setting with `model`
    (SHARED_SETTINGS), read beside `model_folder` (Triton's args["model_repository"]: the model's
    own folder in its repository), in name order. A sibling without a config.pbtxt there (a
    repository without h3_vae) is left out."""
    repository = Path(model_folder).parent
    siblings = {other for models in SHARED_SETTINGS.values() if model in models for other in models} - {model}
    paths = {other: repository / other / "config.pbtxt" for other in sorted(siblings)}
    return {other: config_parameters(path) for other, path in paths.items() if path.is_file()}


def check_agreement(model: str, parameters: Mapping[str, str], siblings: Mapping[str, Mapping[str, str]]) -> None:
    """Raise ValueError naming the key, both models and both values for the first shared setting
    (SHARED_SETTINGS order, then the siblings' order) whose value in `model`'s string
    `parameters` differs from a sibling's (`siblings`: {model: its parameters}). Values compare
    typed (heartbeat_s "15" and "15.0" agree); a key one side lacks is left to that model's own
    check, and a value that does not parse raises that model's settings message."""
    for key, models in SHARED_SETTINGS.items():
        if model not in models or key not in parameters:
            continue
        for other, theirs in siblings.items():
            if other == model or other not in models or key not in theirs:
                continue
            if parse_value(SETTINGS[model], key, parameters[key]) != parse_value(SETTINGS[other], key, theirs[key]):
                raise ValueError(
                    f"{model} parameter {key}={parameters[key]!r} differs from {other} parameter {key}="
                    f"{theirs[key]!r}: {', '.join(models)} must carry the same {key} "
                    "(h3_core.serving.shared.settings.SHARED_SETTINGS)"
                )


def check_siblings(model_folder: str | Path, model: str, parameters: dict[str, str]) -> None:
    """check_agreement of `model`'s parameters with its siblings' config.pbtxt in its model
    repository (sibling_parameters): what each model's initialize runs before loading anything."""
    check_agreement(model, parameters, sibling_parameters(model_folder, model))
