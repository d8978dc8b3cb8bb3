"""The LoRA admin routes of the Videos API (docs/lora.md §"Serving"): list, load and unload the
server's adapters through H3Client.lora_control (h3_cancel's control requests, which reach every
h3_dit instance). Only an admin key may call them (auth.py: `KEY admin` in the key file); without
configured keys they are refused too, as a load names a file on the server's disk.

    GET    /v1/loras          -> {"object": "list", "data": [{"name", "path", "rank", "targets",
                                  "bytes", "instances": {instance: report}}, ...]}
    POST   /v1/loras          {"name": NAME, "path": PATH} -> the load's answer
                                  {"name", "action": "lora_load", "instances": {instance: report}}
    DELETE /v1/loras/{name}   -> the unload's answer (an adapter in use is "unloading" where its
                                  requests run: it takes no new request and goes when they end)

Errors are OpenAI-shaped (fields.ApiError): 403 PERMISSION_DENIED without an admin key, 400
INVALID_ARG for a malformed body and for the server's refusals (an unknown name, a file that is
not there, max_loras or max_lora_rank passed), with the server's message.
"""

import json

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from client.api import H3Client, H3Error

from .auth import Caller
from .fields import ApiError, error_from_server, invalid


def check_admin(caller: Caller) -> None:
    """Raise ApiError 403 PERMISSION_DENIED unless `caller` holds a configured admin key."""
    if caller.owner is None:
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            "the LoRA routes need an admin key: start the Videos API with --api-key-file listing 'KEY admin'",
        )
    if not caller.admin:
        raise ApiError(403, "PERMISSION_DENIED", "the LoRA routes need an admin key ('KEY admin' in the key file)")


def add_lora_routes(api: APIRouter, client: H3Client, authorized) -> None:
    """Add the module's routes to `api` (the /v1 router); `authorized`: the app's Caller dependency."""

    async def control(action: str, name: str | None = None, path: str | None = None) -> dict:
        try:
            return await run_in_threadpool(client.lora_control, action, name, path)
        except H3Error as error:
            raise error_from_server(error.code, error.message) from None

    @api.get("/loras")
    async def list_loras(caller: authorized):
        check_admin(caller)
        return {"object": "list", "data": (await control("lora_list"))["adapters"]}

    @api.post("/loras")
    async def load_lora(request: Request, caller: authorized):
        check_admin(caller)
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise invalid("the body must be a JSON object {'name': NAME, 'path': PATH}") from None
        if not isinstance(body, dict) or sorted(body) != ["name", "path"]:
            raise invalid("the body must be a JSON object {'name': NAME, 'path': PATH}")
        if not all(isinstance(body[key], str) for key in body):
            raise invalid("name and path must be strings")
        return await control("lora_load", body["name"], body["path"])

    @api.delete("/loras/{name}")
    async def unload_lora(name: str, caller: authorized):
        check_admin(caller)
        return await control("lora_unload", name)
