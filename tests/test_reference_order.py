"""References in the order given (issue 41, item 3): REFERENCES (protocol.reference_list) orders
the reference blocks, so where each sits in RoPE time and how the prompt numbers it follow the
request; a reference video's start_time_seconds; a video used without its audio ("video", not
"video_audio"). Served: an audio-then-image request differs from image-then-audio, INFO lists
the blocks in that order with the file each came from, and each equals the in-process run whose
conditions are in that order (the row order of H3's layout)."""

import json

import numpy as np
import pytest
import torch

from h3_core.inputs.references import MediaLimits, decode_video
from h3_core.protocol import REFERENCE_AUDIO, REFERENCE_IMAGES, REFERENCE_VIDEOS, reference_list

from .serving import raw_stream, tensor
from .test_fl2va_serving import png
from .test_ref2va_serving import mp4, tone

COUNTS = {REFERENCE_IMAGES: 2, REFERENCE_VIDEOS: 1, REFERENCE_AUDIO: 1}


def entry(name: str, index: int, start: float = 0.0, audio: bool = True) -> dict:
    return {"input": name, "index": index, "start_time_seconds": start, "audio": audio}


def test_reference_list_default_and_given_order():
    assert reference_list(None, COUNTS) == [
        entry(REFERENCE_IMAGES, 0),
        entry(REFERENCE_IMAGES, 1),
        entry(REFERENCE_VIDEOS, 0),
        entry(REFERENCE_AUDIO, 0),
    ]
    given = [
        {"input": REFERENCE_AUDIO, "index": 0},
        {"input": REFERENCE_VIDEOS, "index": 0, "start_time_seconds": 1, "audio": False},
        {"input": REFERENCE_IMAGES, "index": 1},
        {"input": REFERENCE_IMAGES, "index": 0},
    ]
    assert reference_list(json.dumps(given).encode(), COUNTS) == [
        entry(REFERENCE_AUDIO, 0),
        entry(REFERENCE_VIDEOS, 0, 1.0, False),
        entry(REFERENCE_IMAGES, 1),
        entry(REFERENCE_IMAGES, 0),
    ]


@pytest.mark.parametrize(
    "given, message",
    [
        ("[", "REFERENCES is not valid JSON: Expecting value: line 1 column 2 (char 1)"),
        ('{"input": 1}', 'REFERENCES must be a JSON array of objects, got {"input": 1}'),
        (
            [{"input": "GUIDES", "index": 0}],
            "REFERENCES[0] input 'GUIDES' is not allowed: allowed ['REFERENCE_IMAGES', 'REFERENCE_VIDEOS', "
            "'REFERENCE_AUDIO']",
        ),
        (
            [{"input": REFERENCE_AUDIO, "index": 1}],
            "REFERENCES[0] index 1 is out of range: REFERENCE_AUDIO holds 1 files",
        ),
        (
            [{"input": REFERENCE_AUDIO, "index": 0, "audio": False}],
            "REFERENCES[0]: start_time_seconds and audio are for REFERENCE_VIDEOS only",
        ),
        (
            [{"input": REFERENCE_VIDEOS, "index": 0, "start_time_seconds": -1}],
            "REFERENCES[0] start_time_seconds=-1 is out of range: allowed finite >= 0 seconds",
        ),
        (
            [{"input": REFERENCE_VIDEOS, "index": 0, "colour": 1}],
            "REFERENCES[0] has unknown key 'colour'; allowed: ['input', 'index', 'start_time_seconds', 'audio']",
        ),
        (
            [{"input": REFERENCE_AUDIO, "index": 0}, {"input": REFERENCE_AUDIO, "index": 0}],
            "REFERENCES lists REFERENCE_AUDIO[0] twice: list every reference file once",
        ),
        (
            [{"input": REFERENCE_AUDIO, "index": 0}],
            "REFERENCES leaves out REFERENCE_IMAGES[0]: list every reference file once",
        ),
    ],
)
def test_reference_list_refusals_name_the_entry(given, message):
    with pytest.raises(ValueError) as refused:
        reference_list(given if isinstance(given, str) else json.dumps(given), COUNTS)
    assert str(refused.value) == message


def test_video_start_time_and_without_its_audio():
    """start_time_seconds 0.5 keeps output frames 12.. and the track from sample 16000; audio
    false decodes no track; a start that leaves fewer than 5 frames is refused."""
    data, limits = mp4(48, seed=3), MediaLimits()
    frames, track = decode_video(data, "REFERENCE_VIDEOS[0]", limits)
    later, later_track = decode_video(data, "REFERENCE_VIDEOS[0]", limits, start_s=0.5)
    assert np.array_equal(later, frames[12:]) and later_track.shape == (2, 48000)
    np.testing.assert_array_equal(later_track, track[:, 16000:64000])
    silent, none = decode_video(data, "REFERENCE_VIDEOS[0]", limits, with_audio=False)
    assert np.array_equal(silent, frames) and none is None
    with pytest.raises(ValueError) as refused:
        decode_video(data, "REFERENCE_VIDEOS[0]", limits, start_s=1.9)
    assert str(refused.value) == (
        "REFERENCE_VIDEOS[0]: start_time_seconds=1.9 leaves 2 of its 48 frames at 24 fps; allowed 0..1.792 s "
        "(at least min_video_frames 5 frames from it)"
    )


SHAPE = dict(HEIGHT=64, WIDTH=96, NUM_FRAMES=22, NUM_INFERENCE_STEPS=2, SEED=5)


def served(server, files: dict, order: list | None):
    inputs = [tensor("PROMPT", np.array([[b"a voice and a face"]], dtype=object), "BYTES")]
    inputs += [tensor(name, np.array([[value]], dtype=np.int64), "INT64") for name, value in SHAPE.items()]
    inputs += [tensor(name, np.array([data], dtype=object), "BYTES") for name, data in files.items()]
    if order is not None:
        inputs.append(tensor("REFERENCES", np.array([[json.dumps(order).encode()]], dtype=object), "BYTES"))
    responses, error = raw_stream(
        server.grpc_url, inputs, parameters={"return_mp4": False, "return_frames": True, "return_audio": True}
    )
    assert error is None, error
    infos = [r.as_numpy("INFO") for r in responses]
    (result,) = [r for r, i in zip(responses, infos, strict=True) if i is not None and b'"kind": "result"' in i[0, 0]]
    return result.as_numpy("FRAMES")[0], result.as_numpy("AUDIO")[0], json.loads(result.as_numpy("INFO")[0, 0])


def in_process(files: dict, order: list | None):
    """The same request computed here, with the served models' one CPU thread."""
    from h3_core.diffusion.request import GenerationRequest
    from h3_core.factory import load_engine
    from h3_core.serving.encoder.conditioning import read_references, reference_conditions
    from h3_core.serving.shared.settings import EncoderSettings
    from h3_core.weights.checkpoint_setup import DEFAULT_ROOT

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        settings = EncoderSettings()
        refs = read_references(files, None, 64, 96, 22, 1, None, settings, (64, 96), json.dumps(order))
        engine = load_engine("tiny", DEFAULT_ROOT / "tiny")
        conditions = reference_conditions(engine.video_vae, engine.audio_vae, refs)
        request = GenerationRequest("a voice and a face", 64, 96, 22, 2, seed=5, task="ref2va")
        ((_, frames, audio),) = engine.generate(request, None, conditions)
    finally:
        torch.set_num_threads(threads)
    return frames.numpy(), audio.numpy()


def test_audio_then_image_differs_from_image_then_audio(server):
    """Done-when (d)."""
    files = {REFERENCE_IMAGES: [png(64, 64, 2)], REFERENCE_AUDIO: [tone(2.0, seed=4)]}
    audio_first = [{"input": REFERENCE_AUDIO, "index": 0}, {"input": REFERENCE_IMAGES, "index": 0}]
    image_first = audio_first[::-1]
    results = {}
    for name, order in (("audio first", audio_first), ("image first", image_first)):
        frames, audio, info = served(server, files, order)
        kinds = [(block["kind"], block["input"]) for block in info["conditions"]]
        expected = [("audio" if item["input"] == REFERENCE_AUDIO else "image", f"{item['input']}[0]") for item in order]
        assert kinds == expected, name
        local_frames, local_audio = in_process(files, order)
        assert np.array_equal(frames, local_frames) and np.array_equal(audio, local_audio), name
        results[name] = frames
    assert not np.array_equal(results["audio first"], results["image first"])
    default, _, info = served(server, files, None)  # without REFERENCES: images, videos, audio
    assert [block["kind"] for block in info["conditions"]] == ["image", "audio"]
    assert np.array_equal(default, results["image first"])
