"""The FastAPI application of the Videos API: OpenAI-shaped routes over Jobs, the page at `/`.

    POST   /v1/videos                  create a job (JSON or multipart): the video object
    GET    /v1/videos/{id}             the video object
    GET    /v1/videos                  a page of video objects: ?after=ID&limit=1..100&order=asc|desc
    GET    /v1/videos/{id}/content     ?variant=video|audio|thumbnail|spritesheet|preview&index=K, or an input
                                       as sent: first_frame|last_frame|reference_image|
                                       reference_video|reference_audio&index=K; HEAD too; Range
    POST   /v1/videos/{id}/cancel      cancel a queued or in_progress job (ours): status cancelled
    DELETE /v1/videos/{id}             cancel it if it runs, remove it and its files
    POST   /v1/videos/sync             create, wait, answer the MP4 (header X-Video-Id)
    POST   /v1/videos/{id}/remix       not supported: 404 saying so; so are OpenAI's /v1/videos/edits,
                                       /v1/videos/extensions and /v1/videos/characters
    GET    /v1/models, /v1/models/{id} the served model: OpenAI's model object + its limits (models.py)
    GET    /healthz (also HEAD)        200 while the front end runs
    GET    /readyz (also HEAD)         200 when Triton's h3_pipeline is ready, else 503
    GET    /                           the page (static/index.html; static/ holds its script and style)

With API keys, every /v1 route needs `Authorization: Bearer KEY` (401 otherwise) and a key sees
only its own jobs unless it is an admin key (auth.py); the page and the health routes are public.
POST bodies larger than max_body_bytes (a multipart or JSON create: max_upload_bytes) are refused with
413 from their Content-Length, before any of the body is read (411 for a chunked body). CORS is
off unless origins are given. Every error is OpenAI-shaped (fields.ApiError): unknown routes and
methods say "not supported by this server", a jobs database locked by another process is 503.
Media are served from their files (FileResponse: Content-Length, Range requests answered 206 /
416, HEAD), the inputs as sent too, except the preview, which is replaced while its job runs and
is answered from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from client.api import H3Client
from h3_core import protocol, rules
from h3_core.request_model import UrlPolicy

from . import fields, formats
from .auth import Caller, Keys
from .bodies import read_form
from .content import MediaFile
from .fields import ApiError
from .jobs import PURGE_INTERVAL_S, Jobs
from .loras import add_lora_routes
from .models import model_card, resolved_defaults
from .store import ACTIVE, BUSY_TIMEOUT_S, Store

log = logging.getLogger("videos_api")

STATIC = Path(__file__).resolve().parent / "static"
SYNC_POLL_S = 0.1  # how often /v1/videos/sync looks whether its job ended
POLL_AFTER_MS = 500  # openai-poll-after-ms on an active job: the SDK's poll() waits this long
MAX_LIST_LIMIT = 100
CONTENT = {  # variant -> (file name of output k, media type)
    "video": ("{k}.mp4", "video/mp4"),
    "audio": ("{k}.wav", "audio/wav"),
    "thumbnail": ("{k}.png", "image/png"),
    "spritesheet": ("{k}_spritesheet.jpg", "image/jpeg"),  # made at the first ask (Jobs.spritesheet)
    "preview": ("preview.png", "image/png"),
}
INPUT_VARIANTS = tuple(variant for variant, _, _ in fields.MEDIA_FIELDS.values())  # content of the files sent
CREATE_PATHS = ("/v1/videos", "/v1/videos/sync")  # where a multipart body may carry files
SURROGATE = re.compile("[\ud800-\udfff]")  # what UTF-8 cannot encode
# a 411 / 413 closes the connection: the body it refused is never read (uvicorn would read and drop it)
CLOSE = {"Connection": "close"}
# the response headers a page on another origin may read (CORS): polling, retries, ranges, /sync's id
EXPOSED_HEADERS = (
    "openai-poll-after-ms",
    "Retry-After",
    "x-should-retry",
    "Content-Range",
    "Content-Length",
    "Accept-Ranges",
    "X-Video-Id",
    "WWW-Authenticate",
)


@dataclass(frozen=True)
class Settings:
    """How the front end runs. triton_url: Triton's gRPC endpoint (host:port); data_dir: the
    SQLite file (jobs.sqlite3) and the videos/ folder; api_keys: accepted Bearer keys, each
    mapped to whether it is an admin key (auth.parse_key_file; empty: no authentication);
    cors_origins: origins allowed by CORS (empty: CORS off); max_body_bytes: the largest POST
    body; max_upload_bytes: the largest multipart or JSON create (with its files); retention_s: seconds
    an ended job is kept; max_attempts: submissions of a job across restarts (Jobs docstring);
    accept_wait_s: the longest wait of a create for Triton's first answer; recover_wait_s: the
    longest wait at start-up for Triton to be ready before the restart rule runs (Jobs.recover),
    in seconds; model_name: the
    `model` this server answers to; url_policy: the http(s) URIs an SGLang request may name
    (default: none). Sizes in bytes."""

    triton_url: str = "127.0.0.1:8001"
    data_dir: Path = Path("out/videos_api")
    api_keys: Mapping[str, bool] = field(default_factory=dict)
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 64 * 1024
    max_upload_bytes: int = 16 * 1024 * 1024
    retention_s: float = 24 * 3600.0
    max_attempts: int = 3
    accept_wait_s: float = 30.0
    recover_wait_s: float = 120.0
    model_name: str = "h3"
    url_policy: UrlPolicy = field(default_factory=UrlPolicy)


def video_object(job: dict, model_name: str) -> dict:
    """The OpenAI video object of a stored job, with our extensions (seed, n, num_frames (the
    served clip: aligned up to 17n+5 frames once completed), num_frames_requested (as asked; null
    when the server's default applies), num_inference_steps, step, total_steps, queue_position,
    preview_step, task (sent or implied: fields.task_of), format (the request format: openai,
    sglang, vllm_omni) and normalized_request (h3_core.request_model.VideoRequest.wire, with the
    seed drawn when none was sent: the same for the same request in any format), inputs (the files sent, each
    {"variant", "index", "media_type", "url"}: its download from the content route);
    outside_training once completed when the result's INFO has it). size and seconds are what the
    client asked for, else the result's, else (until it completes) the defaults resolved at
    create (models.resolved_defaults); progress is 100 once completed, else
    min(99, 100 x step / total_steps)."""
    request, outputs = job["request"], job["outputs"]
    result = outputs[0] if outputs else {}
    defaults = request.get("defaults") or {}  # resolved at create (models.resolved_defaults)
    width, height = result.get("width", request["width"]), result.get("height", request["height"])
    num_frames = result.get("num_frames", request["num_frames"])
    if num_frames is None:
        num_frames = defaults.get("num_frames")
    seconds = request["seconds"]
    if seconds is None and num_frames is not None:
        seconds = f"{round(num_frames / protocol.VIDEO_FPS, 3):g}"
    if job["status"] == "completed":
        progress = 100
    else:
        progress = min(99, 100 * job["step"] // job["total_steps"]) if job["total_steps"] else 0
    error = {"code": job["error_code"], "message": job["error_message"]} if job["error_code"] else None
    return {
        "id": job["id"],
        "object": "video",
        "model": model_name,
        "status": job["status"],
        "progress": progress,
        "created_at": job["created_at"],
        "completed_at": job["completed_at"],
        "expires_at": job["expires_at"],
        "prompt": request["prompt"],
        "seconds": seconds,
        "size": f"{width}x{height}" if width and height else defaults.get("size"),
        "error": error,
        "remixed_from_video_id": None,
        "seed": request["seed"],
        "n": request["num_outputs"] or 1,
        "num_frames": num_frames,
        "num_frames_requested": result.get("num_frames_requested", request["num_frames"]),
        "num_inference_steps": result.get("num_inference_steps", job["total_steps"] or request["num_inference_steps"]),
        "step": job["step"],
        "total_steps": job["total_steps"],
        "queue_position": job["queue_position"],
        "preview_step": job["preview_step"],
        "task": fields.task_of(request),
        "format": request.get("format", "openai"),
        "normalized_request": {**json.loads(request["wire"]), "seed": request["seed"]} if "wire" in request else None,
        "inputs": [
            {
                "variant": variant,
                "index": index,
                "media_type": kind,
                "url": f"/v1/videos/{job['id']}/content?variant={variant}&index={index}",
            }
            for variant, kinds in request["inputs"].items()
            for index, kind in enumerate(kinds)
        ],
        **({"outside_training": result["outside_training"]} if "outside_training" in result else {}),
    }


def _listed(job: dict, model_name: str) -> dict:
    """The video object of a job in a list; one that cannot be rendered (a damaged row) is
    logged and listed as {"id", "object", "status", "error": INTERNAL}, never failing the list."""
    try:
        return video_object(job, model_name)
    except Exception as error:
        log.exception("video %s cannot be rendered", job["id"])
        text = f"INTERNAL: this video's record cannot be shown: {type(error).__name__}"
        return {
            "id": job["id"],
            "object": "video",
            "status": job["status"],
            "error": {"code": "INTERNAL", "message": text},
        }


class ApiJSONResponse(JSONResponse):
    """Every JSON answer of the API: its text is always UTF-8, a lone surrogate in a value (of a
    row stored before bodies.py refused them) sent as U+FFFD, so no stored value can make an
    answer fail."""

    def render(self, content) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return SURROGATE.sub("\ufffd", text).encode("utf-8")


def _error_response(error: ApiError) -> JSONResponse:
    headers = dict(error.headers)
    if error.status < 500 and error.status != 429:
        headers.setdefault("x-should-retry", "false")  # the SDK retries 409 otherwise
    return ApiJSONResponse(error.body(), status_code=error.status, headers=headers)


def authorize(request: Request) -> Caller:
    """The caller of a request (auth.Keys.caller with the app's keys): ApiError 401 when refused."""
    return request.app.state.keys.caller(request.headers.get("authorization"))


Authorized = Annotated[Caller, Depends(authorize)]  # FastAPI runs it once per request, router check included


def _file(path: Path, media_type: str, headers: dict, video_id: str, variant: str) -> MediaFile:
    """A file written once and never replaced, streamed from disk (Range and HEAD by Starlette).
    Raises ApiError 404 when it is gone (its job deleted or expired meanwhile)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise ApiError(404, "NOT_FOUND", f"no {variant} of video {video_id}") from None
    return MediaFile(path, media_type=media_type, headers=headers, stat_result=stat)


def _integer_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter `name`: an integer in low..high (h3_core.rules.check_integer and
    check_in_range), `default` when absent. Raises ApiError 400 INVALID_ARG naming it as sent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = rules.check_integer(name, raw, text=True)
    except rules.InvalidValue as error:
        raise fields.invalid(f"{name}={raw!r} {error.reason} in {low}..{high}", name) from error
    try:
        return rules.check_in_range(name, value, low, high)
    except rules.InvalidValue as error:
        raise fields.invalid(f"{name}={raw!r} {error.reason}", name) from error


def create_app(settings: Settings) -> FastAPI:
    """The front end's FastAPI application for `settings`. At start-up it takes the data folder's
    lock (RuntimeError when another front end holds it), applies the restart rule (Jobs.recover)
    and starts the retention sweep; at shutdown it stops the sweep."""
    data_dir = Path(settings.data_dir)
    client = H3Client(settings.triton_url)
    started = int(time.time())  # the model object's `created`: when this front end started

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        data_dir.mkdir(parents=True, exist_ok=True)
        lock = open(data_dir / "lock", "w")  # held while the app runs
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(f"another front end serves {data_dir} (its lock file is held)") from None
        store = Store(data_dir / "jobs.sqlite3")
        jobs = Jobs(
            store,
            data_dir,
            client,
            retention_s=settings.retention_s,
            max_attempts=settings.max_attempts,
            accept_wait_s=settings.accept_wait_s,
        )
        await run_in_threadpool(jobs.recover, settings.recover_wait_s)
        stop = threading.Event()

        def sweep() -> None:
            while not stop.wait(PURGE_INTERVAL_S):
                jobs.purge(time.time())

        sweeper = threading.Thread(target=sweep, name="videos-api-purge", daemon=True)
        sweeper.start()
        app.state.jobs = jobs
        try:
            yield
        finally:
            stop.set()
            sweeper.join()
            client.close()  # its pooled gRPC channels, explicitly: closing them from a finalizer can deadlock
            store.close()
            lock.close()

    app = FastAPI(
        title="h3-triton Videos API",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        default_response_class=ApiJSONResponse,
    )

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        if "chunked" in request.headers.get("transfer-encoding", "").lower():
            error = ApiError(411, "LENGTH_REQUIRED", "send the body with a Content-Length", headers=CLOSE)
            return _error_response(error)
        length = request.headers.get("content-length", "0")
        kind = request.headers.get("content-type", "").lower()
        create = kind.startswith(("multipart/form-data", "application/json")) and request.url.path in CREATE_PATHS
        limit = settings.max_upload_bytes if create else settings.max_body_bytes  # a JSON create's data: URLs
        if not length.isdigit() or int(length) > limit:
            return _error_response(
                ApiError(413, "TOO_LARGE", f"the body is {length} bytes: allowed {limit}", headers=CLOSE)
            )
        return await call_next(request)

    if settings.cors_origins:  # added last: outermost, so refusals (401, 413, ...) carry its headers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "HEAD", "POST", "DELETE"],
            allow_headers=["*"],  # the JS SDK's X-Stainless-*, Range (a suffix or several), If-Range, ...
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError):
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        code = HTTPStatus(error.status_code).name  # NOT_FOUND for an unknown route, METHOD_NOT_ALLOWED, ...
        text = f"{request.method} {request.url.path} is not supported by this server"
        if error.status_code == 404:
            text += "; its routes: docs/videos_api.md"
        elif error.status_code == 405:
            routes = [route for route in (*api.routes, *app.router.routes) if isinstance(route, Route)]
            allowed = {m for route in routes if route.path_regex.match(request.url.path) for m in route.methods}
            error.headers["Allow"] = ", ".join(sorted(allowed))  # every route at the path, not only the first
            text += f"; allowed: {error.headers['Allow']}"
        else:
            text = str(error.detail)
        return _error_response(ApiError(error.status_code, code, text, headers=error.headers))

    @app.exception_handler(sqlite3.OperationalError)
    async def store_error(_request: Request, error: sqlite3.OperationalError):
        if "locked" not in str(error):
            raise error
        text = f"the jobs database is locked by another process (waited {BUSY_TIMEOUT_S:g} s); retry"
        return _error_response(
            ApiError(503, "UNAVAILABLE", text, headers={"Retry-After": str(fields.RETRY_AFTER_UNAVAILABLE_S)})
        )

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, error: Exception):
        log.error("unexpected error", exc_info=error)
        return _error_response(ApiError(500, "INTERNAL", f"{type(error).__name__}: {error}"))

    app.state.keys = Keys(settings.api_keys)

    def jobs_of(request: Request) -> Jobs:
        return request.app.state.jobs

    api = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    async def parse(request: Request) -> tuple[dict, dict[str, list[bytes]]]:
        """The parsed create of a POST body with the defaults the server will use where it left
        them (size, num_frames): formats.read (ours: fields.parse_create; SGLang's H3 JSON and
        vLLM-Omni's form: h3_core.request_model), models.resolved_defaults."""
        multipart = request.headers.get("content-type", "").lower().startswith("multipart/form-data")
        form = await read_form(request, settings.max_upload_bytes)
        # in a worker thread: an SGLang uri's download (up to its time limit) or a reference's
        # duration read holds no other request up
        parsed, media = await run_in_threadpool(formats.read, form, multipart, settings.model_name, settings.url_policy)
        if parsed["width"] is None or parsed["num_frames"] is None:
            parsed["defaults"] = await run_in_threadpool(resolved_defaults, client, parsed, media, settings.model_name)
        return parsed, media

    @api.post("/videos")
    async def create(request: Request, caller: Authorized):
        parsed, media = await parse(request)
        job = await jobs_of(request).create(parsed, media, caller.owner)
        return video_object(job, settings.model_name)

    @api.post("/videos/sync")
    async def create_sync(request: Request, caller: Authorized):
        parsed, media = await parse(request)
        if (parsed["num_outputs"] or 1) != 1:
            raise fields.invalid(f"n={parsed['num_outputs']}: /v1/videos/sync answers one MP4; use /v1/videos", "n")
        jobs = jobs_of(request)
        job = await jobs.create(parsed, media, caller.owner)
        while (ended := await run_in_threadpool(jobs.store.get, job["id"])) is not None and ended["status"] in ACTIVE:
            await asyncio.sleep(SYNC_POLL_S)  # no thread waits: syncs are bounded by the DiT's capacity only
        if ended is None:
            raise ApiError(404, "NOT_FOUND", f"video {job['id']} was deleted while it ran")
        if ended["status"] == "cancelled":
            raise ApiError(409, "CANCELLED", f"video {job['id']} was cancelled")
        if ended["status"] == "failed":
            code = ended["error_code"]
            raise fields.error_from_server(code, ended["error_message"].removeprefix(f"{code}: "), parsed)
        return _file(jobs.folder(job["id"]) / "0.mp4", "video/mp4", {"X-Video-Id": job["id"]}, job["id"], "video")

    @api.get("/videos")
    def list_videos(request: Request, caller: Authorized):
        limit = _integer_query(request, "limit", 20, 1, MAX_LIST_LIMIT)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise fields.invalid(f"order={order!r} must be 'asc' or 'desc'", "order")
        after = request.query_params.get("after")
        try:
            owner = None if caller.admin else caller.owner
            jobs, has_more = jobs_of(request).store.page(after, limit, order == "desc", owner)
        except KeyError:
            raise fields.invalid(f"after={after!r} is not the id of a video", "after") from None
        data = [_listed(job, settings.model_name) for job in jobs]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }

    @api.get("/videos/{video_id}")
    def retrieve(request: Request, video_id: str, caller: Authorized):
        job = jobs_of(request).get(video_id, caller)
        headers = {"openai-poll-after-ms": str(POLL_AFTER_MS)} if job["status"] in ACTIVE else {}
        return ApiJSONResponse(video_object(job, settings.model_name), headers=headers)

    @api.api_route("/videos/{video_id}/content", methods=["GET", "HEAD"])
    def content(request: Request, video_id: str, caller: Authorized):
        jobs = jobs_of(request)
        job = jobs.get(video_id, caller)
        variant = request.query_params.get("variant", "video")
        if variant in INPUT_VARIANTS:
            kinds = job["request"]["inputs"].get(variant)
            if not kinds:
                raise ApiError(404, "NOT_FOUND", f"video {video_id} was sent no {variant}")
            index = _integer_query(request, "index", 0, 0, len(kinds) - 1)
            path = jobs.input_path(video_id, variant, index)
            return _file(path, kinds[index], {"X-Content-Type-Options": "nosniff"}, video_id, variant)
        if variant not in CONTENT:
            allowed = sorted([*CONTENT, *INPUT_VARIANTS])
            raise fields.invalid(f"variant={variant!r} is not served; allowed: {allowed}", "variant")
        n = job["request"]["num_outputs"] or 1
        index = _integer_query(request, "index", 0, 0, n - 1)
        name, media_type = CONTENT[variant]
        path = jobs.folder(video_id) / name.format(k=index)
        if variant == "preview":
            if not path.is_file():
                raise ApiError(404, "NOT_FOUND", f"video {video_id} has no preview yet")
        elif job["status"] != "completed":
            raise ApiError(409, "CONFLICT", f"video {video_id} is {job['status']}: content comes once it is completed")
        headers = {"Cache-Control": "no-store"}
        if variant == "spritesheet":
            try:
                path = jobs.spritesheet(video_id, index)
            except FileNotFoundError:  # deleted or expired meanwhile
                raise ApiError(404, "NOT_FOUND", f"no {variant} of video {video_id}") from None
        if variant != "preview":
            return _file(path, media_type, headers, video_id, variant)
        try:
            data = path.read_bytes()  # replaced after each step: read at once, never half of two
        except FileNotFoundError:  # deleted or expired meanwhile
            raise ApiError(404, "NOT_FOUND", f"no {variant} of video {video_id}") from None
        return Response(data, media_type=media_type, headers=headers)

    @api.post("/videos/{video_id}/cancel")
    def cancel(request: Request, video_id: str, caller: Authorized):
        return video_object(jobs_of(request).cancel(video_id, caller), settings.model_name)

    @api.delete("/videos/{video_id}")
    def delete(request: Request, video_id: str, caller: Authorized):
        jobs_of(request).delete(video_id, caller)
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    add_lora_routes(api, client, Authorized)  # admin only: docs/lora.md

    @api.post("/videos/{video_id}/remix")
    def remix(video_id: str):
        raise ApiError(
            404,
            "NOT_FOUND",
            "remix is not supported by this server: it does not edit a finished video; "
            "create a new one with the changed prompt (and the same seed)",
        )

    @api.post("/videos/edits")
    @api.post("/videos/extensions")
    @api.post("/videos/characters")
    @api.get("/videos/characters/{character_id}")
    def not_served(request: Request):  # OpenAI's last published routes this server has no model for
        raise ApiError(
            404,
            "NOT_FOUND",
            f"{request.method} {request.url.path} is not supported by this server: it edits and extends no "
            "video and keeps no characters; create a new video (docs/videos_api.md, Differences from OpenAI)",
        )

    @api.get("/models")
    def list_models():
        return {"object": "list", "data": [model_card(client, settings.model_name, started)]}

    @api.get("/models/{model_id}")
    def retrieve_model(model_id: str):
        if model_id != settings.model_name:
            raise ApiError(404, "NOT_FOUND", f"no model {model_id!r}; served: {settings.model_name!r}")
        return model_card(client, settings.model_name, started)

    app.include_router(api)

    @app.api_route("/healthz", methods=["GET", "HEAD"], include_in_schema=False)
    def healthz():
        return {"status": "ok"}

    @app.api_route("/readyz", methods=["GET", "HEAD"], include_in_schema=False)
    def readyz():
        if not client.ready():
            raise ApiError(
                503,
                "UNAVAILABLE",
                f"Triton at {settings.triton_url} is not ready: unreachable, or {protocol.PIPELINE_MODEL} not loaded",
                headers={"Retry-After": str(fields.RETRY_AFTER_UNAVAILABLE_S)},
            )
        return {"status": "ready"}

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
