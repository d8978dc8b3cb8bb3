"""The generated tables of the operating manuals: step caching (docs/operations.md), bf16 against
fp8 (docs/gpu_host.md), sequence parallelism's differences (docs/parity.md, docs/multi_gpu.md),
the full model with Qwen3-VL, the official layout and decode placement (docs/deploy_h200.md) and
the 1344 x 768 px clip (docs/performance.md, docs/load_testing.md). Each function takes the
repository root and returns the block's markdown (benchmarks/render_docs.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from doc_sources import Sources, key_source, load, provenance


def cache_curve(root: Path) -> str:
    """The step cache per threshold and step count on the demo model, from cache_demo_cpu.json
    (benchmarks/cache_quality.py), the recommended threshold in bold."""
    path = "benchmarks/results/cache_demo_cpu.json"
    document = load(root, "cache_demo_cpu")
    best = document["summary"]["recommended_threshold"]
    lines = [
        provenance(document, path) + ":",
        "",
        "| steps | threshold | steps skipped | row-step reduction | SSIM min / median | PSNR min / median dB "
        "| audio SNR min / median dB | attribute accuracy unchanged |",
        "|---:|---:|---:|---:|---|---|---|---|",
    ]
    for steps, rows in document["curves"].items():
        for row in rows:
            mark = "**" if row["threshold"] == best else ""
            lines.append(
                f"| {steps} | {mark}{row['threshold']:g}{mark} | {row['skipped_fraction']:.1%} "
                f"| {mark}{row['row_step_reduction']:.2f} x{mark} | {row['ssim_min']:.4f} / {row['ssim_median']:.4f} "
                f"| {row['psnr_min_db']:.1f} / {row['psnr_median_db']:.1f} "
                f"| {row['audio_snr_min_db']:.1f} / {row['audio_snr_median_db']:.1f} | {row['accuracy_unchanged']} |"
            )
    return "\n".join(lines)


def cache_speed(root: Path) -> str:
    """Step caching's speed on the H200 from cache_speed_h200.json (benchmarks/cache_speed.py): the
    demo model's median skip pattern at the recommended threshold replayed by one 30-step request
    of the bench and the full h3 DiT, and 4 requests at concurrency 4 with half of them cached."""
    document = load(root, "cache_speed_h200")
    path = "benchmarks/results/cache_speed_h200.json"
    sources = Sources()
    patterns = document["patterns"]
    first = next(iter(document["replay"].values()))
    height, width, frames = first["shape"]
    lines = [
        f"| {first['rows']:,} rows ({width} x {height}, {frames} frames), {first['steps']} steps | uncached | cached "
        "| uncached / cached | source |",
        "|---|---:|---:|---:|---|",
    ]
    for name, entry in document["replay"].items():
        source = sources.cite(provenance(entry, path))
        uncached, cached = entry["requests"]["uncached"], entry["requests"]["replay_median"]
        precision = "bf16" if entry["quantization"] == "none" else entry["quantization"]
        lines.append(
            f"| one request, `{name}` DiT ({precision}), s ({cached['computed_steps']} of "
            f"{entry['steps']} steps computed) | {uncached['seconds']:.2f} | {cached['seconds']:.2f} "
            f"| {cached['speedup']:.2f} | {source} |"
        )
    for name, entry in document["concurrency"].items():
        source = sources.cite(provenance(entry, path))
        uncached, cached = entry["uncached"], entry["half_cached"]
        lines += [
            f"| 4 requests at concurrency 4, half cached, `{name}` DiT: wall s | {uncached['seconds']:.2f} "
            f"| {cached['seconds']:.2f} | {uncached['seconds'] / cached['seconds']:.2f} | {source} |",
            f"| same: requests a minute | {uncached['throughput_req_per_min']:.2f} "
            f"| {cached['throughput_req_per_min']:.2f} | {cached['throughput_over_uncached']:.2f} | {source} |",
            f"| same: row-steps computed | {uncached['row_steps_computed']:,} | {cached['row_steps_computed']:,} "
            f"| {cached['row_step_reduction']:.2f} | {source} |",
        ]
    pattern = sources.cite(provenance(patterns, path))
    return "\n".join(
        [
            f"Skip pattern: the median of the demo model's {len(patterns['steps']['30']['requests'])} requests at "
            f"threshold {patterns['threshold']:g} and 30 steps ({pattern}).",
            "",
            *lines,
            *sources.render(),
        ]
    )


REFERENCE_STEP_S = 1.323  # vllm-omni's H3 DiT step of 16,384 rows on 2 x H100 (TP2, bf16), docs/model.md §5.11


def fp8_comparison(root: Path) -> str:
    """bf16 and fp8 side by side (h3_dit quantization): the full h3 DiT's weights and steps from
    fp8_h200.json (one process, bf16 then fp8), the demo model's quality from
    fp8_h200_quality.json, the served full model in fp8 from h200_full_model_fp8.json beside the
    reference's run b."""
    sources = Sources()
    steps = load(root, "fp8_h200")
    quality = load(root, "fp8_h200_quality")
    served = load(root, "h200_full_model_fp8")
    step = sources.cite(provenance(steps, "benchmarks/results/fp8_h200.json"))
    demo = sources.cite(provenance(quality, "benchmarks/results/fp8_h200_quality.json"))
    full = sources.cite(provenance(served, "benchmarks/results/h200_full_model_fp8.json"))
    bf16, fp8 = steps["steps"]["none"], steps["steps"]["fp8"]
    lines = [
        "| measure | bf16 | fp8 | bf16 / fp8 | source |",
        "|---|---:|---:|---:|---|",
        f"| full DiT weights in GPU memory, GiB | {bf16['weight_gib']:.2f} | {fp8['weight_gib']:.2f} "
        f"| {bf16['weight_gib'] / fp8['weight_gib']:.2f} | {step} |",
    ]
    for name, row in bf16["steps"].items():
        lines.append(
            f"| step of {name.replace('x', ' x ')} rows, s | {row['seconds']:.4f} "
            f"| {fp8['steps'][name]['seconds']:.4f} | {row['seconds'] / fp8['steps'][name]['seconds']:.3f} | {step} |"
        )
    velocity = fp8["velocity_vs_bf16"]
    summary, q = steps["summary"], quality["summary"]
    runs = quality["quality"]
    clips = runs["n_cases"] * len(runs["per_task"]) * len(runs["seeds"])  # held-out cases x tasks x seeds
    lines += [
        f"| 16,384-row velocity against bf16 (random weights) | | relative error {velocity['relative_l2_error']:.4f}, "
        f"cosine {velocity['cosine']:.4f} | | {step} |",
        f"| solo == co-batched == request mode, torch.equal | | {summary['fp8_bitwise_solo_packed_request']} "
        f"| | {step} |",
        f"| demo model, {clips} clips against bf16: min / median frame PSNR, dB | | {q['fp8_demo_min_psnr_db']:.2f} / "
        f"{q['fp8_demo_median_psnr_db']:.2f} (bf16 against float32: {q['bf16_vs_float32_demo_min_psnr_db']:.2f} / "
        f"{q['bf16_vs_float32_demo_median_psnr_db']:.2f}) | | {demo} |",
        f"| same: min SSIM; min audio SNR, dB | | {q['fp8_demo_min_ssim']:.4f}; {q['fp8_demo_min_audio_snr_db']:.1f} "
        f"| | {demo} |",
        f"| same: attribute accuracy unchanged (every task) | | {q['fp8_demo_accuracy_unchanged']} | | {demo} |",
        "",
        "| served through tritonserver, 672 x 384, 209 frames, 30 steps | fp8, one H200 | reference, 2 x H100 "
        "(vllm-omni TP2, bf16) | source |",
        "|---|---:|---:|---|",
        f"| one request, s | {served['summary']['run_a_wall_s']:.1f} | | {full} |",
        f"| four at concurrency 4, wall s | {served['summary']['run_b_wall_s']:.1f} "
        f"| {served['summary']['reference_run_b_wall_s']:.1f} | {full} |",
        f"| seconds per 16,384-row step (run a) | {served['summary']['run_a_seconds_per_step']:.3f} "
        f"| {REFERENCE_STEP_S} | {full} |",
    ]
    return "\n".join(lines + sources.render())


SEQUENCE_PARALLEL = ("h200x2_sequence_parallel", "h200x2_sequence_parallel_inductor_deterministic")


def sequence_parallel_bitwise(root: Path) -> str:
    """sp_degree 2 against 1 on two GPUs: each check's max abs difference, per results file."""
    documents = [load(root, name) for name in SEQUENCE_PARALLEL]
    header = " | ".join(f"`{name}.json`" for name in SEQUENCE_PARALLEL)
    lines = [f"| sp_degree 2 vs 1 | {header} |", "|---|" + "---:|" * len(documents)]
    checks = dict.fromkeys(
        (part, check) for document in documents for part in document["bitwise"] for check in document["bitwise"][part]
    )
    for part, check in checks:
        cells = []
        for document in documents:
            result = document["bitwise"].get(part, {}).get(check)
            cells.append("-" if result is None else "equal" if result["equal"] else f"{result['max_abs_diff']:.4f}")
        lines.append(f"| {part.replace('_', ' ')}: {check} | {' | '.join(cells)} |")
    sources = [
        f"`{name}.json`: {provenance(document, f'benchmarks/results/{name}.json')}  "
        for document, name in zip(documents, SEQUENCE_PARALLEL, strict=True)
    ]
    return "\n".join(lines + ["", "Max abs difference (`equal`: torch.equal, `-`: not measured there).  ", *sources])


def sequence_parallel_max_diff(root: Path) -> str:
    """Inline: the largest max abs difference of sp_degree 2 against 1 over every check and file."""
    return f"{max_diff(root):.3f}"


def max_diff(root: Path) -> float:
    """The largest `max_abs_diff` over every bitwise check of the SEQUENCE_PARALLEL files."""
    return max(
        result["max_abs_diff"]
        for name in SEQUENCE_PARALLEL
        for part in load(root, name)["bitwise"].values()
        for result in part.values()
    )


def full_model_qwen3vl(root: Path) -> str:
    """The full h3 DiT served on one H200 with MiniMax-H3's Qwen3-VL (50 layers) doing the encoding,
    from h200_full_model_qwen3vl.json (benchmarks/full_model_bench.py --encoder qwen3vl)."""
    document = load(root, "h200_full_model_qwen3vl")
    summary, settings = document["summary"], document["settings"]
    sources = Sources()
    source = sources.cite(provenance(document, "benchmarks/results/h200_full_model_qwen3vl.json"))
    lines = [
        f"| {settings['width']} x {settings['height']} px, {settings['num_frames']} frames, {settings['steps']} steps "
        "| requests | wall s | mean latency s | s / step | rows / step | peak GPU GiB: all (DiT, Qwen3-VL, VAE) "
        "| mean s: encode, denoise, decode | source |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for run in ("a", "b"):
        stages = summary[f"run_{run}_stage_seconds"]
        mean = {key: statistics.mean(stage[key] for stage in stages) for key in ("encode", "denoise", "decode")}
        processes = summary[f"peak_gpu_memory_gib_per_process_{run}"]
        lines.append(
            f"| run {run} | {len(stages)} | {summary[f'run_{run}_wall_s']:.1f} | {summary[f'run_{run}_latency_s']:.1f} "
            f"| {summary[f'run_{run}_seconds_per_step']:.3f} | {summary[f'run_{run}_rows_per_step']:,.0f} "
            f"| {summary[f'peak_gpu_memory_gib_{run}']:.1f} ({processes['h3_dit_0_0']:.1f}, "
            f"{processes['h3_encoder_0_0']:.1f}, {processes['h3_vae_0_0']:.1f}) "
            f"| {mean['encode']:.2f}, {mean['denoise']:.1f}, {mean['decode']:.2f} | {source} |"
        )
    lines += [
        "",
        f"Server start to ready (the DiT and the Qwen3-VL drawn on the GPU, no file): {summary['load_seconds']:.1f} s; "
        f"run b over the reference's run b ({summary['reference_run_b_wall_s']} s on 2 x H100): "
        f"{summary['run_b_over_reference_wall']:.2f} {source}.",
    ]
    return "\n".join(lines + sources.render())


def full_model_qwen3vl_figure(key: str) -> Callable[[Path], str]:
    """An inline figure of h200_full_model_qwen3vl.json: run_a_wall_s / run_b_wall_s (seconds) or
    peak_gib (the larger of the two runs' peaks of GPU 0)."""

    def figure(root: Path) -> str:
        summary = load(root, "h200_full_model_qwen3vl")["summary"]
        if key == "peak_gib":
            return f"{max(summary['peak_gpu_memory_gib_a'], summary['peak_gpu_memory_gib_b']):.1f} GiB"
        return f"{summary[key]:.1f} s"

    return figure


def official_layout(root: Path) -> str:
    """An official-layout checkpoint written, read from disk and served on one H200, from
    official_layout_h200.json (benchmarks/official_layout_bench.py)."""
    document = load(root, "official_layout_h200")
    results, settings = document["results"], document["settings"]
    sources = Sources()
    source = sources.cite(provenance(document, "benchmarks/results/official_layout_h200.json"))
    write, load_, full, serve = results["write"], results["load"], results["full_model_load"], results["serve"]
    stages = serve["stage_seconds"]
    dropped = "after the page cache was dropped" if load_["page_cache_dropped"] else "page cache NOT dropped"
    rows = [
        (
            f"write the checkpoint (`bench` DiT, Qwen3-VL at H3's sizes with "
            f"{settings['text_encoder_layers']} layers), {write['bytes'] / 1e9:.2f} GB",
            f"{write['seconds']:.1f} s ({write['bytes_per_s'] / 1e9:.2f} GB/s)",
        ),
        *(
            (
                f"read `{folder}/` to the GPU, {load_[folder]['bytes'] / 1e9:.2f} GB ({dropped})",
                f"{load_[folder]['seconds']:.2f} s ({load_[folder]['bytes_per_s'] / 1e9:.2f} GB/s)",
            )
            for folder in ("transformer", "text_encoder")
        ),
        (
            f"the full model's weights at those rates, **extrapolated**: DiT {full['dit_bytes'] / 1e9:.1f} GB + "
            f"Qwen3-VL cut to 50 layers {full['qwen3vl_text_decoder_50_layers_bytes'] / 1e9:.1f} GB",
            f"{full['total_seconds']:.1f} s ({full['dit_seconds']:.1f} + {full['qwen3vl_seconds']:.1f})",
        ),
        (
            "`server.launch` to ready (writer, tritonserver, every model loaded from the folder)",
            f"{serve['launch_to_ready_s']:.1f} s",
        ),
        (
            f"one t2va request, {settings['width']} x {settings['height']} px, {settings['num_frames']} frames, "
            f"{settings['steps']} steps, end to end",
            f"{serve['latency_s']:.2f} s (encode {stages['encode']:.2f}, denoise {stages['denoise']:.2f}, "
            f"decode {stages['decode']:.2f})",
        ),
    ]
    lines = ["| step | measured | source |", "|---|---|---|"]
    lines += [f"| {what} | {value} | {source} |" for what, value in rows]
    return "\n".join(lines + sources.render())


PLACEMENT_NAMES = {
    "alone": "nothing beside it",
    "same_gpu": "decodes on the same GPU, beside the steps (time-sliced)",
    "cpu": "decodes on the CPU",
    "other_gpu": "decodes on another GPU",
}


def decode_placement(root: Path) -> str:
    """A DiT step beside decodes, per placement, from decode_placement_h200.json
    (benchmarks/decode_placement.py): step seconds, the ratio over alone and the decodes done."""
    document = load(root, "decode_placement_h200")
    sources = Sources()
    source = sources.cite(provenance(document, "benchmarks/results/decode_placement_h200.json"))
    configs = list(document["configs"])
    lines = [
        "| decodes of 672 x 384 px, 209-frame clips without pause | "
        + " | ".join(f"`{config}` DiT: step s | over alone | decodes done (mean s)" for config in configs)
        + " | source |",
        "|---|" + "---:|---:|---:|" * len(configs) + "---|",
    ]
    for name in document["configs"][configs[0]]:
        label = PLACEMENT_NAMES.get(name)
        if label is None:  # turns_S
            label = f"decodes on the same GPU in turns with the steps, turn_share {name.removeprefix('turns_')}"
        cells = []
        for config in configs:
            run = document["configs"][config][name]
            decodes = (
                "-"
                if name == "alone"
                else f"{run['decodes']}"
                + (f" ({run['decode_s_mean']:.3f})" if run["decode_s_mean"] is not None else "")
            )
            cells += [f"{run['step_s']:.3f}", f"{run['over_alone']:.3f}", decodes]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {source} |")
    alone = document["decode_alone_s"]
    lines += [
        "",
        f"One decode with nothing beside it: {alone['cuda:0']:.3f} s on the GPU, {alone['cpu']:.2f} s on the CPU "
        f"(5 threads) {source}.",
    ]
    return "\n".join(lines + sources.render())


CLIP768_STAGES = ("queue", "encode", "denoise", "decode")
CLIP768_MUST_S = 297.0  # issue 48: SGLang's 4 x H200 Ulysses run, 297.5 GPU-seconds per clip


def clip768_cost_rows(merged: dict, cell) -> list[str]:
    """The clip's wall seconds and GPU-seconds per clip, ours (bf16, fp8; `cell` formats a summary
    key with its footnote) beside each published system's own report: markdown table lines."""
    summary = merged["summary"]
    lines = [
        "| system | GPUs | wall s, send to video | GPU-seconds per clip |",
        "|---|---:|---:|---:|",
    ]
    for name in ("bf16", "fp8"):
        attention = summary.get(f"clip768_5s_{name}_attention") or "sdpa"
        lines.append(f"| ours, {name}, attention {attention} (one process per model, our own VAE) | 1 "
                     f"| {cell(f'clip768_5s_{name}_s')} "
                     f"| {cell(f'clip768_5s_{name}_s')} |")  # fmt: skip
    for row in merged["published"]:
        lines.append(
            f"| {row['system']} (its own report) | {row['gpus']} | {row['wall_s']} | {row['gpu_s_per_clip']} |"
        )
    return lines


def clip768(root: Path) -> str:
    """The 1344 x 768 px, 124-frame, 49-forward t2va clip on one GPU beside the published H200
    systems, from clip768.json (benchmarks/clip768_bench.py runs filed with bench_report.py
    --merge-into; each figure's footnote names its GPU): wall seconds and GPU-seconds per clip,
    where a clip's seconds go, the step's kernel families, the AdaLN table and the load peaks; a
    figure not measured yet says so."""
    merged, sources = load(root, "clip768"), Sources()
    summary = merged["summary"]

    def cell(key: str, spec: str = "{:.1f}") -> str:
        if summary.get(key) is None:
            return "not measured"
        return f"{spec.format(summary[key])} {sources.cite(key_source(root, merged, key))}"

    lines = clip768_cost_rows(merged, cell)
    lines += [
        "",
        "| ours | clips | cold request s | denoise s | s / step | rows / step | mean s: "
        + ", ".join(CLIP768_STAGES)
        + " | peak GPU GiB (DiT, Qwen3-VL, VAE) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name in ("bf16", "fp8"):
        key = f"clip768_5s_{name}"
        if summary.get(f"{key}_s") is None:
            lines.append(f"| {name} | not measured | | | | | | |")
            continue
        stages = [s for s in summary[f"{key}_stage_seconds"] if s]
        means = ", ".join(f"{statistics.mean(s.get(k, 0.0) for s in stages):.2f}" for k in CLIP768_STAGES)
        processes = summary[f"{key}_peak_gib_per_process"]
        peaks = ", ".join(f"{processes.get(p, 0.0):.1f}" for p in ("h3_dit_0_0", "h3_encoder_0_0", "h3_vae_0_0"))
        lines.append(
            f"| {name} | {summary[f'{key}_clips']} | {cell(f'{key}_cold_s')} | {cell(f'{key}_denoise_s')} "
            f"| {cell(f'{key}_seconds_per_step', '{:.3f}')} | {summary[f'{key}_rows']:,.0f} | {means} "
            f"| {cell(f'{key}_peak_gpu_gib')} ({peaks}) |"
        )
    families = sorted({f for n in ("bf16", "fp8") for f in summary.get(f"step768_{n}_kernels_ms") or {}})
    if families:
        lines += ["", "| one step, " + ", ".join(families) + " (GPU ms) | step s | rows |", "|---|---:|---:|"]
        for name in ("bf16", "fp8"):
            kernels = summary.get(f"step768_{name}_kernels_ms")
            if kernels:
                ms = ", ".join(f"{kernels.get(f, 0.0):,.0f}" for f in families)
                lines.append(
                    f"| {name}: {ms} | {cell(f'step768_{name}_s', '{:.3f}')} | {summary[f'step768_{name}_rows']:,} |"
                )
    bf16 = summary.get("clip768_5s_bf16_s")
    verdict = "not measured" if bf16 is None else ("met" if bf16 <= CLIP768_MUST_S else "**not met**")
    lines += [
        "",
        f"Must: `clip768_5s_bf16_s` <= {CLIP768_MUST_S} (the best published GPU-seconds per clip): {verdict}; "
        f"`clip768_5s_fp8_s` <= 0.9 x bf16: "
        + ("not measured" if summary.get("clip768_5s_fp8_s") is None or bf16 is None
           else ("met" if summary["clip768_5s_fp8_s"] <= 0.9 * bf16 else "**not met**"))
        + f". Our VAE's decode of one clip (not H3's VAE): {cell('decode768_5s_s', '{:.3f}')} s, "
        f"peak {cell('decode768_5s_peak_gib')} GiB.",
    ]  # fmt: skip
    lines += [
        "",
        f"AdaLN table: 8 x 128-row requests admitted one step apart over all at one step, mean step "
        f"(`adaln_mixed_over_single_8x128`, target <= 1.10): {cell('adaln_mixed_over_single_8x128', '{:.3f}')}; "
        f"without the table {cell('adaln_mixed_over_single_8x128_no_table', '{:.3f}')}; table fills per step "
        f"{cell('adaln_fills_per_step_mixed', '{:.2f}')}; one fill {cell('adaln_fill_ms_bf16', '{:.2f}')} ms; "
        f"outputs with the table bitwise those without: {cell('adaln_table_bitwise', '{}')}. "
        f"Load peaks: bf16 {cell('bf16_load_peak_gib')} GiB, fp8 quantised while loading "
        f"(`fp8_load_peak_gib`, target below the 61.8 GiB of bf16 weights) {cell('fp8_load_peak_gib')} GiB.",
        "",
        f"AdaLN weights in host memory (`adaln_weights=host`): the fp8 DiT's GPU memory after load "
        f"{cell('fp8_dit_gpu_gib_adaln_off', '{:.1f} GiB')} (`fp8_dit_gpu_gib_adaln_off`; with them on the GPU "
        f"{cell('fp8_dit_gpu_gib', '{:.1f} GiB')}); one admission fill of a 49-forward schedule's values "
        f"{cell('adaln_host_fill_49_s', '{:.2f} s')} (`adaln_host_fill_49_s`), bitwise the device fills: "
        f"{cell('adaln_host_bitwise', '{}')}; fp8 beside the real-size Qwen3-VL on one 80 GB H100 "
        f"(`fp8_adaln_off_fits_h100`, from the measured peak): {cell('fp8_adaln_off_fits_h100', '{}')}.",
    ]
    return "\n".join(lines + sources.render())


def clip768_headline(root: Path) -> str:
    """README's front-page view of the 768p clip: clip768_cost_rows with its footnotes."""
    merged, sources = load(root, "clip768"), Sources()
    summary = merged["summary"]

    def cell(key: str, spec: str = "{:.1f}") -> str:
        if summary.get(key) is None:
            return "not measured"
        return f"{spec.format(summary[key])} {sources.cite(key_source(root, merged, key))}"

    return "\n".join(clip768_cost_rows(merged, cell) + sources.render())


def ref_kv_reuse(name: str) -> Callable[[Path], str]:
    """Reference reuse per k from benchmarks/results/<name>.json (benchmarks/ref_kv_reuse.py): the
    step time and speedup against k = 1, with the demo model the frames' SSIM / PSNR and the
    audio's SNR against k = 1 and whether the attribute accuracy stayed, with the bench DiT the
    latents' relative error and cosine; then the largest per-block drift of the reference keys and
    values from their last refresh (blocks in order)."""

    def render(root: Path) -> str:
        document = load(root, name)
        demo = document["model"] == "demo"
        lines = [provenance(document, f"benchmarks/results/{name}.json") + ":", ""]
        if demo:
            large, rows = document["large_references"], document["reference_rows"]
            lines += [
                f"| k | step s, demo refs ({rows['image']} of {rows['used']} rows) |"
                f" step s, large refs ({large['reference_rows']} of {large['used']} rows) | rows a step, large refs "
                "| SSIM min / mean | PSNR min / mean dB | audio SNR min dB | attribute accuracy unchanged |",
                "|---:|---:|---:|---:|---|---|---:|---|",
            ]
        else:
            lines += [
                f"| k | step s ({document['reference_rows']:,} reference rows of {document['used']:,}) | speedup "
                "| latents' relative error | cosine |",
                "|---:|---:|---:|---:|---:|",
            ]
        for k, step in document["step_s"].items():
            if demo:
                large, quality = document["large_references"], document["quality"].get(k)
                cells = (
                    f"{quality['ssim_min']:.4f} / {quality['ssim_mean']:.4f} | {quality['psnr_min_db']:.1f} / "
                    f"{quality['psnr_mean_db']:.1f} | {quality['audio_snr_min_db']:.1f} | "
                    f"{all(entry['k'] == entry['k1'] for entry in quality['accuracy'])}"
                    if quality
                    else "exact | exact | exact | (reference)"
                )
                lines.append(
                    f"| {k} | {step:.4f} | {large['step_s'][k]:.4f} | {large['rows_per_step'][k]:g} | {cells} |"
                )
            else:
                error = document["latent_error"].get(k, {"relative": 0.0, "cosine": 1.0})
                speedup = document["step_s"]["1"] / step
                lines.append(f"| {k} | {step:.4f} | {speedup:.3f} | {error['relative']:.4g} | {error['cosine']:.6f} |")
        drift = document["drift"]["image"] if demo else document["drift"]
        lines.append("")
        for k, entry in drift.items():
            keys = " ".join(f"{layer['max']:.3f}" for layer in entry["keys"])
            values = " ".join(f"{layer['max']:.3f}" for layer in entry["values"])
            task = " (image references)" if demo else ""
            lines.append(f"Largest drift from the last refresh, k = {k}{task}: keys {keys}; values {values}.  ")
        return "\n".join(lines)

    return render


def lora_demo(root: Path) -> str:
    """The demo's turbo and style LoRAs against the base from lora_demo_cpu.json
    (training/lora_evaluate.py) with issue 51's targets (docs/lora.md §"The demo's LoRAs")."""
    document = load(root, "lora_demo_cpu")
    s = document["summary"]
    style = s["style_per_attribute"]
    clips = document["clips"]
    return "\n".join(
        [
            provenance(document, "benchmarks/results/lora_demo_cpu.json") + f"; {clips} held-out prompts, seed 0:",
            "",
            "| figure | with the LoRA | the base | target |",
            "|---|---:|---:|---|",
            f"| 2-step clips against the base's 8-step: median frame PSNR, dB (`turbo2_psnr_vs_base8_db`) "
            f"| {s['turbo2_psnr_vs_base8_db']:.2f} | {s['base2_psnr_vs_base8_db']:.2f} | >= 36 |",
            f"| 1 step: attribute accuracy (`turbo1_attribute_accuracy`) | {s['turbo1_attribute_accuracy']:.4f} "
            f"| {s['base1_attribute_accuracy']:.4f} | |",
            f"| 1 step: colour accuracy | {s['turbo1_colour_accuracy']:.4f} | {s['base1_colour_accuracy']:.4f} "
            "| >= 0.95 |",
            f"| 2 steps: attribute accuracy | {s['turbo2_attribute_accuracy']:.4f} "
            f"| {s['base2_attribute_accuracy']:.4f} (8 steps: {s['base8_attribute_accuracy']:.4f}) | |",
            f"| style, scale 1: the shape's mean brightness shift, of 255 (`style_brightness_shift`) "
            f"| {s['style_brightness_shift']:+.1f} | 0 (brightness {s['base8_shape_brightness']:.1f}) | >= 30 |",
            f"| style, scale 0.5: the shift (`style_half_scale_shift`) | {s['style_half_scale_shift']:+.1f} | 0 "
            "| about half |",
            f"| style, scale 1: direction / pitch / side accuracy | {style['direction']:.2f} / {style['pitch']:.2f} / "
            f"{style['side']:.2f} | | 1.0 each |",
            f"| style, scale 1: colour accuracy (the brighter shape is read as another colour) | {style['colour']:.2f} "
            "| | |",
        ]
    )
