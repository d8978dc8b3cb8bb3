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

It also takes the LoRA control requests (docs/lora.md §"Serving", protocol.LORA_CONTROLS), answered by
h3_core.serving.shared.lora_control through the registry's adapter table, which every h3_dit
instance follows: REQUEST {"lora_load": {"name", "path"}}, {"lora_unload": {"name"}} or
{"lora_list": {}}; INFO {"kind": "lora", ...} or {"kind": "lora_list", ...}. A load or unload
waits for the DiT instances' reports (at most lora_control.CONTROL_WAIT_S), so a cancel sent
meanwhile waits behind it; a load's path must be a file on the server's disk, relative ones from
the folder above the model repository.

Errors: INVALID_ARG naming the field for a malformed REQUEST (protocol.read_cancel_request: the
same checks as h3_dit's control request), INTERNAL when the registry fails (logged). Torch is
not imported: the process holds the registry and nothing else."""

import traceback

import triton_python_backend_utils as pb_utils

from h3_core.protocol import INFO, REQUEST, cancel_info, read_cancel_request, read_lora_control
from h3_core.serving.shared.lora_control import lora_control
from h3_core.serving.shared.registry import CancelNotRecorded, Registry, record_cancel, server_folder
from h3_core.serving.shared.triton import error_response, json_tensor, resolve_path


class TritonPythonModel:
    def initialize(self, args):
        self.registry = Registry(server_folder())
        self.args = args

    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request) -> "pb_utils.InferenceResponse":
        """One cancel request -> its INFO response, or an error response (INVALID_ARG, INTERNAL)."""
        request_id = request.request_id() or "(no id)"
        try:
            elements = list(pb_utils.get_input_tensor_by_name(request, REQUEST).as_numpy().reshape(-1))
            control = read_lora_control(elements)
            if control is not None:
                return self.lora(*control)
            target = read_cancel_request(elements)
        except ValueError as error:
            pb_utils.Logger.log_info(f"h3_cancel: request {request_id} refused: INVALID_ARG: {error}")
            return error_response("INVALID_ARG", str(error))
        try:
            state = record_cancel(self.registry, target)
        except CancelNotRecorded as error:
            pb_utils.Logger.log_error(f"h3_cancel: the cancel of request {target} failed:\n{traceback.format_exc()}")
            return error_response("INTERNAL", str(error))
        return pb_utils.InferenceResponse([json_tensor(INFO, cancel_info(target, state))])

    def lora(self, action: str, name: str | None, path: str | None) -> "pb_utils.InferenceResponse":
        """One LoRA control request -> its INFO response (lora_control); ValueError for INVALID_ARG."""
        if path is not None:
            resolved = resolve_path(self.args, path)
            if not resolved.is_file():
                raise ValueError(f"{action} path {path!r} is not a file on the server ({resolved})")
            path = str(resolved)
        answer = lora_control(self.registry, action, name, path)
        pb_utils.Logger.log_info(f"h3_cancel: {action} {name or ''}: {answer.get('instances', '')}")
        return pb_utils.InferenceResponse([json_tensor(INFO, answer)])
