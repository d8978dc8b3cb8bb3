"""h3_cancel: the model clients send their cancels by id to (H3Client.cancel, the CLI's Ctrl-C,
the Videos API), an adapter over h3_core.serving.shared.registry.record_cancel.

A cancel sent to h3_dit waits in Triton's queue until the execute in progress ends, and in
execution mode "request" one execute runs a whole generation: with one DiT instance the cancel
was answered only after it ("finished"). This model's execute never waits for a generation: the
registry answers at once and flags the request (announced), and its DiT instance reads the flag
at its next step boundary. One request per execute (max_batch_size 1, no batching):

    REQUEST BYTES [1, 1]: {"cancel_request_id": ID}, ID a non-empty string of at most
        protocol.MAX_REQUEST_ID_CHARS characters, no other key
    INFO BYTES [1, 1]: {"kind": "cancel", "request_id": ID, "state": one of protocol.CANCEL_STATES}

Errors: INVALID_ARG naming the field for a malformed REQUEST (protocol.read_cancel_request: the
same checks as h3_dit's control request), INTERNAL when the registry fails (logged). Torch is
not imported: the process holds the registry and nothing else."""

import traceback

import triton_python_backend_utils as pb_utils

from h3_core.protocol import INFO, REQUEST, cancel_info, read_cancel_request
from h3_core.serving.shared.registry import CancelNotRecorded, Registry, record_cancel, server_folder
from h3_core.serving.shared.triton import error_response, json_tensor


class TritonPythonModel:
    def initialize(self, args):
        self.registry = Registry(server_folder())

    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request) -> "pb_utils.InferenceResponse":
        """One cancel request -> its INFO response, or an error response (INVALID_ARG, INTERNAL)."""
        request_id = request.request_id() or "(no id)"
        try:
            target = read_cancel_request(
                list(pb_utils.get_input_tensor_by_name(request, REQUEST).as_numpy().reshape(-1))
            )
        except ValueError as error:
            pb_utils.Logger.log_info(f"h3_cancel: request {request_id} refused: INVALID_ARG: {error}")
            return error_response("INVALID_ARG", str(error))
        try:
            state = record_cancel(self.registry, target)
        except CancelNotRecorded as error:
            pb_utils.Logger.log_error(f"h3_cancel: the cancel of request {target} failed:\n{traceback.format_exc()}")
            return error_response("INTERNAL", str(error))
        return pb_utils.InferenceResponse([json_tensor(INFO, cancel_info(target, state))])
