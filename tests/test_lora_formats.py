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
from h3_core.weights.lora_formats import lora_targets, read_lora

CFG = CONFIGS["tiny"]
RANK, ALPHA = 4, 6.0
DEFAULT = 8.0  # the alpha of a diffusers file that names none
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
    path, golden, tensors = adapter
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
            # exact: the stacked pair is the file's parts, A concatenated and B block-diagonal;
            # the output is not bit-exact by construction (our B^T GEMM sums 3 x RANK products,
            # zeros off the diagonal, where peft sums RANK per part: a GEMM may group the float32
            # sum differently), so it is compared at float32 rounding
            official = official_module(name)
            parts = [f"{official}.to_{p}" for p in "qkv"]
            assert torch.equal(target.a, torch.cat([tensors[f"{p}.lora_A.default.weight"] for p in parts]))
            assert torch.equal(target.b, torch.block_diag(*(tensors[f"{p}.lora_B.default.weight"] for p in parts)))
            assert target.alpha == 3 * ALPHA and target.rank == 3 * RANK
            torch.testing.assert_close(ours, y, rtol=1.3e-6, atol=1e-5)
        else:
            assert target.alpha == ALPHA and target.rank == RANK
            assert torch.equal(ours, y), name


def test_diffusers_alpha_defaults_and_adapter_metadata(tmp_path):
    _, tensors = toy_adapter(seed=2)
    save_file(tensors, str(tmp_path / "none.safetensors"))
    lora = read_lora(tmp_path / "none.safetensors", CFG)
    # alpha 8 when the metadata has none (LightX2V, the Turbo reference); x 3 on the stacked qkv
    assert {name: t.alpha for name, t in lora.targets.items() if name.startswith("blocks.0.")} == {
        "blocks.0.attn.qkv_proj": 24.0,
        "blocks.0.attn.out_proj": 8.0,
        "blocks.0.mlp.fc1": 8.0,
        "blocks.0.mlp.fc2": 8.0,
        "blocks.0.adaln_proj.linear": 8.0,
    }
    x = torch.randn(3, CFG.hidden_size, generator=torch.Generator().manual_seed(3))
    assert torch.equal(lora.targets["blocks.0.mlp.fc1"].delta(x, scale=0.0), torch.zeros(3, 2 * FFN))
    plain = {"transformer." + k.replace(".default", ""): v for k, v in tensors.items()}  # diffusers' saved form
    save_file(
        plain, str(tmp_path / "d.safetensors"), metadata={"lora_adapter_metadata": json.dumps({"lora_alpha": 16})}
    )
    lora = read_lora(tmp_path / "d.safetensors", CFG)
    assert lora.format == "diffusers" and lora.targets["blocks.1.mlp.fc2"].alpha == 16.0
    assert lora.targets["token_refiner.blocks.0.attn.qkv_proj"].alpha == 48.0


def official_module(ours: str) -> str:
    """Our module name -> diffusers' (for a qkv target: its attention module, holding to_q/k/v)."""
    name = ours.replace("token_refiner.blocks.", "token_refiner.refiner_blocks.")
    if name.startswith("blocks."):
        name = "transformer_blocks." + name.removeprefix("blocks.")
    for a, b in (
        (".attn.qkv_proj", ".attn"),
        (".attn.out_proj", ".attn.to_out.0"),
        (".mlp.fc1", ".ff.net.0.proj"),
        (".mlp.fc2", ".ff.net.2"),
        ("final_layer.adaln_proj.linear", "norm_out.linear"),
    ):
        name = name.replace(a, b)
    return name


def fused_pairs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """Our module name -> (A, B, alpha) of the diffusers adapter with qkv fused (A concatenated,
    B block-diagonal, alpha x 3); B rows stay in the diffusers order."""
    pairs = {}
    for ours in lora_targets(CFG):
        official = official_module(ours)
        parts = [f"{official}.to_{p}" for p in "qkv"] if ours.endswith("qkv_proj") else [official]
        a = torch.cat([tensors[f"{p}.lora_A.default.weight"] for p in parts])
        b = torch.block_diag(*(tensors[f"{p}.lora_B.default.weight"] for p in parts))
        pairs[ours] = (a, b, ALPHA * len(parts))
    return pairs


def assert_same_targets(lora, reference) -> None:
    assert sorted(lora.targets) == sorted(reference.targets)
    for name, target in reference.targets.items():
        mapped = lora.targets[name]
        assert torch.equal(mapped.a, target.a) and torch.equal(mapped.b, target.b), name
        assert mapped.alpha == target.alpha, name


def test_comfyui_fused_qkv_maps_like_diffusers(adapter, tmp_path):
    path, golden, tensors = adapter
    state = {}
    for number, (ours, (a, b, alpha)) in enumerate(fused_pairs(tensors).items()):
        official = official_module(ours)
        key = "diffusion_model." + (f"{official}.qkv_proj" if ours.endswith("qkv_proj") else official)
        down, up = ("lora_down", "lora_up") if number % 2 else ("lora_A", "lora_B")  # both spellings
        state.update({f"{key}.{down}.weight": a, f"{key}.{up}.weight": b, f"{key}.alpha": torch.tensor(alpha)})
    save_file(state, str(tmp_path / "comfy.safetensors"))
    lora = read_lora(tmp_path / "comfy.safetensors", CFG)
    assert lora.format == "comfyui"
    assert lora.targets["blocks.0.attn.qkv_proj"].alpha == 3 * ALPHA
    assert_same_targets(lora, read_lora(path, CFG))
    x, y, weight = golden["blocks.1.mlp.fc1"]
    assert torch.equal(F.linear(x, weight) + lora.targets["blocks.1.mlp.fc1"].delta(x), y)


@pytest.mark.parametrize("layout", ["qkv", "grouped"])
def test_flashgen_maps_like_diffusers(adapter, tmp_path, layout):
    path, golden, tensors = adapter
    heads, head_dim = CFG.num_heads, CFG.head_dim
    # [Q; K; V] row p * WIDTH + h * head_dim + d  ->  grouped row (h * 3 + p) * head_dim + d
    grouped_rows = [p * WIDTH + h * head_dim + d for h in range(heads) for p in range(3) for d in range(head_dim)]
    state = {}
    for ours, (a, b, _) in fused_pairs(tensors).items():
        if ours.endswith("mlp.fc1"):
            b = torch.cat([b[FFN:], b[:FFN]])  # diffusers [up; gate] -> ours [gate; up]
        if ours.endswith("qkv_proj") and layout == "grouped":
            b = b[grouped_rows]
        key = ours if ours.startswith("final_layer.") else f"transformer.{ours}"
        state.update({f"{key}.lora_A.weight": a, f"{key}.lora_B.weight": b})
    metadata = {"lora_rank": str(RANK), "lora_alpha": str(ALPHA), "qkv_layout": layout, "base_schedule": "turbo-4"}
    save_file(state, str(tmp_path / "flashgen.safetensors"), metadata=metadata)
    lora = read_lora(tmp_path / "flashgen.safetensors", CFG)
    assert (lora.format, lora.base_schedule, lora.metadata["qkv_layout"]) == ("flashgen", "turbo-4", layout)
    assert_same_targets(lora, read_lora(path, CFG))
    x, y, weight = golden["token_refiner.blocks.1.attn.out_proj"]
    assert torch.equal(F.linear(x, weight) + lora.targets["token_refiner.blocks.1.attn.out_proj"].delta(x), y)


def refusal(tmp_path, tensors, metadata=None) -> str:
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=metadata)
    with pytest.raises(ValueError) as error:
        read_lora(tmp_path / "bad.safetensors", CFG)
    return str(error.value)


def test_refusals_name_what_is_wrong(adapter, tmp_path):
    _, _, tensors = adapter
    extra = {f"transformer_blocks.0.attn.to_x.lora_{p}.default.weight": torch.zeros(RANK, RANK) for p in "AB"}
    assert refusal(tmp_path, {}) == "LoRA file holds no tensors"
    assert refusal(tmp_path, {**tensors, **extra}) == "LoRA file has unknown module 'transformer_blocks.0.attn.to_x'"
    base = {"transformer_blocks.0.attn.to_q.weight": torch.zeros(WIDTH, CFG.hidden_size)}
    assert refusal(tmp_path, {**tensors, **base}) == (
        "LoRA file has unknown tensor 'transformer_blocks.0.attn.to_q.weight'"
    )
    lone = dict(tensors)
    del lone["transformer_blocks.1.ff.net.2.lora_B.default.weight"]
    assert refusal(tmp_path, lone) == "LoRA module 'transformer_blocks.1.ff.net.2' has lora_A without its pair"
    wide = {**tensors, "transformer_blocks.1.ff.net.2.lora_A.default.weight": torch.zeros(RANK, FFN + 1)}
    assert refusal(tmp_path, wide) == (
        "LoRA module 'transformer_blocks.1.ff.net.2': A (4, 257) and B (96, 4) do not fit "
        "'blocks.1.mlp.fc2' of out=96, in=256"
    )
    flashgen = {f"transformer.blocks.0.attn.norm_q.lora_{p}.weight": torch.zeros(RANK, RANK) for p in "AB"}
    assert refusal(tmp_path, flashgen, {"lora_rank": "4", "lora_alpha": "4"}) == (
        "LoRA module 'transformer.blocks.0.attn.norm_q' targets no linear of the DiT ('blocks.0.attn.norm_q')"
    )
    fastvideo = {"transformer_blocks.0.attn.to_q.diff": torch.zeros(WIDTH, CFG.hidden_size)}
    assert refusal(tmp_path, fastvideo, {"format": "fastvideo-lora-v2"}) == (
        "LoRA file is FastH3's fastvideo-lora-v2 (full-rank weight diffs and sparse-attention gates), "
        "not a LoRA of A/B pairs: unsupported"
    )


def test_diffusers_qkv_parts_missing_from_the_file(tmp_path):
    # LoRA on to_q and to_v only (to_k keeps its base output): the stacked B has zero K rows
    toy, tensors = toy_adapter(seed=4)
    tensors = {k: v for k, v in tensors.items() if ".to_q." in k or ".to_v." in k}
    save_file(tensors, str(tmp_path / "qv.safetensors"))
    config = LoraConfig(r=RANK, lora_alpha=DEFAULT, target_modules=r".*\.(to_q|to_v)", lora_dropout=0.0)
    model = inject_adapter_in_model(config, toy).eval()
    assert model.load_state_dict(tensors, strict=False).unexpected_keys == []
    attn = model.token_refiner.refiner_blocks[1].attn
    target = read_lora(tmp_path / "qv.safetensors", CFG).targets["token_refiner.blocks.1.attn.qkv_proj"]
    assert (target.rank, target.alpha) == (2 * RANK, 2 * DEFAULT)
    q, v = (f"token_refiner.refiner_blocks.1.attn.to_{p}.lora_B.default.weight" for p in "qv")
    assert torch.equal(target.b, torch.block_diag(tensors[q], torch.zeros(WIDTH, 0), tensors[v]))
    x = torch.randn(5, CFG.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        y = torch.cat([attn.to_q(x), attn.to_k(x), attn.to_v(x)], dim=-1)
        weight = torch.cat([attn.to_q.base_layer.weight, attn.to_k.weight, attn.to_v.base_layer.weight])
        ours = F.linear(x, weight) + target.delta(x)
    torch.testing.assert_close(ours, y, rtol=1.3e-6, atol=1e-5)  # float32 rounding, as for the full qkv
    assert torch.equal(ours[:, WIDTH : 2 * WIDTH], y[:, WIDTH : 2 * WIDTH])  # K: base only, exactly
