"""Building an Engine from a weight source: the one module that puts the diffusion engine, the
weights and sequence parallelism together (h3_core.diffusion imports neither weights nor parallel;
the DiT forward, local or sequence-parallel, is handed to the Engine as an object)."""

from pathlib import Path

import torch

from .config import DiTConfig, get_config
from .diffusion.engine import DEFAULT_LIMITS, Engine
from .diffusion.request import RequestLimits
from .diffusion.step_cache import IDENTITY_POLYNOMIAL
from .model.adaln_table import DEFAULT_CAPACITY, check_adaln_weights
from .model.dit import use_bitwise_cublas
from .model.fp8 import build_dit, check_quantization
from .parallel.ulysses import check_sp_degree
from .parallel.workers import DEFAULT_TIMEOUT_S as DEFAULT_SP_TIMEOUT_S
from .parallel.workers import SequenceParallelDiT
from .weights.checkpoint import load_cache_polynomial, load_dit, load_preview
from .weights.vae_hook import load_vaes


def load_engine(
    config: str | DiTConfig,
    source: str | Path,
    device: str = "cpu",
    attention_backend: str = "sdpa",
    with_encoder: bool = True,
    with_vaes: bool = True,
    limits: RequestLimits = DEFAULT_LIMITS,
    trust_remote_code: bool = False,
    sp_degree: int = 1,
    sp_timeout_s: float = DEFAULT_SP_TIMEOUT_S,
    quantization: str = "none",
    adaln_table_values: int = DEFAULT_CAPACITY,
    adaln_weights: str = "device",
) -> Engine:
    """Build an Engine of a DiT config (a name of config.CONFIGS, or a DiTConfig such as one with
    another dtype; sequence parallelism only by name) from a weight source
    (h3_core.weights.checkpoint's module docstring): a native folder (dit.safetensors,
    video_vae.safetensors, audio_vae.safetensors; see checkpoint_setup), an official checkpoint
    folder (transformer/, video_vae/, audio_vae/; its VAEs run only with trust_remote_code,
    h3_core.weights.vae_hook) or `random:SEED`. The DiT uses its device's bitwise GEMM setting
    (h3_core.model.dit); on CUDA its blocks are compiled (H3DiT.compile_blocks; the first step,
    Engine.warm_up, pays the compilation) and small packs replay CUDA graphs
    (H3DiT.use_cuda_graphs). with_encoder / with_vaes False leave those parts out (the Triton DiT
    needs neither). sp_degree > 1 runs the DiT in that many worker processes
    (h3_core.parallel.workers: on the CPU, or on the consecutive GPUs from `device`), each of them
    loading the weights, with sp_timeout_s seconds as their step and collective timeout.
    quantization: h3_dit's (h3_core.model.fp8.build_dit: fp8 block linears quantised while the
    weights load, in every worker too). adaln_table_values: with sp_degree 1 and > 0, the DiT keeps
    the AdaLN projections of that many timestep values (H3DiT.use_adaln_table); 0 leaves it off.
    adaln_weights: h3_dit's ("device", or "host": the AdaLN projection weights loaded into host
    memory, never onto the device; the table's fills stream them, h3_core.model.adaln_table;
    sp_degree 1 with the table on only, ValueError otherwise).
    Previews use the source's fitted latent-to-RGB map
    (checkpoint.load_preview), else an arbitrary colour map of the latent (RANDOM_PREVIEW); the
    step cache the source's fitted polynomial (checkpoint.load_cache_polynomial), else
    IDENTITY_POLYNOMIAL (h3_core.diffusion.step_cache).
    Raises ValueError / FileNotFoundError as checkpoint.load_dit, load_preview and vae_hook.load_vaes;
    ValueError for a quantization the device cannot run (fp8.check_quantization);
    ValueError for an sp_degree that does not divide the heads or GPUs that are not there, and
    h3_core.parallel.workers.WorkerLost for workers that cannot start."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        use_bitwise_cublas()
    cfg = get_config(config) if isinstance(config, str) else config
    check_sp_degree(cfg, sp_degree)
    check_adaln_weights(adaln_weights)
    if adaln_weights == "host" and (sp_degree > 1 or adaln_table_values < 1):
        raise ValueError(
            f"h3_dit parameter adaln_weights=host needs sp_degree 1 and adaln_table_values >= 1, got "
            f"sp_degree={sp_degree} and adaln_table_values={adaln_table_values}"
        )
    if sp_degree > 1 and cfg != get_config(cfg.name):
        raise ValueError(f"sequence parallelism loads the config by name: {cfg.name!r} differs from config.CONFIGS'")
    if sp_degree > 1:
        check_quantization(quantization, device)  # before the workers start (each quantises its DiT)
        dit = SequenceParallelDiT(cfg, str(source), device, sp_degree, attention_backend, sp_timeout_s, quantization)
    else:
        dit = build_dit(cfg, attention_backend, device, quantization, adaln_weights)
        load_dit(dit, source)  # fp8: each block linear quantised as it is loaded
        if adaln_table_values > 0:
            dit.use_adaln_table(adaln_table_values)
        if cuda:
            dit.compile_blocks()
            dit.use_cuda_graphs()
        dit.eval()
    video_vae, audio_vae = load_vaes(source, device, trust_remote_code) if with_vaes else (None, None)
    if with_encoder:
        from .model.encoder import TextEncoder  # imported here: a GPU host without MiniLM can run the DiT
    encoder = TextEncoder() if with_encoder else None
    polynomial = load_cache_polynomial(source) or IDENTITY_POLYNOMIAL
    return Engine(dit, video_vae, audio_vae, encoder, limits, load_preview(source), polynomial)
