"""Glue shared by the Triton python models in model_repository/ (imported only inside the
python backend stub, where triton_python_backend_utils exists).

Error messages start with a stable code word (INVALID_ARG:, UNAVAILABLE:, CANCELLED:,
INTERNAL:) because streaming clients receive only the message text; through the ensemble,
Triton 2.51 prefixes it with "in ensemble 'h3_pipeline', ".
"""
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

ERROR_CODES = ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL")


def model_parameters(args: dict) -> dict[str, str]:
    """The string values of config.pbtxt `parameters`."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def resolve_path(args: dict, path: str) -> Path:
    """An absolute path, or one relative to the folder that holds the model repository."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else Path(args["model_repository"]).resolve().parents[1] / candidate


def error_response(code: str, message: str) -> "pb_utils.InferenceResponse":
    """An error response whose message starts with `code:` (one of ERROR_CODES, which are also
    pb_utils.TritonError status names; pb_utils fills those in only once the stub runs)."""
    status = getattr(pb_utils.TritonError, code)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{code}: {message}", status))


def json_tensor(name: str, value: dict) -> "pb_utils.Tensor":
    """A BYTES [1, 1] tensor holding `value` as JSON."""
    return pb_utils.Tensor(name, np.array([[json.dumps(value).encode()]], dtype=object))


def read_json(request, name: str) -> dict:
    """Decode a BYTES input tensor holding one JSON object. Raises ValueError naming the input
    if it holds more or less than one element, or anything but a JSON object."""
    values = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"{name} must hold one JSON object, got {values.size} elements")
    try:
        value = json.loads(values[0])
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{name} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must hold one JSON object, got {type(value).__name__}")
    return value


# Request parameters a client may set (never Triton's reserved priority / timeout / sequence_*).
REQUEST_PARAMETERS = {"progress_every": (int,), "preview_every": (int,), "deadline_s": (int, float), "request_priority": (int,),
                      "return_mp4": (bool,), "return_frames": (bool,), "return_audio": (bool,), "inject_fault": (str,)}
RESERVED_PARAMETERS = ("priority", "timeout")


def request_parameters(request) -> dict:
    """The request's control parameters as a dict. Triton's own keys (sequence_*, priority,
    timeout) are dropped. Raises ValueError for an unknown name or a value of the wrong type."""
    parameters = {}
    for name, value in json.loads(request.parameters() or "{}").items():
        if name.startswith("sequence_") or name in RESERVED_PARAMETERS:
            continue
        if name not in REQUEST_PARAMETERS:
            raise ValueError(f"request parameter {name!r} is unknown; allowed: {sorted(REQUEST_PARAMETERS)}")
        if type(value) not in REQUEST_PARAMETERS[name]:
            kinds = " or ".join(kind.__name__ for kind in REQUEST_PARAMETERS[name])
            raise ValueError(f"request parameter {name!r} must be {kinds}, got {value!r}")
        parameters[name] = value
    return parameters
