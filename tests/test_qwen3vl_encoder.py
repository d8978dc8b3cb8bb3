"""The Qwen3-VL text encoder of the official checkpoint (docs/model.md §4.1), on a tiny random
Qwen3-VL and byte-level tokenizer written in the official layout (nothing downloaded)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

from h3_core.model.encoder import (
    QWEN3VL_H3_LAYER,
    TextEncoder,
    drawn_weight_bytes,
    load_qwen3vl,
    minilm_path,
    text_width,
    weight_bytes,
)
from h3_core.weights.official_checkpoint import (
    QWEN3VL_H3,
    tiny_qwen3vl,
    write_byte_tokenizer,
    write_random_qwen3vl,
    write_weightless_qwen3vl,
)

PROMPT = "a red ball rolls"  # 16 bytes -> 16 tokens of the byte-level tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl")
    text = write_random_qwen3vl(root / "text_encoder", tiny_qwen3vl(64, 4), dtype="float32")
    return text, write_byte_tokenizer(root / "tokenizer")


def test_layout_shape_dtype_and_golden_value(folders):
    text, tokenizer = folders
    config = json.loads((text / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl" and config["text_config"]["num_hidden_layers"] == 4
    assert text_width(text) == 64
    encoder = TextEncoder(str(text), hidden_layer=2, tokenizer_path=str(tokenizer))
    assert encoder.width == 64 and encoder.count_tokens(PROMPT) == 16
    # verbatim, no special tokens: one token per byte ("a" is byte-level symbol 64, " " is 220)
    assert encoder.tokenizer(PROMPT, add_special_tokens=False)["input_ids"][:3] == [64, 220, 81]
    states = encoder.encode(PROMPT)
    assert states.shape == (16, 64) and states.dtype == torch.float32
    golden = torch.tensor([-2.418106, -2.487848, -0.800350, -3.177398])  # token "a", after decoder layer 1
    torch.testing.assert_close(states[0, :4], golden, atol=1e-4, rtol=0)


def test_cut_equals_full_models_hidden_states(folders):
    """A k-layer cut gives exactly the full model's hidden_states[k] for k below the depth; at
    the full depth transformers' last entry is after the final norm (the trap), which the cut
    does not apply."""
    text, tokenizer = folders
    full = Qwen3VLForConditionalGeneration.from_pretrained(str(text), local_files_only=True).eval()
    cuts = [TextEncoder(str(text), hidden_layer=k, tokenizer_path=str(tokenizer)) for k in range(5)]
    ids = torch.tensor([cuts[0].tokenizer(PROMPT, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        hidden = full.model.language_model(
            input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True
        ).hidden_states
        for k in range(4):
            assert torch.equal(cuts[k].encode(PROMPT), hidden[k][0])
        residual = cuts[4].encode(PROMPT)
        assert not torch.equal(residual, hidden[4][0])
        assert torch.equal(full.model.language_model.norm(residual[None])[0], hidden[4][0])


def test_layer_selection_refused_and_unused_layers_never_read(folders, tmp_path):
    text, tokenizer = folders
    with pytest.raises(
        ValueError,
        match=r"^hidden_layer=50 is out of range for the Qwen3-VL text encoder .*text_encoder: it has 4 "
        r"decoder layers, so allowed 0\.\.4 \(H3 uses 50\)$",
    ):
        TextEncoder(str(text), hidden_layer=50, tokenizer_path=str(tokenizer))
    # a copy without decoder layer 3's tensors still loads a 3-layer cut: they are never read
    cut = tmp_path / "text_encoder"
    cut.mkdir()
    (cut / "config.json").write_text((text / "config.json").read_text())
    state = load_file(str(text / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layers.3." not in k}, str(cut / "model.safetensors"))
    three = TextEncoder(str(cut), hidden_layer=3, tokenizer_path=str(tokenizer)).encode(PROMPT)
    assert torch.equal(three, TextEncoder(str(text), hidden_layer=3, tokenizer_path=str(tokenizer)).encode(PROMPT))
    with pytest.raises(ValueError, match=r"text_encoder is missing tensor 'model\.language_model\.layers\.3\."):
        TextEncoder(str(cut), hidden_layer=4, tokenizer_path=str(tokenizer))


def test_bf16_checkpoint_gives_float32_states(tmp_path):
    text = write_random_qwen3vl(tmp_path / "text_encoder", tiny_qwen3vl(64, 2))  # bf16, as MiniMax-H3's
    tokenizer = write_byte_tokenizer(tmp_path / "tokenizer")
    encoder = TextEncoder(str(text), hidden_layer=2, tokenizer_path=str(tokenizer))
    assert next(encoder.model.parameters()).dtype == torch.bfloat16
    states = encoder.encode(PROMPT)
    assert states.dtype == torch.float32 and states.shape == (16, 64)
    assert torch.equal(states, encoder.encode(PROMPT))
    with pytest.raises(FileNotFoundError, match=r"^tokenizer folder /nonexistent/tokenizer not found$"):
        TextEncoder(str(text), hidden_layer=2, tokenizer_path="/nonexistent/tokenizer")


def test_weight_bytes_counts_what_the_cut_loads(folders):
    """The writer reserves the text encoder's weights on its GPU: read from the safetensors headers,
    they equal the bytes of the parameters the k-layer cut holds (its vision tower included)."""
    text, tokenizer = folders
    for layers in (0, 2, 4):
        encoder = TextEncoder(str(text), hidden_layer=layers, tokenizer_path=str(tokenizer))
        loaded = sum(p.numel() * p.element_size() for p in encoder.model.parameters())
        assert weight_bytes(text, layers) == loaded
    # float32, width 64, vocabulary 263: embedding 67,328 B; a layer (q 64x128, k and v 64x64, o 128x64,
    # MLP 3 x 64x128, norms 2 x 64 + 2 x 32) 197,376 B; the vision tower 432,384 B = 4 x 108,096: patch
    # conv 3x2x16x16 -> 32 + bias 49,184, positions 16x32 512, one block (2 layer norms 128, qkv 3,168,
    # proj 1,056, MLP 2,112 + 2,080) 8,544, merger (norm 64, 128x128 + 128, 128x64 + 64) 24,832 and one
    # DeepStack merger (norm 256, same linears) 25,024
    assert weight_bytes(text, 2) == 67_328 + 2 * 197_376 + 432_384


def test_seeded_random_weights_from_a_config_only_folder(tmp_path):
    """encoder_weights random:SEED: the model is built from config.json alone (the folder has no
    weights) and drawn by init_weights on the encoder's device: the same seed gives bit-identical
    weights and states, another seed others."""
    folder = write_weightless_qwen3vl(tmp_path / "qwen3vl", tiny_qwen3vl(64, 4))
    assert not list(folder.glob("*.safetensors*"))
    assert {"config.json", "preprocessor_config.json", "video_preprocessor_config.json", "tokenizer.json"} <= {
        path.name for path in folder.iterdir()
    }
    first, again, other = (TextEncoder(str(folder), 3, encoder_weights=w) for w in ("random:0", "random:0", "random:1"))
    state, state_again, state_other = (e.model.state_dict() for e in (first, again, other))
    assert state.keys() == state_again.keys() == state_other.keys()
    assert all(torch.equal(state[name], state_again[name]) for name in state)
    assert len(first.model.language_model.layers) == 3 and next(first.model.parameters()).dtype == torch.bfloat16
    # init_weights draws in parameter-name order: the embedding is first, N(0, 1/64) from the seed's generator
    embedding = torch.randn((263, 64), generator=torch.Generator().manual_seed(0)) / 8
    assert torch.equal(state["language_model.embed_tokens.weight"], embedding.to(torch.bfloat16))
    assert torch.equal(state["language_model.layers.0.input_layernorm.weight"], torch.ones(64, dtype=torch.bfloat16))
    embedding_name = "language_model.embed_tokens.weight"
    assert not torch.equal(state[embedding_name], state_other[embedding_name])
    states = first.encode(PROMPT)
    assert states.shape == (16, 64) and states.dtype == torch.float32
    assert torch.equal(states, again.encode(PROMPT)) and not torch.equal(states, other.encode(PROMPT))
    with pytest.raises(OSError, match=r"qwen3vl holds no model\.safetensors or model\.safetensors\.index\.json$"):
        TextEncoder(str(folder), 3)  # encoder_weights "": the weights are read, and there are none


@pytest.mark.parametrize("weights", ["random:", "random:-1", "seed:0", "random:0x1"])
def test_malformed_encoder_weights_are_refused_naming_the_field(folders, weights):
    text, tokenizer = folders
    with pytest.raises(ValueError) as caught:
        TextEncoder(str(text), 2, tokenizer_path=str(tokenizer), encoder_weights=weights)
    assert str(caught.value) == (
        f'encoder_weights={weights!r} is not allowed: "" (read the weights from the folder\'s safetensors) or '
        "random:SEED (seeded random weights) with SEED an integer in 0..9223372036854775806, e.g. random:0"
    )


def test_random_weights_are_refused_for_other_encoders():
    with pytest.raises(ValueError) as caught:
        TextEncoder(None, encoder_weights="random:0")
    assert str(caught.value) == (
        f"encoder_weights='random:0' is for Qwen3-VL encoder folders (config.json model_type \"qwen3_vl\"); "
        f"{minilm_path()} is model_type 'bert': use encoder_weights \"\""
    )


def test_weightless_qwen3vl_at_minimax_h3s_sizes(tmp_path):
    """The config-only folder of MiniMax-H3's text encoder: its 50-layer cut, built on the meta
    device, has the text decoder's 25,157,829,120 parameters (measured on the H200 too) and
    transformers' default Qwen3-VL vision tower projecting to 5120; the byte-level tokenizer's ids
    lie inside its 151,936-token vocabulary."""
    folder = write_weightless_qwen3vl(tmp_path / "qwen3vl")
    text = json.loads((folder / "config.json").read_text())["text_config"]
    assert (text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (
        5120,
        64,
        8,
        128,
    )
    assert (text["intermediate_size"], text["vocab_size"], text["num_hidden_layers"]) == (25600, 151936, 50)
    assert text["max_position_embeddings"] == 262144 and text["rope_parameters"] == {
        "rope_type": "default",
        "rope_theta": 5e6,
        "mrope_section": [24, 20, 20],
        "mrope_interleaved": True,
    }
    model = load_qwen3vl(folder, QWEN3VL_H3_LAYER, "meta", seed=0)  # init_weights draws nothing on meta
    assert sum(p.numel() for p in model.language_model.parameters()) == QWEN3VL_H3.parameters() == 25_157_829_120
    vision = model.config.vision_config
    assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (27, 1152, 5120)
    assert sum(p.numel() for p in model.visual.parameters()) == 595_266_800
    # what the repository writer reserves on h3_encoder's GPU for these drawn weights (bf16)
    assert drawn_weight_bytes(folder, QWEN3VL_H3_LAYER) == 2 * (25_157_829_120 + 595_266_800)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert len(ids) == 16 and max(ids) < 151936
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id == 261
