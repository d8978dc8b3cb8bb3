import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from h3_core.config import get_config
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.weights.checkpoint import (
    diffusers_config,
    grouped_to_qkv,
    load_dit,
    load_weights,
    official_sources,
    save_official_transformer,
    save_weights,
)


@pytest.fixture(scope="module")
def dit():
    model = H3DiT(get_config("tiny"))
    init_weights(model, 0)
    return model


def official_state(dit):
    """The DiT's weights in the official diffusers layout, spelled out from docs/model.md §1.3
    (independently of the loader's rename table)."""
    n = {k: v.clone() for k, v in dit.state_dict().items()}
    state = {
        "token_refiner.final_norm.weight": n["token_refiner.final_norm.weight"],
        "norm_out.norm.weight": n["final_layer.norm.weight"],
    }
    for part in ("weight", "bias"):
        state.update(
            {
                f"proj_in.{part}": n[f"video_patch_proj.{part}"],
                f"audio_proj_in.{part}": n[f"audio_patch_proj.{part}"],
                f"context_embedder.{part}": n[f"condition_proj.{part}"],
                f"time_embedder.linear_1.{part}": n[f"time_embedder.proj_in.{part}"],
                f"time_embedder.linear_2.{part}": n[f"time_embedder.proj_out.{part}"],
                f"norm_out.linear.{part}": n[f"final_layer.adaln_proj.linear.{part}"],
                f"proj_out.{part}": n[f"final_layer.video_out.{part}"],
                f"audio_proj_out.{part}": n[f"final_layer.audio_out.{part}"],
            }
        )
    blocks = [(f"token_refiner.blocks.{i}", f"token_refiner.refiner_blocks.{i}") for i in range(2)]
    blocks += [(f"blocks.{i}", f"transformer_blocks.{i}") for i in range(dit.cfg.num_layers)]
    for native, official in blocks:
        q, k, v = n[f"{native}.attn.qkv_proj.weight"].chunk(3)
        gate, up = n[f"{native}.mlp.fc1.weight"].chunk(2)
        state.update(
            {
                f"{official}.norm1.weight": n[f"{native}.norm1.weight"],
                f"{official}.norm2.weight": n[f"{native}.norm2.weight"],
                f"{official}.attn.to_q.weight": q.clone(),
                f"{official}.attn.to_k.weight": k.clone(),
                f"{official}.attn.to_v.weight": v.clone(),
                f"{official}.attn.norm_q.weight": n[f"{native}.attn.q_norm.weight"],
                f"{official}.attn.norm_k.weight": n[f"{native}.attn.k_norm.weight"],
                f"{official}.attn.to_out.0.weight": n[f"{native}.attn.out_proj.weight"],
                f"{official}.ff.net.0.proj.weight": torch.cat([up, gate]),
                f"{official}.ff.net.2.weight": n[f"{native}.mlp.fc2.weight"],
            }
        )
        if native.startswith("blocks."):
            for part in ("weight", "bias"):
                state[f"{official}.adaln_proj.linear.{part}"] = n[f"{native}.adaln_proj.linear.{part}"]
    return state


def loaded(path):
    model = H3DiT(get_config("tiny"))
    load_weights(model, path)
    return model.state_dict()


def assert_same_weights(a, b):
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_official_names_of_the_full_model_are_the_638_of_the_official_index():
    names = [s for name in H3DiT(get_config("h3"), device="meta").state_dict() for s in official_sources(name)]
    assert len(names) == len(set(names)) == 638  # docs/model.md §1.3
    assert "transformer_blocks.49.attn.to_v.weight" in names and "norm_out.linear.bias" in names
    assert official_sources("token_refiner.blocks.1.attn.qkv_proj.weight") == [
        "token_refiner.refiner_blocks.1.attn.to_q.weight",
        "token_refiner.refiner_blocks.1.attn.to_k.weight",
        "token_refiner.refiner_blocks.1.attn.to_v.weight",
    ]
    assert official_sources("blocks.3.mlp.fc1.weight") == ["transformer_blocks.3.ff.net.0.proj.weight"]


def test_native_and_official_layouts_load_identical_weights(tmp_path, dit):
    save_weights(dit, tmp_path / "native.safetensors")
    save_file(official_state(dit), str(tmp_path / "official.safetensors"))
    assert_same_weights(loaded(tmp_path / "native.safetensors"), dit.state_dict())
    assert_same_weights(loaded(tmp_path / "official.safetensors"), dit.state_dict())


def test_native_file_stores_qkv_head_grouped(tmp_path, dit):
    # vllm-omni's reorder example: rows [q0, k0, v0, q1, k1, v1] -> [q0, q1, k0, k1, v0, v1].
    assert grouped_to_qkv(torch.arange(6.0).reshape(6, 1), 2, 1)[:, 0].tolist() == [0, 3, 1, 4, 2, 5]
    save_weights(dit, tmp_path / "native.safetensors")
    stored = load_file(str(tmp_path / "native.safetensors"))["blocks.1.attn.qkv_proj.weight"]
    qkv = dit.blocks[1].attn.qkv_proj.weight.detach()
    heads, head_dim, width = dit.cfg.num_heads, dit.cfg.head_dim, dit.cfg.attn_width
    for h in range(heads):
        for j in range(3):  # q, k, v
            rows = stored[(3 * h + j) * head_dim : (3 * h + j + 1) * head_dim]
            assert torch.equal(rows, qkv[j * width + h * head_dim : j * width + (h + 1) * head_dim])


def test_official_qkv_stacked_in_order_and_fc1_halves_swapped(tmp_path, dit):
    state = official_state(dit)
    block = "transformer_blocks.0"
    for value, name in enumerate(("attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj")):
        state[f"{block}.{name}.weight"] = torch.full_like(state[f"{block}.{name}.weight"], value)
    up_rows = dit.cfg.ffn_size
    state[f"{block}.ff.net.0.proj.weight"][:up_rows] = 7.0  # the up half comes first
    save_file(state, str(tmp_path / "official.safetensors"))
    weights = loaded(tmp_path / "official.safetensors")
    width = dit.cfg.attn_width
    qkv, fc1 = weights["blocks.0.attn.qkv_proj.weight"], weights["blocks.0.mlp.fc1.weight"]
    assert [qkv[i * width : (i + 1) * width].unique().tolist() for i in range(3)] == [[0.0], [1.0], [2.0]]
    assert fc1[:up_rows].unique().tolist() == [3.0] and fc1[up_rows:].unique().tolist() == [7.0]


def test_bf16_official_checkpoint_casts_to_the_runtime_dtypes(tmp_path, dit):
    # The official files store every tensor in bf16 (66,245,985,792 bytes = 2 x parameters).
    save_file({k: v.bfloat16() for k, v in official_state(dit).items()}, str(tmp_path / "bf16.safetensors"))
    weights = loaded(tmp_path / "bf16.safetensors")
    for name, value in dit.state_dict().items():
        assert weights[name].dtype == value.dtype
        assert torch.equal(weights[name], value.bfloat16().to(value.dtype)), name


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda s: s.pop("transformer_blocks.1.attn.to_v.weight"),
            "checkpoint is missing tensor 'transformer_blocks.1.attn.to_v.weight' (1 missing)",
        ),
        (
            lambda s: s.update({"transformer_blocks.0.attn.to_qkv.weight": torch.zeros(384, 96)}),
            "checkpoint has unexpected tensor 'transformer_blocks.0.attn.to_qkv.weight' (1 unexpected)",
        ),
        (
            lambda s: s.update({"transformer_blocks.0.attn.to_k.weight": torch.zeros(3, 96)}),
            "tensor 'transformer_blocks.0.attn.to_k.weight' has shape (3, 96), expected (128, 96)",
        ),
        (
            lambda s: s.update({"token_refiner.refiner_blocks.1.ff.net.0.proj.weight": torch.zeros(256, 96)}),
            "tensor 'token_refiner.refiner_blocks.1.ff.net.0.proj.weight' has shape (256, 96), expected (512, 96)",
        ),
        (
            lambda s: s.update({"blocks.0.norm1.weight": torch.ones(96)}),
            "checkpoint mixes native and official tensor names: 'blocks.0.norm1.weight' and 'audio_proj_in.bias'",
        ),
    ],
)
def test_official_checkpoint_errors_name_the_tensor(tmp_path, dit, edit, message):
    state = official_state(dit)
    edit(state)
    save_file(state, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        loaded(tmp_path / "bad.safetensors")


def test_native_checkpoint_with_a_misshaped_qkv_names_it(tmp_path, dit):
    state = {k: v.clone() for k, v in dit.state_dict().items()}
    state["blocks.1.attn.qkv_proj.weight"] = torch.zeros(381, 96)
    save_file(state, str(tmp_path / "bad.safetensors"))
    with pytest.raises(
        ValueError, match=re.escape("tensor 'blocks.1.attn.qkv_proj.weight' has shape (381, 96), expected (384, 96)")
    ):
        loaded(tmp_path / "bad.safetensors")


def test_diffusers_config_of_the_full_model_is_the_official_table():
    assert diffusers_config(get_config("h3")) == {  # docs/model.md §1.1, diffusers column
        "num_layers": 50,
        "num_refiner_layers": 2,
        "hidden_size": 5376,
        "num_attention_heads": 56,
        "attention_head_dim": 128,
        "ffn_dim": 14336,
        "in_channels": 24,
        "audio_in_channels": 32,
        "patch_size": [1, 2, 2],
        "text_dim": 5120,
        "freq_dim": 256,
        "time_embed_hidden_dim": 5376,
        "time_embed_dim": 2688,
        "rope_freq_dim": 16,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "qk_norm_eps": 1e-5,
        "final_norm_eps": 1e-5,
    }


def official_files(folder):
    """Every tensor in the safetensors files of `folder`."""
    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state


def from_source(source):
    model = H3DiT(get_config("tiny"))
    load_dit(model, source)
    return model.state_dict()


@pytest.mark.parametrize(
    "max_shard_bytes, files",
    [
        (1 << 30, ["config.json", "diffusion_pytorch_model.safetensors"]),
        (
            1_000_000,
            ["config.json"]
            + [f"diffusion_pytorch_model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
            + ["diffusion_pytorch_model.safetensors.index.json"],
        ),
    ],
)
def test_official_transformer_round_trip(tmp_path, dit, max_shard_bytes, files):
    folder = save_official_transformer(dit, tmp_path, max_shard_bytes)
    assert folder == tmp_path / "transformer" and sorted(p.name for p in folder.iterdir()) == files
    assert json.loads((folder / "config.json").read_text()) == diffusers_config(dit.cfg)
    written, spelled_out = official_files(folder), official_state(dit)  # the names and layout of docs/model.md §1.3
    assert_same_weights(dict(sorted(written.items())), dict(sorted(spelled_out.items())))
    assert_same_weights(from_source(tmp_path), dit.state_dict())
    assert_same_weights(from_source(str(tmp_path)), dit.state_dict())


def test_sharded_index_maps_every_tensor_to_its_shard(tmp_path, dit):
    folder = save_official_transformer(dit, tmp_path, 1_000_000)
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    state = official_state(dit)
    assert sorted(index["weight_map"]) == sorted(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    for name, file in index["weight_map"].items():
        assert name in load_file(str(folder / file)), name
    sizes = [
        sum(t.numel() * t.element_size() for t in load_file(str(folder / f)).values())
        for f in set(index["weight_map"].values())
    ]
    assert len(sizes) == 4 and max(sizes) <= 1_000_000


def test_official_config_mismatch_is_refused_naming_the_key(tmp_path, dit):
    folder = save_official_transformer(dit, tmp_path, 1 << 30)
    config = json.loads((folder / "config.json").read_text())
    config["num_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=f"^{re.escape(str(folder / 'config.json'))} has num_layers=3 but the tiny config has num_layers=2$",
    ):
        from_source(tmp_path)
    config["num_layers"] = 2
    del config["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has no key 'rope_theta'; the tiny config has rope_theta=10000.0$"):
        from_source(tmp_path)


def test_official_transformer_is_checked_against_the_chosen_config(tmp_path, dit):
    save_official_transformer(dit, tmp_path, 1 << 30)
    with pytest.raises(
        ValueError,
        match=r"has num_layers=2 but the small config has num_layers=6 \(it is the tiny config's: --config tiny\)$",
    ):
        load_dit(H3DiT(get_config("small"), device="meta"), tmp_path)


def test_a_shard_missing_a_tensor_of_the_index_is_refused_naming_it(tmp_path, dit):
    folder = save_official_transformer(dit, tmp_path, 1_000_000)
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    file = index["weight_map"]["transformer_blocks.1.attn.to_k.weight"]
    shard = load_file(str(folder / file))
    del shard["transformer_blocks.1.attn.to_k.weight"]
    save_file(shard, str(folder / file))
    message = (
        f"{folder / file} lacks tensor 'transformer_blocks.1.attn.to_k.weight', which "
        "diffusion_pytorch_model.safetensors.index.json places there"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        from_source(tmp_path)


def test_an_index_naming_a_missing_shard_or_no_weights_at_all_is_refused(tmp_path, dit):
    folder = save_official_transformer(dit, tmp_path, 1_000_000)
    (folder / "diffusion_pytorch_model-00002-of-00004.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="00002-of-00004.safetensors not found \\(a shard named by"):
        from_source(tmp_path)
    (folder / "diffusion_pytorch_model.safetensors.index.json").unlink()
    message = (
        f"{folder} holds neither diffusion_pytorch_model.safetensors nor diffusion_pytorch_model.safetensors.index.json"
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        from_source(tmp_path)


def test_an_index_whose_weight_map_leaves_the_folder_is_refused(tmp_path, dit):
    folder = save_official_transformer(dit, tmp_path, 1_000_000)
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"]["proj_in.bias"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(content))
    with pytest.raises(ValueError, match='needs a non-empty "weight_map" of tensor name -> shard file name in'):
        from_source(tmp_path)


def test_saving_official_refuses_an_existing_folder_and_a_bad_shard_size(tmp_path, dit):
    save_official_transformer(dit, tmp_path, 1 << 30)
    with pytest.raises(FileExistsError):
        save_official_transformer(dit, tmp_path, 1 << 30)
    with pytest.raises(ValueError, match="^max_shard_bytes=0 is out of range: allowed >= 1$"):
        save_official_transformer(dit, tmp_path / "other", 0)


def test_bf16_sharded_official_checkpoint_casts_to_the_runtime_dtypes(tmp_path):
    # The official files store every tensor in bf16; the tiny DiT runs in float32.
    model = H3DiT(get_config("tiny"))
    init_weights(model, 5)
    folder = save_official_transformer(model.to(torch.bfloat16), tmp_path, 500_000)
    assert {t.dtype for t in official_files(folder).values()} == {torch.bfloat16}
    weights = from_source(tmp_path)
    for name, value in model.state_dict().items():
        assert weights[name].dtype == torch.float32 and torch.equal(weights[name], value.float()), name
