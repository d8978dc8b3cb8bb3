"""The clip length (issue 41, item 1-2): a request for NUM_FRAMES frames is served as a clip of
config.align_num_frames(NUM_FRAMES) = 17n+5 frames, as H3's own servers do, so a LAST_FRAME
keyframe conditions the returned clip's last frame; lengths whose aligned clip passes
max_num_frames are refused naming NUM_FRAMES and the range; keyframes are sorted once, first then
last, in read_keyframes; NUM_FRAMES 1 with two different keyframes is refused naming both."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from h3_core.config import align_num_frames, audio_latent_frames, audio_num_samples, max_requested_frames
from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.request import GenerationRequest
from h3_core.serving.encoder.conditioning import read_keyframes
from h3_core.serving.shared.settings import EncoderSettings
from tests.test_engine import engine  # noqa: F401  (the fixture: tiny, max_num_frames 64)

TEXT = torch.zeros(3, 384)


def last_keyframe_request(num_frames: int) -> tuple[GenerationRequest, list[Condition]]:
    request = GenerationRequest("x", 64, 96, num_frames, 1, seed=1, task="fl2va")
    return request, [Condition("keyframe", -1, torch.zeros(24, 1, 4, 6))]


def test_max_requested_frames_golden():
    maxima = (1, 4, 5, 21, 22, 64, 121, 124, 209)
    assert [max_requested_frames(m) for m in maxima] == [0, 0, 5, 5, 22, 56, 107, 124, 209]


def test_last_frame_keyframe_sits_on_the_served_clips_last_frame(engine):  # noqa: F811
    """Done-when (a): for every NUM_FRAMES 1..max_num_frames (64 here) with a LAST_FRAME keyframe,
    the keyframe's RoPE time is the returned clip's last frame's (5/3 per frame from the target
    origin), and the audio follows the served length; NUM_FRAMES whose aligned clip passes 64 (57..64)
    are refused naming the range. Today's code placed it at frame 21 for NUM_FRAMES 10."""
    limit = engine.limits.max_num_frames
    served_lengths = set()
    for num_frames in range(1, limit + 1):
        request, conditions = last_keyframe_request(num_frames)
        if num_frames > 56:
            with pytest.raises(ValueError) as refused:
                engine.prepare(request, TEXT, conditions)
            assert str(refused.value) == (
                f"num_frames={num_frames} is out of range: allowed 1..56 (NUM_FRAMES; the clip is aligned up to "
                "17n+5 frames, at most max_num_frames=64)"
            )
            continue
        (state,) = engine.prepare(request, TEXT, conditions)
        layout = state.layout
        assert (state.num_frames_requested, state.num_frames) == (num_frames, align_num_frames(num_frames))
        ((block, row),) = layout.blocks()
        keyframe_times = layout.position_ids()[row : row + block.rows, 0]
        last_frame_time = layout.origin + L.FRAME_TIME * (state.num_frames - 1)
        assert torch.allclose(keyframe_times, torch.full_like(keyframe_times, last_frame_time), rtol=0, atol=1e-9)
        assert layout.audio_t == audio_latent_frames(state.num_frames)
        served_lengths.add(state.num_frames)
    assert sorted(served_lengths) == [5, 22, 39, 56]
    # the returned clip has exactly the served length (frames and audio samples)
    request, conditions = last_keyframe_request(10)
    (state,) = engine.prepare(request, TEXT, conditions)
    frames, audio = engine.decode(state)
    assert (frames.shape[0], audio.shape[1]) == (22, audio_num_samples(22))


def png(height: int, width: int, value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), value, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_keyframes_are_sorted_first_then_last_once():
    """KEYFRAME_INDICES [-1, 0]: the rows, the presentation's pictures (images), the geometry's
    sizes and the canvas all follow the first frame's keyframe (KEYFRAMES[1] here)."""
    last, first = png(64, 128, 10), png(128, 64, 200)  # sent last frame first
    keyframes = read_keyframes([last, first], [-1, 0], None, None, "stretch", EncoderSettings(), 64 * 96, 22)
    assert keyframes.frames == [0, -1]
    assert [int(image[0, 0, 0]) for image in keyframes.images] == [200, 10]
    assert keyframes.geometry["keyframe_sizes"] == [[128, 64], [64, 128]]
    assert (keyframes.height, keyframes.width) == (96, 64)  # the first frame's portrait aspect


def test_one_frame_with_two_different_keyframes_is_refused_naming_both():
    """Done-when (c); two equal keyframes, or two frames, are served."""
    settings = EncoderSettings()
    with pytest.raises(ValueError) as refused:
        read_keyframes([png(64, 96, 1), png(64, 96, 2)], [-1, 0], 64, 96, None, settings, 64 * 96, 1)
    assert str(refused.value) == (
        "KEYFRAMES[1] (first frame) and KEYFRAMES[0] (last frame) are different images, but NUM_FRAMES=1 asks for "
        "one frame, which is both: send one keyframe, or NUM_FRAMES >= 2"
    )
    assert read_keyframes([png(64, 96, 1)] * 2, None, 64, 96, None, settings, 64 * 96, 1).frames == [0, -1]
    assert read_keyframes([png(64, 96, 1), png(64, 96, 2)], None, 64, 96, None, settings, 64 * 96, 2).frames == [0, -1]


def test_served_fl2va_at_10_and_21_frames_is_the_22_frame_clip(client):
    """Done-when (b): the same keyframes, prompt and seed at NUM_FRAMES 10, 21 and 22 are served
    as one 22-frame clip, the last keyframe on its last frame, so the last frames are equal (within
    0 px); INFO echoes what was asked. Before, NUM_FRAMES 10 returned 10 frames whose last frame
    was not the one the keyframe conditioned."""
    from tests.test_fl2va_serving import png

    first, last = png(64, 96, 21), png(64, 96, 22)
    clips = {}
    for asked in (10, 21, 22):
        (result,) = client.generate(
            "a door opens",
            height=64,
            width=96,
            num_frames=asked,
            num_inference_steps=2,
            seed=5,
            first_frame=first,
            last_frame=last,
            return_mp4=False,
            return_frames=True,
            return_audio=True,
        )
        assert (result.info["num_frames_requested"], result.info["num_frames"]) == (asked, 22)
        assert result.frames.shape == (22, 64, 96, 3) and result.audio.shape == (2, audio_num_samples(22))
        clips[asked] = result
    for asked in (10, 21):
        assert np.array_equal(clips[asked].frames, clips[22].frames)
        assert np.array_equal(clips[asked].audio, clips[22].audio)


def test_keyframes_beside_guides_advise_guides_the_code_accepts():
    """Item 2: the refusal advised guides at frame -1, which GUIDE_FRAMES refuses."""
    keyframe, guide = L.ConditionBlock("keyframe", 1, 4, 6, 0, -1), L.ConditionBlock("guide", 1, 4, 6, 0, 3)
    with pytest.raises(ValueError) as refused:
        L.make_layout(4, 64, 96, 22, conditions=(keyframe, guide))
    assert str(refused.value) == (
        "keyframes cannot be mixed with guides or references: send guides at frames 0 and num_frames - 1"
    )


def test_keyframes_over_the_rows_or_memory_limits_are_refused_before_any_vae_runs():
    """A fl2va request whose rows (keyframes included, num_outputs of them) pass max_batch_rows, or
    whose memory passes max_request_mb, is refused by read_keyframes, as read_references refuses
    references: before the VAEs run (the text's rows are not known yet). 64 x 96 x 22 frames with
    both keyframes pad to 192 rows an output; memory (request_memory_mb, tiny's hidden size 96):
    96 B x 384 rows x 96 + 160 B x 64 x 96 x 22 voxels = 25,165,824 B = 24 MiB."""
    files = [png(64, 96, 1), png(64, 96, 2)]
    with pytest.raises(ValueError) as refused:
        read_keyframes(files, [0, -1], 64, 96, None, EncoderSettings(max_batch_rows=256), 64 * 96, 22, None, 2)
    assert str(refused.value) == (
        "rows=384 (2 x 192, keyframes included) is out of range: allowed 1..256 (max_batch_rows): "
        "send fewer outputs, fewer frames, or a smaller canvas"
    )
    with pytest.raises(ValueError) as refused:
        read_keyframes(files, [0, -1], 64, 96, None, EncoderSettings(max_request_mb=1), 64 * 96, 22, None, 2)
    assert str(refused.value) == (
        "memory=24 MiB (keyframes included) is out of range: allowed up to 1 MiB (max_request_mb)"
    )
    served = read_keyframes(files, [0, -1], 64, 96, None, EncoderSettings(max_batch_rows=384), 64 * 96, 22, None, 2)
    assert served.frames == [0, -1]
