"""The rows each h3_dit instance packs on the GPUs it drives, from their free memory (the writer's
GPU sizing glue: server.sizing's pure functions applied to a repository's settings and placement).
"""

from __future__ import annotations

from collections.abc import Mapping

from h3_core.model.dit import GRAPH_MAX_ROWS
from h3_core.model.encoder import drawn_weight_bytes, minilm_path, weight_bytes
from h3_core.model.reference_kv import bytes_per_reference_row
from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings

from . import sizing
from .placement import InstanceGroup


def gpu_rows(
    cfg,
    dit: DitSettings,
    vae: VaeSettings,
    encoder: EncoderSettings,
    groups: Mapping[str, InstanceGroup],
    sp_degree: int,
    machine: sizing.Machine,
    notes: list[str],
    text_encoder_bytes: int | None = None,
) -> dict[int, int]:
    """{first GPU of each h3_dit instance: its rows}: sizing.gpu_max_batch_rows of each GPU it
    drives (its own and the next sp_degree - 1), the least of them; the decode reserve for dit's
    largest canvas taken off h3_vae's GPU, the text encoder's weights (text_encoder_bytes, else
    read from its folder) off h3_encoder's. One note per GPU, also for a GPU that holds only
    h3_encoder and h3_vae (what is left there). Raises ValueError for a GPU without a free-memory
    figure, one where the DiT does not fit, or one where h3_encoder and h3_vae do not."""
    weights = sizing.dit_gpu_weight_bytes(cfg, dit)
    per_row = sizing.gpu_bytes_per_row_and_width(cfg, dit.quantization)
    height, width, frames = dit.max_height, dit.max_width, dit.max_num_frames
    decode = sizing.decode_reserve_bytes(height, width, frames, vae.decode_workers)
    folder = encoder.encoder_path or minilm_path()
    if text_encoder_bytes is not None:
        text, text_what = text_encoder_bytes, "text encoder weights"
    elif encoder.encoder_weights:
        text = drawn_weight_bytes(folder, encoder.hidden_layer)
        text_what = f"text encoder weights (drawn, encoder_weights {encoder.encoder_weights})"
    else:
        try:
            text, text_what = weight_bytes(folder, encoder.hidden_layer), "text encoder weights"
        except OSError:  # h3_encoder will refuse to load it, naming the folder
            text, text_what = 0, f"text encoder weights (none found in {folder})"
    firsts = groups[DitSettings.MODEL].gpus
    driven = {first + rank: first for first in firsts for rank in range(sp_degree)}
    beside = {int(device.split(":")[1]) for device in (vae.device, encoder.device) if device.startswith("cuda:")}
    gpu_rows: dict[int, int] = {}
    for gpu in sorted(set(driven) | beside):
        if gpu not in machine.gpu_free_bytes:
            raise ValueError(f"no free-memory figure for GPU {gpu}")
        reserves = []
        if vae.device in ("cuda", f"cuda:{gpu}"):
            workers = f"{vae.decode_workers} decode workers"
            reserves.append((decode, f"decode reserve ({workers} x a {width} x {height} px, {frames}-frame decode)"))
        if encoder.device in ("cuda", f"cuda:{gpu}"):
            reserves.append((text, text_what))
        if gpu in driven and sp_degree == 1:  # a sequence-parallel group's DiT runs without graphs
            pool = sizing.graph_pool_bytes(cfg.hidden_size, per_row)
            reserves.append((pool, f"CUDA graph pool ({GRAPH_MAX_ROWS:,} graphed rows)"))
        free, kept = machine.gpu_free_bytes[gpu], sum(size for size, _ in reserves)
        reserved = "".join(f" - {size // sizing.MIB:,} MiB {what}" for size, what in reserves)
        if gpu not in driven:
            left = (free - kept) // sizing.MIB
            if left < 0:
                raise ValueError(
                    f"h3_encoder and h3_vae do not fit GPU {gpu}: {free // sizing.MIB:,} MiB free{reserved}"
                )
            notes.append(f"GPU {gpu}: {free // sizing.MIB:,} MiB free{reserved} -> {left:,} MiB left (no h3_dit)")
            continue
        held = dit.max_num_seqs + dit.max_waiting
        references = bytes_per_reference_row(cfg) if dit.max_ref_kv_refresh > 1 and sp_degree == 1 else 0
        cached = sizing.held_cache_bytes_per_row(held, dit.max_cache_threshold > 0 and sp_degree == 1, references)
        rows = sizing.gpu_max_batch_rows(free, weights, kept, cfg.hidden_size, per_row, cached)
        notes.append(
            f"GPU {gpu}: {free // sizing.MIB:,} MiB free - {weights // sizing.MIB:,} MiB DiT weights "
            f"(quantization {dit.quantization}, AdaLN table of {dit.adaln_table_values} values"
            f"{sizing.host_adaln_note(cfg, dit)}){reserved} -> "
            f"{rows:,} rows at {per_row} bytes per row and unit of hidden_size {cfg.hidden_size} (measured on an "
            f"H200 in {'fp8' if dit.quantization == 'fp8' else 'bf16'}, server.sizing)"
            + (f" + {cached:,} bytes per row of {held} held requests' step caches" if cached else "")
            + (" (reference keys and values included)" if references else "")
        )
        gpu_rows[driven[gpu]] = min(rows, gpu_rows.get(driven[gpu], rows))
    return gpu_rows
