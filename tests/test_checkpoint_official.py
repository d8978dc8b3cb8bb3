import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from h3_core.checkpoint import grouped_to_qkv, init_weights, load_weights, official_sources, save_weights
from h3_core.config import get_config
from h3_core.model import H3DiT


@pytest.fixture(scope="module")
def dit():
    model = H3DiT(get_config("tiny"))
    init_weights(model, 0)
    return model


def official_state(dit):
    """The DiT's weights in the official diffusers layout, spelled out from h3_spec §1.3
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
    assert len(names) == len(set(names)) == 638  # h3_spec §1.3
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
