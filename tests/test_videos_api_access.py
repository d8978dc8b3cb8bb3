"""The Videos API's edges that clients probe: the key file and non-ASCII keys, keys that own
their jobs (an admin key sees all, an old store migrates), a locked store, creates that wait for
Triton without holding a worker thread, unsupported routes and the health routes (all without a
server), then /v1/models and content ranges / HEAD through the official SDK and httpx against a
real tritonserver."""

import json
import sqlite3
import threading

import openai
import pytest
from fastapi.testclient import TestClient

from videos_api import app as app_module
from videos_api.__main__ import main
from videos_api.app import Settings, create_app
from videos_api.auth import owner_of, parse_key_file
from videos_api.fields import parse_create
from videos_api.store import Store

from .test_fl2va_serving import png
from .videos_api_serving import HTTP, FrontEnd, wait_for

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API is scheduled to permanently shut down:DeprecationWarning")
UNREACHABLE = "127.0.0.1:1"
JSON = {"Content-Type": "application/json"}
UNAUTHORIZED = {
    "message": "UNAUTHORIZED: a valid API key is required: send Authorization: Bearer <key>",
    "type": "invalid_request_error",
    "param": None,
    "code": "UNAUTHORIZED",
}


def bearer(key: str) -> dict:
    """An Authorization header with the key's UTF-8 bytes, as curl or a browser sends them."""
    return {"Authorization": b"Bearer " + key.encode("utf-8")}


# ---- without a server ------------------------------------------------------------------------


def test_the_key_file_holds_keys_and_admin_marks(tmp_path, capsys):
    text = "alpha\n\n  ключ  \ncafé admin\n🔑\u00a0\n".encode()
    assert parse_key_file(text) == {"alpha": False, "ключ": False, "café": True, "🔑": False}
    for bad, message in (
        (b"a b\n", "line 1: expected KEY or 'KEY admin' (a key holds no whitespace)"),
        (b"a\na admin x\n", "line 2: expected KEY or 'KEY admin' (a key holds no whitespace)"),
        (b"a\n\na admin\n", "line 3: the key is listed twice"),
        (
            b"caf\xe9\n",
            "the key file is not UTF-8 text: 'utf-8' codec can't decode byte 0xe9 in position 3: "
            "invalid continuation byte",
        ),
    ):
        with pytest.raises(ValueError) as refused:
            parse_key_file(bad)
        assert str(refused.value) == message
        (tmp_path / "keys.txt").write_bytes(bad)
        with pytest.raises(SystemExit) as exited:
            main(["--api-key-file", str(tmp_path / "keys.txt")])
        assert exited.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"python -m videos_api: error: --api-key-file: {message}"


def test_non_ascii_keys_are_compared_as_utf8_bytes(tmp_path):
    keys = {"ключ": False, "café": False, "🔑": False}
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path, api_keys=keys))) as http:
        for key in keys:
            assert http.get("/v1/videos", headers=bearer(key)).status_code == 200
        for header in (
            bearer("ключ\u00a0"),  # a trailing no-break space
            bearer("кluч"),
            bearer("🔒"),
            {"Authorization": "Bearer"},
        ):
            response = http.get("/v1/videos", headers=header)
            assert (response.status_code, response.headers["www-authenticate"], response.json()) == (
                401,
                "Bearer",
                {"error": UNAUTHORIZED},
            ), header


def stored(jobs, job_id: str, owner: str | None, first: bytes | None = None) -> None:
    """Put an ended job of `owner` into the store, as a finished generation leaves it; `first`: a
    first frame it was sent (written where create keeps it)."""
    request, _ = parse_create({"prompt": "a", "seed": 1, **({"input_reference": first} if first else {})}, "h3")
    jobs.store.add(job_id, 1000, request, owner)
    if first is not None:
        path = jobs.input_path(job_id, "first_frame", 0)
        path.parent.mkdir(parents=True)
        path.write_bytes(first)
    assert jobs.store.end(job_id, "failed", now=1000, expires_at=2**40, error=("INTERNAL", "INTERNAL: x"))


def test_keys_own_their_jobs_and_an_admin_key_sees_all(tmp_path):
    keys = {"key-a": False, "key-b": False, "root": True}
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path, api_keys=keys))) as http:
        jobs = http.app.state.jobs
        first = png(64, 96, 5)
        stored(jobs, "video_a", owner_of(b"key-a"), first)
        stored(jobs, "video_b", owner_of(b"key-b"))
        stored(jobs, "video_old", None)  # made before keys were configured

        def listed(key: str, query: str = "") -> list[str]:
            return [job["id"] for job in http.get(f"/v1/videos?order=asc{query}", headers=bearer(key)).json()["data"]]

        assert listed("key-a") == ["video_a"] and listed("key-b") == ["video_b"]
        assert listed("root") == ["video_a", "video_b", "video_old"]
        assert listed("root", "&after=video_a") == ["video_b", "video_old"]
        after = http.get("/v1/videos?after=video_a", headers=bearer("key-b"))
        assert (after.status_code, after.json()["error"]["message"]) == (
            400,
            "INVALID_ARG: after='video_a' is not the id of a video",
        )
        for method, path in (
            ("GET", "/v1/videos/video_a"),
            ("GET", "/v1/videos/video_a/content"),
            ("HEAD", "/v1/videos/video_a/content"),
            ("GET", "/v1/videos/video_a/content?variant=first_frame"),
            ("HEAD", "/v1/videos/video_a/content?variant=first_frame"),
            ("POST", "/v1/videos/video_a/cancel"),
            ("DELETE", "/v1/videos/video_a"),
        ):
            response = http.request(method, path, headers=bearer("key-b"))
            assert response.status_code == 404, path
            if method != "HEAD":
                assert response.json()["error"]["message"] == "NOT_FOUND: no video with id 'video_a'", path
        assert http.get("/v1/videos/video_a", headers=bearer("key-a")).json()["status"] == "failed"
        # the file it was sent: to its key (and the admin's), with ranges and HEAD like the outputs
        sent = "/v1/videos/video_a/content?variant=first_frame"
        part = http.get(sent, headers={**bearer("key-a"), "Range": "bytes=0-9"})
        assert (part.status_code, part.headers["content-range"], part.content) == (
            206,
            f"bytes 0-9/{len(first)}",
            first[:10],
        )
        head = http.head(sent, headers=bearer("root"))
        assert (head.status_code, head.headers["content-length"], head.headers["content-type"], head.content) == (
            200,
            str(len(first)),
            "image/png",
            b"",
        )
        assert head.headers["x-content-type-options"] == "nosniff"
        assert http.get("/v1/videos/video_old", headers=bearer("root")).json()["status"] == "failed"
        assert http.delete("/v1/videos/video_a", headers=bearer("root")).json()["deleted"]
        assert listed("key-a") == [] and listed("root") == ["video_b", "video_old"]


OLD_REQUEST, _ = parse_create({"prompt": "old", "seed": 3}, "h3")
# the same request as stored before conditioned inputs (no task, fit, inputs)
BEFORE_INPUTS = {key: value for key, value in OLD_REQUEST.items() if key not in ("task", "fit", "inputs")}
OLD_SCHEMA = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL,
    status TEXT NOT NULL, request TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, triton_request_id TEXT,
    step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER, queue_position INTEGER NOT NULL DEFAULT 0,
    preview_step INTEGER, outputs TEXT, error_code TEXT, error_message TEXT, completed_at INTEGER,
    expires_at INTEGER
)
"""


def test_a_store_from_before_owners_gains_the_column_and_its_jobs_are_the_admins(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        db.execute(OLD_SCHEMA)
        db.execute(
            "INSERT INTO jobs (id, created_at, status, request, completed_at, expires_at) "
            "VALUES ('video_old', 1000, 'cancelled', ?, 1000, ?)",
            (json.dumps(BEFORE_INPUTS), 2**40),
        )
    store = Store(tmp_path / "jobs.sqlite3")
    assert (store.get("video_old")["owner"], store.get("video_old")["request"]) == (None, OLD_REQUEST)
    store.close()
    assert Store(tmp_path / "jobs.sqlite3").get("video_old")["owner"] is None  # opened again: migrated once
    keys = {"key-a": False, "root": True}
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path, api_keys=keys))) as http:
        assert http.get("/v1/videos", headers=bearer("key-a")).json()["data"] == []
        assert http.get("/v1/videos/video_old", headers=bearer("key-a")).status_code == 404
        assert [job["id"] for job in http.get("/v1/videos", headers=bearer("root")).json()["data"]] == ["video_old"]
        old = http.get("/v1/videos/video_old", headers=bearer("root")).json()
        assert (old["status"], old["task"], old["inputs"]) == ("cancelled", "t2va", [])


def test_a_store_locked_by_another_process_is_503_and_reads_go_on(tmp_path):
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path))) as http:
        stored(http.app.state.jobs, "video_x", None)
        other = sqlite3.connect(tmp_path / "jobs.sqlite3", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock, as a backup tool or a stuck process would
        try:
            create = {"prompt": "a", "size": "96x64", "num_frames": 9}  # no defaults to ask Triton for
            for method, path, body in (("POST", "/v1/videos", create), ("DELETE", "/v1/videos/video_x", None)):
                response = http.request(method, path, json=body)
                assert (response.status_code, response.headers["retry-after"], response.json()) == (
                    503,
                    "10",
                    {
                        "error": {
                            "message": "UNAVAILABLE: the jobs database is locked by another process "
                            "(waited 2 s); retry",
                            "type": "server_error",
                            "param": None,
                            "code": "UNAVAILABLE",
                        }
                    },
                ), path
            assert [job["id"] for job in http.get("/v1/videos").json()["data"]] == ["video_x"]
            assert http.get("/v1/videos/video_x").json()["status"] == "failed"
        finally:
            other.rollback()
            other.close()
        assert http.delete("/v1/videos/video_x").json()["deleted"]


class HeldTriton:
    """Stands in for H3Client: generate() waits until `release` is set, then answers one progress
    response (queue position 1) and ends with no outputs."""

    def __init__(self, url: str):
        self.release, self.lock, self.waiting = threading.Event(), threading.Lock(), 0

    def generate(self, prompt, *, on_progress, **fields):
        with self.lock:
            self.waiting += 1
        self.release.wait()
        on_progress(0, 1, 1)
        return []

    def close(self) -> None:
        self.release.set()


def test_creates_waiting_for_triton_hold_no_worker_thread(tmp_path, monkeypatch):
    held = HeldTriton(UNREACHABLE)
    monkeypatch.setattr(app_module, "H3Client", lambda url: held)
    creates = 45  # more than the 40 worker threads FastAPI runs plain routes on
    settings = Settings(triton_url=UNREACHABLE, data_dir=tmp_path, accept_wait_s=600)
    with TestClient(create_app(settings)) as http:
        answers = []
        posts = [
            threading.Thread(
                target=lambda: answers.append(
                    http.post("/v1/videos", json={"prompt": "a", "size": "96x64", "num_frames": 9})
                )
            )
            for _ in range(creates)
        ]
        for post in posts:
            post.start()
        wait_for(lambda: held.waiting == creates, 120, "every create waiting for Triton's first answer")
        listing = []
        reader = threading.Thread(target=lambda: listing.append(http.get("/v1/videos?limit=100")))
        reader.start()
        reader.join(120)  # a bound on a hang: the list needs a worker thread the creates must not hold
        assert len(listing) == 1 and answers == []  # the list answered while every create still waited
        assert [job["status"] for job in listing[0].json()["data"]] == ["queued"] * creates
        held.release.set()
        for post in posts:
            post.join(120)
        assert sorted(answer.json()["queue_position"] for answer in answers) == [1] * creates
        wait_for(lambda: not http.app.state.jobs.store.active(), 120, "every job ended")  # before the store closes


def test_unsupported_routes_say_so_and_health_routes_answer(tmp_path):
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path))) as http:
        for method, path, status, message in (
            (
                "POST",
                "/v1/videos/video_x/remix",
                404,
                "NOT_FOUND: remix is not supported by this server: it does not edit a finished video; "
                "create a new one with the changed prompt (and the same seed)",
            ),
            (
                "POST",
                "/v1/images/generations",
                404,
                "NOT_FOUND: POST /v1/images/generations is not supported by this server; "
                "its routes: docs/videos_api.md",
            ),
            (
                "PUT",
                "/v1/videos",
                405,
                "METHOD_NOT_ALLOWED: PUT /v1/videos is not supported by this server; allowed: GET, POST",
            ),
            (
                "PATCH",
                "/v1/videos/video_x/content",
                405,
                "METHOD_NOT_ALLOWED: PATCH /v1/videos/video_x/content is not supported by this server; "
                "allowed: GET, HEAD",
            ),
        ):
            response = http.request(method, path)
            assert (response.status_code, response.json()["error"]["message"]) == (status, message), path
        assert http.put("/v1/videos").headers["allow"] == "GET, POST"
        assert (http.get("/healthz").status_code, http.get("/healthz").json()) == (200, {"status": "ok"})
        assert (http.head("/healthz").status_code, http.head("/readyz").status_code) == (200, 503)  # probes may HEAD
        for response, message, param in (  # refused before Triton is asked
            (
                http.post("/v1/videos", content=b'{"prompt": "a", "seed": 1, "seed": 2}', headers=JSON),
                "INVALID_ARG: seed was sent twice: it takes one value",
                "seed",
            ),
            (http.get("/v1/videos?limit=x"), "INVALID_ARG: limit='x' must be an integer in 1..100", "limit"),
        ):
            assert (response.status_code, response.json()["error"]["message"], response.json()["error"]["param"]) == (
                400,
                message,
                param,
            )
        for path, message in (
            ("/readyz", f"UNAVAILABLE: Triton at {UNREACHABLE} is not ready: unreachable, or h3_pipeline not loaded"),
            ("/v1/models", f"UNAVAILABLE: {UNREACHABLE} did not answer: failed to connect to all addresses"),
        ):
            response = http.get(path)
            assert (response.status_code, response.headers["retry-after"]) == (503, "10"), path
            assert response.json()["error"]["message"].startswith(message), path


# ---- the SDK against a real tritonserver ------------------------------------------------------

KEYS = {"key-a": "key-a-0123", "key-b": "key-b-4567", "admin": "root-key", "utf-8": "ключ-café-🔑"}


@pytest.fixture(scope="module")
def front_end(server, tmp_path_factory):
    keys = f"{KEYS['key-a']}\n{KEYS['key-b']}\n{KEYS['admin']} admin\n{KEYS['utf-8']}\n"
    with FrontEnd(server.grpc_url, tmp_path_factory.mktemp("videos_api_access"), keys=keys) as running:
        yield running


def sdk_as(front_end, who: str) -> openai.OpenAI:
    """The official SDK with the key of `who` (KEYS: an ASCII one; the SDK cannot send others),
    without retries."""
    return openai.OpenAI(base_url=f"{front_end.url}/v1", api_key=KEYS[who], max_retries=0)


def test_models_name_the_served_model_and_its_limits(front_end):
    sdk = sdk_as(front_end, "key-a")
    (model,) = sdk.models.list().data
    assert model.to_dict() == {
        "id": "h3",
        "object": "model",
        "created": model.created,
        "owned_by": "h3-triton",
        "config_name": "tiny",
        "tasks": ["t2va", "fl2va", "ref2va"],
        "fps": 24,
        "size": {
            "default": "96x64",
            "multiple": 32,
            "width": {"min": 32, "max": 256},
            "height": {"min": 32, "max": 256},
        },
        "num_frames": {"default": 22, "min": 1, "max": 124},
        "num_inference_steps": {"default": 4, "min": 1, "max": 400},
        "n": {"min": 1, "max": 4},
        "max_prompt_bytes": 4096,
    }
    assert sdk.models.retrieve("h3") == model
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("sora-2")
    assert missing.value.body["message"] == "NOT_FOUND: no model 'sora-2'; served: 'h3'"
    assert HTTP.get(f"{front_end.url}/readyz").json() == {"status": "ready"}


def test_content_answers_ranges_and_head_and_keys_isolate_it(front_end):
    sdk = sdk_as(front_end, "key-a")
    video = sdk.videos.create_and_poll(prompt="a ranged ball", extra_body={"num_inference_steps": 1, "seed": 2})
    whole = sdk.videos.download_content(video.id).content
    url, key_a = f"{front_end.url}/v1/videos/{video.id}/content", bearer(KEYS["key-a"])
    head = HTTP.head(url, headers=key_a)
    assert (head.status_code, head.headers["content-length"], head.headers["accept-ranges"], head.content) == (
        200,
        str(len(whole)),
        "bytes",
        b"",
    )
    assert head.headers["content-type"] == "video/mp4"
    size = len(whole)
    for asked, status, content_range, body in (
        ("bytes=0-99", 206, f"bytes 0-99/{size}", whole[:100]),
        ("bytes=100-", 206, f"bytes 100-{size - 1}/{size}", whole[100:]),
        ("bytes=-10", 206, f"bytes {size - 10}-{size - 1}/{size}", whole[-10:]),
        (f"bytes={size}-", 416, f"bytes */{size}", b""),
    ):
        response = HTTP.get(url, headers={**key_a, "Range": asked})
        assert (response.status_code, response.headers["content-range"], response.content) == (
            status,
            content_range,
            body,
        ), asked
    audio = HTTP.head(f"{url}?variant=audio", headers=key_a)
    assert (audio.status_code, audio.headers["content-type"], audio.headers["accept-ranges"]) == (
        200,
        "audio/wav",
        "bytes",
    )
    # a non-ASCII key as curl sends it (UTF-8) is accepted; in another encoding it is another key
    utf8 = HTTP.get(f"{front_end.url}/v1/videos", headers=bearer(KEYS["utf-8"]))
    assert (utf8.status_code, utf8.json()["data"]) == (200, [])  # its own jobs: none
    cp1251 = HTTP.get(f"{front_end.url}/v1/videos", headers={"Authorization": "Bearer ключ".encode("cp1251")})
    assert (cp1251.status_code, cp1251.json()) == (401, {"error": UNAUTHORIZED})
    # another key sees nothing of it; the admin key sees it
    other = sdk_as(front_end, "key-b")
    for call in (other.videos.retrieve, other.videos.download_content, other.videos.delete):
        with pytest.raises(openai.NotFoundError) as missing:
            call(video.id)
        assert missing.value.body["message"] == f"NOT_FOUND: no video with id {video.id!r}"
    assert video.id not in [v.id for v in other.videos.list(limit=100)]
    admin = sdk_as(front_end, "admin")
    assert video.id in [v.id for v in admin.videos.list(limit=100)]
    assert admin.videos.download_content(video.id).content == whole
