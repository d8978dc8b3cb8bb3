"""What a model repository sizes from the machine: pure functions, applied by server.repository.

Units: bytes, MiB (2**20 bytes) where a name says `_mb`, seconds where it says `_s`, rows of the
packed DiT sequence.

- cpu_threads: the cores this process may run on (os.sched_getaffinity) divided evenly among the
  model processes (one per Triton model instance), at least 1. More OpenMP threads than free
  cores makes every parallel region wait for a descheduled thread.
- GPU memory (cuda), per GPU that holds a DiT instance:
      available = free - DiT weights - LoRA reserve - decode reserve
      rows      = available // (bytes_per_row_and_width x hidden_size + held step caches), down to
                  a multiple of 64
  max_batch_rows = the least over the GPUs, capped at MAX_BATCH_ROWS (65,536). DiT weights: the
  bytes of every parameter and buffer (h3_core.model.H3DiT on the meta device; about parameters x 2
  in bf16). Reserve, on the GPU that holds h3_vae and h3_encoder: decode_workers x the video VAE
  decode of the largest canvas the limits allow (request_memory_mb's decode term), plus the text
  encoder's weights (h3_core.model.encoder.weight_bytes: 50.3 GB for MiniMax-H3's Qwen3-VL cut to 50
  layers, plus its vision tower). bytes_per_row_and_width: GPU_BF16_BYTES_PER_ROW_AND_WIDTH (or
  GPU_FP8_BYTES_PER_ROW_AND_WIDTH with h3_dit quantization = fp8, whose DiT weights are also smaller),
  measured on an H200, scaled by the config's dtype bytes / 2. Held step caches (with
  max_cache_threshold > 0): held_cache_bytes_per_row, every held request (max_num_seqs +
  max_waiting) at up to max_batch_rows rows, each keeping its step cache, and with
  max_ref_kv_refresh > 1 its reference keys and values (every row may be a reference row: an
  upper bound). CUDA graph pool (sp_degree
  1, on every GPU with a DiT instance): graph_pool_bytes. LoRA reserve: max_loras adapters of
  max_lora_rank (lora_bytes), counted with the DiT's weights.
- max_sequence_idle_microseconds: longer than the longest execute(), with sequence parallelism
  including one that loses a worker, with GPU turns one that waits for its turn (see idle_timeout).
- execute_budget_s on cuda: GPU_EXECUTE_BUDGET_S (below).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from h3_core.config import ROW_ALIGN, DiTConfig
from h3_core.diffusion.request import STEP_CACHE_BYTES_PER_ROW, request_memory_mb
from h3_core.model.dit import GRAPH_MAX_ROWS
from h3_core.parallel.workers import EXIT_GRACE_S, SP_TIMEOUT_FRACTION
from h3_core.serving.shared.gpu_turns import TURN_WAIT_FRACTION
from h3_core.serving.shared.settings import MIN_EXECUTE_STEPS, REQUEST_IDLE_FACTOR, STEP_ESTIMATES, step_estimate_s

from .options import DEVICES

MIB = 2**20
# DiT activation bytes per packed row and unit of hidden_size on a GPU, bf16: the h3 DiT served on one
# H200 peaked at 69,436 MiB with one 16,384-row request and 86,398 MiB with 4 (65,536 rows):
# 16,962 MiB / 49,152 rows = 0.345 MiB a row = 67 B x 5,376 (benchmarks/full_model_bench.py,
# 2026-11-30, benchmarks/results/h200_full_model.json, docs/gpu_memory.md; eager 4,096-row tiles).
GPU_BF16_BYTES_PER_ROW_AND_WIDTH = 67
# The same with h3_dit quantization = fp8: in one process on one H200 (benchmarks/fp8_bench.py,
# 2026-12-02, benchmarks/results/fp8_h200.json) the compiled 4 x 16,384-row step of the h3 DiT
# peaked 35.5 B per row and unit of width over its weights in fp8 and 38.2 B in bf16 (both below
# the served figure above, which holds more than the step); scaled: 67 x 35.5 / 38.2 = 62.
GPU_FP8_BYTES_PER_ROW_AND_WIDTH = 62
MAX_BATCH_ROWS = 65_536  # rows of one packed forward at most (4 x the 16,384-row benchmark request)
# The recorded H200 step: the bench DiT (8 layers, hidden 5376, bf16) steps one 16,384-row request
# in 0.355 s (benchmarks/results/h200.json, engine_bench e_packing_curve["16384"].one_s = 0.3548;
# a_step["1"] 0.351 s). Scaled linearly by rows and by layers; narrower configs than H3's width
# are over-estimated, which errs on the safe side.
H200_STEP_S, H200_STEP_ROWS, H200_STEP_LAYERS = STEP_ESTIMATES["cuda"]
MIN_IDLE_S = 60.0  # today's CPU value, and the floor everywhere
# A restart of the sequence-parallel workers (what a lost worker costs): 11.3 s for the bench DiT
# (8 layers) on two H200s, weights drawn on each GPU, blocks compiled from Inductor's cache
# (benchmarks/results/h200x2_sequence_parallel.json, in_process.sp2.restart_s = 11.34). Scaled
# linearly by layers like a step (over-estimating the part that does not grow with them); loading
# a checkpoint from disk instead of drawing the weights is not measured. On the 2-core CPU a
# restart of 2 workers took 0.2 s (tiny) and 0.7 s (demo), far inside MIN_IDLE_S.
H200_SP_RESTART_S, H200_SP_RESTART_LAYERS = 11.3, 8
# A lost worker's execute holds two tries of its step, each up to the step timeout
# (idle / SP_TIMEOUT_FRACTION) plus EXIT_GRACE_S, so the rest (the steps before, the restart, the
# graces) must fit in the idle timeout less two step timeouts: 1 / (1 - 2 / 4) = 2 times it.
SP_IDLE_FACTOR = 1 / (1 - 2 / SP_TIMEOUT_FRACTION)
# h3_dit's execute_budget_s on cuda: seconds one execute() keeps taking steps while nothing is
# announced for the DiT (h3_core.serving.dit.step_loop.StepLoop.another_step). Each execute costs a Triton
# round trip of about 6 ms on the H200 host (docs/benchmarks.md, served vs request mode). An
# execute takes another step while its time so far plus the last step's stays under the budget,
# so it lasts at least half the budget and the round trip costs at most 6 ms / 0.5 s = 1.2% of
# the step time: 0.8% for the 360 ms step of benchmark (f) (2 steps an execute), 0.7% for the
# bench DiT's 285 ms 16,384-row step (3), under 1% for the 15 ms 128-row step (about 66), against
# 1.7%, 2.1% and 40% with one step an execute. Announced newcomers and cancels (through the
# encoder; clients' through h3_cancel, h3_vae's for gone clients) still wait at most the step in
# flight; what the budget delays is the unannounced: a control request sent straight to h3_dit
# waits at most 1 s plus one step, and the active / waiting gauges are set once an execute. It is far below
# half the idle timeout (at least MIN_IDLE_S here), which the settings require.
GPU_EXECUTE_BUDGET_S = 1.0
# step mode: idle >= 2.5 x the longest execute of steps alone, MIN_EXECUTE_STEPS (2) steps = 5 steps
STEP_IDLE_FACTOR = 2.5 * MIN_EXECUTE_STEPS
# A decode beside a DiT instance made its steps 2.1x slower while it ran (docs/multi_gpu.md): what
# steps cost while they run without their GPU turn, time-slicing the GPU with a stuck decode.
TIME_SLICED_SLOWDOWN = 2.1
# With GPU turns an execute may hold one wait for the turn, idle / TURN_WAIT_FRACTION
# (h3_core.serving.shared.gpu_turns; a timeout is remembered, so later steps do not wait again), and its
# steps time-sliced: the rest of the idle timeout must hold the execute's factor x its steps
# x TIME_SLICED_SLOWDOWN.
TURNS_IDLE_FACTOR = TIME_SLICED_SLOWDOWN * TURN_WAIT_FRACTION / (TURN_WAIT_FRACTION - 1)


@dataclass(frozen=True)
class Machine:
    """What sizing reads from the machine: `cores` this process may run on, and the free memory
    (bytes) of each GPU to use, by CUDA device index ({} on the CPU)."""

    cores: int
    gpu_free_bytes: dict[int, int]


def available_cores() -> int:
    """The cores this process may run on (os.sched_getaffinity; os.cpu_count where it is missing)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_gpus(text: str, device_count: int) -> list[int]:
    """The GPU indices of `--gpus`: "all" (every visible GPU) or a comma list such as "0,1".
    Raises ValueError for no visible GPU, a malformed list, a repeated index or one >= device_count."""
    if device_count < 1:
        raise ValueError("no CUDA GPU is visible (torch.cuda.device_count() == 0); use --device cpu")
    if text == "all":
        return list(range(device_count))
    try:
        gpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus {text!r} is not 'all' or a comma list of GPU indices such as 0,1") from None
    if len(set(gpus)) != len(gpus) or not all(0 <= gpu < device_count for gpu in gpus):
        raise ValueError(
            f"--gpus {text!r}: each index must appear once and lie in 0..{device_count - 1} "
            f"({device_count} GPUs visible)"
        )
    return gpus


def probe(
    gpus: Sequence[int] = (), mem_get_info: Callable[[int], tuple[int, int]] | None = None, cores: int | None = None
) -> Machine:
    """This machine: available_cores() (or `cores`) and the free bytes of each of `gpus` from
    mem_get_info(index) -> (free, total) (default torch.cuda.mem_get_info, which starts a CUDA
    context on each GPU: call it in a process that ends before the server starts)."""
    if gpus and mem_get_info is None:
        import torch

        mem_get_info = torch.cuda.mem_get_info
    return Machine(
        cores=available_cores() if cores is None else cores,
        gpu_free_bytes={gpu: int(mem_get_info(gpu)[0]) for gpu in gpus},
    )


def cpu_threads(cores: int, processes: int) -> int:
    """torch CPU threads per model process: cores // processes, at least 1.
    Raises ValueError unless cores >= 1 and processes >= 1."""
    if cores < 1 or processes < 1:
        raise ValueError(f"cpu_threads needs cores >= 1 and processes >= 1, got {cores} and {processes}")
    return max(1, cores // processes)


def dtype_bytes(config: DiTConfig) -> int:
    """Bytes of one element of the config's runtime dtype (bfloat16: 2, float32: 4)."""
    return config.torch_dtype.itemsize


@functools.cache
def dit_weight_bytes(config: DiTConfig, quantization: str = "none") -> int:
    """Bytes of the DiT's parameters and buffers in their dtypes after h3_dit's `quantization`
    (h3_core.model.fp8.quantize_blocks), counted on the meta device (no memory used; cached, as
    building the 50-layer model there takes a fraction of a second): bench
    12,052,395,520 (6,008,975,616 parameters, mostly bf16); h3 66,280,430,080 in bf16 and
    47,025,031,680 (43.80 GiB) in fp8."""
    from h3_core.model import H3DiT
    from h3_core.model.fp8 import quantize_blocks

    dit = H3DiT(config, device="meta")
    quantize_blocks(dit, quantization)
    return sum(t.numel() * t.element_size() for t in (*dit.parameters(), *dit.buffers()))


def adaln_table_bytes(config: DiTConfig, dit) -> int:
    """GPU bytes of an h3_dit instance's AdaLN table (DitSettings `dit`: adaln_table_values
    values of h3_core.model.adaln_table.value_bytes each, 9,698,304 B for h3; 0 with
    sp_degree > 1, where the workers project per step)."""
    from h3_core.model.adaln_table import value_bytes

    return dit.adaln_table_values * value_bytes(config) if dit.sp_degree == 1 else 0


def lora_bytes(config: DiTConfig, dit) -> int:
    """GPU bytes reserved for an h3_dit instance's LoRA adapters (DitSettings `dit`): lora_slots
    (max_loras, or the adapters loras names) adapters of max_lora_rank on every linear an adapter
    may target, in the model dtype (h3_core.weights.lora_formats.reserve_bytes: 3,232,595,968 B an
    adapter of rank 128 for h3)."""
    from h3_core.weights.lora_formats import reserve_bytes

    return dit.lora_slots * reserve_bytes(config, dit.max_lora_rank, dtype_bytes(config))


def dit_gpu_weight_bytes(config: DiTConfig, dit) -> int:
    """GPU bytes of an h3_dit instance's weights (DitSettings `dit`): dit_weight_bytes of its
    quantization plus its AdaLN table (adaln_table_bytes) and its LoRA reserve (lora_bytes); with
    adaln_weights = host the AdaLN projection weights (h3_core.model.adaln_table.weight_bytes) are
    left out and the fill's two scratch buffers (scratch_bytes) counted instead. h3, bf16, 64
    values, no LoRA: 66,901,121,536 B on the device; with host AdaLN weights and 102 values
    42,231,754,240 B, 22,976,355,840 in fp8."""
    from h3_core.model.adaln_table import scratch_bytes, weight_bytes

    total = dit_weight_bytes(config, dit.quantization) + adaln_table_bytes(config, dit) + lora_bytes(config, dit)
    if dit.adaln_weights == "host":
        total += scratch_bytes(config) - weight_bytes(config)
    return total


def host_adaln_note(config: DiTConfig, dit) -> str:
    """The sizing note's words for the AdaLN weights of DitSettings `dit`: "" on the device;
    with adaln_weights = host the pinned host memory they take and the scratch counted instead."""
    if dit.adaln_weights != "host":
        return ""
    from h3_core.model.adaln_table import scratch_bytes, weight_bytes

    return (
        f"; AdaLN weights in pinned host memory, {weight_bytes(config) // MIB:,} MiB, "
        f"not on the GPU, a {scratch_bytes(config) // MIB:,} MiB fill scratch instead"
    )


def gpu_bytes_per_row_and_width(config: DiTConfig, quantization: str = "none") -> int:
    """The DiT activation bytes per packed row and unit of hidden_size on a GPU:
    GPU_BF16_BYTES_PER_ROW_AND_WIDTH (67, measured in bf16) or, with quantization fp8,
    GPU_FP8_BYTES_PER_ROW_AND_WIDTH (62), x dtype bytes / 2."""
    measured = GPU_FP8_BYTES_PER_ROW_AND_WIDTH if quantization == "fp8" else GPU_BF16_BYTES_PER_ROW_AND_WIDTH
    return measured * dtype_bytes(config) // 2


def decode_reserve_bytes(max_height: int, max_width: int, max_num_frames: int, decode_workers: int) -> int:
    """GPU bytes kept for h3_vae: decode_workers decodes of the largest canvas at once (pixels,
    frames), each request_memory_mb's decode term (its rows term is 0 here), rounded up to MiB."""
    return decode_workers * request_memory_mb(max_height, max_width, max_num_frames, 0, 0) * MIB


def held_cache_bytes_per_row(held_requests: int, step_cache: bool, reference_row_bytes: int = 0) -> int:
    """GPU bytes the step caches of the requests an h3_dit instance holds may keep, per row of
    max_batch_rows: each of `held_requests` (max_num_seqs + max_waiting) may hold a request of up
    to max_batch_rows rows that caches (step_cache: max_cache_threshold > 0), keeping
    STEP_CACHE_BYTES_PER_ROW (768 B) a row (h3_core.diffusion.step_cache); 0 without caching.
    For H3 (hidden 5376, bf16: 360,192 B of activations a row) and 4 + 8 held requests: 9,216 B,
    2.5 % of a row. reference_row_bytes: what a request reusing its reference keys and values
    keeps per reference row (h3_dit max_ref_kv_refresh > 1: h3_core.model.reference_kv.
    bytes_per_reference_row, 1,433,600 B for H3 in bf16, 4 x a row's activations; 0 when off),
    counted for every row of every held request (an upper bound: any row may be a reference's)."""
    return held_requests * ((STEP_CACHE_BYTES_PER_ROW if step_cache else 0) + reference_row_bytes)


def graph_pool_bytes(hidden_size: int, bytes_per_row_and_width: int) -> int:
    """GPU bytes the DiT's CUDA graphs keep (H3DiT.use_cuda_graphs, on cuda with sp_degree 1): all
    graphs share one memory pool, which keeps the peak of the largest graphed forward, at most
    GRAPH_MAX_ROWS (4,096) rows at bytes_per_row_and_width x hidden_size a row, held apart from the
    eager packs' memory: 1,407 MiB for H3 in bf16 (67 B x 5,376 x 4,096), an upper bound."""
    return GRAPH_MAX_ROWS * bytes_per_row_and_width * hidden_size


def gpu_max_batch_rows(
    free_bytes: int,
    weight_bytes: int,
    reserve_bytes: int,
    hidden_size: int,
    bytes_per_row_and_width: int,
    cache_bytes_per_row: int = 0,
) -> int:
    """The packed rows one GPU can step: (free - weights - reserve) // (bytes_per_row_and_width x
    hidden_size + cache_bytes_per_row, the held requests' step caches: held_cache_bytes_per_row),
    down to a multiple of 64, at most MAX_BATCH_ROWS.
    Raises ValueError when not even 64 rows fit (the message gives the MiB)."""
    available = free_bytes - weight_bytes - reserve_bytes
    rows = max(available, 0) // (bytes_per_row_and_width * hidden_size + cache_bytes_per_row) // ROW_ALIGN * ROW_ALIGN
    if rows < ROW_ALIGN:
        raise ValueError(
            f"the DiT does not fit: {free_bytes // MIB:,} MiB free - {weight_bytes // MIB:,} MiB of "
            f"weights - {reserve_bytes // MIB:,} MiB reserve leaves "
            f"{int(available / MIB):,} MiB, under {ROW_ALIGN} rows"
        )
    return min(rows, MAX_BATCH_ROWS)


def step_seconds(rows: int, num_layers: int) -> float:
    """Estimated seconds of one DiT step over `rows` packed rows of a `num_layers` DiT on an
    H200: H200_STEP_S x rows / 16,384 x num_layers / 8."""
    return step_estimate_s("cuda", rows, num_layers)


def sp_restart_seconds(num_layers: int) -> float:
    """Estimated seconds of a restart of the sequence-parallel workers of a `num_layers` DiT on
    H200s: H200_SP_RESTART_S x num_layers / 8."""
    return H200_SP_RESTART_S * num_layers / H200_SP_RESTART_LAYERS


def idle_timeout(
    device: str,
    execution_mode: str,
    max_batch_rows: int,
    num_layers: int,
    max_steps: int,
    sp_degree: int = 1,
    gpu_turns: bool = False,
) -> tuple[int, str]:
    """(max_sequence_idle_microseconds, why) for h3_dit. It must exceed the longest execute():
    - cpu: step mode MIN_IDLE_S = 60 s (tiny on the 2-core CPU steps 4,096 rows in under 0.2 s,
      which also holds a lost sequence-parallel worker's restart, under 1 s there, and retried
      step); request mode max(60 s, max_steps x step x 1.5), step =
      h3_core.serving.shared.settings.step_estimate_s("cpu", max_batch_rows, num_layers) (a whole
      generation in one execute(); DitSettings refuses a shorter idle timeout);
    - cuda, with step = step_seconds(max_batch_rows, num_layers):
      step mode:    max(60 s, 5 x step): an execute takes at least MIN_EXECUTE_STEPS (2) steps
                    while nothing is announced, so 2.5 x its longest run of steps alone (one
                    over its budget is bounded by execute_budget_s < idle / 2, DitSettings.check);
      request mode: max(60 s, max_steps x step x 1.5) (a whole generation in one execute()).
      with sp_degree > 1 also at least SP_IDLE_FACTOR (2) x (before + restart + 2 x EXIT_GRACE_S):
      an execute that loses a worker runs its steps `before` the loss (GPU_EXECUTE_BUDGET_S in
      step mode, max_steps x step in request mode), the failed try and the retried step (each
      at most the step timeout, idle / SP_TIMEOUT_FRACTION, plus EXIT_GRACE_S) and one restart
      of the workers (sp_restart_seconds(num_layers)); h3_core.parallel.workers allows no more.
      with gpu_turns the step or request term x TURNS_IDLE_FACTOR (2.8): one wait for the GPU's
      turn of at most idle / TURN_WAIT_FRACTION (h3_dit's wait limit) and steps time-sliced with
      a stuck decode (TIME_SLICED_SLOWDOWN).
    Raises ValueError for an unknown device."""
    if device == "cpu" and execution_mode == "request":
        step = step_estimate_s("cpu", max_batch_rows, num_layers)
        seconds = max(MIN_IDLE_S, max_steps * step * REQUEST_IDLE_FACTOR)
        return round(seconds * 1e6), (
            f"on the CPU, request mode: max(60 s, {max_steps} steps x {step:.3f} s x {REQUEST_IDLE_FACTOR}) = "
            f"{seconds:.1f} s, a step of {max_batch_rows:,} rows of the {num_layers}-layer DiT estimated from tiny's "
            "4,096 rows in under 0.2 s on the 2-core CPU."
        )
    if device == "cpu":
        return int(MIN_IDLE_S * 1e6), (
            "on the CPU 60 s: tiny on the 2-core CPU steps 4,096 rows in under 0.2 s, so "
            "request mode needs > 50 x 0.2 s = 10 s; 60 s leaves a 6x margin"
            + (
                ", which also holds a lost sequence-parallel worker's restart (under 1 s there) and retried step."
                if sp_degree > 1
                else "."
            )
        )
    if device != "cuda":
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    step = step_seconds(max_batch_rows, num_layers)
    estimate = (
        f"a step of {max_batch_rows:,} rows of the {num_layers}-layer DiT estimated as {H200_STEP_S} s x "
        f"{max_batch_rows:,} / {H200_STEP_ROWS:,} rows x {num_layers} / {H200_STEP_LAYERS} layers = "
        f"{step:.3f} s (the bench DiT on the H200, benchmarks/results/h200.json)"
    )
    turns = TURNS_IDLE_FACTOR if gpu_turns else 1.0
    turns_text = f" x {TURNS_IDLE_FACTOR:g} (GPU turns)" if gpu_turns else ""
    if execution_mode == "request":
        seconds = max(MIN_IDLE_S, max_steps * step * REQUEST_IDLE_FACTOR * turns)
        formula = f"request mode: max(60 s, {max_steps} steps x {step:.3f} s x {REQUEST_IDLE_FACTOR}{turns_text}"
        before, before_text = max_steps * step, f"{max_steps} steps x {step:.3f} s"
    else:
        seconds = max(MIN_IDLE_S, STEP_IDLE_FACTOR * step * turns)
        formula = f"step mode: max(60 s, {STEP_IDLE_FACTOR:g} x {step:.3f} s{turns_text}"
        before, before_text = GPU_EXECUTE_BUDGET_S, f"{GPU_EXECUTE_BUDGET_S:g} s of execute budget"
    if sp_degree > 1:
        restart = sp_restart_seconds(num_layers)
        seconds = max(seconds, SP_IDLE_FACTOR * (before + restart + 2 * EXIT_GRACE_S))
        formula += f", {SP_IDLE_FACTOR:g} x ({before_text} + {restart:.3f} s of restart + 2 x {EXIT_GRACE_S:g} s))"
        estimate += (
            f"; a lost sequence-parallel worker costs the execute two tries of its step, each within the "
            f"step timeout (this / {SP_TIMEOUT_FRACTION}), the steps before and one restart of the workers "
            f"estimated as {H200_SP_RESTART_S} s x {num_layers} / {H200_SP_RESTART_LAYERS} layers = {restart:.3f} s "
            f"(benchmarks/results/h200x2_sequence_parallel.json)"
        )
    else:
        formula += ")"
    return round(seconds * 1e6), f"on cuda, {formula} = {seconds:.1f} s, {estimate}."
