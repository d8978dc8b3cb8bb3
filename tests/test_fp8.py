"""fp8 block linears (h3_dit quantization = fp8, h3_core.model.fp8) on the CPU, through PyTorch's
reference torch._scaled_mm: the scales, an exact product, which linears are quantised, the
quantisation while loading (bitwise that after a bf16 load, from every weight source), the
settings and sizing that report it, and the step loop's bitwise solo == co-batched == request
mode in fp8 with INFO naming it. The CUDA kernels are checked on the H200 (tests/test_gpu.py,
benchmarks/fp8_bench.py)."""

import pytest
import torch

from h3_core.config import get_config
from h3_core.model import H3DiT
from h3_core.model.dit import Linear
from h3_core.model.fp8 import (
    E4M3,
    E4M3_MAX,
    Fp8Linear,
    block_linears,
    build_dit,
    check_quantization,
    quantize_blocks,
    row_scales,
)
from h3_core.model.fp8 import to_e4m3 as quantise
from h3_core.model.initialization import init_weights
from h3_core.serving.dit.events import Result
from h3_core.serving.shared.settings import DitSettings
from h3_core.weights.checkpoint import DIT_FILE, load_dit, save_official_transformer, save_weights
from server import sizing

from .step_loop_harness import Client, assert_solo, make_loop


def test_row_scales_map_each_rows_largest_magnitude_to_448():
    x = torch.zeros(3, 16)
    x[0, :3] = torch.tensor([448.0, -224.0, 1.0])
    x[1, 5] = -0.5  # amax 0.5
    scales = row_scales(x)  # row 2 is all zeros: padding rows quantise to 0, not NaN
    assert scales.dtype == torch.float32 and scales.shape == (3, 1)
    assert torch.equal(scales[:2, 0], torch.tensor([1.0, 0.5 / 448]))
    q = quantise(x, scales)
    assert q.dtype == E4M3 and E4M3_MAX == 448.0
    assert torch.equal(q[0, :3].float(), torch.tensor([448.0, -224.0, 1.0]))
    assert torch.equal(q[1].float().abs().max(), torch.tensor(448.0)) and q[1, 5].float() == -448.0
    assert torch.equal(q[2].float(), torch.zeros(16))


def test_an_fp8_linear_of_exactly_representable_values_is_exact():
    """Weights in {0, +-0.5, +-1} with a 1 in every row (scale 1/448: 448 x w is 0, 224 or 448)
    and inputs in {0, +-1, +-2, +-4} with a 4 in every row (x / scale = 112 x: 112, 224, 448):
    every fp8 value is exact, so the product equals x @ W^T."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0])[torch.randint(0, 5, (32, 48), generator=generator)]
    weight[:, 0] = 1.0
    x = torch.tensor([0.0, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0])[torch.randint(0, 7, (80, 48), generator=generator)]
    x[:, 0] = 4.0
    linear = Linear(48, 32, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(weight)
    fp8 = Fp8Linear.from_linear(linear)
    assert fp8.weight.dtype == E4M3 and fp8.weight.shape == (32, 48) and not fp8.weight.requires_grad
    assert fp8.weight_scale.dtype == torch.float32 and fp8.weight_scale.shape == (1, 32)
    expected = (x @ weight.t()).to(torch.bfloat16)
    got = fp8(x.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    fp8.row_tile = 64  # two tiles, the second zero-padded: the same rows
    assert torch.equal(fp8(x.to(torch.bfloat16)), expected)
    assert torch.equal(fp8(x), expected.float())  # a float32 input gets float32 back


def test_quantize_blocks_replaces_exactly_the_four_linears_of_every_block():
    dit = H3DiT(get_config("tiny"))
    init_weights(dit, 0)
    before = {name: module.weight.clone() for name, module in dit.named_modules() if isinstance(module, Linear)}
    quantize_blocks(dit, "none")
    assert not any(isinstance(m, Fp8Linear) for m in dit.modules())
    quantize_blocks(dit, "fp8")
    fp8 = sorted(name for name, module in dit.named_modules() if isinstance(module, Fp8Linear))
    assert fp8 == sorted(
        f"blocks.{i}.{part}" for i in range(2) for part in ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")
    )
    assert len(block_linears(dit)) == 8
    for name, module in dit.named_modules():  # the refiner, AdaLN, embeddings and final layer untouched
        if isinstance(module, Linear) and not isinstance(module, Fp8Linear):
            assert torch.equal(module.weight, before[name]), name
    assert dit.blocks[0].mlp.fc1.row_tile == 64  # the CPU's tile, kept


def test_bad_quantizations_are_refused_naming_the_parameter(monkeypatch):
    with pytest.raises(ValueError, match=r"h3_dit parameter quantization='int8' is not one of \('none', 'fp8'\)"):
        DitSettings(quantization="int8")
    with pytest.raises(ValueError, match=r"quantization='int8' is not one of"):
        check_quantization("int8", "cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    with pytest.raises(
        ValueError,
        match=r"quantization=fp8 needs a GPU of compute capability >= 8.9 \(fp8 tensor cores\), cuda:0 has 8.0",
    ):
        check_quantization("fp8", "cuda:0")
    check_quantization("none", "cuda:0")
    with pytest.raises(ValueError, match="bias-free linears only"):
        Fp8Linear.from_linear(Linear(16, 16, bias=True))


def test_sizing_sees_the_smaller_fp8_model():
    # the h3 DiT: 19.27 B block-linear parameters at 1 byte instead of 2, plus their float32 scales
    assert sizing.dit_weight_bytes(get_config("h3"), "fp8") == 47_025_031_680
    assert sizing.dit_weight_bytes(get_config("h3"), "none") == 66_280_430_080
    assert sizing.gpu_bytes_per_row_and_width(get_config("bench"), "fp8") == 62


@pytest.fixture(scope="module")
def fp8_engine():
    from h3_core.factory import load_engine

    return load_engine("tiny", "random:0", "cpu", with_encoder=False, with_vaes=False, quantization="fp8")


def test_fp8_co_batched_requests_equal_their_solo_and_request_mode_runs_and_info_names_it(fp8_engine):
    client = Client(make_loop(fp8_engine, quantization="fp8"))
    client.send("a", steps=3, seed=1)
    client.send("b", steps=2, seed=2)
    client.run()
    (a,) = client.of("a", Result)
    (b,) = client.of("b", Result)
    assert a.info["largest_pack"] == 2 and a.info["quantization"] == b.info["quantization"] == "fp8"
    assert_solo(fp8_engine, a, 3, 1)  # request mode: the request stepped alone to completion
    assert_solo(fp8_engine, b, 2, 2)
    assert isinstance(fp8_engine.dit.blocks[1].mlp.fc2, Fp8Linear)


def bits(tensor):
    """A tensor's bytes (float8 has no torch.equal on the CPU)."""
    return tensor.contiguous().view(torch.uint8)


@pytest.mark.parametrize("kind", ["random", "native", "official"])
def test_quantised_while_loading_equals_load_then_quantise_bit_for_bit(tmp_path, kind):
    cfg = get_config("tiny")
    if kind == "random":
        source = "random:3"
    else:
        written = H3DiT(cfg)
        init_weights(written, 5)
        if kind == "native":
            save_weights(written, tmp_path / DIT_FILE)
        else:
            save_official_transformer(written, tmp_path, max_shard_bytes=200_000)  # several shards
        source = tmp_path
    reference = H3DiT(cfg)  # today's path: the whole bf16 DiT loaded, then quantised
    load_dit(reference, source)
    quantize_blocks(reference, "fp8")
    streamed = build_dit(cfg, "sdpa", "cpu", "fp8")  # empty fp8 block linears: no bf16 block weights held
    assert isinstance(streamed.blocks[1].mlp.fc1, Fp8Linear) and streamed.blocks[1].mlp.fc1.weight.dtype == E4M3
    held = sum(t.numel() * t.element_size() for t in (*streamed.parameters(), *streamed.buffers()))
    assert held == sizing.dit_weight_bytes(cfg, "fp8")
    load_dit(streamed, source)
    expected, got = reference.state_dict(), streamed.state_dict()
    assert list(got) == list(expected) and "blocks.0.attn.qkv_proj.weight_scale" in got
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(bits(got[name]), bits(tensor)), name
    assert build_dit(cfg, "sdpa", "cpu", "none").blocks[0].mlp.fc1.weight.dtype == cfg.torch_dtype
