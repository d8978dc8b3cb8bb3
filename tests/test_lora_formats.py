"""LoRA file formats (h3_core.weights.lora_formats) against peft (docs/lora.md §"File formats").

The golden outputs come from peft: a toy module with diffusers' attribute names and the tiny
DiT's widths gets the adapter injected by peft (inject_adapter_in_model) and its lora weights
loaded from the same file; every target linear's output there is compared with our base linear
(its weight in our layout) plus our mapped delta. The ComfyUI and FlashGen files of the same
adapter are written here from the diffusers tensors with torch.block_diag and explicit row
indices, independently of the mapping code, and must map to the same tensors.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, inject_adapter_in_model
from safetensors.torch import save_file
from torch import nn

from h3_core.config import CONFIGS
from h3_core.weights.lora_formats import DEFAULT_ALPHA, lora_targets, read_lora

CFG = CONFIGS["tiny"]
RANK, ALPHA = 4, 6.0
WIDTH, FFN = CFG.attn_width, CFG.ffn_size


def linear(inp: int, out: int) -> nn.Linear:
    return nn.Linear(inp, out, bias=False)


class ToyAttention(nn.Module):
    def __init__(self):
        super().__init__()
        h = CFG.hidden_size
        self.to_q, self.to_k, self.to_v = linear(h, WIDTH), linear(h, WIDTH), linear(h, WIDTH)
        self.to_out = nn.ModuleList([linear(WIDTH, h)])


class ToyFF(nn.Module):
    def __init__(self):
        super().__init__()
        proj = nn.Module()
        proj.proj = linear(CFG.hidden_size, 2 * FFN)  # diffusers' GEGLU-style proj: rows [up; gate]
        self.net = nn.ModuleList([proj, nn.Identity(), linear(FFN, CFG.hidden_size)])


class ToyBlock(nn.Module):
    def __init__(self, adaln: bool):
        super().__init__()
        self.attn, self.ff = ToyAttention(), ToyFF()
        if adaln:
            self.adaln_proj = nn.Module()
            self.adaln_proj.linear = linear(CFG.time_embed_dim, 18 * CFG.hidden_size)


class ToyTransformer(nn.Module):
    """diffusers' module names for the linears a LoRA targets, at the tiny DiT's widths."""

    def __init__(self):
        super().__init__()
        self.transformer_blocks = nn.ModuleList(ToyBlock(True) for _ in range(CFG.num_layers))
        self.token_refiner = nn.Module()
        self.token_refiner.refiner_blocks = nn.ModuleList(ToyBlock(False) for _ in range(CFG.num_refiner_layers))
        self.norm_out = nn.Module()
        self.norm_out.linear = linear(CFG.time_embed_dim, 2 * CFG.hidden_size)


TARGETS = r".*\.(to_q|to_k|to_v|to_out\.0|net\.0\.proj|net\.2|linear)"


def toy_adapter(seed: int) -> tuple[ToyTransformer, dict[str, torch.Tensor]]:
    """A seeded toy module (float32) and a LoRA of rank RANK on every target, in the Turbo file's
    names (`<module>.lora_A.default.weight`)."""
    torch.manual_seed(seed)
    toy = ToyTransformer()
    tensors = {}
    for name, module in toy.named_modules():
        if isinstance(module, nn.Linear):
            tensors[f"{name}.lora_A.default.weight"] = torch.randn(RANK, module.in_features)
            tensors[f"{name}.lora_B.default.weight"] = torch.randn(module.out_features, RANK)
    return toy, tensors


def peft_toy(toy: ToyTransformer, tensors: dict[str, torch.Tensor], alpha: float) -> ToyTransformer:
    """`toy` with peft's LoRA layers injected and the file's weights loaded into them."""
    config = LoraConfig(r=RANK, lora_alpha=alpha, target_modules=TARGETS, lora_dropout=0.0)
    model = inject_adapter_in_model(config, toy)
    result = model.load_state_dict(tensors, strict=False)
    assert result.unexpected_keys == []
    assert all("lora_" not in key for key in result.missing_keys)
    return model.eval()


def our_weight(toy: ToyTransformer, official: str) -> tuple[str, torch.Tensor]:
    """Our module name and base weight (our layout) for a toy module name."""
    modules = dict(toy.named_modules())
    weight = modules[official].get_base_layer().weight if hasattr(modules[official], "get_base_layer") else None
    ours = official.replace("transformer_blocks.", "blocks.").replace("refiner_blocks.", "blocks.")
    ours = ours.replace("attn.to_out.0", "attn.out_proj").replace("ff.net.0.proj", "mlp.fc1")
    ours = ours.replace("ff.net.2", "mlp.fc2").replace("norm_out.linear", "final_layer.adaln_proj.linear")
    if ours.endswith("mlp.fc1"):
        up, gate = weight.chunk(2)
        weight = torch.cat([gate, up])
    return ours, weight


def golden_outputs(model: ToyTransformer, x_seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Our module name -> (input x, peft's output in our row layout, our base weight)."""
    modules = dict(model.named_modules())
    generator = torch.Generator().manual_seed(x_seed)
    out = {}
    with torch.no_grad():
        for name, module in modules.items():
            if not hasattr(module, "lora_A") or name.endswith((".to_k", ".to_v")):
                continue
            if name.endswith(".to_q"):
                stem = name.removesuffix(".to_q")
                x = torch.randn(5, module.in_features, generator=generator)
                parts = [modules[f"{stem}.{p}"] for p in ("to_q", "to_k", "to_v")]
                ours = our_weight(model, name)[0].replace("attn.to_q", "attn.qkv_proj")
                weight = torch.cat([p.get_base_layer().weight for p in parts])
                out[ours] = (x, torch.cat([p(x) for p in parts], dim=-1), weight)
                continue
            ours, weight = our_weight(model, name)
            x = torch.randn(5, module.in_features, generator=generator)
            y = module(x)
            if ours.endswith("mlp.fc1"):
                up, gate = y.chunk(2, dim=-1)
                y = torch.cat([gate, up], dim=-1)
            out[ours] = (x, y, weight)
    return out


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """The diffusers file (alpha in its metadata), peft's golden outputs, and the file's tensors."""
    toy, tensors = toy_adapter(seed=0)
    path = tmp_path_factory.mktemp("lora") / "turbo.safetensors"
    save_file(tensors, str(path), metadata={"lora_alpha": str(ALPHA)})
    golden = golden_outputs(peft_toy(toy, tensors, ALPHA), x_seed=1)
    return path, golden, tensors


def test_diffusers_matches_peft(adapter):
    path, golden, _ = adapter
    lora = read_lora(path, CFG)
    assert lora.format == "diffusers" and lora.base_schedule is None
    assert sorted(lora.targets) == sorted(lora_targets(CFG)) == sorted(golden)
    assert len(lora.targets) == 5 * CFG.num_layers + 4 * CFG.num_refiner_layers + 1 == 19
    assert lora.rank == 3 * RANK  # the stacked qkv
    assert lora.bytes == sum(t.a.nbytes + t.b.nbytes for t in lora.targets.values())
    for name, (x, y, weight) in golden.items():
        target = lora.targets[name]
        ours = F.linear(x, weight) + target.delta(x)
        if name.endswith("qkv_proj"):
            # the stacked delta sums over 3 x RANK columns (zeros off the diagonal) where peft sums
            # over RANK per part: float32 summation may group differently, so compare to 1 ulp-level
            assert target.alpha == 3 * ALPHA and target.rank == 3 * RANK
            torch.testing.assert_close(ours, y, rtol=1e-6, atol=1e-5)
        else:
            assert target.alpha == ALPHA and target.rank == RANK
            assert torch.equal(ours, y), name


def test_diffusers_alpha_defaults_and_adapter_metadata(tmp_path):
    _, tensors = toy_adapter(seed=2)
    save_file(tensors, str(tmp_path / "none.safetensors"))
    assert {t.alpha for n, t in read_lora(tmp_path / "none.safetensors", CFG).targets.items()} == {
        DEFAULT_ALPHA,
        3 * DEFAULT_ALPHA,
    }
    plain = {k.replace(".default", ""): v for k, v in tensors.items()}
    save_file(plain, str(tmp_path / "d.safetensors"), metadata={"lora_adapter_metadata": json.dumps({"lora_alpha": 16})})
    lora = read_lora(tmp_path / "d.safetensors", CFG)
    assert lora.targets["blocks.1.mlp.fc2"].alpha == 16.0
    assert lora.targets["token_refiner.blocks.0.attn.qkv_proj"].alpha == 48.0
