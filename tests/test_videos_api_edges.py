"""The Videos API's edges found by an integrator's probes (issue 44), without a Triton: text that is
not UTF-8 refused at the edge and old rows that still render, refusals that close the connection
(a real uvicorn), CORS for the JS SDK, the forms a key may come in, deep JSON, INT64 parameters,
ranges a server must ignore, list cursors of removed jobs, the spritesheet, and durability (the
purge's order, recovery waiting for Triton, the integrity check at start)."""

import io
import socket
import sqlite3
import threading

import av
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from client.api import H3Error
from videos_api import jobs as jobs_module
from videos_api.app import EXPOSED_HEADERS, Settings, create_app
from videos_api.auth import owner_of, parse_key_file
from videos_api.content import sprite_indices
from videos_api.fields import parse_create
from videos_api.jobs import Jobs
from videos_api.store import Store

from .test_fl2va_serving import png
from .videos_api_serving import API_KEY, FrontEnd

UNREACHABLE = "127.0.0.1:1"
JSON = {"Content-Type": "application/json"}
KEYS = {API_KEY: False, "café": False, "ключ": False, "🔑": False, "root": True}


def bearer(key: str) -> dict:
    return {"Authorization": b"Bearer " + key.encode("utf-8")}


@pytest.fixture
def http(tmp_path):
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path, api_keys=KEYS))) as client:
        yield client


def invalid(message: str, param: str | None) -> dict:
    return {
        "error": {
            "message": f"INVALID_ARG: {message}",
            "type": "invalid_request_error",
            "param": param,
            "code": "INVALID_ARG",
        }
    }


def ended(jobs: Jobs, job_id: str, key: str = API_KEY, prompt: str = "a", outputs=None, first: bytes | None = None):
    """Store an ended job of `key` as a finished generation leaves it (completed with `outputs`,
    else failed); `first`: a first frame it was sent, written where create keeps it."""
    request, _ = parse_create({"prompt": "a", "seed": 1, **({"input_reference": first} if first else {})}, "h3")
    jobs.store.add(job_id, 1000, {**request, "prompt": prompt}, owner_of(key.encode()))
    if first is not None:
        path = jobs.input_path(job_id, "first_frame", 0)
        path.parent.mkdir(parents=True)
        path.write_bytes(first)
    status, error = ("completed", None) if outputs is not None else ("failed", ("INTERNAL", "INTERNAL: x"))
    assert jobs.store.end(job_id, status, now=1000, expires_at=2000, outputs=outputs, error=error)


# ---- 1. text that is not UTF-8 ---------------------------------------------------------------


def test_a_lone_surrogate_is_refused_at_the_edge_and_stores_nothing(http):
    for body, message, param in (
        (
            b'{"prompt": "a red ball \\ud800 rolls"}',
            "prompt holds a lone surrogate U+D800 at character 11: text must be UTF-8",
            "prompt",
        ),
        (
            b'{"prompt": "a", "input_reference": {"image_url": "data:\\udfff"}}',
            "input_reference holds a lone surrogate U+DFFF at character 5: text must be UTF-8",
            "input_reference",
        ),
        (
            b'{"prompt": "a", "\\ud83d": 1}',
            "the field name '\\ud83d' holds a lone surrogate U+D83D at character 0: text must be UTF-8",
            None,
        ),
    ):
        response = http.post("/v1/videos", content=body, headers={**JSON, **bearer(API_KEY)})
        assert (response.status_code, response.json()) == (400, invalid(message, param))
    assert http.app.state.jobs.store.ids() == set()


def test_a_stored_row_with_a_lone_surrogate_renders_in_lists_and_gets(http):
    jobs = http.app.state.jobs
    ended(jobs, "video_ok1")
    ended(jobs, "video_bad", prompt="a red ball \ud800 rolls")  # stored before the edge refused it
    ended(jobs, "video_ok2")
    listed = http.get("/v1/videos?order=asc", headers=bearer(API_KEY))
    assert listed.status_code == 200
    assert [(job["id"], job["prompt"]) for job in listed.json()["data"]] == [
        ("video_ok1", "a"),
        ("video_bad", "a red ball \ufffd rolls"),
        ("video_ok2", "a"),
    ]
    one = http.get("/v1/videos/video_bad", headers=bearer(API_KEY))
    assert (one.status_code, one.json()["prompt"]) == (200, "a red ball \ufffd rolls")
    # a row that cannot be rendered at all (its request lost its fields) is listed with an error
    jobs.store.add("video_broken", 1000, {}, owner_of(API_KEY.encode()))
    listed = http.get("/v1/videos?order=asc", headers=bearer(API_KEY)).json()["data"]
    assert [job["id"] for job in listed] == ["video_ok1", "video_bad", "video_ok2", "video_broken"]
    assert listed[-1] == {
        "id": "video_broken",
        "object": "video",
        "status": "queued",
        "error": {"code": "INTERNAL", "message": "INTERNAL: this video's record cannot be shown: KeyError"},
    }
    assert http.delete("/v1/videos/video_bad", headers=bearer(API_KEY)).json()["deleted"] is True


# ---- 2. a refusal closes the connection (a real uvicorn) ----------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The front end in its own process (uvicorn) without a Triton."""
    with FrontEnd(UNREACHABLE, tmp_path_factory.mktemp("served")) as front_end:
        yield front_end


def exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send a request head and the start of its body; everything the server sends until it
    closes the connection (a 30 s bound on a server that keeps it open: socket.timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head + body)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
        return received


def test_a_413_or_411_closes_the_connection_without_reading_the_body(served):
    auth = f"Authorization: Bearer {API_KEY}\r\n".encode()
    too_large = b"POST /v1/videos HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
    too_large += f"Content-Length: {2**30}\r\n\r\n".encode()
    chunked = b"POST /v1/videos HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
    chunked += b"Transfer-Encoding: chunked\r\n\r\n"
    for head, body, status in (
        (too_large, b'{"prompt": "' + b"a" * 60000, b"413"),
        (chunked, b"5\r\nhello\r\n", b"411"),
    ):
        answer = exchange(served.port, head, body)
        lines = answer.split(b"\r\n\r\n")[0].lower().split(b"\r\n")
        assert lines[0].startswith(b"http/1.1 " + status + b" ") and b"connection: close" in lines, answer


# ---- 3. CORS for a page on another origin (the JS SDK) ------------------------------------------


def test_cors_lets_the_js_sdk_preflight_and_read_the_polling_and_range_headers(tmp_path):
    origin = "http://127.0.0.1:9"
    settings = Settings(triton_url=UNREACHABLE, data_dir=tmp_path, api_keys=KEYS, cors_origins=(origin,))
    with TestClient(create_app(settings)) as http:
        ended(http.app.state.jobs, "video_a", first=png(64, 96, 5))
        asked = "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-retry-count,range"
        for method in ("POST", "GET", "DELETE"):
            preflight = http.options(
                "/v1/videos/video_a/content",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": asked,
                },
            )
            assert preflight.status_code == 200, preflight.text
            assert preflight.headers["access-control-allow-origin"] == origin
            assert preflight.headers["access-control-allow-headers"] == asked
        part = http.get(
            "/v1/videos/video_a/content?variant=first_frame",
            headers={"Origin": origin, "Range": "bytes=-10", **bearer(API_KEY)},
        )
        assert part.status_code == 206
        exposed = part.headers["access-control-expose-headers"].lower().split(", ")
        assert exposed == [name.lower() for name in EXPOSED_HEADERS]
        for name in ("openai-poll-after-ms", "retry-after", "content-range", "x-video-id"):
            assert name in exposed
        refused = http.get("/v1/videos", headers={"Origin": origin})  # a refusal is readable too
        assert (refused.status_code, refused.headers["access-control-allow-origin"]) == (401, origin)


# ---- 4. keys -----------------------------------------------------------------------------------


def test_keys_come_as_utf8_latin1_or_percent_encoded_and_bearer_takes_spaces(http):
    jobs = http.app.state.jobs
    for key in ("café", "ключ", "🔑"):
        ended(jobs, f"video_{owner_of(key.encode())[:8]}", key=key)

    def listed(authorization: bytes) -> tuple:
        response = http.get("/v1/videos", headers={"Authorization": authorization})
        return response.status_code, [job["id"] for job in response.json().get("data", [])]

    cafe = [f"video_{owner_of('café'.encode())[:8]}"]
    assert listed(b"Bearer caf\xc3\xa9") == (200, cafe)  # UTF-8
    assert listed(b"Bearer caf\xe9") == (200, cafe)  # Latin-1: a browser's fetch
    assert listed(b"Bearer  caf\xe9") == (200, cafe)  # two spaces
    assert listed(b"Bearer UTF-8''caf%C3%A9") == (200, cafe)
    key = [f"video_{owner_of('ключ'.encode())[:8]}"]
    assert listed(b"Bearer UTF-8''%D0%BA%D0%BB%D1%8E%D1%87") == (200, key)  # what the page sends
    emoji = [f"video_{owner_of('🔑'.encode())[:8]}"]
    assert listed(b"Bearer UTF-8''%F0%9F%94%91") == (200, emoji)
    for refused in (b"Bearer UTF-8''%D0%BA", b"Bearer UTF-8''caf%E9", b"Bearer caf", b"Basic caf\xe9"):
        assert listed(refused)[0] == 401, refused
    with pytest.raises(ValueError) as both:
        parse_key_file("é\nÃ©\n".encode())
    assert str(both.value) == "two keys are the same bytes when one is sent as Latin-1 (e.g. 'é' and 'Ã©'): change one"


# ---- 5. bodies, parameters, ranges, cursors, the spritesheet ------------------------------------


def test_deep_json_non_utf8_forms_and_int64_parameters_are_400_naming_the_field(http):
    auth = bearer(API_KEY)
    deep = http.post("/v1/videos", content=b"[" * 30000 + b"]" * 30000, headers={**JSON, **auth})
    assert (deep.status_code, deep.json()) == (400, invalid("the JSON body nests deeper than 8 levels", None))
    nested = b'{"prompt": "a", "reference_images": [[[[[[[[["x"]]]]]]]]]}'
    deep = http.post("/v1/videos", content=nested, headers={**JSON, **auth})
    assert (deep.status_code, deep.json()) == (
        400,
        invalid("the JSON body nests deeper than 8 levels", "reference_images"),
    )
    big = http.post("/v1/videos", json={"prompt": "a", "preview_every": 2**63}, headers=auth)
    message = f"preview_every={2**63} does not fit INT64 ({-(2**63)}..{2**63 - 1})"
    assert (big.status_code, big.json()) == (400, invalid(message, "preview_every"))
    not_utf8 = invalid("prompt is not UTF-8 text: byte 0xE9 at byte 3", "prompt")
    form = {"Content-Type": "application/x-www-form-urlencoded", **auth}
    for body in (b"prompt=caf\xe9&seed=1", b"prompt=caf%E9&seed=1"):
        response = http.post("/v1/videos", content=body, headers=form)
        assert (response.status_code, response.json()) == (400, not_utf8), body
    multipart = (
        b'--B\r\nContent-Disposition: form-data; name="seed"\r\n\r\n1\r\n'
        b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\ncaf\xe9\r\n--B--\r\n'
    )
    response = http.post(
        "/v1/videos", content=multipart, headers={"Content-Type": "multipart/form-data; boundary=B", **auth}
    )
    assert (response.status_code, response.json()) == (400, not_utf8)
    named = http.post("/v1/videos", content=b"pr%FFompt=a", headers=form)
    assert (named.status_code, named.json()) == (
        400,
        invalid("a field name is not UTF-8 text: byte 0xFF at byte 2", None),
    )
    # UTF-8 text passes the edge (then Triton, unreachable here, is 503)
    for body in (b"prompt=caf%C3%A9&seed=1", "prompt=café&seed=1".encode()):
        assert http.post("/v1/videos", content=body, headers=form).status_code == 503
    assert http.app.state.jobs.store.ids() == set()


def test_ranges_of_another_unit_or_malformed_answer_the_whole_file(http):
    first = png(64, 96, 5)
    ended(http.app.state.jobs, "video_a", first=first)
    sent = "/v1/videos/video_a/content?variant=first_frame"
    for header in ("items=0-5", "bytes=x-", "bytes=5-2", "bytes", "bytes=,"):
        whole = http.get(sent, headers={**bearer(API_KEY), "Range": header})
        assert (whole.status_code, whole.headers["content-type"], whole.content) == (200, "image/png", first), header
    past = http.get(sent, headers={**bearer(API_KEY), "Range": f"bytes={len(first)}-"})
    assert (past.status_code, past.headers["content-range"]) == (416, f"bytes */{len(first)}")
    suffix = http.get(sent, headers={**bearer(API_KEY), "Range": "bytes=-10"})
    assert (suffix.status_code, suffix.content) == (206, first[-10:])


def test_a_cursor_of_a_deleted_or_expired_video_keeps_its_place(http):
    jobs = http.app.state.jobs
    for name in "abcdef":
        ended(jobs, f"video_{name}")

    def page(query: str) -> list[str]:
        response = http.get(f"/v1/videos?{query}", headers=bearer(API_KEY))
        assert response.status_code == 200, response.text
        return [job["id"] for job in response.json()["data"]]

    assert page("order=asc&limit=2") == ["video_a", "video_b"]
    assert http.delete("/v1/videos/video_b", headers=bearer(API_KEY)).json()["deleted"] is True
    assert page("order=asc&limit=2&after=video_b") == ["video_c", "video_d"]
    assert page("order=desc&limit=2&after=video_b") == ["video_a"]
    assert sorted(jobs.purge(now=2000)) == ["video_a", "video_c", "video_d", "video_e", "video_f"]  # all expired
    ended(jobs, "video_g")
    assert page("order=asc&after=video_d") == ["video_g"]
    # a cursor of another key's video, or of none, stays a 400
    other = http.get("/v1/videos?after=video_d", headers=bearer("café"))
    assert other.json() == invalid("after='video_d' is not the id of a video", "after")
    # the places are kept as long as an ended job
    jobs.purge(now=2000 + jobs.retention_s + 1)
    gone = http.get("/v1/videos?after=video_d", headers=bearer(API_KEY))
    assert gone.json() == invalid("after='video_d' is not the id of a video", "after")


def mp4_of_grays(levels: list[int], width: int = 96, height: int = 64) -> bytes:
    """An H.264 MP4 whose frame k is a flat gray of levels[k] (PyAV)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "0"}
        for level in levels:
            image = np.full((height, width, 3), level, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def test_the_spritesheet_is_a_jpeg_grid_of_frames_spread_over_the_clip(http):
    assert sprite_indices(22) == [0, 1, 3, 4, 6, 7, 8, 10, 11, 13, 14, 15, 17, 18, 20, 21]
    assert (sprite_indices(3), sprite_indices(1)) == ([0, 1, 2], [0])
    jobs = http.app.state.jobs
    levels = [20 + 10 * k for k in range(22)]
    ended(jobs, "video_a", outputs=[{"width": 96, "height": 64, "num_frames": 22}])
    jobs.folder("video_a").mkdir(parents=True, exist_ok=True)
    (jobs.folder("video_a") / "0.mp4").write_bytes(mp4_of_grays(levels))
    url = "/v1/videos/video_a/content?variant=spritesheet"
    sheet = http.get(url, headers=bearer(API_KEY))
    assert (sheet.status_code, sheet.headers["content-type"]) == (200, "image/jpeg")
    image = np.asarray(Image.open(io.BytesIO(sheet.content)).convert("L"), dtype=int)
    assert image.shape == (4 * 64, 4 * 96)
    centres = [image[32 + 64 * (k // 4), 48 + 96 * (k % 4)] for k in range(16)]
    expected = [levels[i] for i in sprite_indices(22)]
    assert all(abs(got - want) <= 3 for got, want in zip(centres, expected, strict=True)), (centres, expected)
    head = http.head(url, headers=bearer(API_KEY))
    assert (head.status_code, head.headers["content-length"]) == (200, str(len(sheet.content)))
    assert http.get(url, headers=bearer(API_KEY)).content == sheet.content  # kept, not made again


# ---- 6. durability -----------------------------------------------------------------------------


def test_the_purge_never_removes_a_job_created_while_it_runs(tmp_path):
    with TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path))) as http:
        jobs = http.app.state.jobs
        ids = jobs.store.ids
        request, _ = parse_create({"prompt": "a", "seed": 1}, "h3")

        def ids_then_a_new_job() -> set[str]:
            known = ids()
            jobs.store.add("video_new", 1000, request, None)  # as create does: its row, then its folder
            (jobs.folder("video_new") / "inputs").mkdir(parents=True)
            (jobs.folder("video_new") / "inputs" / "first_frame_0").write_bytes(b"x")
            return known

        (jobs.folder("video_stray") / "inputs").mkdir(parents=True)
        jobs.store.ids = ids_then_a_new_job
        assert jobs.purge(now=1000) == []
        assert sorted(path.name for path in jobs.videos.iterdir()) == ["video_new"]
        assert (jobs.folder("video_new") / "inputs" / "first_frame_0").read_bytes() == b"x"


class SlowTriton:
    """A client whose Triton is ready after `not_ready` asks (never for None); records calls."""

    def __init__(self, not_ready: int | None):
        self.not_ready, self.calls = not_ready, []
        self.generated = threading.Event()

    def ready(self) -> bool:
        self.calls.append("ready")
        return self.not_ready is not None and self.calls.count("ready") > self.not_ready

    def cancel(self, request_id: str) -> dict:
        self.calls.append(f"cancel {request_id}")
        if not self.ready():
            raise H3Error("UNAVAILABLE", "failed to connect to all addresses")
        return {"state": "unknown"}

    def generate(self, prompt, **kwargs) -> list:
        self.calls.append(f"generate {kwargs['request_id']}")
        self.generated.set()
        return []


def active_job(tmp_path, client) -> Jobs:
    jobs = Jobs(Store(tmp_path / "jobs.sqlite3"), tmp_path, client, retention_s=60, max_attempts=3, accept_wait_s=1)
    request, _ = parse_create({"prompt": "a", "seed": 1}, "h3")
    jobs.store.add("video_a", 1000, request, None)
    jobs.store.submitted("video_a", "video_a-1")
    return jobs


def test_recovery_waits_for_triton_to_be_ready_then_resubmits(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "RECOVER_POLL_S", 0.01)
    client = SlowTriton(not_ready=3)
    jobs = active_job(tmp_path, client)
    jobs.recover(wait_s=600)
    assert client.generated.wait(60)
    assert client.calls[:6] == ["ready"] * 4 + ["cancel video_a-1", "ready"]
    assert client.calls[6] == "generate video_a-2"


def test_recovery_fails_the_job_once_triton_stays_unreachable_past_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "RECOVER_POLL_S", 0.01)
    client = SlowTriton(not_ready=None)
    jobs = active_job(tmp_path, client)
    jobs.recover(wait_s=0.05)
    job = jobs.store.get("video_a")
    assert (job["status"], job["error_code"]) == ("failed", "UNAVAILABLE")
    assert job["error_message"] == (
        "UNAVAILABLE: the front end restarted and could not cancel this job's Triton request: "
        "failed to connect to all addresses"
    )
    assert client.calls.count("ready") >= 2 and "cancel video_a-1" in client.calls


def test_a_damaged_jobs_database_stops_the_start(tmp_path):
    path = tmp_path / "jobs.sqlite3"
    store = Store(path)
    request, _ = parse_create({"prompt": "a", "seed": 1}, "h3")
    for k in range(200):
        store.add(f"video_{k:04d}", 1000, request, None)
    store.close()
    with sqlite3.connect(path, isolation_level=None) as db:  # the id index made to point at another's pages
        db.execute("PRAGMA writable_schema=ON")
        db.execute("UPDATE sqlite_schema SET rootpage = 6 WHERE name = 'sqlite_autoindex_jobs_1'")
    db.close()
    with pytest.raises(RuntimeError) as refused:
        Store(path)
    message = str(refused.value)
    assert message.startswith(f"the jobs database {path} failed its integrity check: *** in database main ***; ")
    assert "Page 3 is never used" in message
    assert message.endswith(". Stop, move it aside (with its -wal and -shm files) and restore a copy, or start empty")
    with pytest.raises(RuntimeError), TestClient(create_app(Settings(triton_url=UNREACHABLE, data_dir=tmp_path))):
        pass


# ---- 7. OpenAI's last published routes that this server does not serve --------------------------


def test_openais_edit_extend_and_character_routes_answer_404_saying_so(http):
    for method, path in (
        ("POST", "/v1/videos/edits"),
        ("POST", "/v1/videos/extensions"),
        ("POST", "/v1/videos/characters"),
        ("GET", "/v1/videos/characters/char_1"),
    ):
        response = http.request(method, path, headers=bearer(API_KEY), json={"prompt": "a"})
        assert (response.status_code, response.json()["error"]["message"]) == (
            404,
            f"NOT_FOUND: {method} {path} is not supported by this server: it edits and extends no video and "
            "keeps no characters; create a new video (docs/videos_api.md, Differences from OpenAI)",
        )


def bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels (its data is a few bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")
    )


def test_a_keyframe_header_over_pillows_bomb_limit_is_left_to_the_servers_refusal():
    # before: Pillow's DecompressionBombError (over 2 x MAX_IMAGE_PIXELS, 178,956,970) escaped the
    # header read of the create's defaults, and the create answered 500 INTERNAL
    from videos_api.models import _upright_size

    assert _upright_size(bomb_png(20_000, 10_000)) is None
    assert _upright_size(bomb_png(2**31 - 1, 1)) is None
    assert _upright_size(png(64, 96, seed=0)) == (64, 96)


@pytest.mark.parametrize("seconds", ["\u0664", "\uff14", "0_5", "4_0", "1e", ""])
def test_seconds_take_ascii_decimal_numbers_only(seconds):
    # before: float() took Arabic-Indic and full-width digits and underscores ("0_5" -> 5 s)
    from videos_api.fields import ApiError

    with pytest.raises(ApiError) as info:
        parse_create({"prompt": "a", "seconds": seconds}, "h3")
    assert (info.value.status, info.value.param) == (400, "seconds")
    assert parse_create({"prompt": "a", "seconds": " 2.5 "}, "h3")[0]["num_frames"] == 60
