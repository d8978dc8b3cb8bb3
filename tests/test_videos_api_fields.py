"""The Videos API front end (videos_api) without a server: OpenAI's create fields and files mapped
onto h3_pipeline's request, bad fields refused with OpenAI's error shape, server errors mapped to
HTTP codes, retention, an unreachable Triton, CORS and chunked bodies, the command line."""

import pytest
from fastapi.testclient import TestClient

from h3_core.serving.shared.registry import DitLoad
from server.environment import pick_free_ports
from videos_api.app import Settings, create_app
from videos_api.fields import CREATE_FIELDS, error_from_server, form_fields, parse_create, task_of
from videos_api.jobs import Jobs
from videos_api.store import Store

from .test_fl2va_serving import png as noise_png
from .test_ref2va_serving import tone
from .videos_api_serving import NUM_FRAMES_RULE, api_error, data_url


def test_create_fields_map_onto_the_pipeline_request():
    # as the SDK sends them (multipart: every value a string) and as JSON
    sent = {"prompt": "a ball", "size": "96x64", "seconds": "0.5", "seed": "7", "n": "2", "model": "h3"}
    assert parse_create(sent, "h3") == (
        {
            "prompt": "a ball",
            "width": 96,
            "height": 64,
            "size": "96x64",
            "seconds": "0.5",
            "num_frames": 12,
            "num_inference_steps": None,
            "seed": 7,
            "num_outputs": 2,
            "preview_every": 1,
            "task": None,
            "fit": None,
            "flow_shift": None,
            "audio_flow_shift": None,
            "lora": [],
            "references": None,
            "inputs": {},
        },
        {},
    )
    sent = {"prompt": "a ball", "num_frames": 9, "num_inference_steps": 3, "preview_every": 0, "task": "t2va"}
    assert parse_create(sent, "h3")[0] == {
        "prompt": "a ball",
        "width": None,
        "height": None,
        "size": None,
        "seconds": None,
        "num_frames": 9,
        "num_inference_steps": 3,
        "seed": None,
        "num_outputs": None,
        "preview_every": 0,
        "task": "t2va",
        "fit": None,
        "flow_shift": None,
        "audio_flow_shift": None,
        "lora": [],
        "references": None,
        "inputs": {},
    }
    lora = form_fields([("prompt", "p"), ("lora", "style:0.5"), ("lora", '[{"name": "turbo"}]')])
    assert parse_create(lora, "h3")[0]["lora"] == [{"name": "style", "scale": 0.5}, {"name": "turbo", "scale": 1.0}]


def test_file_fields_come_as_uploads_or_data_urls_and_imply_the_task():
    first, last, audio = noise_png(64, 96, 1), b"\xff\xd8\xff\xe0 a JPEG's start", tone(2.0)
    # multipart as the SDK sends extra_body lists ("name[]") and OpenAI's input_reference object
    form = form_fields(
        [
            ("prompt", "a door opens"),
            ("input_reference[image_url]", data_url(first)),
            ("reference_images[]", first),
            ("reference_images", data_url(last, "image/jpeg")),
        ]
    )
    assert form == {
        "prompt": "a door opens",
        "input_reference": {"image_url": data_url(first)},
        "reference_images": [first, data_url(last, "image/jpeg")],
    }
    with pytest.raises(Exception) as twice:
        form_fields([("prompt", "a"), ("prompt", "b")])
    assert (twice.value.status, twice.value.message) == (400, "INVALID_ARG: prompt was sent twice: it takes one value")
    request, media = parse_create(
        {"prompt": "a", "input_reference": first, "last_frame": data_url(last), "fit": "pad"}, "h3"
    )
    assert (request["inputs"], request["fit"], task_of(request)) == (
        {"first_frame": ["image/png"], "last_frame": ["image/jpeg"]},
        "pad",
        "fl2va",
    )
    assert media == {"first_frame": [first], "last_frame": [last]}
    request, media = parse_create(
        {"prompt": "a", "reference_images": [data_url(first)], "reference_audio": audio}, "h3"
    )
    assert (request["inputs"], media, task_of(request)) == (
        {"reference_image": ["image/png"], "reference_audio": ["audio/wav"]},
        {"reference_image": [first], "reference_audio": [audio]},
        "ref2va",
    )


@pytest.mark.parametrize(
    "sent, message, param",
    [
        ({}, "prompt is required and must be a string", "prompt"),
        ({"prompt": 3}, "prompt is required and must be a string", "prompt"),
        ({"prompt": "a", "size": "96"}, "size='96' must be WIDTHxHEIGHT in pixels, e.g. '96x64'", "size"),
        ({"prompt": "a", "size": "-96x64"}, "size='-96x64' must be WIDTHxHEIGHT in pixels, e.g. '96x64'", "size"),
        ({"prompt": "a", "seconds": "soon"}, "seconds='soon' must be a number of seconds > 0", "seconds"),
        ({"prompt": "a", "seconds": "0"}, "seconds='0' must be a number of seconds > 0", "seconds"),
        ({"prompt": "a", "seconds": "nan"}, "seconds='nan' must be a number of seconds > 0", "seconds"),
        ({"prompt": "a", "seconds": True}, "seconds=True must be a number of seconds > 0", "seconds"),
        ({"prompt": "a", "seconds": 1, "num_frames": 24}, "give seconds or num_frames, not both", "seconds"),
        (
            {"prompt": "a", "num_inference_steps": 2.5},
            "num_inference_steps=2.5 must be an integer",
            "num_inference_steps",
        ),
        ({"prompt": "a", "seed": "x"}, "seed='x' must be an integer", "seed"),
        ({"prompt": "a", "n": True}, "n=True must be an integer", "n"),
        ({"prompt": "a", "model": "sora-2"}, "model='sora-2' is not served here; allowed: 'h3'", "model"),
        ({"prompt": "a", "fps": 30}, f"unknown field 'fps'; allowed: {sorted(CREATE_FIELDS)}", "fps"),
        (
            {"prompt": "a", "input_reference": {"image_url": "https://example.com/a.png"}},
            "input_reference='https://example.com/a.png' must be a file or a base64 data URL "
            "(data:image/png;base64,...): this server fetches no URLs",
            "input_reference",
        ),
        (
            {"prompt": "a", "input_reference": {"file_id": "file_1"}},
            "input_reference file_id is not served: upload the file or send a data URL",
            "input_reference",
        ),
        (
            {"prompt": "a", "last_frame": "data:image/png;base64,iVBOR*"},
            "last_frame is not valid base64 after 'data:...;base64,': Only base64 data is allowed",
            "last_frame",
        ),
        (
            {"prompt": "a", "reference_images": [b"x", b""]},
            "reference_images[1] is empty (0 bytes)",
            "reference_images",
        ),
        (
            {"prompt": "a", "reference_audio": 5},
            "reference_audio[0] must be a file or a base64 data URL, got int",
            "reference_audio",
        ),
        ({"prompt": "a", "task": 2}, "task=2 must be a string", "task"),
    ],
)
def test_bad_create_fields_are_invalid_arg(sent, message, param):
    with pytest.raises(Exception) as refused:
        parse_create(sent, "h3")
    assert (refused.value.status, refused.value.body()) == (
        400,
        {"error": api_error("INVALID_ARG", message, param)},
    )


def test_server_errors_map_to_http_codes():
    full = DitLoad(held=12, max_num_seqs=4, max_waiting=8).message()
    cases = {
        ("INVALID_ARG", "num_outputs=5 is out of range: allowed 1..4"): (400, {}, "n"),
        ("INVALID_ARG", f"SEED={2**64} does not fit INT64 ({-(2**63)}..{2**63 - 1})"): (400, {}, "seed"),
        ("INVALID_ARG", "preview_every=-1 is out of range: allowed >= 0"): (400, {}, "preview_every"),
        ("UNAVAILABLE", full): (429, {"Retry-After": "5"}, None),
        ("UNAVAILABLE", "the server is shutting down"): (503, {"Retry-After": "10"}, None),
        ("UNAVAILABLE", "Stub process 'h3_dit_0_0' is not healthy."): (503, {"Retry-After": "10"}, None),
        ("CANCELLED", "request r cancelled by request at step 2 of 9"): (409, {}, None),
        ("INTERNAL", "denoise step 3 failed: boom"): (500, {}, None),
        ("TIMEOUT", "no response for 600 s (idle_timeout_s)"): (504, {}, None),
        ("UNKNOWN", "something else"): (502, {}, None),
    }
    for (code, text), (status, headers, param) in cases.items():
        error = error_from_server(code, text)
        assert (error.status, error.headers, error.param, error.message) == (status, headers, param, f"{code}: {text}")
    # a file's refusal names the API field it came in (KEYFRAMES holds the keyframes sent, first then last)
    not_image = ": is not an image (no known file signature); the allowed formats are PNG, JPEG, WEBP"
    for inputs, text, param, message in (
        ({"last_frame": ["image/png"]}, f"KEYFRAMES[0]{not_image}", "last_frame", f"last_frame{not_image}"),
        ({"first_frame": [], "last_frame": []}, f"KEYFRAMES[1]{not_image}", "last_frame", f"last_frame{not_image}"),
        ({"first_frame": []}, f"KEYFRAMES[0]{not_image}", "input_reference", f"input_reference{not_image}"),
        ({}, "REFERENCE_AUDIO[1]: is 16.000 s long", "reference_audio", "reference_audio[1]: is 16.000 s long"),
        (
            {},
            "REFERENCE_IMAGES holds 10 files: allowed 0..9",
            "reference_images",
            "REFERENCE_IMAGES holds 10 files: allowed 0..9",
        ),
        (
            {},
            "TASK='i2v' is not allowed: allowed ['t2va', 'fl2va', 'ref2va']",
            "task",
            "TASK='i2v' is not allowed: allowed ['t2va', 'fl2va', 'ref2va']",
        ),
        (
            {},
            "fit='zoom' is not allowed: allowed ['crop', 'pad', 'stretch']",
            "fit",
            "fit='zoom' is not allowed: allowed ['crop', 'pad', 'stretch']",
        ),
    ):
        error = error_from_server("INVALID_ARG", text, {"inputs": inputs})
        assert (error.status, error.param, error.message) == (400, param, f"INVALID_ARG: {message}")
    refusal = f"num_frames=192 is out of range: allowed 1..124{NUM_FRAMES_RULE}"
    error = error_from_server("INVALID_ARG", refusal, {"seconds": "8"})
    assert (error.param, error.message) == ("seconds", f"INVALID_ARG: {refusal} (seconds='8' at 24 fps)")
    assert error_from_server("UNAVAILABLE", full).body()["error"]["type"] == "rate_limit_error"


def test_retention_removes_ended_jobs_their_files_and_stray_folders(tmp_path):
    store = Store(tmp_path / "jobs.sqlite3")
    jobs = Jobs(store, tmp_path, client=None, retention_s=60, max_attempts=3, accept_wait_s=1)
    request, _ = parse_create({"prompt": "a", "seed": 1}, "h3")
    for job_id in ("old", "young", "running"):
        store.add(job_id, 1000, request, None)
        jobs.folder(job_id).mkdir()
        (jobs.folder(job_id) / "0.mp4").write_bytes(b"mp4")
    assert store.end("old", "completed", now=1000, expires_at=1060, outputs=[{"seed": 1}])
    assert store.end("young", "failed", now=1050, expires_at=1110, error=("INTERNAL", "INTERNAL: x"))
    assert not store.end("old", "cancelled", now=1001, expires_at=1061)  # ended already: nothing changes
    jobs.folder("stray").mkdir()
    assert jobs.purge(now=1059) == []
    assert sorted(path.name for path in jobs.videos.iterdir()) == ["old", "running", "young"]
    assert jobs.purge(now=1060) == ["old"]
    assert store.get("old") is None and not jobs.folder("old").exists()
    assert (store.get("young")["status"], store.get("running")["status"]) == ("failed", "queued")
    assert jobs.purge(now=10**9) == ["young"]
    assert [job["id"] for job in store.active()] == ["running"] and jobs.folder("running").is_dir()


def test_an_unreachable_triton_is_503_with_retry_after(tmp_path):
    (port,) = pick_free_ports(1, "127.0.0.1")
    with TestClient(create_app(Settings(triton_url=f"127.0.0.1:{port}", data_dir=tmp_path))) as http:
        response = http.post("/v1/videos", json={"prompt": "a ball"})
        assert (response.status_code, response.headers["retry-after"]) == (503, "10")
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("UNAVAILABLE", "server_error")
        assert error["message"].startswith("UNAVAILABLE: ")
        assert http.get("/v1/videos").json()["data"] == []  # a refused job is not kept


def test_cors_is_off_unless_origins_are_given_and_chunked_bodies_are_refused(tmp_path):
    preflight = {"Origin": "http://page.example", "Access-Control-Request-Method": "POST"}
    for origins in ((), ("http://page.example",)):
        settings = Settings(triton_url="127.0.0.1:1", data_dir=tmp_path / str(len(origins)), cors_origins=origins)
        with TestClient(create_app(settings)) as http:
            response = http.options("/v1/videos", headers=preflight)
            if origins:
                assert (response.status_code, response.headers["access-control-allow-origin"]) == (200, origins[0])
            else:
                assert "access-control-allow-origin" not in response.headers
                assert (response.status_code, response.json()["error"]["message"]) == (
                    405,
                    "METHOD_NOT_ALLOWED: OPTIONS /v1/videos is not supported by this server; allowed: GET, POST",
                )
            chunked = http.post(
                "/v1/videos", content=iter([b'{"prompt": "a"}']), headers={"Content-Type": "application/json"}
            )
            assert (chunked.status_code, chunked.json()["error"]["message"]) == (
                411,
                "LENGTH_REQUIRED: send the body with a Content-Length",
            )


def test_the_command_line_binds_127_0_0_1_and_checks_its_flags(tmp_path, capsys):
    from videos_api.__main__ import _parser, main

    args = _parser().parse_args([])
    assert (args.host, args.port, args.retention_hours, args.max_attempts, args.api_key_file, args.cors_origin) == (
        "127.0.0.1",
        8080,
        24.0,
        3,
        None,
        [],
    )
    (tmp_path / "empty.txt").write_text("\n")
    for argv, message in (
        (["--triton-url", "http://x:1"], "--triton-url: url must be host:port without a scheme, got 'http://x:1'"),
        (["--port", "70000"], "--port must be in 1..65535, got 70000"),
        (["--retention-hours", "0"], "argument --retention-hours: must be > 0, got 0"),
        (
            ["--api-key-file", str(tmp_path / "none.txt")],
            f"--api-key-file: [Errno 2] No such file or directory: '{tmp_path / 'none.txt'}'",
        ),
        (["--api-key-file", str(tmp_path / "empty.txt")], f"--api-key-file {tmp_path / 'empty.txt'} holds no key"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"python -m videos_api: error: {message}"
