import math

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.rope import apply_rope, rope_table
from h3_core.weights.checkpoint import load_weights, save_weights


@pytest.fixture(scope="module")
def dit():
    model = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(model, 0)
    return model.eval()


def random_inputs(layouts, seeds):
    video, audio, text = [], [], []
    for lay, seed in zip(layouts, seeds, strict=True):
        g = torch.Generator().manual_seed(seed)
        video.append(torch.randn(lay.video_rows, 96, generator=g))
        audio.append(torch.randn(lay.audio_rows, 32, generator=g))
        text.append(torch.randn(lay.text_len, 384, generator=g))
    return video, audio, text


def forward(dit, layouts, t_video, t_audio, inputs):
    video, audio, text = inputs
    batch = L.pack_requests(layouts, t_video, t_audio)
    return L.split_rows(batch, *dit(torch.cat(video), torch.cat(audio), torch.cat(text), batch))


LAYOUTS = [L.make_layout(9, 64, 96, 22), L.make_layout(17, 64, 64, 5), L.make_layout(44, 32, 64, 5)]
T_VIDEO, T_AUDIO, SEEDS = [0.1, 0.5, 0.9], [0.2, 0.6, 0.9], [1, 2, 3]


def test_parameter_counts():
    # docs/model.md §1.3 (full model) and §8 (bench: 6.0 B; tiny: 731,824 at text width 64 -> 384 here).
    assert sum(p.numel() for p in H3DiT(get_config("h3"), device="meta").parameters()) == 33_122_992_896
    assert sum(p.numel() for p in H3DiT(get_config("bench"), device="meta").parameters()) == 6_008_975_616
    assert sum(p.numel() for p in H3DiT(get_config("tiny")).parameters()) == 731_824 + (384 - 64) * 96


def test_native_parameter_names_and_dtypes():
    state = H3DiT(get_config("bench"), device="meta").state_dict()
    assert state["blocks.0.attn.qkv_proj.weight"].shape == (21504, 5376)
    assert state["blocks.7.adaln_proj.linear.weight"].shape == (96768, 2688)
    assert state["final_layer.adaln_proj.linear.weight"].shape == (10752, 2688)
    assert state["token_refiner.blocks.1.mlp.fc1.weight"].shape == (28672, 5376)
    assert state["video_patch_proj.weight"].dtype == torch.float32
    assert state["final_layer.audio_out.weight"].dtype == torch.float32
    assert state["time_embedder.proj_out.weight"].shape == (2688, 5376)
    assert state["condition_proj.weight"].dtype == torch.bfloat16


def test_packed_equals_solo_bitwise_and_order_invariant(dit):
    inputs = random_inputs(LAYOUTS, SEEDS)
    packed = forward(dit, LAYOUTS, T_VIDEO, T_AUDIO, inputs)
    for i in range(3):
        solo = forward(dit, [LAYOUTS[i]], [T_VIDEO[i]], [T_AUDIO[i]], [[x[i]] for x in inputs])[0]
        assert torch.equal(solo[0], packed[i][0]) and torch.equal(solo[1], packed[i][1])
    order = [2, 0, 1]
    permuted = forward(
        dit,
        [LAYOUTS[i] for i in order],
        [T_VIDEO[i] for i in order],
        [T_AUDIO[i] for i in order],
        [[x[i] for i in order] for x in inputs],
    )
    for j, i in enumerate(order):
        assert torch.equal(permuted[j][0], packed[i][0]) and torch.equal(permuted[j][1], packed[i][1])


def test_isolation_perturbing_one_request_leaves_others_unchanged(dit):
    inputs = random_inputs(LAYOUTS, SEEDS)
    base = forward(dit, LAYOUTS, T_VIDEO, T_AUDIO, inputs)
    video, audio, text = inputs
    perturbed = (
        [video[0], video[1] * 3 + 1, video[2]],
        [audio[0], -audio[1], audio[2]],
        [text[0], text[1] + 5, text[2]],
    )
    out = forward(dit, LAYOUTS, T_VIDEO, [0.2, 0.7, 0.9], perturbed)
    for i in (0, 2):
        assert torch.equal(out[i][0], base[i][0]) and torch.equal(out[i][1], base[i][1])
    assert not torch.equal(out[1][0], base[1][0])


def test_padding_invariance(dit):
    lay = LAYOUTS[0]
    inputs = random_inputs([lay], [7])
    base = forward(dit, [lay], [0.3], [0.4], inputs)[0]
    wider = L.make_layout(9, 64, 96, 22, seq_len=256)
    out = forward(dit, [wider], [0.3], [0.4], inputs)[0]
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])


def test_output_depends_on_timestep_and_padding_rows_enter_as_zero(dit):
    lay = LAYOUTS[0]
    inputs = random_inputs([lay], [5])
    seen = {}
    hook = dit.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0].clone()))
    a = forward(dit, [lay], [0.3], [0.4], inputs)[0]
    hook.remove()
    assert seen["x"][lay.used :].abs().sum().item() == 0.0
    assert seen["x"][: lay.used].abs().amax(dim=1).gt(0).all()  # every real row is embedded
    b = forward(dit, [lay], [0.6], [0.4], inputs)[0]
    assert not torch.equal(a[0], b[0])


def test_rope_table_golden_values():
    pos = torch.tensor([[1.0, 0.0, 0.0], [2.0, 3.0, -1.5]], dtype=torch.float64)
    table = rope_table(pos, 2, 10000.0, torch.float32)  # inv_freq = [1, 0.01]
    angles = torch.tensor([[1.0, 0.01, 0, 0, 0, 0], [2.0, 0.02, 3.0, 0.03, -1.5, -0.015]])
    assert table.shape == (2, 12)
    assert torch.allclose(table[:, :6], angles.cos(), atol=1e-7)
    assert torch.allclose(table[:, 6:], angles.sin(), atol=1e-7)
    assert table[0, :6].tolist()[2:] == [1.0] * 4
    x = torch.arange(16, dtype=torch.float32).reshape(1, 1, 16)
    out = apply_rope(x, table[:1])
    assert out[0, 0, 12:].tolist() == [12.0, 13.0, 14.0, 15.0]  # dims beyond 6R pass through
    c, s = math.cos(1.0), math.sin(1.0)
    assert out[0, 0, 0].item() == pytest.approx(0 * c - 6 * s, abs=1e-6)
    assert out[0, 0, 6].item() == pytest.approx(6 * c + 0 * s, abs=1e-6)


def test_checkpoint_round_trip_and_strict_errors(tmp_path, dit):
    path = tmp_path / "dit.safetensors"
    save_weights(dit, path)
    other = H3DiT(get_config("tiny"), row_tile=64)
    load_weights(other, path)
    assert all(torch.equal(a, b) for a, b in zip(dit.state_dict().values(), other.state_dict().values(), strict=True))
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    missing = dict(state)
    del missing["blocks.1.mlp.fc2.weight"]
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="missing tensor 'blocks.1.mlp.fc2.weight'"):
        load_weights(other, tmp_path / "missing.safetensors")
    save_file({**state, "extra.weight": torch.zeros(1)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensor 'extra.weight'"):
        load_weights(other, tmp_path / "extra.safetensors")
    save_file({**state, "condition_proj.bias": torch.zeros(3)}, str(tmp_path / "shape.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'condition_proj.bias' has shape \(3,\), expected \(96,\)"):
        load_weights(other, tmp_path / "shape.safetensors")


def test_init_is_deterministic_and_not_zero():
    a, b = H3DiT(get_config("tiny")), H3DiT(get_config("tiny"))
    init_weights(a, 3)
    init_weights(b, 3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.blocks[0].adaln_proj.linear.weight.count_nonzero() == a.blocks[0].adaln_proj.linear.weight.numel()
    assert a.final_layer.video_out.weight.count_nonzero() == a.final_layer.video_out.weight.numel()


def test_compiled_blocks_one_graph_for_every_pack(monkeypatch):
    """compile_blocks (the GPU default) on the CPU: packs of other row counts and timestep counts
    reuse the first compiled graphs (no recompilation), the result is deterministic and close
    to the eager forward (fused elementwise work rounds differently, so not bitwise)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = H3DiT(get_config("tiny"), row_tile=0)
    init_weights(eager, 0)
    compiled = H3DiT(get_config("tiny"), row_tile=0)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks()
    inputs = random_inputs(LAYOUTS, SEEDS)
    packs = [[0], [0, 1], [2, 0, 1], [1]]  # 1 to 3 documents, 1 to 3 distinct timesteps
    for pack in packs:
        chosen = [LAYOUTS[i] for i in pack]
        args = (
            [T_VIDEO[i] for i in pack],
            [T_AUDIO[i] for i in pack],
            [[inputs[k][i] for i in pack] for k in range(3)],
        )
        first = forward(compiled, chosen, *args)
        again = forward(compiled, chosen, *args)
        reference = forward(eager.eval(), chosen, *args)
        for (video, audio), (video2, audio2), (video_e, audio_e) in zip(first, again, reference, strict=True):
            assert torch.equal(video, video2) and torch.equal(audio, audio2)
            torch.testing.assert_close(video, video_e, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(audio, audio_e, atol=1e-4, rtol=1e-4)
    assert sum(counters["recompiles"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 2  # before_attention and after_attention, shared by the blocks


def test_cuda_default_needs_the_bitwise_cublas_workspace(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.raises(
        RuntimeError,
        match=r"^the DiT on CUDA is batch-invariant only with CUBLAS_WORKSPACE_CONFIG=:0:0, got None: call "
        r"h3_core\.model\.dit\.use_bitwise_cublas\(\) before",
    ):
        H3DiT(get_config("tiny"), device="cuda")


def test_pack_rows_depend_only_on_the_layouts_as_cuda_graphs_assume(dit):
    """GraphedForward keys a graph by the layouts and the number of unique timesteps and keeps
    the PackRows of its capture: forward_rows with the PackRows of a pack at other timesteps
    (other values, another row -> timestep map, same count) equals forward bit for bit."""
    inputs = random_inputs(LAYOUTS, SEEDS)
    video, audio, text = (torch.cat(part) for part in inputs)
    captured = L.pack_requests(LAYOUTS, [0.1, 0.5, 0.9], [0.2, 0.6, 0.9])  # 5 unique timesteps
    later = L.pack_requests(LAYOUTS, [0.3, 0.3, 0.8], [0.4, 0.7, 0.5])  # 5 unique, other rows per timestep
    assert len(captured.unique_timesteps) == len(later.unique_timesteps) == 5
    assert not torch.equal(captured.inverse_indices, later.inverse_indices)
    with torch.inference_mode():
        replayed = dit.forward_rows(
            video, audio, text, later.unique_timesteps, later.inverse_indices, dit.pack_rows(captured)
        )
    for got, expected in zip(replayed, dit(video, audio, text, later), strict=True):
        assert torch.equal(got, expected)


def test_cuda_graphs_need_a_cuda_device(dit):
    with pytest.raises(RuntimeError, match="^CUDA graphs need a CUDA device, not cpu$"):
        dit.use_cuda_graphs()
    assert dit.graphs is None
