"""benchmarks/bench_text_encoder.py: the weight-free benchmark encoder loads through
h3_core.model.encoder.TextEncoder with the asked width, tokenizes per character and is seeded."""

import json
import sys

import pytest
import torch

from h3_core.model.encoder import TextEncoder

from .serving import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_text_encoder import write_bench_text_encoder  # noqa: E402 - after the sys.path set-up above

PROMPT = "Ab 3!"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_bench_text_encoder(tmp_path_factory.mktemp("bench_encoder") / "encoder", width=64)


def test_folder_loads_as_a_text_encoder_of_the_asked_width(folder):
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["intermediate_size"],
        config["max_position_embeddings"],
    ) == (64, 1, 1, 64, 512)
    encoder = TextEncoder(str(folder))
    assert encoder.width == 64
    assert encoder.model.config.vocab_size == 5 + 2 * 68  # specials + characters + their ## forms


def test_one_token_per_character(folder):
    encoder = TextEncoder(str(folder))
    ids = encoder.tokenizer(PROMPT)["input_ids"]
    assert encoder.tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "a", "##b", "3", "!", "[SEP]"]
    assert encoder.count_tokens(PROMPT) == 6


def test_encode_shape_and_seeded_weights(folder, tmp_path):
    states = TextEncoder(str(folder)).encode(PROMPT)
    assert states.shape == (6, 64) and states.dtype == torch.float32
    assert torch.isfinite(states).all()
    same_seed = TextEncoder(str(write_bench_text_encoder(tmp_path / "again", width=64))).encode(PROMPT)
    assert torch.equal(states, same_seed)
    other_seed = TextEncoder(str(write_bench_text_encoder(tmp_path / "seed1", width=64, seed=1))).encode(PROMPT)
    assert other_seed.shape == (6, 64) and not torch.equal(states, other_seed)


def test_width_must_be_a_positive_multiple_of_64(tmp_path):
    with pytest.raises(ValueError, match=r"^width must be a positive multiple of 64, got 100$"):
        write_bench_text_encoder(tmp_path / "w100", width=100)
    with pytest.raises(ValueError, match=r"^width must be a positive multiple of 64, got 0$"):
        write_bench_text_encoder(tmp_path / "w0", width=0)
    assert not (tmp_path / "w100").exists() and not (tmp_path / "w0").exists()
