"""fl2va end to end through tritonserver (tiny config, CPU): first, last and both keyframes from
the API and the CLI, the geometry echoed in INFO, a conditioned request co-batched with a running
t2va request equal to its solo run bit for bit, and bad keyframes refused with INVALID_ARG before
any model work while the server goes on serving."""

import io
import json
import threading

import numpy as np
import pytest
from PIL import Image

from client.api import H3Error

from .serving import generate_cli
from .test_images import png_header_only

SHAPE = dict(height=64, width=96, num_frames=9, num_inference_steps=3, seed=5)


def png(height: int, width: int, seed: int, mode: str = "RGB") -> bytes:
    """A random-noise PNG of the given size (bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format="PNG")
    return out.getvalue()


def frames(client, prompt: str, **kwargs) -> tuple[np.ndarray, dict]:
    (result,) = client.generate(prompt, return_mp4=False, return_frames=True, **{**SHAPE, **kwargs})
    return result.frames, result.info


def test_first_last_and_both_keyframes(client):
    """Each keyframe set reaches the DiT (another set gives other frames), INFO says the task, the
    keyframes and the geometry; the same request twice gives the same frames."""
    first, last = png(64, 96, 1), png(64, 96, 2)
    plain, plain_info = frames(client, "a door opens")
    results = {}
    for name, kwargs in {
        "first": dict(first_frame=first),
        "last": dict(last_frame=last),
        "both": dict(first_frame=first, last_frame=last),
    }.items():
        results[name], info = frames(client, "a door opens", **kwargs)
        assert info["task"] == "fl2va"
        frames_asked = {"first": [0], "last": [-1], "both": [0, -1]}[name]
        assert info["conditions"] == [{"kind": "keyframe", "frame": frame} for frame in frames_asked]
        assert info["geometry"] == {
            "canvas": "requested",
            "height": 64,
            "width": 96,
            "fit": "crop",
            "keyframe_sizes": [[64, 96]] * (2 if name == "both" else 1),
        }
        assert results[name].shape == (22, 64, 96, 3)  # NUM_FRAMES 9: served aligned to 22
    assert plain_info["task"] == "t2va" and "conditions" not in plain_info
    for a, b in (("first", "last"), ("first", "both"), ("last", "both")):
        assert not np.array_equal(results[a], results[b])
    assert not np.array_equal(plain, results["first"])
    again, _ = frames(client, "a door opens", first_frame=first, last_frame=last)
    assert np.array_equal(again, results["both"])


def test_canvas_follows_the_first_keyframe_and_fit_is_applied(client):
    """Without HEIGHT/WIDTH the canvas takes the first keyframe's aspect at about the default
    canvas area (tiny: 64 x 96 = 6,144 px): a 200 x 100 (w x h) image, aspect 2, gives 55.4 x
    110.9 px, rounded to the nearest multiples of 32: 64 x 96; the image is padded into it."""
    (result,) = client.generate(
        "a wide landscape",
        num_frames=9,
        num_inference_steps=2,
        seed=1,
        first_frame=png(100, 200, 3),
        fit="pad",
        return_mp4=False,
        return_frames=True,
    )
    assert result.info["geometry"] == {
        "canvas": "from the first keyframe's aspect",
        "height": 64,
        "width": 96,
        "fit": "pad",
        "keyframe_sizes": [[100, 200]],
    }
    assert result.frames.shape == (22, 64, 96, 3)


def test_conditioned_request_cobatched_with_t2va_equals_solo(client):
    """K5: an fl2va request that joins a running t2va request (so they share packs) gives the
    frames of its solo run, bit for bit; so does a second fl2va request of another shape."""
    first, last = png(64, 96, 7), png(32, 64, 8)
    solo_a, _ = frames(client, "keyframe a", first_frame=first)
    solo_b, _ = frames(client, "keyframe b", last_frame=last, height=32, width=64, num_frames=5, num_inference_steps=4)
    started, outcome = threading.Event(), {}

    def long_t2va():
        try:
            client.generate(
                "a long one",
                num_frames=5,
                height=32,
                width=32,
                num_inference_steps=400,
                seed=1,
                request_id="long-t2va",
                progress_every=1,
                on_progress=lambda step, total, queue: started.set(),
            )
        except H3Error as error:
            outcome["error"] = error

    thread = threading.Thread(target=long_t2va)
    thread.start()
    assert started.wait(120)
    try:
        results = {}

        def run(name, **kwargs):
            results[name] = frames(client, f"keyframe {name}", **kwargs)

        threads = [
            threading.Thread(target=run, args=("a",), kwargs=dict(first_frame=first)),
            threading.Thread(
                target=run,
                args=("b",),
                kwargs=dict(last_frame=last, height=32, width=64, num_frames=5, num_inference_steps=4),
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        client.cancel("long-t2va")
        thread.join(120)
    assert outcome["error"].code == "CANCELLED"
    (frames_a, info_a), (frames_b, info_b) = results["a"], results["b"]
    assert info_a["largest_pack"] >= 2 and info_b["largest_pack"] >= 2  # the t2va request ran all along
    assert np.array_equal(frames_a, solo_a) and np.array_equal(frames_b, solo_b)


def test_generate_cli_with_keyframes(server, tmp_path):
    first, last = tmp_path / "first.png", tmp_path / "last.png"
    first.write_bytes(png(64, 96, 11))
    last.write_bytes(png(64, 96, 12))
    out = tmp_path / "clip.mp4"
    done = generate_cli(
        server.grpc_url, out, "--first-frame", str(first), "--last-frame", str(last), "--fit", "stretch"
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0


def truncated_png() -> bytes:
    return png(64, 96, 1)[:200]


BAD = {
    "truncated": (dict(first_frame=truncated_png()), "KEYFRAMES[0]: is not a complete PNG image"),
    "not an image": (dict(first_frame=b"hello, world"), "KEYFRAMES[0]: is not an image (no known file signature)"),
    "bomb by header": (
        dict(last_frame=png_header_only(20000, 20000)),
        "KEYFRAMES[0]: refused from its header as a decompression bomb (over max_pixels 40000000)",
    ),
    "1x1": (dict(first_frame=png(1, 1, 1)), "KEYFRAMES[0]: is 1x1 px (width x height as stored)"),
    "aspect": (
        dict(first_frame=png(64, 96, 1), last_frame=png(32, 200, 1)),
        "KEYFRAMES[1]: is 200x32 px (width x height as stored), aspect 6.25",
    ),
    "three keyframes": (None, "KEYFRAMES holds 3 images: allowed 1..2 (the first and the last frame)"),
    "index 5": (None, "KEYFRAME_INDICES value 5 is not allowed: 0 (first frame) or -1 (last frame)"),
    "t2va with a keyframe": (
        dict(first_frame=png(64, 96, 1), task="t2va"),
        "TASK='t2va' takes no conditions; got 1 (send TASK 'fl2va' / 'ref2va' or no TASK)",
    ),
    "fl2va without": (
        dict(task="fl2va"),
        "TASK='fl2va' needs KEYFRAMES (1 or 2 images) and nothing else; got 0 keyframes and 0 guides or references",
    ),
    "one frame, two keyframes": (
        dict(first_frame=png(64, 96, 1), last_frame=png(64, 96, 2), num_frames=1),
        "KEYFRAMES[0] (first frame) and KEYFRAMES[1] (last frame) are different images, but NUM_FRAMES=1 asks for "
        "one frame, which is both: send one keyframe, or NUM_FRAMES >= 2",
    ),
    "fit": (
        dict(first_frame=png(64, 96, 1), fit="zoom"),
        "fit='zoom' is not allowed: allowed ['crop', 'pad', 'stretch']",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_keyframes_are_refused_before_any_work(server, client, case):
    kwargs, message = BAD[case]
    if kwargs is None:  # not expressible through H3Client: raw pipeline inputs
        from tests.serving import raw_stream, tensor

        images = [png(64, 96, i) for i in range(3 if case == "three keyframes" else 1)]
        inputs = [
            tensor("PROMPT", np.array([[b"x"]], dtype=object), "BYTES"),
            tensor("KEYFRAMES", np.array([images], dtype=object), "BYTES"),
        ]
        if case == "index 5":
            inputs.append(tensor("KEYFRAME_INDICES", np.array([[5]], dtype=np.int64), "INT64"))
        responses, error = raw_stream(server.grpc_url, inputs, model="h3_pipeline")
        assert error is not None and "INVALID_ARG: " + message in str(error), error
    else:
        with pytest.raises(H3Error) as raised:
            client.generate("x", num_inference_steps=1, **kwargs)
        assert raised.value.code == "INVALID_ARG" and message in raised.value.message, raised.value
    (result,) = client.generate("still serving", num_frames=5, height=32, width=32, num_inference_steps=1, seed=1)
    assert json.dumps(result.info["task"]) == '"t2va"'
