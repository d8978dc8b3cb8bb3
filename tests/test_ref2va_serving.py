"""ref2va end to end through tritonserver (tiny config, CPU): reference images, audio and videos
(with and without their audio) and timeline guides from the API and the CLI, INFO's conditions
and geometry, a ref2va request co-batched with a running t2va request equal to its solo run, one
cancelled mid-run leaving its neighbour unchanged, and bad references refused with INVALID_ARG
before any model work while the server goes on serving."""

import threading

import numpy as np
import pytest

from client.api import H3Error
from h3_core import media

from .serving import generate_cli
from .test_fl2va_serving import png
from .test_references import m4a, pcm, wav

SHAPE = dict(height=64, width=96, num_frames=9, num_inference_steps=3, seed=5)


def tone(seconds: float, rate: int = 32000, seed: int = 0, channels: int = 2) -> bytes:
    """A WAV of seeded noise at a quarter of full scale."""
    return wav(pcm(channels, int(seconds * rate), seed), rate)


def mp4(frames: int, height: int = 64, width: int = 96, fps: int = 24, audio: bool = True, seed: int = 0) -> bytes:
    """An MP4 of seeded noise frames at `fps`, with a stereo noise track when `audio`."""
    rng = np.random.default_rng(seed)
    video = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    track = (rng.standard_normal((2, frames * 32000 // fps)) * 0.1).astype(np.float32) if audio else None
    return media.encode_mp4(video, track, fps=fps)


def run(client, prompt: str, **kwargs):
    (result,) = client.generate(prompt, return_mp4=False, return_frames=True, **{**SHAPE, **kwargs})
    return result.frames, result.info


def test_every_reference_kind_reaches_the_dit(client):
    """An image, an audio clip, a video with audio, a video without and a guide: INFO lists them
    in block order with the geometry applied; each input changes the clip; the same request twice
    gives the same frames."""
    inputs = dict(
        reference_images=[png(80, 60, 1)],
        reference_audio=[tone(2.0, seed=2)],
        reference_videos=[mp4(24, seed=3), mp4(12, audio=False, seed=4)],
        guides=[(png(64, 96, 5), 4)],
    )
    frames, info = run(client, "a cat sings", **inputs)
    assert info["task"] == "ref2va" and frames.shape == (22, 64, 96, 3)
    assert info["conditions"] == [
        {"kind": "guide", "frame": 4},
        {"kind": "image", "input": "REFERENCE_IMAGES[0]"},
        {"kind": "video_audio", "input": "REFERENCE_VIDEOS[0]", "start_time_seconds": 0.0},
        {"kind": "video", "input": "REFERENCE_VIDEOS[1]", "start_time_seconds": 0.0},
        {"kind": "audio", "input": "REFERENCE_AUDIO[0]"},
    ]
    geometry = info["geometry"]
    assert (geometry["canvas"], geometry["height"], geometry["width"], geometry["fit"]) == (
        "requested",
        64,
        96,
        "crop",
    )
    assert geometry["reference_image_sizes"] == [[[80, 60], [96, 64]]]  # 4:3 portrait at about 64 x 96 px
    assert geometry["reference_video_sizes"] == [[22, 64, 96], [5, 64, 96]]  # 24 -> 22, 12 -> 5 frames (17n + 5)
    assert geometry["reference_audio_seconds"] == [2.0]
    again, _ = run(client, "a cat sings", **inputs)
    assert np.array_equal(again, frames)
    for name in inputs:
        fewer = {key: value for key, value in inputs.items() if key != name}
        other, _ = run(client, "a cat sings", **fewer)
        assert not np.array_equal(other, frames), name


def test_odd_but_valid_audio_is_accepted(client):
    """44.1 kHz is resampled, mono duplicated, silence accepted."""
    for audio in (tone(2.5, rate=44100, seed=1), tone(2.0, channels=1, seed=2), wav(np.zeros((2, 64000), np.int16))):
        _, info = run(client, "a voice", reference_audio=[audio], num_inference_steps=1)
        assert info["conditions"] == [{"kind": "audio", "input": "REFERENCE_AUDIO[0]"}]


def test_ref2va_cobatched_equals_solo_and_a_cancel_leaves_the_neighbour_unchanged(client):
    """A ref2va request that joins a running ref2va request (400 steps, cancelled by id once the
    second is done) gives its solo frames bit for bit."""
    inputs = dict(reference_images=[png(64, 64, 7)], reference_audio=[tone(2.0, seed=8)], guides=[(png(64, 96, 9), 0)])
    solo, _ = run(client, "joins later", **inputs)
    started, outcome = threading.Event(), {}

    def long_ref2va():
        try:
            client.generate(
                "the long one",
                **{**SHAPE, "num_inference_steps": 400},
                reference_images=[png(64, 64, 10)],
                request_id="long-ref2va",
                progress_every=1,
                on_progress=lambda step, total, queue: started.set(),
            )
        except H3Error as error:
            outcome["error"] = error

    thread = threading.Thread(target=long_ref2va)
    thread.start()
    assert started.wait(120)
    try:
        frames, info = run(client, "joins later", **inputs)
    finally:
        assert client.cancel("long-ref2va") == "cancelled"
        thread.join(120)
    assert outcome["error"].code == "CANCELLED"
    assert info["largest_pack"] == 2 and np.array_equal(frames, solo)


def test_generate_cli_with_references(server, tmp_path):
    paths = {"image.png": png(64, 64, 1), "voice.wav": tone(2.0, seed=1), "guide.png": png(64, 96, 2)}
    for name, data in paths.items():
        (tmp_path / name).write_bytes(data)
    out = tmp_path / "clip.mp4"
    done = generate_cli(
        server.grpc_url,
        out,
        "--reference-image",
        str(tmp_path / "image.png"),
        "--reference-audio",
        str(tmp_path / "voice.wav"),
        "--guide",
        f"{tmp_path / 'guide.png'}@8",
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0


BAD = {
    "ten images": (
        dict(reference_images=[png(64, 64, i) for i in range(10)]),
        "REFERENCE_IMAGES holds 10 files: allowed 0..9",
    ),
    "thirteen in all": (
        dict(reference_images=[png(64, 64, i) for i in range(9)], guides=[(png(64, 96, i), i) for i in range(4)]),
        "the request holds 13 references and guides: allowed 1..12",
    ),
    "audio too long": (
        dict(reference_audio=[tone(16.0)]),
        "REFERENCE_AUDIO[0]: is 16.000 s long (from its header); allowed 2.0..15.0 s",
    ),
    "audio too short": (
        dict(reference_audio=[tone(1.0)]),
        "REFERENCE_AUDIO[0]: is 1.000 s long (from its header); allowed 2.0..15.0 s",
    ),
    "audio over 15 s in all": (
        dict(reference_audio=[tone(8.0, seed=1), tone(8.0, seed=2)]),
        "REFERENCE_AUDIO holds 16.00 s of audio in all: allowed up to 15.0 s",
    ),
    "corrupt wav": (
        dict(reference_audio=[b"RIFF" + bytes(range(200))]),
        "REFERENCE_AUDIO[0]: cannot be read as WAV, FLAC, MP3 (Invalid data found when processing input)",
    ),
    "mp4 without video": (dict(reference_videos=[m4a()]), "REFERENCE_VIDEOS[0]: has no video stream"),
    "5 fps video": (
        dict(reference_videos=[mp4(10, fps=5, audio=False)]),
        "REFERENCE_VIDEOS[0]: is 5 fps; allowed 12..60 fps (resampled to 24)",
    ),
    "aspect 3:1": (dict(reference_images=[png(64, 192, 1)]), "REFERENCE_IMAGES[0]: is 192x64 px"),
    "too small an image": (dict(reference_images=[png(16, 16, 1)]), "REFERENCE_IMAGES[0]: is 16x16 px"),
    "guide beyond the last frame": (
        dict(guides=[(png(64, 96, 1), 9)]),
        "GUIDE_FRAMES value 9 is out of range: allowed 0..8 (the clip's frames)",
    ),
    "too many rows": (
        dict(height=256, width=256, num_frames=121, reference_videos=[mp4(120, 256, 256, audio=False)]),
        "references and guides included) is out of range: allowed 1..4096 (max_batch_rows)",
    ),
    "four outputs of too many rows": (
        dict(num_outputs=4, height=256, width=256, reference_videos=[mp4(48, 256, 256, audio=False)]),
        "(4 x 1344, references and guides included) is out of range: allowed 1..4096 (max_batch_rows)",
    ),
    "repeated guide frame": (
        dict(guides=[(png(64, 96, 1), 3), (png(64, 96, 2), 3)]),
        "GUIDE_FRAMES [3, 3] repeats a frame: one guide per frame",
    ),
    "keyframes with references": (
        dict(first_frame=png(64, 96, 1), reference_images=[png(64, 64, 1)]),
        "KEYFRAMES cannot be mixed with references or guides: send the first and last frames as GUIDES",
    ),
    "t2va with references": (
        dict(task="t2va", reference_images=[png(64, 64, 1)]),
        "TASK='t2va' takes no conditions; got 1",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_references_are_refused_before_any_work(client, case):
    kwargs, message = BAD[case]
    with pytest.raises(H3Error) as raised:
        client.generate("x", **{**SHAPE, "num_inference_steps": 1, **kwargs})
    assert raised.value.code == "INVALID_ARG" and message in raised.value.message, raised.value
    (result,) = client.generate("still serving", num_frames=5, height=32, width=32, num_inference_steps=1, seed=1)
    assert result.info["task"] == "t2va"
