"""The fl2va presentation of the Qwen3-VL text encoder (docs/model.md §4.1): keyframes seen by the vision
tower, on a synthetic official checkpoint (h3_core.weights.official_checkpoint: a 52-layer random
Qwen3-VL with a one-block vision tower, its byte-level tokenizer and a small image processor)."""

import json
import re
import shutil

import numpy as np
import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from h3_core.model.encoder import QWEN3VL_H3_LAYER, TextEncoder
from h3_core.weights.official_checkpoint import TEXT_ENCODER, TOKENIZER, write_synthetic_checkpoint

PROMPT = "a red ball rolls"  # 16 bytes -> 16 tokens of the byte-level tokenizer
# "<Picture 1>: " in the byte-level tokenizer: printable ASCII c is ord(c) - 33, a space 220
PICTURE_1 = [27, 47, 72, 66, 83, 84, 81, 68, 220, 16, 29, 25, 220]
PICTURE_2 = PICTURE_1[:9] + [17] + PICTURE_1[10:]
VISION_START, VISION_END, IMAGE_PAD = 259, 260, 261  # 256 + their index in QWEN_SPECIAL_TOKENS
IMAGE_TOKENS = 20  # a 64x96 keyframe: resized to 128x160 (min pixels 128x128), 8x10 patches of 16, 2x2 merged


def keyframe(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("official") / "h3-synthetic", "tiny")


def qwen3vl(folder, **kwargs) -> TextEncoder:
    return TextEncoder(
        str(folder / TEXT_ENCODER), hidden_layer=QWEN3VL_H3_LAYER, tokenizer_path=str(folder / TOKENIZER), **kwargs
    )


@pytest.fixture(scope="module")
def encoder(checkpoint):
    return qwen3vl(checkpoint)


def model_inputs(encoder: TextEncoder, images: list[np.ndarray]) -> dict:
    """The keyword arguments encode_presentation gives encoder.model (captured by a forward pre-hook)."""
    seen = {}
    handle = encoder.model.register_forward_pre_hook(lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        encoder.encode_presentation(PROMPT, images)
    finally:
        handle.remove()
    return seen


def test_token_ids_spans_and_vision_token_count(encoder):
    images = [keyframe(0), keyframe(1)]
    grid = encoder.image_processor(images=images, return_tensors="pt", input_data_format="channels_last")[
        "image_grid_thw"
    ]
    assert grid.tolist() == [[1, 8, 10], [1, 8, 10]]
    assert int(grid[0].prod()) // encoder.image_processor.merge_size**2 == IMAGE_TOKENS
    block = [VISION_START, *[IMAGE_PAD] * IMAGE_TOKENS, VISION_END]
    prompt_ids = encoder.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    expected = PICTURE_1 + block + PICTURE_2 + block + prompt_ids
    inputs = model_inputs(encoder, images)
    assert inputs["input_ids"].tolist() == [expected]
    assert torch.equal(inputs["image_grid_thw"], grid)
    assert inputs["mm_token_type_ids"].tolist() == [[int(i == IMAGE_PAD) for i in expected]]
    assert inputs["pixel_values"].shape == (2 * 80, 3 * 2 * 16 * 16)
    states, spans = encoder.encode_presentation(PROMPT, images)
    assert spans == [(13, 35), (48, 70)]
    assert all(expected[start] == VISION_START and expected[end - 1] == VISION_END for start, end in spans)
    assert states.shape == (len(expected), 384) == (86, 384) and states.dtype == torch.float32


def test_states_equal_the_full_models_hidden_states_with_the_vision_tower(checkpoint, encoder):
    """transformers' full Qwen3-VL (vision tower, DeepStack, M-RoPE) gives the same rows at
    hidden_states[50] as the 50-layer cut."""
    images = [keyframe(0)]
    inputs = model_inputs(encoder, images)
    full = Qwen3VLForConditionalGeneration.from_pretrained(str(checkpoint / TEXT_ENCODER), local_files_only=True)
    with torch.inference_mode():
        hidden = full.eval().model(**inputs, output_hidden_states=True).hidden_states
    states, _ = encoder.encode_presentation(PROMPT, images)
    assert torch.equal(states, hidden[QWEN3VL_H3_LAYER][0].float())


def test_deterministic_and_sensitive_to_the_keyframe(encoder):
    first, spans = encoder.encode_presentation(PROMPT, [keyframe(0)])
    again, again_spans = encoder.encode_presentation(PROMPT, [keyframe(0)])
    assert torch.equal(first, again) and spans == again_spans == [(13, 35)]
    other, _ = encoder.encode_presentation(PROMPT, [keyframe(2)])
    # causal attention: the label and <|vision_start|> (rows 0..13) do not see the image; row 14 on do
    assert torch.equal(other[:14], first[:14])
    assert all(not torch.equal(other[row], first[row]) for row in range(14, len(first)))
    text, no_spans = encoder.encode_presentation(PROMPT, [])
    assert torch.equal(text, encoder.encode(PROMPT)) and no_spans == []


def test_max_tokens_counts_vision_tokens(checkpoint):
    length = len(PICTURE_1) + IMAGE_TOKENS + 2 + len(PROMPT)  # 51
    states, _ = qwen3vl(checkpoint, max_tokens=length).encode_presentation(PROMPT, [keyframe(0)])
    assert states.shape == (51, 384)
    short = qwen3vl(checkpoint, max_tokens=length - 1)
    message = "prompt and 1 keyframe(s) have 51 tokens (22 in vision blocks); the text encoder accepts at most 50"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        short.encode_presentation(PROMPT, [keyframe(0)])
    assert short.encode(PROMPT).shape == (16, 384)


@pytest.mark.parametrize(
    "image, got",
    [
        (np.zeros((64, 96, 3), dtype=np.float32), "float32 [64, 96, 3]"),
        (np.zeros((64, 96, 4), dtype=np.uint8), "uint8 [64, 96, 4]"),
        (np.zeros((0, 96, 3), dtype=np.uint8), "uint8 [0, 96, 3]"),
        (torch.zeros(64, 96, 3, dtype=torch.uint8), "Tensor"),
    ],
)
def test_bad_keyframes_are_named(encoder, image, got):
    message = f"keyframe 2 must be a uint8 [H, W, 3] RGB array, got {got}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        encoder.encode_presentation(PROMPT, [keyframe(0), image])


def test_vision_tokens_in_the_prompt_are_refused(encoder):
    message = (
        "prompt must not contain <|image_pad|> or <|video_pad|> when keyframes are given: the vision tower's "
        "features would be placed on them"
    )
    for prompt in (f"a <|image_pad|> {PROMPT}", f"<|video_pad|>{PROMPT}"):
        with pytest.raises(ValueError) as info:
            encoder.encode_presentation(prompt, [keyframe(0)])
        assert str(info.value) == message
    assert encoder.encode_presentation(f"a <|image_pad|> {PROMPT}", [])[0].shape == (20, 384)  # text only: as encode


def test_image_processor_file_missing_or_mismatched(checkpoint, tmp_path):
    copy = tmp_path / "copy"
    for name in (TEXT_ENCODER, TOKENIZER):
        shutil.copytree(checkpoint / name, copy / name)
    config = copy / TEXT_ENCODER / "preprocessor_config.json"
    settings = json.loads(config.read_text())
    assert settings["patch_size"] == 16 and settings["merge_size"] == 2 and settings["temporal_patch_size"] == 2
    assert settings["size"] == {"shortest_edge": 128 * 128, "longest_edge": 256 * 256}
    config.write_text(json.dumps(settings | {"patch_size": 14}))
    message = f"{config} has patch_size=14 but the vision tower's config.json has patch_size=16"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qwen3vl(copy)
    config.unlink()
    without = qwen3vl(copy)
    assert without.image_processor is None
    assert torch.equal(without.encode_presentation(PROMPT, [])[0], without.encode(PROMPT))
    message = f"{config} not found: the Qwen3-VL text encoder needs its image processor's settings to encode keyframes"
    with pytest.raises(FileNotFoundError) as info:
        without.encode_presentation(PROMPT, [keyframe(0)])
    assert str(info.value) == message
