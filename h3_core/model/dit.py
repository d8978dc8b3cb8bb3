"""The H3 diffusion transformer (docs/model.md §1): one module, config-driven, nanoGPT style.

Dataflow of `H3DiT.forward` for a PackedBatch of N requests (rows S = sum of padded lengths):
video rows -> video_patch_proj (fp32), audio rows -> audio_patch_proj (fp32), text ->
condition_proj -> 2-block token refiner; scattered into a zero [S, H] buffer (padding rows stay
0); time embedding of each unique timestep; num_layers AdaLN blocks with 3-axis RoPE and
per-document attention; final layer; fp32 video/audio heads.

Batch invariance (solo == co-batched, bitwise): no row's result may depend on how many rows
share the forward. On the CPU every row-wise linear runs in GEMM calls of 64 rows (`row_tile`,
oneDNN picks other kernels for other row counts); on CUDA each linear is one GEMM over the whole
pack with cuBLAS's split-K workspace off (CUBLAS_WORKSPACE_CONFIG=:0:0, set by
use_bitwise_cublas before cuBLAS starts), which the H200 showed row invariant for every linear
of the DiT at 64..65,536 rows and any offset (benchmarks/batch_invariance.py,
docs/gpu_backends.md). The time embedder and AdaLN projections run once per unique timestep
value, and with the AdaLN table (use_adaln_table, h3_core.model.adaln_table) once per value
ever seen; CUDA graphs of small packs live in h3_core.model.graphs.
"""

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import AUDIO_ROW_WIDTH, ROW_ALIGN, VIDEO_ROW_WIDTH, DiTConfig
from .adaln_table import AdaLNSlots, AdaLNTable, check_adaln_weights
from .attention import AttentionFn, Documents, get_attention_backend
from .graphs import GRAPH_MAX_ROWS, GRAPHS_KEPT, GraphedForward
from .lora import LoraAdapters, LoraPlan, LoraSlot, lora_scope, row_tiled
from .packed import PackedBatch
from .rope import apply_rope, rope_table

# Default row tiles, bitwise solo == co-batched: 64 rows on the CPU; on CUDA none (one GEMM per
# linear) with the cuBLAS workspace off. The 4096-row tiles used before cost a 128-row request
# 43.6 vs 17.9 ms a step on the H200 (bench config, benchmarks/results/batch_invariance_h200.json).
CPU_ROW_TILE, GPU_ROW_TILE = 64, 0
BITWISE_CUBLAS_WORKSPACE = ":0:0"  # CUBLAS_WORKSPACE_CONFIG: no workspace, so no split-K reduction


RECOMPILE_LIMIT = 64  # compiled entries per code object (compile_blocks; torch's default is 8)


def use_bitwise_cublas() -> None:
    """Set CUBLAS_WORKSPACE_CONFIG=:0:0 for this process. cuBLAS reads it when it first runs, so
    call this before the process's first CUDA GEMM (load_engine and the h3_dit model do)."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = BITWISE_CUBLAS_WORKSPACE


class Linear(nn.Linear):
    """nn.Linear that, when `row_tile` > 0, multiplies in GEMM calls of exactly `row_tile` rows
    (the last tile zero-padded), so every call has one shape and a row's result does not depend
    on how many rows share the forward (docs/model.md §3.5 (3)). One-row inputs run as one call.
    x: [rows, in_features] -> [rows, out_features] in x's dtype. Subclasses change the GEMM
    (`gemm`; h3_core.model.fp8.Fp8Linear), not the tiling."""

    row_tile: int = 0
    lora: LoraSlot | None = None  # per-request LoRA deltas after the base GEMM (h3_core.model.lora)

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """One GEMM call: x [rows, in_features] -> [rows, out_features]."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = row_tiled(self.gemm, x, self.row_tile)
        return y if self.lora is None else self.lora.apply(x, y)


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps): normalise in fp32, multiply by the fp32 weight, cast
    back to x's dtype (docs/model.md §1.4). Works on the last dim of any shape."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class Attention(nn.Module):
    """Fused qkv (no bias) -> per-head QK RMSNorm -> optional RoPE -> varlen attention -> out_proj.
    linear_device: where qkv_proj and out_proj are built (None: the surrounding default device)."""

    def __init__(self, cfg: DiTConfig, dtype: torch.dtype, linear_device: str | None = None):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, 3 * cfg.attn_width, bias=False, dtype=dtype, device=linear_device)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.eps, dtype)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.eps, dtype)
        self.out_proj = Linear(cfg.attn_width, cfg.hidden_size, bias=False, dtype=dtype, device=linear_device)

    def forward(
        self,
        x: torch.Tensor,
        attention: AttentionFn,
        documents: Documents,
        rope: torch.Tensor | None,
    ) -> torch.Tensor:
        rows = x.shape[0]
        q, k, v = self.qkv_proj(x).view(rows, 3, self.heads, self.head_dim).unbind(1)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = attention(q, k, v, documents)
        return self.out_proj(out.reshape(rows, self.heads * self.head_dim))


class MLP(nn.Module):
    """SiLU-gated MLP: fc1 -> [gate; up] -> silu(gate) * up -> fc2 (no biases), built on
    linear_device (None: the surrounding default device)."""

    def __init__(self, cfg: DiTConfig, dtype: torch.dtype, linear_device: str | None = None):
        super().__init__()
        self.fc1 = Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False, dtype=dtype, device=linear_device)
        self.fc2 = Linear(cfg.ffn_size, cfg.hidden_size, bias=False, dtype=dtype, device=linear_device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)


def residual(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """x + update computed in fp32 and rounded to x's dtype (docs/model.md §1.6)."""
    return (x.float() + update.float()).to(x.dtype)


class RefinerBlock(nn.Module):
    """Token refiner block: pre-norm attention (QK-norm, no RoPE, no AdaLN) and MLP (§1.7)."""

    def __init__(self, cfg: DiTConfig, dtype: torch.dtype):
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.eps, dtype)
        self.attn = Attention(cfg, dtype)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.eps, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x, attention, documents):
        x = residual(x, self.attn(self.norm1(x), attention, documents, rope=None))
        return residual(x, self.mlp(self.norm2(x)))


class TokenRefiner(nn.Module):
    """Refiner blocks then a final RMSNorm over the projected text rows."""

    def __init__(self, cfg: DiTConfig, dtype: torch.dtype):
        super().__init__()
        self.blocks = nn.ModuleList(RefinerBlock(cfg, dtype) for _ in range(cfg.num_refiner_layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.eps, dtype)

    def forward(self, x, attention, documents):
        for block in self.blocks:
            x = block(x, attention, documents)
        return self.final_norm(x)


class TimeEmbedder(nn.Module):
    """t in [0, 1] -> sinusoid [cos(t f) | sin(t f)] (f_j = 10000^(-j/(D/2))) -> proj_in -> SiLU
    -> proj_out, all fp32 (docs/model.md §1.6). Input float32 [1]; output float32 [1, time_embed_dim]."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.freq_dim = cfg.timestep_freq_dim
        self.proj_in = Linear(cfg.timestep_freq_dim, cfg.time_embed_hidden_size, dtype=torch.float32)
        self.proj_out = Linear(cfg.time_embed_hidden_size, cfg.time_embed_dim, dtype=torch.float32)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        angles = t.float()[:, None] * freqs
        return self.proj_out(F.silu(self.proj_in(torch.cat([angles.cos(), angles.sin()], dim=-1))))


class AdaLNProj(nn.Module):
    """Linear(time_embed_dim -> n x hidden) over SiLU(t_emb): t_emb float32 [M, time_embed_dim]
    -> [M, n x hidden] in the model dtype. per_timestep=True (serving) makes one call per
    timestep, so the result is independent of how many timesteps share the forward; False
    (training) one call for all M. Given AdaLNSlots (H3DiT.use_adaln_table) instead of t_emb, the
    stored rows of those one-row calls.

    host=True (h3_dit adaln_weights = host): `linear` is built on the meta device and the weight
    [n x hidden, time_embed_dim] and bias [n x hidden] live in `host` (CPU tensors, pinned when
    `pin`), no parameters; a per-timestep call copies them to t_emb's device first (the AdaLN
    table streams them once per fill pass instead, h3_core.model.adaln_table)."""

    def __init__(self, cfg: DiTConfig, n: int, dtype: torch.dtype, host: bool = False, pin: bool = False):
        super().__init__()
        self.linear = Linear(cfg.time_embed_dim, n * cfg.hidden_size, dtype=dtype, device="meta" if host else None)
        self.host: tuple[torch.Tensor, torch.Tensor] | None = None
        if host:
            shape = (n * cfg.hidden_size, cfg.time_embed_dim)
            weight = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pin)
            self.host = (weight, torch.empty(shape[0], dtype=dtype, device="cpu", pin_memory=pin))

    def project_input(self, e: torch.Tensor) -> torch.Tensor:
        """The GEMM input of time embeddings e float32 [rows, time_embed_dim]: SiLU(e) in the model dtype."""
        return F.silu(e).to(self.linear.weight.dtype)

    @staticmethod
    def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One projection call: x [1, time_embed_dim] (project_input) -> [1, n x hidden], the
        GEMM Linear runs for one row, with the weight wherever it was read from."""
        return F.linear(x, weight, bias)

    def forward(self, t_emb: torch.Tensor, per_timestep: bool = True) -> torch.Tensor:
        if isinstance(t_emb, AdaLNSlots):
            out = t_emb.rows(self)
            return out if self.linear.lora is None else self.linear.lora.extend(self, t_emb, out)
        if not per_timestep:
            return self.linear(self.project_input(t_emb))
        if self.host is None:
            weight, bias = self.linear.weight, self.linear.bias
        else:
            weight, bias = (tensor.to(t_emb.device, non_blocking=True) for tensor in self.host)
        out = torch.cat([self.project(self.project_input(e), weight, bias) for e in t_emb.split(1)])
        return out if self.linear.lora is None else self.linear.lora.extend(self, t_emb, out)


class DiTBlock(nn.Module):
    """AdaLN block (docs/model.md §1.6): modulation row c = unique_index * 3 + modality.

    h = norm1(x)(1 + scale_msa[c]) + shift_msa[c]; x += gate_msa[c] * attn(h);
    h = norm2(x)(1 + scale_mlp[c]) + shift_mlp[c]; x += gate_mlp[c] * mlp(h).

    The row-wise work runs in two halves around the attention call, `before_attention` and
    `after_attention`, which H3DiT.compile_blocks compiles (the per-document attention in between
    stays eager: its loop over documents depends on the pack).
    """

    def __init__(
        self, cfg: DiTConfig, dtype: torch.dtype, linear_device: str | None = None, host_adaln: tuple[bool, bool] = ()
    ):
        super().__init__()
        self.hidden = cfg.hidden_size
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.eps, dtype)
        self.attn = Attention(cfg, dtype, linear_device)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.eps, dtype)
        self.mlp = MLP(cfg, dtype, linear_device)
        self.adaln_proj = AdaLNProj(cfg, 18, dtype, *host_adaln)

    def before_attention(self, x, table, mod_index, rope):
        """AdaLN-modulated norm1, qkv projection, QK-norm and RoPE: q, k, v [rows, heads, head_dim]."""
        shift_msa, scale_msa = table[:, : self.hidden], table[:, self.hidden : 2 * self.hidden]
        h = self.norm1(x) * (1 + scale_msa[mod_index]) + shift_msa[mod_index]
        attn, rows = self.attn, x.shape[0]
        q, k, v = attn.qkv_proj(h).view(rows, 3, attn.heads, attn.head_dim).unbind(1)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        return q, k, v

    def after_attention(self, x, out, table, mod_index):
        """out_proj, gated residual, AdaLN-modulated norm2, MLP, gated residual -> new x."""
        gate_msa, shift_mlp, scale_mlp, gate_mlp = table[:, 2 * self.hidden :].chunk(4, dim=-1)
        x = residual(x, gate_msa[mod_index] * self.attn.out_proj(out.reshape(x.shape[0], -1)))
        h = self.norm2(x) * (1 + scale_mlp[mod_index]) + shift_mlp[mod_index]
        return residual(x, gate_mlp[mod_index] * self.mlp(h))

    def forward(self, x, t_emb, mod_index, attention, documents, rope, per_timestep=True):
        # [M, 18H] -> [M*3, 6H]: rows m*3 + modality, chunks shift/scale/gate for msa then mlp.
        table = self.adaln_proj(t_emb, per_timestep).view(-1, 6 * self.hidden)
        q, k, v = self.before_attention(x, table, mod_index, rope)
        return self.after_attention(x, attention(q, k, v, documents), table, mod_index)


class FinalLayer(nn.Module):
    """RMSNorm -> per-timestep shift/scale (no modality) -> fp32 video and audio heads."""

    def __init__(self, cfg: DiTConfig, dtype: torch.dtype, host_adaln: tuple[bool, bool] = ()):
        super().__init__()
        self.hidden = cfg.hidden_size
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps, dtype)
        self.adaln_proj = AdaLNProj(cfg, 2, dtype, *host_adaln)
        self.video_out = Linear(cfg.hidden_size, VIDEO_ROW_WIDTH, dtype=torch.float32)
        self.audio_out = Linear(cfg.hidden_size, AUDIO_ROW_WIDTH, dtype=torch.float32)

    def forward(self, x, t_emb, timestep_index, per_timestep=True):
        shift, scale = self.adaln_proj(t_emb, per_timestep).chunk(2, dim=-1)
        h = (self.norm(x) * (1 + scale[timestep_index]) + shift[timestep_index]).float()
        return self.video_out(h), self.audio_out(h)


@dataclass
class PackRows:
    """The device tensors of a PackedBatch that depend only on its requests' layouts
    (H3DiT.pack_rows), so a CUDA graph of a pack structure keeps them between replays; S = the
    pack's rows."""

    video_rows: torch.Tensor  # int64 [sum V]: the rows holding video tokens
    audio_rows: torch.Tensor  # int64 [sum 2*T_a]: the rows holding audio tokens
    text_rows: torch.Tensor  # int64 [sum L]: the rows receiving refined text
    refiner_text_rows: torch.Tensor  # int64 [sum L]: where each text token sits in the refiner sequence
    refiner_rows: int  # rows of the refiner sequence
    modality: torch.Tensor  # int64 [S]: a row's AdaLN modality (token tag; padding, -1, clamped to 0: as video)
    rope: torch.Tensor  # [S, 6 * rope_freqs_per_axis] model dtype: rope_table of the rows
    documents: Documents  # the pack's attention documents
    refiner_documents: Documents  # the refiner sequence's
    lora: LoraPlan | None = None  # the pack's per-request LoRA work (H3DiT.loras.plan)


@dataclass
class Embedded:
    """The packed rows as the blocks take them (H3DiT.embed), all on the DiT's device; S = the
    pack's rows, M = its unique timesteps."""

    x: torch.Tensor  # [S, hidden] model dtype: the embedded rows (padding rows 0)
    t_emb: torch.Tensor | AdaLNSlots  # float32 [M, time_embed_dim], or the table's slots (use_adaln_table)
    mod_index: torch.Tensor  # int64 [S]: a row's AdaLN modulation row (timestep_index * 3 + modality)
    timestep_index: torch.Tensor  # int64 [S]: a row's row of t_emb (+ its LoRA AdaLN group x M: lora.LoraPlan)
    rows: PackRows


class H3DiT(nn.Module):
    """The H3 DiT. Parameter names are the native (vllm-omni) names of docs/model.md §1.3.

    Args:
        cfg: sizes (config.CONFIGS).
        attention_backend: name in attention.BACKENDS (RuntimeError when it cannot run on
            `device` with the config's dtype).
        row_tile: rows per linear GEMM call (see set_row_tile); None = the device's bitwise
            default (CPU_ROW_TILE on the CPU; on CUDA one GEMM per linear with the cuBLAS
            workspace off: RuntimeError unless CUBLAS_WORKSPACE_CONFIG is :0:0,
            use_bitwise_cublas); 0 = one call per linear, batch-invariant only on CUDA with
            that workspace setting (training uses it).
        device: where the parameters live ("meta" for shape-only models).
        block_linears_device: where the blocks' qkv_proj, out_proj, fc1 and fc2 are built (None:
            `device`; "meta" for a loader that replaces them, h3_core.model.fp8.build_dit).
        adaln_weights: h3_dit's (adaln_table.ADALN_WEIGHTS): "device", or "host": every AdaLNProj's
            weight and bias in host memory (pinned on CUDA), none on `device` (AdaLNProj; the
            AdaLN table streams them per fill pass). ValueError for another value.
    """

    def __init__(
        self,
        cfg: DiTConfig,
        attention_backend: str = "sdpa",
        row_tile: int | None = None,
        device: str | torch.device = "cpu",
        block_linears_device: str | None = None,
        adaln_weights: str = "device",
    ):
        super().__init__()
        check_adaln_weights(adaln_weights)
        cuda = torch.device(device).type == "cuda"
        if row_tile is None and cuda and os.environ.get("CUBLAS_WORKSPACE_CONFIG") != BITWISE_CUBLAS_WORKSPACE:
            raise RuntimeError(
                f"the DiT on CUDA is batch-invariant only with CUBLAS_WORKSPACE_CONFIG={BITWISE_CUBLAS_WORKSPACE}, "
                f"got {os.environ.get('CUBLAS_WORKSPACE_CONFIG')!r}: call h3_core.model.dit.use_bitwise_cublas() "
                "before the process's first CUDA GEMM, or pass row_tile explicitly"
            )
        self.cfg = cfg
        dtype = cfg.torch_dtype
        host = (True, cuda) if adaln_weights == "host" else ()  # AdaLNProj's host, pin
        with torch.device(device):
            self.video_patch_proj = Linear(VIDEO_ROW_WIDTH, cfg.hidden_size, dtype=torch.float32)
            self.audio_patch_proj = Linear(AUDIO_ROW_WIDTH, cfg.hidden_size, dtype=torch.float32)
            self.condition_proj = Linear(cfg.text_dim, cfg.hidden_size, dtype=dtype)
            self.token_refiner = TokenRefiner(cfg, dtype)
            self.time_embedder = TimeEmbedder(cfg)
            self.blocks = nn.ModuleList(DiTBlock(cfg, dtype, block_linears_device, host) for _ in range(cfg.num_layers))
            self.final_layer = FinalLayer(cfg, dtype, host)
        self.attention = get_attention_backend(attention_backend, device, dtype)
        if row_tile is None:
            row_tile = GPU_ROW_TILE if cuda else CPU_ROW_TILE
        self.set_row_tile(row_tile)
        self.graphs: GraphedForward | None = None  # use_cuda_graphs
        self.adaln_table: AdaLNTable | None = None  # use_adaln_table
        self.max_compiled_rows: int | None = None  # compile_blocks
        self.loras = LoraAdapters(self)  # per-request LoRA adapters (h3_core.model.lora)

    def compile_blocks(self) -> None:
        """Compile every DiTBlock's row-wise halves (before_attention, after_attention) with
        torch.compile(dynamic=True): one graph per half whatever the pack's row count, so a new
        pack shape costs no recompilation (the row count and the number of timesteps are symbolic;
        the blocks share their code, so all of them reuse the first one's compiled graphs). The
        per-document attention between them stays eager. A compiled step is not bitwise equal to
        an eager one (fused elementwise work rounds differently), so a server compiles once at
        load and runs every mode through the same compiled code.

        The compiled kernels index with int32 while the widest intermediate (fc1's 2 x ffn_size
        or qkv's 3 x attn_width columns) holds fewer than 2^31 elements; a larger pack would
        recompile them with int64 indices (dynamo's guard, seen on the H200 at 131,072 rows),
        and from then on a request would no longer meet the kernels of its earlier steps or of
        the CUDA graphs captured before. So `transformer` refuses packs of more than
        max_compiled_rows rows (74,898 for the H3 widths; servers pack at most
        server.sizing.MAX_BATCH_ROWS = 65,536)."""
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # never fall back to eager silently
        # with LoRA slots a Linear's forward breaks the graph at its slot (the deltas run eagerly) and
        # its resumed code compiles once per linear shape (in_features are static), for every config
        # in the process: 4 shapes a config, so 8 entries were hit by three DiTs in one process
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        cfg = self.cfg
        self.max_compiled_rows = (2**31 - 1) // max(2 * cfg.ffn_size, 3 * cfg.attn_width)
        for block in self.blocks:
            block.before_attention = torch.compile(block.before_attention, dynamic=True)
            block.after_attention = torch.compile(block.after_attention, dynamic=True)

    def use_cuda_graphs(self, max_rows: int = GRAPH_MAX_ROWS, kept: int = GRAPHS_KEPT) -> None:
        """Replay packs of at most `max_rows` rows from CUDA graphs (GraphedForward), keeping at
        most `kept` pack structures. CUDA only (RuntimeError on another device; ValueError for
        max_rows or kept below 1); load_engine turns it on for a GPU DiT after compile_blocks."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device.type}")
        if kept < 1 or max_rows < 1:
            raise ValueError(f"CUDA graphs need max_rows >= 1 and kept >= 1, got {max_rows} and {kept}")
        self.graphs = GraphedForward(self, max_rows, kept)

    def use_adaln_table(self, capacity: int) -> None:
        """Read every AdaLN projection from an AdaLNTable of `capacity` timestep values (h3_core.
        model.adaln_table: bitwise the per-timestep projections, each value computed once). Call it
        after loading the weights (the table keeps values of the weights it saw); captured CUDA
        graphs are dropped (they read the old table's memory). ValueError for capacity < 1."""
        self.adaln_table = AdaLNTable(self, capacity)
        if self.graphs is not None:
            self.use_cuda_graphs(self.graphs.max_rows, self.graphs.kept)

    def step_timesteps(self, batch: PackedBatch) -> torch.Tensor:
        """The pack's timestep input of forward_rows: its unique timesteps (float32 [M]), or with
        the AdaLN table their slots (int64 [M] on the DiT's device, filling unseen values)."""
        return batch.unique_timesteps if self.adaln_table is None else self.adaln_table.slots(batch.unique_timesteps)

    def set_row_tile(self, row_tile: int) -> None:
        """Run every row-wise linear in GEMM calls of `row_tile` rows (0 = one call per linear).

        The linears on the text-refiner sequence (condition_proj, token_refiner) then use
        ROW_ALIGN (64) rows: every request's text block there starts at a multiple of 64 rows,
        so 64-row tiles never pad (a 4096-row tile would pad a 64-row text block 64-fold).
        """
        refiner = {id(m) for m in (self.condition_proj, *self.token_refiner.modules())}
        for module in self.modules():
            if isinstance(module, Linear):
                module.row_tile = min(row_tile, ROW_ALIGN) if id(module) in refiner else row_tile

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return self.video_patch_proj.weight.device

    @torch.inference_mode()
    def forward(
        self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, batch: PackedBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One packed forward: `embed`, then `transformer` over every row, then the video and
        audio rows of the heads' outputs. A pack of at most graphs.max_rows rows replays its
        CUDA graph when graphs are on (use_cuda_graphs): the same kernels, so the same bits.

        Args:
            video: float32 [sum V, 96] noisy video rows of all requests, in batch order.
            audio: float32 [sum 2*T_a, 32] noisy audio rows (channel-major per request).
            text: [sum L, text_dim] text encoder states of all requests, in batch order.
            batch: the PackedBatch describing the rows.
        Returns:
            (video velocity float32 [sum V, 96], audio velocity float32 [sum 2*T_a, 32]).
        """
        if self.graphs is not None and batch.total_rows <= self.graphs.max_rows:
            return self.graphs(video, audio, text, batch)
        return self.forward_rows(video, audio, text, *self.device_batch(batch))

    def forward_rows(
        self,
        video: torch.Tensor,
        audio: torch.Tensor,
        text: torch.Tensor,
        unique_timesteps: torch.Tensor,
        inverse_indices: torch.Tensor,
        rows: PackRows,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` from device tensors only (what a CUDA graph captures: no host read-back, no
        copy to the device): video, audio, text as forward's; unique_timesteps float32 [M] and
        inverse_indices int64 [S] of the PackedBatch, on the device (with the AdaLN table the int64
        slots of step_timesteps in place of unique_timesteps); rows = pack_rows(batch)."""
        e = self.embed_rows(video, audio, text, unique_timesteps, inverse_indices, rows)
        with lora_scope(rows.lora):
            video_out, audio_out = self.transformer(
                e.x, e.t_emb, e.mod_index, e.timestep_index, self.attention, rows.documents, rows.rope
            )
        return video_out[rows.video_rows], audio_out[rows.audio_rows]

    def device_batch(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, PackRows]:
        """What forward_rows and embed_rows take of `batch`, on the DiT's device: step_timesteps
        (float32 [M], or int64 slots), each row's index into them (int64 [S]) and its PackRows."""
        device = self.device
        return self.step_timesteps(batch).to(device), batch.inverse_indices.to(device), self.pack_rows(batch)

    def pack_rows(self, batch: PackedBatch) -> PackRows:
        """The batch's layout-determined tensors on the DiT's device (PackRows), with its
        attention Documents and the RoPE table of its rows."""
        cfg, device = self.cfg, self.device
        return PackRows(
            video_rows=batch.video_rows.to(device),
            audio_rows=batch.audio_rows.to(device),
            text_rows=batch.text_rows.to(device),
            refiner_text_rows=batch.refiner_text_rows.to(device),
            refiner_rows=batch.refiner_rows,
            modality=batch.token_tags.clamp(min=0).to(device),
            rope=rope_table(batch.position_ids.to(device), cfg.rope_freqs_per_axis, cfg.rope_theta, cfg.torch_dtype),
            documents=Documents(batch.cu_seqlens, batch.total_rows, device),
            refiner_documents=Documents(batch.refiner_cu_seqlens, batch.refiner_rows, device),
            lora=self.loras.plan(batch),
        )

    def embed(self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, batch: PackedBatch) -> "Embedded":
        """The part of `forward` before the blocks, over the whole pack (arguments as forward's);
        see embed_rows. Sequence-parallel ranks (h3_core.parallel.ulysses) run it unchanged,
        each over the whole pack."""
        return self.embed_rows(video, audio, text, *self.device_batch(batch))

    def embed_rows(
        self,
        video: torch.Tensor,
        audio: torch.Tensor,
        text: torch.Tensor,
        unique_timesteps: torch.Tensor,
        inverse_indices: torch.Tensor,
        rows: PackRows,
    ) -> "Embedded":
        """The patch projections and the token refiner scattered into the rows, the time
        embedding of each unique timestep and the AdaLN row indices (arguments as forward_rows')."""
        cfg, device, dtype = self.cfg, self.device, self.cfg.torch_dtype
        total = rows.modality.shape[0]

        # Embedding: each modality projected over all rows (fixed shapes), kept at its own rows.
        x = torch.zeros(total, cfg.hidden_size, dtype=dtype, device=device)
        video_in = torch.zeros(total, VIDEO_ROW_WIDTH, device=device).index_copy_(0, rows.video_rows, video)
        x.index_copy_(0, rows.video_rows, self.video_patch_proj(video_in)[rows.video_rows].to(dtype))
        audio_in = torch.zeros(total, AUDIO_ROW_WIDTH, device=device).index_copy_(0, rows.audio_rows, audio)
        x.index_copy_(0, rows.audio_rows, self.audio_patch_proj(audio_in)[rows.audio_rows].to(dtype))
        text_in = torch.zeros(rows.refiner_rows, cfg.text_dim, dtype=dtype, device=device)
        text_in.index_copy_(0, rows.refiner_text_rows, text.to(dtype))
        with lora_scope(rows.lora):
            refined = self.token_refiner(self.condition_proj(text_in), self.attention, rows.refiner_documents)
        x.index_copy_(0, rows.text_rows, refined[rows.refiner_text_rows])

        # Conditioning: one time embedding per unique timestep (or the table's slots); row -> AdaLN row index.
        if self.adaln_table is not None:
            t_emb = AdaLNSlots(self.adaln_table, unique_timesteps)
        else:
            t_emb = torch.cat([self.time_embedder(t) for t in unique_timesteps.split(1)])
        if rows.lora is not None:  # rows of requests with AdaLN adapters read their own AdaLN rows
            inverse_indices = rows.lora.adaln_rows(inverse_indices, unique_timesteps.shape[0])
        return Embedded(x, t_emb, inverse_indices * 3 + rows.modality, inverse_indices, rows)

    def transformer(
        self,
        x: torch.Tensor,
        t_emb: torch.Tensor,
        mod_index: torch.Tensor,
        timestep_index: torch.Tensor,
        attention: AttentionFn,
        documents: Documents | None,
        rope: torch.Tensor,
        per_timestep: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The AdaLN blocks and the final layer over embedded rows: the part of `forward` after
        the embedding, shared by serving (forward) and training (training/dit_train.py, which
        calls it with gradients, its own attention function and per_timestep=False).

        Args:
            x: [S, hidden] embedded rows in the model dtype.
            t_emb: float32 [M, time_embed_dim], one row per timestep.
            mod_index: int64 [S], a row's AdaLN modulation row: timestep_index * 3 + modality tag.
            timestep_index: int64 [S], a row's row of t_emb.
            attention: an AttentionFn; `documents` is passed to it unchanged.
            rope: [S, 6 * rope_freqs_per_axis] rope_table of the rows, model dtype.
            per_timestep: one AdaLN projection call per timestep (serving's batch invariance)
                or one for all of t_emb (see AdaLNProj).
        Returns:
            (video head float32 [S, 96], audio head float32 [S, 32]) for every row.
        Raises:
            ValueError: compiled blocks (compile_blocks) and S > max_compiled_rows.
        """
        if self.max_compiled_rows is not None and x.shape[0] > self.max_compiled_rows:
            raise ValueError(
                f"a pack of {x.shape[0]:,} rows exceeds the compiled blocks' {self.max_compiled_rows:,} rows "
                "(int32 indexing; a larger pack would recompile them and break bitwise parity)"
            )
        for block in self.blocks:
            x = block(x, t_emb, mod_index, attention, documents, rope, per_timestep)
        return self.final_layer(x, t_emb, timestep_index, per_timestep)
