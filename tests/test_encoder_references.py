"""The ref2va presentation of the Qwen3-VL text encoder (docs/model.md §4.1): reference images, timestamped
reference videos and audio labels, on a synthetic official checkpoint's Qwen3-VL
(h3_core.weights.official_checkpoint: a 52-layer random Qwen3-VL with a one-block vision tower, its
byte-level tokenizer, a small image processor and video processor)."""

import json
import re
import shutil
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from h3_core.model.encoder import QWEN3VL_H3_LAYER, TextEncoder
from h3_core.model.presentation import video_patches
from h3_core.weights.official_checkpoint import (
    TEXT_ENCODER,
    TOKENIZER,
    tiny_qwen3vl,
    write_byte_tokenizer,
    write_random_qwen3vl,
)
from tests.test_encoder_vision import qwen3vl

PROMPT = "a red ball rolls"  # 16 bytes -> 16 tokens of the byte-level tokenizer
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 259, 260, 261, 262  # 256 + their index in QWEN_SPECIAL_TOKENS
IMAGE_TOKENS = 20  # a 64x96 image: resized to 128x160 (min pixels 128x128), 8x10 patches of 16, 2x2 merged
# a 4-frame 64x64 video (all 4 frames sampled): frames x pixels below the video minimum 2x128x128, so
# resized to 96x96: grid [2, 6, 6], 2 temporal groups of 9 video tokens
GROUP_TOKENS = 9


def text_ids(text: str) -> list[int]:
    """The byte-level tokenizer's ids of printable ASCII `text`: ord(c) - 33, a space 220."""
    return [220 if char == " " else ord(char) - 33 for char in text]


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8)


def video(seed: int, frames: int = 4, side: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, side, side, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("official")
    write_random_qwen3vl(folder / TEXT_ENCODER, tiny_qwen3vl(384))
    write_byte_tokenizer(folder / TOKENIZER)
    return folder


@pytest.fixture(scope="module")
def encoder(checkpoint):
    return qwen3vl(checkpoint)


def model_inputs(encoder: TextEncoder, *references) -> dict:
    """The keyword arguments encode_references gives encoder.model (captured by a forward pre-hook)."""
    seen = {}
    handle = encoder.model.register_forward_pre_hook(lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        encoder.encode_references(PROMPT, *references)
    finally:
        handle.remove()
    return seen


def test_token_ids_spans_and_vision_token_counts(encoder):
    inputs = model_inputs(encoder, [image(0), image(1)], [video(2)], 1)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 10], [1, 8, 10]]
    assert inputs["video_grid_thw"].tolist() == [[2, 6, 6]]
    assert 6 * 6 // encoder.video_processor.merge_size**2 == GROUP_TOKENS
    assert encoder.video_processor.get_num_of_video_patches(4, 64, 64) == 2 * 6 * 6  # transformers' own count
    assert inputs["pixel_values"].shape == (2 * 80, 3 * 2 * 16 * 16)
    assert inputs["pixel_values_videos"].shape == (72, 3 * 2 * 16 * 16)
    assert inputs["pixel_values_videos"].dtype == torch.float32
    image_block = [VISION_START, *[IMAGE_PAD] * IMAGE_TOKENS, VISION_END]
    video_block = [VISION_START, *[VIDEO_PAD] * GROUP_TOKENS, VISION_END]
    # timestamps: frames 0..3 at 24 fps, the mean of each group's first and last frame: 1/48 s and 5/48 s
    expected = (
        text_ids("<Picture 1>: ")
        + image_block
        + text_ids("<Picture 2>: ")
        + image_block
        + text_ids("<Video 1>: <0.0 seconds>")
        + video_block
        + text_ids("<0.1 seconds>")
        + video_block
        + text_ids("<Audio 1>: " + PROMPT)
    )
    assert inputs["input_ids"].tolist() == [expected]
    token_types = [1 if i == IMAGE_PAD else 2 if i == VIDEO_PAD else 0 for i in expected]
    assert inputs["mm_token_type_ids"].tolist() == [token_types]
    states, spans = encoder.encode_references(PROMPT, [image(0), image(1)], [video(2)], 1)
    assert spans == [(13, 35), (48, 70), (94, 105), (118, 129)]
    assert all(expected[start] == VISION_START and expected[end - 1] == VISION_END for start, end in spans)
    assert states.shape == (len(expected), 384) == (156, 384) and states.dtype == torch.float32


def test_video_text_is_the_qwen3vl_processors(encoder):
    """A 2-second clip: 4 frames sampled at the processor's 2 a second (0, 16, 31, 47); its text is
    what transformers' Qwen3VLProcessor.replace_video_token writes for them."""
    clip = video(3, frames=48, side=32)
    inputs = model_inputs(encoder, [], [clip], 0)
    assert inputs["video_grid_thw"].tolist() == [[2, 6, 6]]
    block = "<|vision_start|>" + "<|video_pad|>" * GROUP_TOKENS + "<|vision_end|>"
    text = f"<Video 1>: <0.3 seconds>{block}<1.6 seconds>{block}{PROMPT}"  # (0 + 16) / 48 s, (31 + 47) / 48 s
    assert inputs["input_ids"][0].tolist() == encoder.tokenizer(text)["input_ids"]
    processor = SimpleNamespace(
        video_processor=encoder.video_processor,
        vision_start_token="<|vision_start|>",
        video_token="<|video_pad|>",
        vision_end_token="<|vision_end|>",
        _calculate_timestamps=partial(Qwen3VLProcessor._calculate_timestamps, None),
    )
    metadata = VideoMetadata(total_num_frames=48, fps=24, frames_indices=[0, 16, 31, 47])
    video_inputs = {"video_grid_thw": inputs["video_grid_thw"], "video_metadata": [metadata]}
    assert f"<Video 1>: {Qwen3VLProcessor.replace_video_token(processor, video_inputs, 0)}{PROMPT}" == text


def test_video_pixels_match_the_image_processors(encoder):
    """A 2-frame 64x96 clip is sized as an image is (128x160): each frame's half of a temporal patch
    is the image processor's pixels of that frame; later groups hold later frames."""
    first, second = image(4), image(5)
    pixels, grid, seconds = video_patches(encoder.video_processor, np.stack([first, second]))
    assert grid == [1, 8, 10] and seconds == [1 / 48]

    def image_pixels(frame):
        out = encoder.image_processor(images=[frame], return_tensors="np", input_data_format="channels_last")
        return out["pixel_values"].reshape(80, 3, 2, 256)

    halves = pixels.reshape(80, 3, 2, 256)
    assert np.array_equal(halves[:, :, 0], image_pixels(first)[:, :, 0])
    assert np.array_equal(halves[:, :, 1], image_pixels(second)[:, :, 1])
    assert np.array_equal(
        video_patches(encoder.video_processor, np.stack([first, first]))[0], image_pixels(first).reshape(80, -1)
    )
    # 3 frames are padded with the last to 2 groups; group 2 is frame 3 twice
    frames = np.stack([first, first, second])
    pixels, grid, seconds = video_patches(encoder.video_processor, frames)
    same = video_patches(encoder.video_processor, np.stack([second] * 3))[0]
    assert grid[0] == 2 and seconds == [1 / 48, 2 / 24]
    half = len(pixels) // 2
    assert np.array_equal(pixels[half:], same[half:]) and not np.array_equal(pixels[:half], same[:half])


def test_states_equal_the_full_models_hidden_states_with_an_image_and_a_video(checkpoint, encoder):
    """transformers' full Qwen3-VL (vision tower on images and video frames, DeepStack, M-RoPE) gives
    the same rows at hidden_states[50] as the 50-layer cut."""
    references = ([image(0)], [video(2)], 1)
    inputs = model_inputs(encoder, *references)
    full = Qwen3VLForConditionalGeneration.from_pretrained(str(checkpoint / TEXT_ENCODER), local_files_only=True)
    with torch.inference_mode():
        hidden = full.eval().model(**inputs, output_hidden_states=True).hidden_states
    states, spans = encoder.encode_references(PROMPT, *references)
    assert spans == [(13, 35), (59, 70), (83, 94)]
    assert torch.equal(states, hidden[QWEN3VL_H3_LAYER][0].float())


def test_deterministic_and_sensitive_to_the_video(encoder):
    first, spans = encoder.encode_references(PROMPT, [image(0)], [video(2)], 0)
    again, again_spans = encoder.encode_references(PROMPT, [image(0)], [video(2)], 0)
    assert torch.equal(first, again) and spans == again_spans == [(13, 35), (59, 70), (83, 94)]
    other, _ = encoder.encode_references(PROMPT, [image(0)], [video(6)], 0)
    # causal attention: the rows before the first video token (60) do not see the video; the rest do
    assert torch.equal(other[:60], first[:60])
    assert all(not torch.equal(other[row], first[row]) for row in range(60, len(first)))


def test_audio_labels_alone_are_text(encoder):
    states, spans = encoder.encode_references(PROMPT, [], [], 2)
    assert spans == [] and torch.equal(states, encoder.encode(f"<Audio 1>: <Audio 2>: {PROMPT}"))
    assert states.shape == (22 + 16, 384)
    text, no_spans = encoder.encode_references(PROMPT, [], [], 0)
    assert torch.equal(text, encoder.encode(PROMPT)) and no_spans == []
    # with audio labels alone no vision token is placed: vision tokens in the prompt are text
    assert encoder.encode_references(f"<|video_pad|>{PROMPT}", [], [], 1)[0].shape == (11 + 17, 384)


def test_max_tokens_counts_every_token(checkpoint):
    references = ([image(0), image(1)], [video(2)], 1)
    states, _ = qwen3vl(checkpoint, max_tokens=156).encode_references(PROMPT, *references)
    assert states.shape == (156, 384)
    message = (
        "prompt and 2 image(s), 1 video(s), 1 audio clip(s) have 156 tokens (66 in vision blocks); the text "
        "encoder accepts at most 155"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qwen3vl(checkpoint, max_tokens=155).encode_references(PROMPT, *references)


@pytest.mark.parametrize(
    "clip, got",
    [
        (np.zeros((4, 64, 64, 3), dtype=np.float32), "float32 [4, 64, 64, 3]"),
        (np.zeros((64, 64, 3), dtype=np.uint8), "uint8 [64, 64, 3]"),
        (np.zeros((1, 64, 64, 3), dtype=np.uint8), "uint8 [1, 64, 64, 3]"),
        (np.zeros((4, 0, 64, 3), dtype=np.uint8), "uint8 [4, 0, 64, 3]"),
        ([np.zeros((64, 64, 3), dtype=np.uint8)] * 4, "list"),
    ],
)
def test_bad_videos_are_named(encoder, clip, got):
    message = f"video 2 must be a uint8 [T, H, W, 3] RGB array of at least 2 frames, got {got}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        encoder.encode_references(PROMPT, [], [video(2), clip], 0)


def test_bad_images_audio_count_and_vision_tokens_are_refused(encoder):
    message = "image 2 must be a uint8 [H, W, 3] RGB array, got uint8 [64, 96, 4]"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        encoder.encode_references(PROMPT, [image(0), np.zeros((64, 96, 4), dtype=np.uint8)], [], 0)
    for count in (-1, 1.0):
        with pytest.raises(ValueError, match=f"^audio_count must be an int >= 0, got {count}$"):
            encoder.encode_references(PROMPT, [image(0)], [], count)
    for images, videos, given in (([image(0)], [video(2)], "images or videos"), ([], [video(2)], "videos")):
        message = (
            f"prompt must not contain <|image_pad|> or <|video_pad|> when {given} are given: the vision "
            "tower's features would be placed on them"
        )
        with pytest.raises(ValueError) as info:
            encoder.encode_references(f"<|image_pad|>{PROMPT}", images, videos, 0)
        assert str(info.value) == message


def test_video_processor_file_missing_or_mismatched(checkpoint, tmp_path):
    copy = tmp_path / "copy"
    for name in (TEXT_ENCODER, TOKENIZER):
        shutil.copytree(checkpoint / name, copy / name)
    config = copy / TEXT_ENCODER / "video_preprocessor_config.json"
    settings = json.loads(config.read_text())
    assert settings["patch_size"] == 16 and settings["merge_size"] == 2 and settings["temporal_patch_size"] == 2
    assert settings["size"] == {"shortest_edge": 2 * 128 * 128, "longest_edge": 8 * 256 * 256}
    assert settings["fps"] == 2 and settings["image_mean"] == settings["image_std"] == [0.5, 0.5, 0.5]
    config.write_text(json.dumps(settings | {"temporal_patch_size": 4}))
    message = f"{config} has temporal_patch_size=4 but the vision tower's config.json has temporal_patch_size=2"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qwen3vl(copy)
    config.unlink()
    without = qwen3vl(copy)
    assert without.video_processor is None
    assert without.encode_references(PROMPT, [image(0)], [], 1)[1] == [(13, 35)]  # images need no video processor
    message = f"{config} not found: the Qwen3-VL text encoder needs its video processor's settings to encode videos"
    with pytest.raises(FileNotFoundError) as info:
        without.encode_references(PROMPT, [], [video(2)], 0)
    assert str(info.value) == message


def test_the_presentation_follows_the_block_order(encoder):
    """Issue 41 item 3: order ["audio", "video", "image"] presents <Audio 1>, <Video 1>, then
    <Picture 1> (each kind numbered from 1), the vision tower's inputs unchanged; an order that does
    not match the items is refused."""
    order = ["audio", "video", "image"]
    inputs = model_inputs(encoder, [image(0)], [video(2)], 1, order)
    image_block = [VISION_START, *[IMAGE_PAD] * IMAGE_TOKENS, VISION_END]
    video_block = [VISION_START, *[VIDEO_PAD] * GROUP_TOKENS, VISION_END]
    expected = (
        text_ids("<Audio 1>: <Video 1>: <0.0 seconds>")
        + video_block
        + text_ids("<0.1 seconds>")
        + video_block
        + text_ids("<Picture 1>: ")
        + image_block
        + text_ids(PROMPT)
    )
    assert inputs["input_ids"].tolist() == [expected]
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 10]] and inputs["video_grid_thw"].tolist() == [[2, 6, 6]]
    states, spans = encoder.encode_references(PROMPT, [image(0)], [video(2)], 1, order)
    default, _ = encoder.encode_references(PROMPT, [image(0)], [video(2)], 1)
    assert [expected[start] for start, _ in spans] == [VISION_START] * 3 and states.shape == default.shape
    assert not torch.equal(states, default)
    with pytest.raises(ValueError) as refused:
        encoder.encode_references(PROMPT, [image(0)], [], 1, ["image", "video"])
    assert str(refused.value) == (
        "order ['image', 'video'] must list 'image', 'video' and 'audio' once per item: "
        "{'image': 1, 'video': 0, 'audio': 1}"
    )
