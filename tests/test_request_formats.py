"""The three request formats (ours, SGLang's H3 JSON, vLLM-Omni's multipart) read into one
request model (h3_core.request_model): golden mappings with each format's step convention, the
refusals naming the sender's field path, uri rules (data:, part:NAME, file://, allowed http on
127.0.0.1), and the same fl2va and ref2va request in the three formats giving the same normalised
request and the same MP4 through a real tritonserver."""

import base64
import http.server
import json
import threading

import pytest
from fastapi.testclient import TestClient

from h3_core import config, protocol, request_model
from h3_core.request_model import RequestError, UrlPolicy, read_sglang, read_uri, read_vllm_omni
from videos_api import formats
from videos_api.app import Settings, create_app
from videos_api.fields import ApiError, error_from_server

from .test_fl2va_serving import png
from .test_ref2va_serving import mp4, tone


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


FIRST, LAST, IMAGE, AUDIO = png(64, 96, 1), png(64, 96, 2), png(80, 60, 3), tone(2.0, seed=4)


def test_one_clip_length_rule_and_canvas_multiple():
    assert config.align_num_frames is protocol.align_num_frames
    assert config.CANVAS_MULTIPLE is protocol.CANVAS_MULTIPLE


# ---- golden mappings, one per format ---------------------------------------------------------


def test_sglang_golden_mapping_counts_sigma_points():
    request = read_sglang(
        {
            "task": "t2va",
            "prompt": "a ball",
            "target": {"short_edge": 768, "aspect_ratio": "16:9", "duration_seconds": 5},
            "num_inference_steps": 50,
        }
    )
    assert (request.width, request.height, request.num_frames, request.clip_frames) == (1344, 768, 120, 124)
    assert (request.num_inference_steps, request.flow_shift, request.audio_flow_shift) == (49, 12.0, 3.0)


def test_vllm_omni_golden_mapping_counts_forwards():
    request = read_vllm_omni(
        {
            "prompt": "a ball",
            "short_edge": "768",
            "aspect_ratio": "16:9",
            "num_inference_steps": "50",
            "flow_shift": "12",
            "extra_params": '{"duration": 5, "audio_flow_shift": 3}',
        }
    )
    assert (request.width, request.height, request.num_frames, request.clip_frames) == (1344, 768, 120, 124)
    assert (request.num_inference_steps, request.flow_shift, request.audio_flow_shift) == (50, 12.0, 3.0)


def test_ours_golden_mapping_counts_forwards():
    parsed, media = formats.read(
        {"prompt": "a ball", "size": "1344x768", "seconds": "5", "num_inference_steps": 50}, False, "h3"
    )
    assert (parsed["width"], parsed["height"], parsed["num_frames"], parsed["num_inference_steps"]) == (
        1344,
        768,
        120,
        50,
    )
    assert (parsed["format"], parsed["flow_shift"], protocol.align_num_frames(parsed["num_frames"])) == (
        "openai",
        None,
        124,
    )


def test_portrait_and_demo_canvases():
    assert request_model.canvas(768, "9:16", "a") == (768, 1344)
    assert request_model.canvas(64, "16:9", "a") == (96, 64)  # the demo model's 96 x 64


# ---- the same request in three formats -------------------------------------------------------


def fl2va_bodies() -> dict:
    """The same fl2va request (first and last keyframe, 0.5 s at 96 x 64, 2 forwards, seed 5,
    shifts 12 / 3) as each format sends it: (form, multipart) for formats.read."""
    sglang = {
        "task": "fl2va",
        "prompt": "a door opens",
        "conditions": [
            {"type": "image", "uri": data_url(FIRST), "role": "keyframe", "frame_index": 0},
            {"type": "image", "uri": data_url(LAST), "role": "keyframe", "frame_index": -1},
        ],
        "target": {"short_edge": 64, "aspect_ratio": "16:9", "duration_seconds": 0.5},
        "seed": 5,
        "num_inference_steps": 3,
    }
    vllm = {
        "prompt": "a door opens",
        "short_edge": "64",
        "aspect_ratio": "16:9",
        "num_inference_steps": "2",
        "seed": "5",
        "flow_shift": "12",
        "input_references": [FIRST, LAST],
        "extra_params": json.dumps({"task": "fl2va", "duration": 0.5, "audio_flow_shift": 3, "frame_indices": [0, -1]}),
    }
    ours = {
        "prompt": "a door opens",
        "size": "96x64",
        "seconds": "0.5",
        "num_inference_steps": "2",
        "seed": "5",
        "flow_shift": "12",
        "audio_flow_shift": "3",
        "task": "fl2va",
        "input_reference": FIRST,
        "last_frame": LAST,
    }
    return {"sglang": (sglang, False), "vllm_omni": (vllm, True), "openai": (ours, True)}


def ref2va_bodies() -> dict:
    """The same ref2va request (an audio reference, then an image reference: that order) in each
    format; SGLang's as a multipart body whose uris name its file parts."""
    sglang = {
        "task": "ref2va",
        "prompt": "a cat sings",
        "conditions": [{"type": "audio", "uri": "part:voice"}, {"type": "image", "uri": data_url(IMAGE)}],
        "target": {"short_edge": 64, "aspect_ratio": "16:9", "duration_seconds": 0.5},
        "seed": 5,
        "num_inference_steps": 3,
    }
    vllm = {
        "prompt": "a cat sings",
        "width": "96",
        "height": "64",
        "num_inference_steps": "2",
        "seed": "5",
        "flow_shift": "12",
        "input_references": [AUDIO, IMAGE],
        "extra_params": json.dumps({"task": "ref2va", "duration": 0.5, "audio_flow_shift": 3}),
    }
    ours = {
        "prompt": "a cat sings",
        "size": "96x64",
        "seconds": "0.5",
        "num_inference_steps": "2",
        "seed": "5",
        "flow_shift": "12",
        "audio_flow_shift": "3",
        "reference_images": [IMAGE],
        "reference_audio": [AUDIO],
        "references": json.dumps([{"input": "REFERENCE_AUDIO", "index": 0}, {"input": "REFERENCE_IMAGES", "index": 0}]),
    }
    return {
        "sglang": ({"request": json.dumps(sglang), "voice": AUDIO}, True),
        "vllm_omni": (vllm, True),
        "openai": (ours, True),
    }


@pytest.mark.parametrize("bodies", [fl2va_bodies, ref2va_bodies])
def test_three_formats_give_the_same_normalised_request(bodies):
    read = {name: formats.read(form, multipart, "h3") for name, (form, multipart) in bodies().items()}
    assert [parsed["format"] for parsed, _ in read.values()] == ["sglang", "vllm_omni", "openai"]
    wires = {parsed["wire"] for parsed, _ in read.values()}
    assert len(wires) == 1, wires
    wire = json.loads(wires.pop())
    assert (wire["width"], wire["height"], wire["num_frames"], wire["num_inference_steps"]) == (96, 64, 12, 2)
    assert (wire["seed"], wire["flow_shift"], wire["audio_flow_shift"]) == (5, 12.0, 3.0)
    medias = [media for _, media in read.values()]
    assert medias[0] == medias[1] == medias[2]
    if wire["task"] == "ref2va":
        assert [r["kind"] for r in wire["references"]] == ["audio", "image"]
        orders = [parsed["references"] for parsed, _ in read.values()]
        assert (
            orders[0]
            == orders[1]
            == orders[2]
            == [
                {"input": "REFERENCE_AUDIO", "index": 0},
                {"input": "REFERENCE_IMAGES", "index": 0},
            ]
        )
    else:
        assert [k["frame"] for k in wire["keyframes"]] == [0, -1]


def test_video_references_keep_order_start_and_audio():
    clip = mp4(24, seed=3)
    sglang = read_sglang(
        {
            "task": "ref2va",
            "prompt": "p",
            "conditions": [
                {"type": "image", "uri": data_url(IMAGE)},
                {"type": "video", "uri": data_url(clip, "video/mp4"), "start_time_seconds": 0.25},
                {"type": "video_audio", "uri": data_url(clip, "video/mp4")},
            ],
            "target": {"duration_seconds": 1},
        }
    )
    assert sglang.reference_order() == [
        {"input": "REFERENCE_IMAGES", "index": 0},
        {"input": "REFERENCE_VIDEOS", "index": 0, "start_time_seconds": 0.25, "audio": False},
        {"input": "REFERENCE_VIDEOS", "index": 1, "start_time_seconds": 0.0, "audio": True},
    ]
    vllm = read_vllm_omni(
        {
            "prompt": "p",
            "input_references": [IMAGE, clip],
            "extra_params": '{"duration": 1, "start_time_seconds": [null, 0.25]}',
        }
    )
    assert [(r.kind, r.start_time_seconds, r.path) for r in vllm.references] == [
        ("image", 0.0, "input_references[0]"),
        ("video", 0.25, "input_references[1]"),
    ]


def test_sglang_auto_aspect_takes_the_first_images_and_model_is_checked():
    body = {
        "task": "fl2va",
        "prompt": "p",
        "conditions": [{"type": "image", "uri": data_url(png(128, 64, 1))}],
        "target": {"short_edge": 64, "aspect_ratio": "auto"},
    }
    assert (read_sglang(body).width, read_sglang(body).height) == (64, 128)  # a portrait keyframe
    parsed, _ = formats.read({**body, "model": "h3"}, False, "h3")
    assert parsed["format"] == "sglang"
    with pytest.raises(ApiError) as refused:
        formats.read({**body, "model": "sora-2"}, False, "h3")
    assert (refused.value.param, refused.value.message) == (
        "model",
        "INVALID_ARG: model: 'sora-2' is not served here; allowed: 'h3'",
    )


def test_sglang_ref2va_without_duration_takes_its_audio_references():
    request = read_sglang(
        {
            "task": "ref2va",
            "prompt": "p",
            "conditions": [
                {"type": "image", "uri": data_url(IMAGE)},
                {"type": "audio", "uri": data_url(tone(2.0), "audio/wav")},
            ],
        }
    )
    assert (request.num_frames, request.paths["num_frames"]) == (48, "conditions[1].uri")


# ---- refusals name the sender's field path ---------------------------------------------------


def sglang_error(body: dict, parts=None, policy=None) -> tuple[str, str]:
    with pytest.raises(RequestError) as refused:
        read_sglang({"task": "t2va", "prompt": "p", **body}, parts, policy)
    return refused.value.path, str(refused.value)


def test_sglang_refusals_name_the_field_path():
    image = data_url(IMAGE)
    assert sglang_error({"target": {"duration_seconds": -1}}) == (
        "target.duration_seconds",
        "target.duration_seconds: -1 must be a finite number > 0",
    )
    two = {"task": "fl2va", "conditions": [{"type": "image", "uri": image}, {"type": "image", "uri": "file:///etc/x"}]}
    assert sglang_error(two) == (
        "conditions[1].uri",
        "conditions[1].uri: file:// URIs are refused: send a data: URL, a part:NAME file part or an allowed URL",
    )
    for name, why in (("guidance_scale", "no guidance_scale"), ("fps", "fps is fixed at 24")):
        path, text = sglang_error({name: 1})
        assert (path, text.endswith(why)) == (name, True)
    assert sglang_error({"conditions": [{"type": "image", "uri": image}]}) == (
        "conditions",
        "conditions: task 't2va' takes no conditions; got 1",
    )
    ref = {"task": "ref2va", "conditions": [{"type": "image", "uri": image, "frame_index": 0}]}
    assert sglang_error(ref) == ("conditions[0].frame_index", "conditions[0].frame_index: is for keyframes only")
    assert sglang_error({"task": "fl2va", "conditions": [{"type": "image", "uri": "part:x"}]}) == (
        "conditions[0].uri",
        "conditions[0].uri: names part 'x', which the body does not hold (parts: [])",
    )
    assert sglang_error({"num_inference_steps": 1}) == (
        "num_inference_steps",
        "num_inference_steps: 1 is out of range: allowed >= 2 (sigma points including 0: N - 1 forwards)",
    )


def test_vllm_omni_refusals_name_the_field_path():
    def error(form):
        with pytest.raises(RequestError) as refused:
            read_vllm_omni({"prompt": "p", **form})
        return refused.value.path, str(refused.value)

    assert error({"lora": '[{"name": "x", "path": "/a.safetensors"}]'}) == (  # no path from a request
        "lora",
        "lora: lora entry {'name': 'x', 'path': '/a.safetensors'} is not an object of 'name' and optional 'scale' "
        "(unknown: ['path'])",
    )
    assert read_vllm_omni({"prompt": "p", "lora": '[{"name": "turbo", "scale": 0.5}]'}).lora == (("turbo", 0.5),)
    assert error({"input_references": [FIRST, LAST], "extra_params": '{"frame_indices": [0, 0]}'}) == (
        "extra_params.frame_indices",
        "extra_params.frame_indices: KEYFRAME_INDICES [0, 0] repeats a frame: "
        "each keyframe conditions a different frame",
    )
    assert error({"fps": "30"}) == ("fps", "fps: '30' is not allowed: fps is fixed at 24")
    assert error({"extra_params": '{"duration": 0}'}) == (
        "extra_params.duration",
        "extra_params.duration: 0 must be a finite number > 0",
    )


def test_server_refusals_are_reworded_with_the_senders_path():
    parsed, _ = formats.read(fl2va_bodies()["sglang"][0], False, "h3")
    error = error_from_server("INVALID_ARG", "num_frames=500 is out of range: allowed 1..124", parsed)
    assert (error.param, error.message) == (
        "target.duration_seconds",
        "INVALID_ARG: target.duration_seconds: num_frames=500 is out of range: allowed 1..124",
    )
    error = error_from_server("INVALID_ARG", "KEYFRAMES[1]: is not an image", parsed)
    assert (error.param, error.message) == (
        "conditions[1].uri",
        "INVALID_ARG: conditions[1].uri: KEYFRAMES[1]: is not an image",
    )
    parsed, _ = formats.read(*ref2va_bodies()["vllm_omni"], "h3")
    error = error_from_server("INVALID_ARG", "REFERENCE_IMAGES[0]: is not an image", parsed)
    assert error.param == "input_references[1]"
    error = error_from_server("INVALID_ARG", "audio_flow_shift=300.0 is out of range: allowed 0.01..100.0", parsed)
    assert (error.param, error.message) == (
        "extra_params.audio_flow_shift",
        "INVALID_ARG: extra_params.audio_flow_shift: audio_flow_shift=300.0 is out of range: allowed 0.01..100.0",
    )
    ours, _ = formats.read(*ref2va_bodies()["openai"], "h3")
    assert error_from_server("INVALID_ARG", "flow_shift=300.0 is out of range", ours).param == "flow_shift"
    with pytest.raises(ApiError) as refused:
        formats.read({"prompt": "p", "target": {"short_edge": "x"}}, False, "h3")
    assert (refused.value.param, refused.value.message) == (
        "task",
        "INVALID_ARG: task: None is not allowed: allowed ['t2va', 'fl2va', 'ref2va']",
    )


# ---- uri over http: only allowed hosts, limits ------------------------------------------------


@pytest.fixture(scope="module")
def http_files():
    """A local HTTP server on 127.0.0.1 (a free port): /image.png, /big (one byte more than the
    image), /redirect -> /image.png, /loop -> /loop, /drip (a byte every 10 ms, never done)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/drip":  # a byte at a time, never done: only a time limit ends it
                self.send_response(200)
                self.send_header("Content-Length", str(10**6))
                self.end_headers()
                try:
                    while not stopped.wait(0.01):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                except OSError:  # the client gave up
                    pass
                return
            if self.path in ("/redirect", "/loop"):
                self.send_response(302)
                self.send_header("Location", "/image.png" if self.path == "/redirect" else "/loop")
                self.end_headers()
                return
            body = IMAGE if self.path == "/image.png" else b"x" * (len(IMAGE) + 1)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    stopped = threading.Event()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    stopped.set()
    httpd.shutdown()
    httpd.server_close()


def test_http_uris_only_for_allowed_hosts_with_limits(http_files):
    allowed = UrlPolicy(hosts=frozenset({"127.0.0.1"}), allow_private=True, max_bytes=len(IMAGE), max_redirects=1)
    assert read_uri("u", f"{http_files}/image.png", {}, allowed) == IMAGE
    assert read_uri("u", f"{http_files}/redirect", {}, allowed) == IMAGE
    for url, policy, text in (
        (f"{http_files}/image.png", None, "u: host '127.0.0.1' is not allowed (allowed hosts: [])"),
        (
            f"{http_files}/image.png",
            UrlPolicy(hosts=frozenset({"127.0.0.1"})),
            "u: host '127.0.0.1' resolves to 127.0.0.1, a private address",
        ),
        (f"{http_files}/big", allowed, f"u: is larger than {len(IMAGE)} bytes"),
        (f"{http_files}/loop", allowed, "u: more than 1 redirects"),
        (
            f"{http_files}/drip",
            UrlPolicy(hosts=frozenset({"127.0.0.1"}), allow_private=True, timeout_s=0.3),
            "u: took longer than 0.3 s to download",
        ),
    ):
        with pytest.raises(RequestError) as refused:
            read_uri("u", url, {}, policy)
        assert str(refused.value) == text


# ---- through a real tritonserver --------------------------------------------------------------


def post(http, form: dict, multipart: bool):
    if not multipart:
        return http.post("/v1/videos/sync", json=form)
    files, data = [], {}
    for name, value in form.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bytes):
                files.append((name, (name, item)))
            else:
                data[name] = item
    return http.post("/v1/videos/sync", data=data, files=files)


def test_three_formats_give_the_same_mp4(server, tmp_path):
    """The same fl2va and the same ref2va request in the three formats: one normalised request
    (the video object's, byte-equal) and the same MP4 bytes from a real tritonserver."""
    with TestClient(create_app(Settings(triton_url=server.grpc_url, data_dir=tmp_path))) as http:
        for bodies in (fl2va_bodies(), ref2va_bodies()):
            mp4s, normalised = [], []
            for name, (form, multipart) in bodies.items():
                response = post(http, form, multipart)
                assert response.status_code == 200, (name, response.text)
                video = http.get(f"/v1/videos/{response.headers['x-video-id']}").json()
                assert video["format"] == name
                mp4s.append(response.content)
                normalised.append(json.dumps(video["normalized_request"], sort_keys=True))
            assert mp4s[0][4:8] == b"ftyp"
            assert mp4s[0] == mp4s[1] == mp4s[2]
            assert normalised[0] == normalised[1] == normalised[2]
        # the served model's limits, refused naming the field path of the format sent
        sglang = {**fl2va_bodies()["sglang"][0], "target": {"short_edge": 64, "duration_seconds": 10}}
        vllm = {**ref2va_bodies()["vllm_omni"][0], "extra_params": '{"duration": 10}'}
        for form, multipart, path in (
            (sglang, False, "target.duration_seconds"),
            (vllm, True, "extra_params.duration"),
        ):
            response = post(http, form, multipart)
            error = response.json()["error"]
            assert (response.status_code, error["param"]) == (400, path), error
            assert error["message"].startswith(f"INVALID_ARG: {path}: num_frames=240 is out of range"), error


# ---- the CLI takes SGLang's JSON file -----------------------------------------------------------


def test_cli_request_file_refusals_name_the_field(tmp_path, capsys):
    from client.generate import main

    request = tmp_path / "req.json"
    request.write_text(json.dumps({"task": "t2va", "prompt": "p", "target": {"duration_seconds": 0}}))
    for flags, message in (
        ([], f"--request {request}: target.duration_seconds: 0 must be a finite number > 0"),
        (["--prompt", "p"], "--request replaces --prompt: give the request's fields in the file"),
    ):
        with pytest.raises(SystemExit) as raised:
            main(["--request", str(request), "--out", str(tmp_path / "c.mp4"), "--url", "127.0.0.1:1", *flags])
        assert raised.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"python -m client.generate: error: {message}"
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "c.mp4")])
    assert capsys.readouterr().err.splitlines()[-1] == "python -m client.generate: error: give --prompt or --request"


def test_cli_request_file_is_the_same_clip_as_its_mapping(server, client, tmp_path, capsys):
    """SGLang's JSON file through the CLI gives the MP4 of its mapped request sent by H3Client:
    96 x 64, 12 frames asked for, 3 sigma points = 2 forwards, shifts 12 / 3."""
    from client.generate import main

    request = tmp_path / "req.json"
    body = {
        "task": "fl2va",
        "prompt": "a door opens",
        "conditions": [{"type": "image", "uri": data_url(FIRST), "role": "keyframe", "frame_index": 0}],
        "target": {"short_edge": 64, "aspect_ratio": "16:9", "duration_seconds": 0.5},
        "seed": 3,
        "num_inference_steps": 3,
    }
    request.write_text(json.dumps(body))
    out = tmp_path / "clip.mp4"
    assert main(["--request", str(request), "--out", str(out), "--url", server.grpc_url]) == 0, capsys.readouterr()
    (expected,) = client.generate(
        "a door opens",
        height=64,
        width=96,
        num_frames=12,
        num_inference_steps=2,
        seed=3,
        flow_shift=12.0,
        audio_flow_shift=3.0,
        first_frame=FIRST,
    )
    assert out.read_bytes() == expected.video_mp4


def test_sglang_auto_aspect_of_a_bomb_header_is_refused_naming_the_field():
    from .test_videos_api_edges import bomb_png

    with pytest.raises(RequestError) as info:
        request_model.sglang._auto_aspect([bomb_png(20_000, 10_000)])
    assert (info.value.path, str(info.value)) == (
        "target.aspect_ratio",
        "target.aspect_ratio: 'auto' cannot read the first image condition's header (DecompressionBombError)",
    )
