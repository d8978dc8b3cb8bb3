"""The Videos API front end (videos_api) with the official openai SDK as the client against a real
tritonserver (create, poll, download, list, delete, cancel mid-run, bad input, overload) and a
front end killed mid-job."""

import io
import json
import socket
import sqlite3

import numpy as np
import openai
import pytest
from openai.types import Video
from PIL import Image

from h3_core.media import encode_wav
from videos_api.jobs import first_frame

from .serving import idle_metrics
from .test_fl2va_serving import png as noise_png
from .test_references import float_wav, turned_mp4
from .videos_api_serving import API_KEY, AUTH, HTTP, NUM_FRAMES_RULE, FrontEnd, api_error, data_url, wait_for

# the SDK marks its videos methods deprecated (OpenAI retired its own video service); only that
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API is scheduled to permanently shut down:DeprecationWarning")

# ---- the SDK against a real tritonserver ------------------------------------------------------


@pytest.fixture(scope="module")
def front_end(server, tmp_path_factory):
    with FrontEnd(server.grpc_url, tmp_path_factory.mktemp("videos_api")) as running:
        yield running


def sdk_for(front_end) -> openai.OpenAI:
    """The official SDK pointed at the front end, without retries (each refusal is seen once)."""
    return openai.OpenAI(base_url=f"{front_end.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def sdk(front_end):
    return sdk_for(front_end)


def png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_sdk_creates_polls_and_downloads_what_the_client_api_generates(sdk, client, front_end):
    video = sdk.videos.create_and_poll(
        prompt="a red ball rolls to the left",
        size="96x64",
        seconds="0.5",
        extra_body={"seed": 11, "num_inference_steps": 3},
    )
    assert video.to_dict() == {
        "id": video.id,
        "object": "video",
        "model": "h3",
        "status": "completed",
        "progress": 100,
        "created_at": video.created_at,
        "completed_at": video.completed_at,
        "expires_at": video.completed_at + 24 * 3600,
        "prompt": "a red ball rolls to the left",
        "seconds": "0.5",
        "size": "96x64",
        "error": None,
        "remixed_from_video_id": None,
        "seed": 11,
        "n": 1,
        "num_frames": 22,  # 0.5 s = 12 frames asked: the clip is aligned up to 17n+5
        "num_frames_requested": 12,
        "num_inference_steps": 3,
        "step": 3,
        "total_steps": 3,
        "queue_position": 0,
        "preview_step": 3,
        "task": "t2va",
        "format": "openai",
        "normalized_request": {
            "prompt": "a red ball rolls to the left",
            "task": "t2va",
            "width": 96,
            "height": 64,
            "num_frames": 12,
            "num_inference_steps": 3,
            "seed": 11,
            "num_outputs": None,
            "flow_shift": None,
            "audio_flow_shift": None,
            "lora": [],
            "keyframes": [],
            "references": [],
        },
        "inputs": [],
    }
    (reference,) = client.generate(
        "a red ball rolls to the left",
        height=64,
        width=96,
        num_frames=12,
        num_inference_steps=3,
        seed=11,
        preview_every=1,
        return_audio=True,
    )
    assert sdk.videos.download_content(video.id).content == reference.video_mp4
    assert sdk.videos.download_content(video.id, variant="audio").content == encode_wav(reference.audio)
    thumbnail = png(sdk.videos.download_content(video.id, variant="thumbnail").content)
    assert thumbnail.shape == (64, 96, 3) and np.array_equal(thumbnail, first_frame(reference.video_mp4))
    preview = png(sdk.videos.download_content(video.id, variant="preview").content)
    assert np.array_equal(preview, reference.previews[-1][1])  # the last step's, at latent resolution
    # the synchronous route answers the same MP4 and keeps the job like any other
    sync = HTTP.post(
        f"{front_end.url}/v1/videos/sync",
        json={
            "prompt": "a red ball rolls to the left",
            "size": "96x64",
            "seconds": 0.5,
            "seed": 11,
            "num_inference_steps": 3,
        },
        headers=AUTH,
        timeout=120,
    )
    assert (sync.status_code, sync.headers["content-type"], sync.content) == (200, "video/mp4", reference.video_mp4)
    assert sdk.videos.retrieve(sync.headers["x-video-id"]).status == "completed"


def test_json_create_of_several_outputs_downloads_each(sdk, client, front_end):
    created = HTTP.post(
        f"{front_end.url}/v1/videos",
        json={"prompt": "a blue square", "num_frames": 9, "num_inference_steps": 2, "seed": 4, "n": 2},
        headers=AUTH,
    )
    assert created.status_code == 200 and created.json()["status"] in ("queued", "in_progress")
    video = sdk.videos.poll(created.json()["id"])
    assert (video.status, video.n, video.seed, video.size, video.seconds) == (
        "completed",
        2,
        4,
        "96x64",
        "0.917",
    )  # 22 frames
    references = client.generate("a blue square", num_frames=9, num_inference_steps=2, seed=4, num_outputs=2)
    for index, reference in enumerate(references):
        content = sdk.videos.download_content(video.id, extra_query={"index": index}).content
        assert content == reference.video_mp4
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.videos.download_content(video.id, extra_query={"index": 2})
    assert refused.value.body["message"] == "INVALID_ARG: index='2' is out of range: allowed 0..1"


def test_size_and_seconds_are_filled_at_create_from_the_defaults_the_server_uses(sdk):
    # the model's defaults (tiny: 96x64, 22 frames), then a portrait keyframe's aspect; both as completed
    short = {"num_inference_steps": 2, "preview_every": 0, "seed": 6}
    made = [(sdk.videos.create(prompt="a ball", extra_body={**short}), "96x64", "0.917")]
    portrait = noise_png(192, 108, 8)  # 108 wide, 192 high: about the default area at its aspect
    made.append(
        (
            sdk.videos.create(prompt="a ball", input_reference=("p.png", portrait, "image/png"), extra_body=short),
            "64x96",
            "0.917",
        )
    )
    made.append((sdk.videos.create(prompt="a ball", seconds="0.5", extra_body=short), "96x64", "0.5"))
    for created, size, seconds in made:
        assert (created.size, created.seconds) == (size, seconds), created.id
        done = sdk.videos.poll(created.id)
        assert (done.status, done.size, done.seconds) == ("completed", size, seconds), created.id


def result_info(data_dir, video_id: str) -> list[dict]:
    """The server's INFO of each output of a completed job, read from the front end's SQLite file."""
    with sqlite3.connect(data_dir / "jobs.sqlite3") as db:
        return json.loads(db.execute("SELECT outputs FROM jobs WHERE id = ?", (video_id,)).fetchone()[0])


def test_sdk_input_reference_and_a_last_frame_in_extra_body_make_the_client_apis_fl2va_clip(sdk, client, front_end):
    # a first frame of 200 x 300 noise (a PNG over the 64 KiB JSON limit), cropped to the 96 x 64 canvas
    first, last = noise_png(200, 300, 1), noise_png(64, 96, 2)
    assert len(first) > 64 * 1024
    shape = {"seed": 3, "num_frames": 9, "num_inference_steps": 2}
    video = sdk.videos.create_and_poll(
        prompt="a door opens",
        size="96x64",
        input_reference=("first.png", first, "image/png"),
        extra_body={"last_frame": data_url(last), **shape},
    )
    assert (video.status, video.task, video.model_extra["inputs"]) == (
        "completed",
        "fl2va",
        [
            {
                "variant": variant,
                "index": 0,
                "media_type": "image/png",
                "url": f"/v1/videos/{video.id}/content?variant={variant}&index=0",
            }
            for variant in ("first_frame", "last_frame")
        ],
    )
    (info,) = result_info(front_end.data_dir, video.id)
    assert (info["task"], info["conditions"], info["geometry"]["fit"]) == (
        "fl2va",
        [{"kind": "keyframe", "frame": 0}, {"kind": "keyframe", "frame": -1}],
        "crop",
    )
    (reference,) = client.generate(
        "a door opens",
        height=64,
        width=96,
        first_frame=first,
        last_frame=last,
        preview_every=1,
        return_audio=True,
        **shape,
    )
    assert sdk.videos.download_content(video.id).content == reference.video_mp4
    assert sdk.videos.download_content(video.id, variant="audio").content == encode_wav(reference.audio)
    for item, sent in zip(video.model_extra["inputs"], (first, last), strict=True):
        downloaded = HTTP.get(f"{front_end.url}{item['url']}", headers=AUTH)
        assert (downloaded.headers["content-type"], downloaded.content) == ("image/png", sent)


def test_multipart_reference_image_makes_the_client_apis_ref2va_clip(sdk, client, front_end):
    image = noise_png(64, 64, 4)
    shape = {"seed": 4, "num_frames": 9, "num_inference_steps": 2}
    created = HTTP.post(
        f"{front_end.url}/v1/videos",
        data={"prompt": "a ball", "size": "96x64", "fit": "stretch", **{k: str(v) for k, v in shape.items()}},
        files=[("reference_images", ("ball.png", image, "image/png"))],
        headers=AUTH,
    )
    assert created.status_code == 200, created.text
    video = sdk.videos.poll(created.json()["id"])
    assert (video.status, video.task) == ("completed", "ref2va")
    (reference,) = client.generate("a ball", height=64, width=96, reference_images=[image], fit="stretch", **shape)
    assert sdk.videos.download_content(video.id).content == reference.video_mp4
    downloaded = sdk.videos.download_content(video.id, variant="reference_image", extra_query={"index": 0})
    assert downloaded.content == image


def test_list_pages_through_the_videos(sdk):
    ids = [
        sdk.videos.create(prompt=f"list {k}", extra_body={"num_frames": 1, "num_inference_steps": 1}).id
        for k in range(3)
    ]
    assert [sdk.videos.poll(video_id).status for video_id in ids] == ["completed"] * 3
    newest = sdk.videos.list(limit=2)
    assert ([v.id for v in newest.data], newest.has_more, newest.last_id) == ([ids[2], ids[1]], True, ids[1])
    assert sdk.videos.list(limit=2, after=ids[1]).data[0].id == ids[0]
    oldest_first = [v.id for v in sdk.videos.list(order="asc", limit=1)]  # the SDK pages on by after=last_id
    assert oldest_first[-3:] == ids and len(oldest_first) == len(set(oldest_first))


def test_delete_removes_a_video_and_its_files(sdk, front_end):
    video = sdk.videos.create_and_poll(prompt="delete me", extra_body={"num_frames": 1, "num_inference_steps": 1})
    folder = front_end.data_dir / "videos" / video.id
    assert sorted(path.name for path in folder.iterdir()) == ["0.mp4", "0.png", "0.wav", "preview.png"]
    assert sdk.videos.delete(video.id).to_dict() == {"id": video.id, "object": "video.deleted", "deleted": True}
    assert not folder.exists()
    for call in (sdk.videos.retrieve, sdk.videos.delete, sdk.videos.download_content):
        with pytest.raises(openai.NotFoundError) as missing:
            call(video.id)
        assert missing.value.body == api_error("NOT_FOUND", f"no video with id {video.id!r}")


LONG = {"prompt": "a long one", "extra_body": {"num_frames": 22, "num_inference_steps": 400, "seed": 1}}


def started(sdk, video_id: str) -> Video:
    """The video once two of its steps are done."""
    return wait_for(lambda: (v := sdk.videos.retrieve(video_id)).step >= 2 and v, 300, f"{video_id} at step 2")


def test_cancel_and_delete_mid_run_cancel_the_triton_request(sdk, server, front_end):
    video = sdk.videos.create(**LONG)
    running = started(sdk, video.id)
    assert (running.status, running.total_steps, running.progress) == (
        "in_progress",
        400,
        min(99, 100 * running.step // 400),
    )
    assert running.preview_step >= 1
    with pytest.raises(openai.ConflictError) as early:
        sdk.videos.download_content(video.id)
    assert (
        early.value.body["message"] == f"CONFLICT: video {video.id} is in_progress: content comes once it is completed"
    )
    cancelled = sdk.post(f"/videos/{video.id}/cancel", cast_to=Video)
    assert (cancelled.status, cancelled.error) == ("cancelled", None)  # our extension of the SDK's statuses
    assert sdk.videos.poll(video.id).status == "cancelled"  # poll() ends on it too
    ended = f"request {video.id}-1 ended CANCELLED: request {video.id}-1 cancelled by request at step "
    wait_for(lambda: ended in server.log_text(), 30, "the DiT's cancellation")
    with pytest.raises(openai.ConflictError) as again:
        sdk.post(f"/videos/{video.id}/cancel", cast_to=Video)
    assert (
        again.value.body["message"]
        == f"CONFLICT: video {video.id} is cancelled; only queued or in_progress ones cancel"
    )

    other = sdk.videos.create(**LONG)
    started(sdk, other.id)
    assert sdk.videos.delete(other.id).deleted
    ended = f"request {other.id}-1 ended CANCELLED: request {other.id}-1 cancelled by request at step "
    wait_for(lambda: ended in server.log_text(), 30, "the DiT's cancellation")
    wait_for(lambda: not (front_end.data_dir / "videos" / other.id).exists(), 30, "its files removed")
    with pytest.raises(openai.NotFoundError):
        sdk.videos.retrieve(other.id)


def test_bad_input_is_refused_and_creates_nothing(sdk, front_end):
    if not sdk.videos.list(limit=1).data:  # run alone: one video for the content routes' cases
        sdk.videos.create(prompt="a red ball rolls to the left", extra_body={"num_inference_steps": 1})
    before = [v.id for v in sdk.videos.list(limit=100)]
    url = f"{front_end.url}/v1/videos"
    cases = [  # (JSON body, status, message, param): ranges are the server's own INVALID_ARG text
        (
            {"prompt": "a", "seconds": "8"},
            f"num_frames=192 is out of range: allowed 1..124{NUM_FRAMES_RULE} (seconds='8' at 24 fps)",
            "seconds",
        ),
        ({"prompt": "a", "size": "100x64"}, "width=100 is out of range: allowed multiples of 32 in 32..256", "size"),
        ({"prompt": "a", "n": 5}, "num_outputs=5 is out of range: allowed 1..4", "n"),
        ({"prompt": "a", "seed": -1}, "seed=-1 is out of range: allowed 0..9223372036854775807", "seed"),
        (
            {"prompt": "a", "seed": 2**64},
            f"SEED={2**64} does not fit INT64 ({-(2**63)}..{2**63 - 1})",
            "seed",
        ),
        ({"prompt": "a", "preview_every": -1}, "preview_every=-1 is out of range: allowed >= 0", "preview_every"),
        ({"prompt": " "}, "prompt must contain visible characters, got ' '", "prompt"),
        (
            {"prompt": "a", "num_inference_steps": 0},
            "num_inference_steps=0 is out of range: allowed 1..400",
            "num_inference_steps",
        ),
        ({"prompt": "a", "size": "96"}, "size='96' must be WIDTHxHEIGHT in pixels, e.g. '96x64'", "size"),
    ]
    for body, message, param in cases:
        response = HTTP.post(url, json=body, headers=AUTH)
        assert (response.status_code, response.json()) == (
            400,
            {"error": api_error("INVALID_ARG", message, param)},
        ), body
    # the SDK's multipart with a file the server cannot decode: its refusal names the API field
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.videos.create(prompt="a", input_reference=("ref.png", b"GIF89a", "image/png"))
    assert refused.value.body == api_error(
        "INVALID_ARG", "input_reference: is a GIF image; the allowed formats are PNG, JPEG, WEBP", "input_reference"
    )
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.videos.create(prompt="a", extra_body={"reference_audio": [data_url(b"RIFF", "audio/wav")]})
    assert refused.value.body["param"] == "reference_audio"
    assert refused.value.body["message"].startswith("INVALID_ARG: reference_audio[0]: ")
    samples = np.zeros((2, 3 * 32000), dtype=np.float32)
    samples[0, 2 * 32000 + 5] = np.nan
    with pytest.raises(openai.BadRequestError) as refused:  # issue 41 item 5: refused where it is decoded
        sdk.videos.create(prompt="a", extra_body={"reference_audio": [data_url(float_wav(samples), "audio/wav")]})
    assert refused.value.body == api_error(
        "INVALID_ARG",
        "reference_audio[0]: holds non-finite samples (NaN or infinity) from 1.984 s; allowed finite samples",
        "reference_audio",
    )
    mirrored = data_url(turned_mp4(0, hflip=True), "video/mp4")  # issue 41 item 4
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.videos.create(prompt="a", extra_body={"reference_videos": [mirrored]})
    assert refused.value.body == api_error(
        "INVALID_ARG",
        "reference_videos[0]: its display matrix mirrors the picture; allowed rotations by multiples of 90 degrees",
        "reference_videos",
    )
    large = json.dumps({"prompt": "a" * 70000}).encode()
    bad_json = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    raw = [  # (method, path, body, Content-Type, status, message)
        ("POST", "/v1/videos", b"[1]", "application/json", 400, "INVALID_ARG: the JSON body must be an object"),
        ("POST", "/v1/videos", b"{", "application/json", 400, f"INVALID_ARG: the body is not valid JSON: {bad_json}"),
        (
            "POST",
            "/v1/videos",
            b"a",
            "text/plain",
            400,
            "INVALID_ARG: Content-Type 'text/plain' is not served: "
            "send application/json, multipart/form-data or application/x-www-form-urlencoded",
        ),
        (  # a JSON create may be as large as a multipart one (its data: URLs); other JSON routes 64 KiB
            "POST",
            "/v1/videos/video_x/cancel",
            large,
            "application/json",
            413,
            f"TOO_LARGE: the body is {len(large)} bytes: allowed 65536",
        ),
        (
            "POST",
            "/v1/videos/sync",
            b'{"prompt": "a", "n": 2}',
            "application/json",
            400,
            "INVALID_ARG: n=2: /v1/videos/sync answers one MP4; use /v1/videos",
        ),
        ("GET", "/v1/videos/video_nope", None, None, 404, "NOT_FOUND: no video with id 'video_nope'"),
        ("GET", "/v1/videos?limit=0", None, None, 400, "INVALID_ARG: limit='0' is out of range: allowed 1..100"),
        ("GET", "/v1/videos?order=up", None, None, 400, "INVALID_ARG: order='up' must be 'asc' or 'desc'"),
        (
            "GET",
            "/v1/videos?after=video_nope",
            None,
            None,
            400,
            "INVALID_ARG: after='video_nope' is not the id of a video",
        ),
        (
            "GET",
            f"/v1/videos/{before[0]}/content?variant=first_frame",
            None,
            None,
            404,
            f"NOT_FOUND: video {before[0]} was sent no first_frame",
        ),
        (
            "GET",
            f"/v1/videos/{before[0]}/content?variant=webm",
            None,
            None,
            400,
            "INVALID_ARG: variant='webm' is not served; allowed: ['audio', 'first_frame', 'last_frame', "
            "'preview', 'reference_audio', 'reference_image', 'reference_video', 'spritesheet', 'thumbnail', "
            "'video']",
        ),
    ]
    for method, path, body, kind, status, message in raw:
        headers = {**AUTH, **({"Content-Type": kind} if kind else {})}
        response = HTTP.request(method, f"{front_end.url}{path}", content=body, headers=headers)
        assert (response.status_code, response.json()["error"]["message"]) == (status, message), path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = HTTP.get(url, headers=headers)
        assert (response.status_code, response.headers["www-authenticate"], response.json()["error"]) == (
            401,
            "Bearer",
            api_error("UNAUTHORIZED", "a valid API key is required: send Authorization: Bearer <key>"),
        )
    assert [v.id for v in sdk.videos.list(limit=100)] == before


def test_an_oversize_upload_is_413_before_its_body_is_read(front_end):
    """Headers announcing one byte over --max-upload-bytes (16 MiB by default) and no body: the
    answer comes at once, so nothing of the body was waited for."""
    limit = 16 * 1024 * 1024
    head = (
        f"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {limit + 1}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", front_end.port), timeout=30) as connection:
        connection.sendall(head.encode())
        answer = b""
        while b"}}" not in answer:
            answer += connection.recv(65536)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.split(b"\r\n")[0] == b"HTTP/1.1 413 Request Entity Too Large"
    assert json.loads(body)["error"]["message"] == f"TOO_LARGE: the body is {limit + 1} bytes: allowed {limit}"


def test_a_full_dit_is_429_with_retry_after(sdk, server):
    """The shipped capacity: max_num_seqs + max_waiting = 4 + 8 requests held by the DiT."""
    assert idle_metrics(server, timeout_s=30)["h3_active_requests"] == 0  # nothing left by an earlier test
    held = []
    try:
        for _ in range(12):
            held.append(sdk.videos.create(**LONG).id)
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.videos.create(**LONG)
    finally:
        for video_id in held:
            sdk.videos.delete(video_id)
    assert refused.value.response.headers["retry-after"] == "5"
    assert refused.value.body == {
        "message": "UNAVAILABLE: the DiT holds 12 requests, its capacity max_num_seqs + max_waiting = 4 + 8; "
        "retry later",
        "type": "rate_limit_error",
        "param": None,
        "code": "UNAVAILABLE",
    }
    metrics = idle_metrics(server, timeout_s=30)
    assert (metrics["h3_active_requests"], metrics["h3_waiting_requests"]) == (0, 0)


# ---- the restart rule -------------------------------------------------------------------------


def triton_state(data_dir, video_id: str) -> tuple:
    """(status, attempts, triton_request_id) of a job, read from the front end's SQLite file."""
    with sqlite3.connect(data_dir / "jobs.sqlite3") as db:
        return db.execute("SELECT status, attempts, triton_request_id FROM jobs WHERE id = ?", (video_id,)).fetchone()


def test_a_killed_front_end_resubmits_its_job_or_fails_it_by_the_restart_rule(server, client, tmp_path):
    data = tmp_path / "data"
    keyframe = noise_png(64, 96, 21)  # the job's file is sent again with the resubmission
    request = {
        "prompt": "restart me",
        "input_reference": ("first.png", keyframe, "image/png"),
        "extra_body": {"num_frames": 9, "num_inference_steps": 150, "seed": 21},
    }
    first = FrontEnd(server.grpc_url, data, "--max-attempts", "2").start()
    try:
        video = sdk_for(first).videos.create(**request)
        started(sdk_for(first), video.id)
    finally:
        first.kill()
    assert triton_state(data, video.id) == ("in_progress", 1, f"{video.id}-1")
    with FrontEnd(server.grpc_url, data, "--max-attempts", "2") as second:
        sdk = sdk_for(second)
        assert sdk.videos.poll(video.id).status == "completed"
        assert triton_state(data, video.id) == ("completed", 2, f"{video.id}-2")
        assert f"{video.id}: Triton request {video.id}-1 cancelled (" in second.log()
        (reference,) = client.generate(
            "restart me", first_frame=keyframe, num_frames=9, num_inference_steps=150, seed=21
        )
        assert sdk.videos.download_content(video.id).content == reference.video_mp4  # same seed, same output
        other = sdk.videos.create(**request)
        started(sdk, other.id)
        second.kill()
    with FrontEnd(server.grpc_url, data, "--max-attempts", "1") as third:
        sdk = sdk_for(third)
        failed = sdk.videos.retrieve(other.id)
        assert (failed.status, failed.error.to_dict()) == (
            "failed",
            {
                "code": "INTERNAL",
                "message": "INTERNAL: the front end stopped while this job ran (submissions: 1; --max-attempts 1)",
            },
        )
        assert triton_state(data, other.id) == ("failed", 1, f"{other.id}-1")
        assert sdk.videos.download_content(other.id, variant="first_frame").content == keyframe  # kept until it expires
        assert sdk.videos.download_content(video.id).content == reference.video_mp4  # nothing lost
