"""The Triton helpers the python models in model_repository/ share (each model.py imports them;
it runs inside the python backend stub, where triton_python_backend_utils exists: the helpers
that build Triton objects import it when called, so this module imports without Triton). The
wire contract itself (names, parameters, error codes) is h3_core.protocol.

Error messages start with a stable code word (h3_core.protocol.ERROR_CODES) because streaming
clients receive only the message text; through the ensemble, Triton 2.51 prefixes it with
"in ensemble 'h3_pipeline', ".
"""

import codecs
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the stub's module, present only where the python backend runs a model
    import triton_python_backend_utils as pb_utils


def model_parameters(args: dict) -> dict[str, str]:
    """The string values of config.pbtxt `parameters`."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


# one `parameters` entry of a config.pbtxt in protobuf's text format: key: "K" value: { string_value: "V" }
# (the colon before a message is optional, a field may end in , or ;, strings are C-escaped)
PARAMETER = re.compile(
    r'key\s*:\s*"((?:[^"\\]|\\.)*)"\s*[,;]?\s*value\s*:?\s*\{\s*string_value\s*:\s*"((?:[^"\\]|\\.)*)"\s*[,;]?\s*\}'
)
COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|#[^\n]*')  # a string (kept) or a comment to the line's end


def config_parameters(path: Path) -> dict[str, str]:
    """The string values of the `parameters` of the config.pbtxt at `path` (model_parameters of
    a file: a sibling model's, h3_core.serving.shared.agreement), read from protobuf's text format
    (Triton's ModelConfig: only the ModelParameter map has `string_value`), with no import beyond
    the standard library: the python backend stub's Python need not hold tritonclient or protobuf.
    Raises ValueError naming the file when a `string_value` is not inside an entry it can read."""
    text = COMMENT.sub(lambda m: m.group(1) or "", Path(path).read_text(encoding="utf-8"))
    found = PARAMETER.findall(text)
    if len(found) != text.count("string_value"):
        raise ValueError(
            f"{path}: cannot read its parameters: {text.count('string_value')} string_value fields, "
            f'{len(found)} of them as key: "..." value: {{ string_value: "..." }}'
        )
    unescape = lambda value: codecs.escape_decode(value.encode())[0].decode()  # noqa: E731 - C escapes, as protobuf
    return {unescape(key): unescape(value) for key, value in found}


def resolve_path(args: dict, path: str) -> Path:
    """An absolute path, or one relative to the folder that holds the model repository."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else Path(args["model_repository"]).resolve().parents[1] / candidate


def set_threads(cpu_threads: int) -> None:
    """torch CPU threads of this model's process. The model processes share the machine's
    cores; more OpenMP threads than free cores makes every parallel region wait for a
    descheduled thread (a tiny step went from 4 ms to 700 ms with 2 threads under load). Torch is
    imported here, so that a model without torch work (h3_cancel) does not load it."""
    import torch

    torch.set_num_threads(cpu_threads)


def error_response(code: str, message: str) -> "pb_utils.InferenceResponse":
    """An error response whose message starts with `code:` (one of protocol.ERROR_CODES, which
    are also pb_utils.TritonError status names; pb_utils fills those in only once the stub runs)."""
    import triton_python_backend_utils as pb_utils

    status = getattr(pb_utils.TritonError, code)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{code}: {message}", status))


def json_tensor(name: str, value: dict) -> "pb_utils.Tensor":
    """A BYTES [1, 1] tensor holding `value` as JSON."""
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.array([[json.dumps(value).encode()]], dtype=object))
