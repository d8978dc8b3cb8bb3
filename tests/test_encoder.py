import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from h3_core.diffusion.request import GenerationRequest, RequestLimits, validate_request
from h3_core.model.encoder import TextEncoder, minilm_path
from h3_core.protocol import InvalidRequest, check_prompt, check_prompt_bytes, frames_for_seconds
from h3_core.request_model import read_sglang

PROMPT = "a red ball rolls to the left while a low tone plays"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder()


def test_minilm_width_and_token_count(encoder):
    assert encoder.width == 384 and encoder.max_tokens == 256
    assert encoder.count_tokens(PROMPT) == 14
    # [CLS] a red ball rolls to the left while a low tone plays [SEP]
    assert encoder.tokenizer(PROMPT)["input_ids"] == [
        101,
        1037,
        2417,
        3608,
        9372,
        2000,
        1996,
        2187,
        2096,
        1037,
        2659,
        4309,
        3248,
        102,
    ]


def test_encode_shape_values_and_determinism(encoder):
    states = encoder.encode(PROMPT)
    assert states.shape == (14, 384) and states.dtype == torch.float32
    assert torch.equal(states, encoder.encode(PROMPT))
    # Golden values of the pretrained MiniLM's last layer ([CLS] row, first 4 dims).
    golden = torch.tensor([0.158481, 0.034375, -0.185409, -0.367339])
    torch.testing.assert_close(states[0, :4], golden, atol=1e-4, rtol=0)


def test_presentation_is_the_prompt_alone(encoder):
    """MiniLM sees no keyframes: encode_presentation gives encode(prompt) and no vision spans."""
    keyframe = np.full((64, 96, 3), 200, dtype=np.uint8)
    states, spans = encoder.encode_presentation(PROMPT, [keyframe, keyframe])
    assert torch.equal(states, encoder.encode(PROMPT)) and states.shape == (14, 384) and spans == []
    assert torch.equal(encoder.encode_presentation(PROMPT, [])[0], states)


def test_references_are_the_prompt_alone(encoder):
    """MiniLM sees no references: encode_references gives encode(prompt) and no vision spans."""
    image = np.full((64, 96, 3), 200, dtype=np.uint8)
    video = np.full((4, 64, 64, 3), 100, dtype=np.uint8)
    states, spans = encoder.encode_references(PROMPT, [image, image], [video], 1)
    assert torch.equal(states, encoder.encode(PROMPT)) and states.shape == (14, 384) and spans == []
    assert torch.equal(encoder.encode_references(PROMPT, [], [], 0)[0], states)


def test_hidden_layer_selects_output_hidden_states(encoder):
    last = TextEncoder(hidden_layer=6)
    assert torch.equal(last.encode(PROMPT), encoder.encode(PROMPT))
    embeddings = TextEncoder(str(minilm_path()), hidden_layer=0).encode(PROMPT)
    golden = torch.tensor([-0.264108, 0.212983, -0.087894, 0.133383])  # token "a", embedding layer
    torch.testing.assert_close(embeddings[1, :4], golden, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"^hidden_layer must be in \[-7, 6\], got 7$"):
        TextEncoder(hidden_layer=7)
    with pytest.raises(ValueError, match=r"^max_tokens must be in \[1, 512\], got 513$"):
        TextEncoder(max_tokens=513)
    with pytest.raises(FileNotFoundError, match=r"^text encoder folder /nonexistent/encoder not found$"):
        TextEncoder("/nonexistent/encoder")


def test_prompt_errors(encoder):
    long_prompt = "word " * 300
    assert encoder.count_tokens(long_prompt) == 302
    with pytest.raises(ValueError, match=r"^prompt has 302 tokens; the text encoder accepts at most 256$"):
        encoder.encode(long_prompt)
    with pytest.raises(ValueError, match=r"^prompt must be a non-empty string, got ''$"):
        encoder.encode("")
    with pytest.raises(ValueError, match=r"^prompt must contain visible characters, got '  '$"):
        encoder.count_tokens("  ")
    short = TextEncoder(max_tokens=14)
    assert short.encode(PROMPT).shape == (14, 384)
    with pytest.raises(ValueError, match=r"^prompt has 15 tokens; the text encoder accepts at most 14$"):
        short.encode(PROMPT + " softly")


def test_offline_env_loads_local_files_only(encoder, tmp_path):
    # A fresh process with the hub offline and an empty HF cache gives the same states.
    out = tmp_path / "states.safetensors"
    script = (
        "import sys; from safetensors.torch import save_file; from h3_core.model.encoder import TextEncoder; "
        "save_file({'s': TextEncoder().encode(sys.argv[1])}, sys.argv[2])"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    subprocess.run([sys.executable, "-c", script, PROMPT, str(out)], cwd=REPO, env=env, check=True)
    assert torch.equal(load_file(str(out))["s"], encoder.encode(PROMPT))


@pytest.mark.parametrize(
    "prompt,message",
    [
        ("", "prompt must be a non-empty string, got ''"),
        (b"a red ball", "prompt must be a non-empty string, got b'a red ball'"),
        ("\u200b", "prompt must contain visible characters, got '\\u200b'"),
        ("\ufeff", "prompt must contain visible characters, got '\\ufeff'"),
        (
            " \u200b\t\u200d\n\u3000\u2028\u00a0",
            "prompt must contain visible characters, got ' \\u200b\\t\\u200d\\n\\u3000\\u2028\\xa0'",
        ),
        ("\u200b" * 1365, "prompt must contain visible characters, got '" + "\\u200b" * 32 + "'... (1365 characters)"),
    ],
)
def test_prompt_without_visible_characters_is_refused(encoder, prompt, message):
    # 1365 zero-width spaces are 4095 bytes, within max_prompt_bytes; the message quotes 32.
    for check in (check_prompt, encoder.count_tokens, encoder.encode):
        with pytest.raises(ValueError) as info:
            check(prompt)
        assert str(info.value) == message
    request = GenerationRequest(prompt, 32, 32, 1, 1)
    with pytest.raises(ValueError) as info:
        validate_request(request, RequestLimits())
    assert str(info.value) == message


def test_leading_byte_order_mark_is_dropped(encoder):
    assert check_prompt("\ufeff" + PROMPT) == PROMPT
    assert check_prompt("\ufeff\ufeff" + PROMPT) == "\ufeff" + PROMPT  # only one, at the start
    assert check_prompt("a\ufeff\u200bb ") == "a\ufeff\u200bb "  # nothing else changes
    assert check_prompt("\u200ba") == "\u200ba"
    assert encoder.count_tokens("\ufeff" + PROMPT) == 14
    assert torch.equal(encoder.encode("\ufeff" + PROMPT), encoder.encode(PROMPT))


@pytest.mark.parametrize("prompt", ["\u3164", "\ufe0f", "\u2800\u2800", "\u0301\u0301"])
def test_default_ignorable_and_lone_combining_characters_are_not_visible(prompt):
    with pytest.raises(ValueError, match="^prompt must contain visible characters, got "):
        check_prompt(prompt)
    assert check_prompt("e\u0301") == "e\u0301"  # a combining mark on a letter is fine


def test_one_prompt_size_rule_for_the_core_and_h3_encoder():
    """rules.check_prompt_bytes is the size rule of validate_request and of h3_encoder's PROMPT
    read (tests/test_bad_input.py's prompt_over_4096_bytes sends it through the server): a
    leading byte-order mark counts, 4096 bytes pass and 4097 do not."""
    check_prompt_bytes(4096, 4096)
    with pytest.raises(InvalidRequest) as direct:
        check_prompt_bytes(4097, 4096)
    with pytest.raises(InvalidRequest) as core:
        validate_request(GenerationRequest("\ufeff" + "a" * 4094, 32, 32, 1, 1), RequestLimits())
    assert (str(direct.value), direct.value.field) == ("prompt is 4097 bytes: allowed 1..4096", "prompt")
    assert (str(core.value), core.value.field) == ("prompt is 4097 bytes: allowed 1..4096", "prompt")
    validate_request(GenerationRequest("a" * 4096, 32, 32, 1, 1), RequestLimits())


def test_frames_for_seconds_is_the_one_duration_rule():
    assert [frames_for_seconds(s) for s in (0.917, 1, 4, 0.02)] == [22, 24, 96, 0]
    assert (
        read_sglang({"task": "t2va", "prompt": "a", "target": {"duration_seconds": 4}}).num_frames
        == frames_for_seconds(4)
        == 96
    )
