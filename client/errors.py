"""H3Error: a failed generation and its code word, read from a server's error or final response
(Triton's ensemble and request-id prefixes removed; Triton's own errors, which carry no code
word, mapped by TRITON_ERRORS). Needs no torch.
"""

from __future__ import annotations

import re

from tritonclient.utils import InferenceServerException

from h3_core import protocol

ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")
REQUEST_ID_PREFIX = re.compile(r"^\[request id: [^\]]*\] ")
# Triton's own errors, raised before or around the models, carry no code word: a malformed
# request (wrong data type, shape, batch size, input or output name; a sequence id without
# START) is INVALID_ARG; a dead model process (python backend stub), a lost connection and a
# full /dev/shm (the python backend could not grow its shared memory) are UNAVAILABLE.
TRITON_ERRORS = (
    (
        re.compile(
            r"^(inference input '[^']*' data-type is |unexpected shape for input "
            r"|inference request batch-size must be |unexpected inference (input|output) "
            r"|inference request for sequence .* must specify the START flag"
            r"|input '[^']*' batch size does not match other inputs "
            r"|inference request to model '[^']*' must specify batch-size 1 )"
        ),
        "INVALID_ARG",
    ),
    (
        re.compile(
            r"^(Stub process '[^']*' is not healthy|failed to connect to all addresses|Stream removed"
            r"|Socket closed|The stream is no longer in valid state"
            r"|Failed to process the request\(s\) for model '[^']*', "
            r"message: Failed to increase the shared memory pool size)"
        ),
        "UNAVAILABLE",
    ),
)


class H3Error(Exception):
    """A failed generation: an error response (refusals: INVALID_ARG, UNAVAILABLE; Triton's own
    errors), or a final response whose INFO is {"kind": "error", "code", "message"} (a started
    request that ended early: CANCELLED, INTERNAL). `code` is the code word (TIMEOUT when the
    client gave up; UNKNOWN for an unrecognised error); `message` is the rest, without
    Triton's ensemble and request-id prefixes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    @classmethod
    def from_server(cls, error: InferenceServerException) -> H3Error:
        """The H3Error of a tritonclient error: its code word, or TRITON_ERRORS' for Triton's own
        errors, else UNKNOWN."""
        text = REQUEST_ID_PREFIX.sub("", ENSEMBLE_PREFIX.sub("", error.message() or str(error)))
        match = protocol.CODE_PATTERN.match(text)
        if match:
            return cls(match.group(1), text[match.end() :])
        return cls(next((code for pattern, code in TRITON_ERRORS if pattern.match(text)), "UNKNOWN"), text)
