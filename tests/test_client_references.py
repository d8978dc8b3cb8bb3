"""ref2va's references and timeline guides in the client without a server: the inputs
H3Client.generate sends (names, datatypes, shapes, the files' exact bytes, the guides' frames),
its argument checks, and the command line's --reference-image / --reference-video /
--reference-audio / --guide flags, against FakeTriton (tests/test_client_api.py)."""

import numpy as np
import pytest

from client.api import H3Client, H3Error
from client.generate import main
from h3_core import protocol

from .test_client_api import FakeTriton, results_script
from .test_client_generate import CLI_FLAGS

# Media files as the client sends them: never decoded, so any bytes do (NUL, 0xff and a trailing
# NUL included, which a str-based BYTES encoding would lose).
IMAGE_A = b"\x89PNG\r\n\x1a\n\x00character\xff\x00"
IMAGE_B = b"\xff\xd8\xff\xe0\x00object\x00"
VIDEO = b"\x00\x00\x00\x18ftypmp42\x00moov\xff"
VOICE = b"RIFF\x24\x00\x00\x00WAVEfmt \x00"
SOUND = b"fLaC\x00\x00\x00\x22\xff"
GUIDE_0 = b"\x89PNG\r\n\x1a\n\x00guide0"
GUIDE_1 = b"RIFF\x00\x00\x00\x00WEBPVP8 guide1\x00"


@pytest.fixture
def media(tmp_path, monkeypatch):
    """The media files in tmp_path (the current folder: str paths relative to it), an empty file of
    each kind and a folder."""
    for name, data in [
        ("a.png", IMAGE_A),
        ("b.jpg", IMAGE_B),
        ("clip.mp4", VIDEO),
        ("voice.wav", VOICE),
        ("sound.flac", SOUND),
        ("g0.png", GUIDE_0),
        ("g1.webp", GUIDE_1),
        ("empty.png", b""),
        ("empty.mp4", b""),
        ("empty.wav", b""),
    ]:
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "kwargs, tensors",
    [
        (
            dict(reference_images=["a.png", IMAGE_B]),
            {"REFERENCE_IMAGES": ("BYTES", [1, 2], [IMAGE_A, IMAGE_B])},
        ),
        (dict(reference_videos=("clip.mp4",)), {"REFERENCE_VIDEOS": ("BYTES", [1, 1], [VIDEO])}),
        (
            dict(reference_audio=[SOUND, "voice.wav"]),
            {"REFERENCE_AUDIO": ("BYTES", [1, 2], [SOUND, VOICE])},
        ),
        (
            dict(guides=[("g1.webp", 40), (GUIDE_0, 0)]),
            {"GUIDES": ("BYTES", [1, 2], [GUIDE_1, GUIDE_0]), "GUIDE_FRAMES": ("INT64", [1, 2], [40, 0])},
        ),
    ],
)
def test_generate_sends_each_kind_of_reference_in_its_order(monkeypatch, media, kwargs, tensors):
    fake = FakeTriton(results_script()).install(monkeypatch)
    H3Client("fake:1").generate("a", seed=3, **kwargs)
    (request,) = fake.requests
    assert request.inputs == ["PROMPT", "SEED", *tensors]
    assert {name: request.tensors[name] for name in tensors} == tensors
    assert request.parameters == {"progress_every": 0}


def test_generate_sends_a_mix_in_the_protocol_order_then_the_task(monkeypatch, media):
    fake = FakeTriton(results_script()).install(monkeypatch)
    H3Client("fake:1").generate(
        "a",
        task="ref2va",
        guides=[(media / "g0.png", np.int64(0)), ("g1.webp", 96)],  # numpy integers and pathlib paths do
        reference_audio=["voice.wav"],
        reference_videos=[VIDEO],
        reference_images=[media / "b.jpg", "a.png", IMAGE_B],
    )
    (request,) = fake.requests
    assert request.inputs == [
        "PROMPT",
        "REFERENCE_IMAGES",
        "REFERENCE_VIDEOS",
        "REFERENCE_AUDIO",
        "GUIDES",
        "GUIDE_FRAMES",
        "TASK",
    ]
    assert request.inputs[1:6] == list(protocol.REFERENCE_INPUTS) + [protocol.GUIDE_FRAMES]
    assert request.tensors["REFERENCE_IMAGES"] == ("BYTES", [1, 3], [IMAGE_B, IMAGE_A, IMAGE_B])
    assert request.tensors["REFERENCE_VIDEOS"] == ("BYTES", [1, 1], [VIDEO])
    assert request.tensors["REFERENCE_AUDIO"] == ("BYTES", [1, 1], [VOICE])
    assert request.tensors["GUIDES"] == ("BYTES", [1, 2], [GUIDE_0, GUIDE_1])
    assert request.tensors["GUIDE_FRAMES"] == ("INT64", [1, 2], [0, 96])
    assert request.tensors["TASK"] == ("BYTES", [1, 1], [b"ref2va"])


def test_empty_sequences_send_nothing(monkeypatch):
    fake = FakeTriton(results_script()).install(monkeypatch)
    H3Client("fake:1").generate("a", reference_images=[], reference_videos=(), reference_audio=[], guides=())
    (request,) = fake.requests
    assert request.inputs == ["PROMPT"]


def test_counts_and_frames_are_left_to_the_server(monkeypatch):
    """The server's limits are configurable: more than the default MAX_* and a frame it would
    refuse still go as given."""
    fake = FakeTriton(results_script()).install(monkeypatch)
    images = [bytes([k]) for k in range(protocol.MAX_REFERENCE_IMAGES + 1)]
    H3Client("fake:1").generate("a", reference_images=images, guides=[(GUIDE_0, -1), (GUIDE_1, 10**6)])
    (request,) = fake.requests
    assert request.tensors["REFERENCE_IMAGES"] == ("BYTES", [1, protocol.MAX_REFERENCE_IMAGES + 1], images)
    assert request.tensors["GUIDE_FRAMES"] == ("INT64", [1, 2], [-1, 10**6])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(reference_images="a.png"),
            TypeError,
            "reference_images must be a sequence (list or tuple), got str 'a.png'",
        ),
        (
            dict(reference_videos=VIDEO[:4]),
            TypeError,
            r"reference_videos must be a sequence (list or tuple), got bytes b'\x00\x00\x00\x18'",
        ),
        (
            dict(reference_audio=None),
            TypeError,
            "reference_audio must be a sequence (list or tuple), got NoneType None",
        ),
        (dict(guides={"g0.png": 0}), TypeError, "guides must be a sequence (list or tuple), got dict {'g0.png': 0}"),
        (dict(reference_images=[IMAGE_A, 3]), TypeError, "reference_images[1] must be a path or bytes, got int 3"),
        (dict(reference_images=["a.png", "missing.png"]), ValueError, "reference_images[1] missing.png: no such file"),
        (
            dict(reference_videos=["folder"]),
            ValueError,
            "reference_videos[0] folder is not a file; give a video file's path",
        ),
        (dict(reference_videos=["empty.mp4"]), ValueError, "reference_videos[0] empty.mp4 is empty: give an MP4 file"),
        (dict(reference_audio=[b""]), ValueError, "reference_audio[0] is empty: give a WAV, FLAC or MP3 file"),
        (
            dict(reference_audio=[VOICE, "empty.wav"]),
            ValueError,
            "reference_audio[1] empty.wav is empty: give a WAV, FLAC or MP3 file",
        ),
        (
            dict(reference_audio=["folder"]),
            ValueError,
            "reference_audio[0] folder is not a file; give an audio file's path",
        ),
        (dict(guides=["g0.png"]), TypeError, "guides[0] must be an (image, frame) pair, got str 'g0.png'"),
        (
            dict(guides=[("g0.png", 0), ("g1.webp",)]),
            TypeError,
            "guides[1] must be an (image, frame) pair, got tuple ('g1.webp',)",
        ),
        (dict(guides=[("g0.png", 2.0)]), TypeError, "guides[0] frame must be int, got float 2.0"),
        (dict(guides=[("g0.png", True)]), TypeError, "guides[0] frame must be int, got bool True"),
        (dict(guides=[("g0.png", "3")]), TypeError, "guides[0] frame must be int, got str '3'"),
        (dict(guides=[(7, 3)]), TypeError, "guides[0] must be a path or bytes, got int 7"),
        (dict(guides=[("missing.png", 3)]), ValueError, "guides[0] missing.png: no such file"),
        (dict(guides=[(b"", 3)]), ValueError, "guides[0] is empty: give a PNG, JPEG or WebP file"),
        (
            dict(guides=[("empty.png", 3)]),
            ValueError,
            "guides[0] empty.png is empty: give a PNG, JPEG or WebP file",
        ),
        (
            dict(guides=[(GUIDE_0, 2**63)]),
            H3Error,
            f"INVALID_ARG: guides[0] frame={2**63} does not fit INT64 ({-(2**63)}..{2**63 - 1})",
        ),
    ],
)
def test_bad_references_and_guides_are_refused_before_sending(monkeypatch, media, kwargs, error, message):
    fake = FakeTriton(results_script()).install(monkeypatch)
    with pytest.raises(error) as raised:
        H3Client("fake:1").generate("a", **kwargs)
    assert str(raised.value) == message
    assert (fake.requests, fake.made) == ([], 0)


# ---- the command line ---------------------------------------------------------------------------


def test_generate_cli_sends_the_same_ref2va_request_as_the_api(monkeypatch, media):
    """Repeated flags keep their order, interleaved with other flags; a path may hold an "@" (the
    frame follows the last one)."""
    (media / "at@2").mkdir()
    (media / "at@2" / "g@.png").write_bytes(GUIDE_1)
    fake = FakeTriton(results_script() * 2).install(monkeypatch)
    flags = [
        *["--reference-image", "b.jpg", "--guide", "at@2/g@.png@40", "--reference-image", str(media / "a.png")],
        *["--reference-audio", "voice.wav", "--reference-video", "clip.mp4", "--reference-audio", "sound.flac"],
        *["--guide", "g0.png@0", "--task", "ref2va"],
    ]
    assert main([*CLI_FLAGS, "--out", str(media / "x.mp4"), *flags]) == 0
    H3Client("fake:1").generate(
        b"a",
        reference_images=[IMAGE_B, "a.png"],
        reference_videos=["clip.mp4"],
        reference_audio=[VOICE, media / "sound.flac"],
        guides=[(GUIDE_1, 40), ("g0.png", 0)],
        task="ref2va",
        num_outputs=1,
        progress_every=1,
        request_id="cli-test",
    )
    cli, api_call = fake.requests
    assert vars(cli) == vars(api_call)
    assert cli.tensors["REFERENCE_IMAGES"] == ("BYTES", [1, 2], [IMAGE_B, IMAGE_A])
    assert cli.tensors["REFERENCE_VIDEOS"] == ("BYTES", [1, 1], [VIDEO])
    assert cli.tensors["REFERENCE_AUDIO"] == ("BYTES", [1, 2], [VOICE, SOUND])
    assert cli.tensors["GUIDES"] == ("BYTES", [1, 2], [GUIDE_1, GUIDE_0])
    assert cli.tensors["GUIDE_FRAMES"] == ("INT64", [1, 2], [40, 0])


def test_generate_cli_without_reference_flags_sends_none(monkeypatch, media):
    fake = FakeTriton(results_script()).install(monkeypatch)
    assert main([*CLI_FLAGS, "--out", str(media / "x.mp4")]) == 0
    (request,) = fake.requests
    assert request.inputs == ["PROMPT", "NUM_OUTPUTS"]


GUIDE_FORMAT = "argument --guide: must be IMAGE@FRAME with FRAME an integer >= 0, got"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--guide", "g0.png"], f"{GUIDE_FORMAT} 'g0.png'"),
        (["--guide", "g0.png@"], f"{GUIDE_FORMAT} 'g0.png@'"),
        (["--guide", "@3"], f"{GUIDE_FORMAT} '@3'"),
        (["--guide", "g0.png@-1"], f"{GUIDE_FORMAT} 'g0.png@-1'"),
        (["--guide", "g0.png@1.5"], f"{GUIDE_FORMAT} 'g0.png@1.5'"),
        (["--guide", "g0.png@x"], f"{GUIDE_FORMAT} 'g0.png@x'"),
        (["--guide", "g0.png@3@"], f"{GUIDE_FORMAT} 'g0.png@3@'"),
        (["--guide", "missing.png@3"], "--guide missing.png: no such file"),
        (
            ["--guide", "g0.png@1", "--guide", "empty.png@2"],
            "--guide empty.png is empty: give a PNG, JPEG or WebP file",
        ),
        (
            ["--reference-image", "a.png", "--reference-image", "missing.png"],
            "--reference-image missing.png: no such file",
        ),
        (["--reference-video", "folder"], "--reference-video folder is not a file; give a video file's path"),
        (["--reference-video", "empty.mp4"], "--reference-video empty.mp4 is empty: give an MP4 file"),
        (["--reference-audio", "empty.wav"], "--reference-audio empty.wav is empty: give a WAV, FLAC or MP3 file"),
    ],
)
def test_generate_cli_refuses_bad_reference_flags_before_sending(monkeypatch, media, capsys, flags, message):
    fake = FakeTriton(results_script()).install(monkeypatch)
    with pytest.raises(SystemExit) as raised:
        main([*CLI_FLAGS, "--out", str(media / "x.mp4"), *flags])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"python -m client.generate: error: {message}"
    assert "Traceback" not in err
    assert (fake.requests, fake.made) == ([], 0)
