"""fp8 block linears (h3_dit parameter `quantization = fp8`): the four linears of every DiT block
(qkv_proj, out_proj, fc1, fc2) multiply in float8 e4m3 with per-output-channel weight scales and
per-row activation scales, accumulate in fp32 and return bf16 (torch._scaled_mm, row-wise
scaling). Attention, norms, AdaLN projections, embeddings, the token refiner and the final layer
stay in the model dtype.

Scales (the usual "row-wise" fp8 recipe, e.g. the FBGEMM / torchao float8 row-wise GEMMs):
weight W [out, in] -> s_w[j] = max_k |W[j, k]| / 448, W8 = e4m3(W / s_w); activation x [rows, in]
-> s_x[i] = max_k |x[i, k]| / 448, x8 = e4m3(x / s_x); y[i, j] = s_x[i] s_w[j] sum_k x8[i, k] W8[j, k].
448 is e4m3's largest finite value.

Batch invariance (docs/principles.md §8): s_x of a row depends on that row alone, and the
GEMM runs on whole packs like the bf16 ones (row tiles on the CPU, one call per linear on CUDA
with the cuBLAS workspace off), so a row's result does not depend on the pack (checked on the
H200 by benchmarks/batch_invariance.py and tests/test_gpu.py, on the CPU by tests/test_fp8.py).
Under H3DiT.compile_blocks the activation quantisation is traced into the compiled block halves,
so it fuses with the norm and modulation before it.
"""

import torch

from .dit import H3DiT, Linear

QUANTIZATIONS = ("none", "fp8")
E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448.0
MIN_AMAX = 1e-12  # an all-zero row (padding) gets this amax instead of 0, so it quantises to 0, not NaN
MIN_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada (8.9), Hopper (9.0) and later


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-row scales of x [rows, k] (any float dtype): float32 [rows, 1] = max |x[i, :]| / 448."""
    return x.abs().amax(dim=-1, keepdim=True).float().clamp(min=MIN_AMAX) / E4M3_MAX


def to_e4m3(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [rows, k] / scales [rows, 1] (float32), clamped to +-448 (a cast past it gives NaN) ->
    float8_e4m3fn [rows, k]."""
    return (x.float() / scales).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


class Fp8Linear(Linear):
    """A bias-free block linear in fp8 e4m3 (module docstring): weight float8_e4m3fn
    [out_features, in_features], weight_scale float32 [1, out_features]. x [rows, in_features]
    in any float dtype -> [rows, out_features] in x's dtype (the GEMM returns bf16). Row tiling
    as Linear."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias=False, device="meta")
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.register_buffer("weight_scale", weight_scale)

    @classmethod
    def empty(cls, out_features: int, in_features: int, device: str | torch.device) -> "Fp8Linear":
        """An unfilled Fp8Linear [out_features, in_features] on `device` (quantize_ fills it)."""
        weight = torch.empty(out_features, in_features, dtype=E4M3, device=device)
        return cls(weight, torch.empty(1, out_features, dtype=torch.float32, device=device))

    @torch.no_grad()
    def quantize_(self, weight: torch.Tensor) -> None:
        """Fill the fp8 weight and its scales from a full-precision weight [out_features,
        in_features] (any float dtype, any device), as from_linear quantises a Linear's weight."""
        weight = weight.to(self.weight.device)
        scale = row_scales(weight)
        self.weight.copy_(to_e4m3(weight, scale))
        self.weight_scale.copy_(scale.t())

    @classmethod
    def from_linear(cls, linear: Linear) -> "Fp8Linear":
        """Quantise a bias-free Linear's weight (per output channel). Raises ValueError for a
        linear with a bias."""
        if linear.bias is not None:
            raise ValueError("Fp8Linear quantises bias-free linears only")
        weight = linear.weight.detach()
        scale = row_scales(weight)  # [out, 1]
        fp8 = cls(to_e4m3(weight, scale), scale.t().contiguous())
        fp8.row_tile = linear.row_tile
        return fp8

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        scales = row_scales(x)
        y = torch._scaled_mm(
            to_e4m3(x, scales), self.weight.t(), scale_a=scales, scale_b=self.weight_scale, out_dtype=torch.bfloat16
        )
        return y.to(x.dtype)


def block_linears(dit: H3DiT) -> list[tuple[torch.nn.Module, str]]:
    """(parent module, attribute) of the 4 x num_layers linears that fp8 quantises."""
    return [
        (parent, name)
        for block in dit.blocks
        for parent, name in ((block.attn, "qkv_proj"), (block.attn, "out_proj"), (block.mlp, "fc1"), (block.mlp, "fc2"))
    ]


def check_quantization(quantization: str, device: str | torch.device) -> None:
    """Raise ValueError unless `quantization` is in QUANTIZATIONS and, for fp8 on CUDA, the GPU
    has fp8 tensor cores (compute capability >= 8.9). fp8 on the CPU runs PyTorch's reference
    kernels: slow, for tests."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"h3_dit parameter quantization={quantization!r} is not one of {QUANTIZATIONS}")
    device = torch.device(device)
    if quantization == "fp8" and device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            raise ValueError(
                f"h3_dit parameter quantization=fp8 needs a GPU of compute capability >= "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (fp8 tensor cores), {device} has "
                f"{capability[0]}.{capability[1]}"
            )


def build_dit(
    cfg, attention_backend: str, device: str | torch.device, quantization: str, adaln_weights: str = "device"
) -> H3DiT:
    """An unloaded H3DiT (a DiTConfig `cfg`) for h3_dit's `quantization`: "none" builds it as it
    is; "fp8" builds its block linears on the meta device and puts an empty Fp8Linear on `device`
    in each one's place, so the bf16 block weights are never allocated: h3_core.weights.checkpoint
    .load_dit then quantises each block linear's weight as it is read or drawn (Fp8Linear.quantize_),
    one tensor at a time, to the bits quantize_blocks gives after a bf16 load (tests/test_fp8.py).
    adaln_weights: H3DiT's (the AdaLN projections stay in the model dtype either way).
    Raises ValueError as check_quantization, and what H3DiT raises."""
    check_quantization(quantization, device)
    if quantization == "none":
        return H3DiT(cfg, attention_backend=attention_backend, device=device, adaln_weights=adaln_weights)
    dit = H3DiT(cfg, attention_backend, device=device, block_linears_device="meta", adaln_weights=adaln_weights)
    for parent, name in block_linears(dit):
        linear = getattr(parent, name)
        fp8 = Fp8Linear.empty(linear.out_features, linear.in_features, dit.device)
        fp8.row_tile = linear.row_tile
        setattr(parent, name, fp8)
    return dit


def quantize_blocks(dit: H3DiT, quantization: str) -> None:
    """Apply h3_dit's `quantization` to a loaded DiT in place: "none" leaves it as it is; "fp8"
    replaces its block linears by Fp8Linear (the bf16 weights are freed once the last reference
    to them goes). Call it after loading the weights and before H3DiT.compile_blocks.
    Raises ValueError as check_quantization."""
    check_quantization(quantization, dit.device)
    if quantization == "fp8":
        for parent, name in block_linears(dit):
            setattr(parent, name, Fp8Linear.from_linear(getattr(parent, name)))
