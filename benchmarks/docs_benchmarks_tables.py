"""The generated tables of README.md (the headline) and docs/benchmarks.md: the H200 targets and
their history, the engine's steps (one step, fused, packing, roofline, attention backends), the
served runs (c, d, f), the full-model runs, the registry's CPU cost and the conditioned steps. Each
function takes the repository root and returns the block's markdown (benchmarks/render_docs.py).
"""

from __future__ import annotations

from pathlib import Path

from doc_sources import COMPARE, TARGETS, Sources, history, key_source, load, provenance, shown

# key: (measurement, our figure's format, the reference's figure: vllm-omni on H100s, 33 B, docs/model.md §5.11)
HEADLINE: dict[str, tuple[str, str, str]] = {
    "pack8_speedup_256_rows_e": ("8 packed vs one at a time, 256-row requests: throughput", "{:.2f}x", "not measured"),
    "pack8_min_speedup_e": (
        "8 packed vs one at a time, lowest over 128 to 16,384 rows (4 packed at 16,384): throughput",
        "{:.2f}x",
        "1.03x at 16,384 rows (4 packed, step cost 3.90x)",
    ),
    "step_mfu": ("16,384-row step: model FLOP/s over the measured bf16 matmul rate", "{:.3f}", "not measured"),
    "small_step_ms_128": ("128-row step", "{:.2f} ms", "not measured"),
    "request_over_default_time_to_first_step_d": (
        "10 requests every 5 s, default policy vs run to completion: mean time to first step",
        "{:.2f}x lower",
        "not measured",
    ),
    "default_over_request_mean_latency_d": ("same: mean latency", "{:.3f}x", "2x (step mode)"),
    "step4_over_request_throughput_c": (
        "4 requests at concurrency 4, step mode 4 slots vs request mode: throughput",
        "{:.3f}",
        "0.96",
    ),
    "server_overhead_fraction_f": ("served step vs in-process step, 16,384 rows", "{:+.2%}", "not measured"),
    "server_overhead_ms_128": ("same, 128 rows", "{:+.2f} ms", "not measured"),
}


def h200_headline(root: Path) -> str:
    """README's headline table: HEADLINE's keys of h200.json's summary, each with its source."""
    merged, sources = load(root, "h200"), Sources()
    lines = [
        "| measurement | ours | reference (vllm-omni, H100s, 33 B) | measured |",
        "|---|---|---|---|",
    ]
    for key, (label, spec, reference) in HEADLINE.items():
        mark = sources.cite(key_source(root, merged, key))
        lines.append(f"| {label} (`{key}`) | {spec.format(merged['summary'][key])} | {reference} | {mark} |")
    return "\n".join(lines + sources.render())


def h200_targets(root: Path) -> str:
    """Every TARGETS key of h200.json's summary: the target, the value, met or not, the source."""
    merged, sources = load(root, "h200"), Sources()
    lines = ["| key | what | target | value | met | measured |", "|---|---|---|---:|---|---|"]
    for key, (what, comparison, target, _) in TARGETS.items():
        value = merged["summary"][key]
        met = "yes" if COMPARE[comparison](value, target) else "**no**"
        mark = sources.cite(key_source(root, merged, key))
        lines.append(f"| `{key}` | {what} | {comparison} {shown(key, target)} | {shown(key, value)} | {met} | {mark} |")
    return "\n".join(lines + sources.render())


def h200_history(root: Path) -> str:
    """h200.json's summary_history: every replaced value, with the merge's date and sources."""
    merged = load(root, "h200")
    lines = ["| merged | key | before | after | merged from |", "|---|---|---:|---:|---|"]
    for key in merged["summary"]:
        for entry, before, after in history(merged, key):
            files = ", ".join(f"`{Path(source['file']).name}`" for source in entry["sources"])
            lines.append(f"| {entry['merged']} | `{key}` | {shown(key, before)} | {shown(key, after)} | {files} |")
    return "\n".join(lines)


def engine_step(root: Path) -> str:
    """(a): step time of 1-4 packed 16,384-row requests against the matmul probe."""
    document = load(root, "engine_bench_h200")
    rate = document["matmul_flops_per_s"]
    steps = document["a_step"]
    one = steps["1"]["seconds"]
    lines = [
        f"{provenance(document, 'benchmarks/results/engine_bench_h200.json')}; matmul probe "
        f"{rate / 1e12:.1f} TFLOP/s (the higher of {len(document['matmul_probes_flops_per_s'])} 8192^3 bf16 probes).",
        "",
        "| requests | rows | step ms | per-request cost | model TFLOP/s | of matmul rate |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for count, step in steps.items():
        cost = step["seconds"] / int(count) / one
        tflops = step["flops"] / step["seconds"] / 1e12
        lines.append(
            f"| {count} | {step['rows']:,} | {step['seconds'] * 1e3:,.1f} | {cost:.2f}x | {tflops:.1f} "
            f"| {step['mfu']:.1%} |"
        )
    return "\n".join(lines)


def engine_fused(root: Path) -> str:
    """(b): one fused 3-request forward over three separate ones, GPU kernel time and wall."""
    document = load(root, "engine_bench_h200")
    lines = [
        provenance(document, "benchmarks/results/engine_bench_h200.json") + ", interleaved runs:",
        "",
        "| run | 3 separate ms | fused ms | fused / separate (kernels) | fused / separate (wall) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for number, run in enumerate(document["b_fused_vs_separate"], 1):
        lines.append(
            f"| {number} | {run['separate_ms']:,.1f} | {run['fused_ms']:,.1f} | {run['fused_over_separate']:.3f} "
            f"| {run['fused_over_separate_wall']:.3f} |"
        )
    return "\n".join(lines)


def engine_packing(root: Path) -> str:
    """(e): N requests packed per step against one at a time, per request size."""
    document = load(root, "engine_bench_h200")
    lines = [
        provenance(document, "benchmarks/results/engine_bench_h200.json") + ":",
        "",
        "| rows per request | one request ms | packed | packed ms | throughput ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for rows, point in document["e_packing_curve"].items():
        lines.append(
            f"| {int(rows):,} | {point['one_s'] * 1e3:,.2f} | {point['packed']} | {point['packed_s'] * 1e3:,.2f} "
            f"| {point['speedup']:.2f}x |"
        )
    return "\n".join(lines)


def engine_roofline(root: Path) -> str:
    """The roofline section: step and kernel time per pack against max(weight read, FLOPs)."""
    document = load(root, "engine_bench_h200")
    lines = [
        provenance(document, "benchmarks/results/engine_bench_h200.json") + ":",
        "",
        "| pack | rows | step ms | GPU kernel ms | launches | floor ms | bound | step / floor |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for pack, point in document["roofline"].items():
        count, rows = pack.split("x")
        lines.append(
            f"| {count} x {int(rows):,} | {point['rows']:,} | {point['seconds'] * 1e3:,.2f} "
            f"| {point['kernel_ms']:,.2f} | {point['launches']} | {point['floor_seconds'] * 1e3:,.2f} "
            f"| {point['bound']} | {point['over_floor']:.2f} |"
        )
    return "\n".join(lines)


def engine_attention(root: Path) -> str:
    """flash_attn4 in the DiT: step time with `auto` attention over `sdpa`, interleaved runs."""
    path = "benchmarks/results/engine_bench_h200_flash_attn4.json"
    document = load(root, "engine_bench_h200_flash_attn4")
    lines = [
        f"{provenance(document, path)}, flash-attn-4 {document['flash_attn_4']}:",
        "",
        "| step | sdpa ms (median) | auto ms (median) | auto / sdpa |",
        "|---|---:|---:|---:|",
    ]
    for count in ("1", "3"):
        runs = document["attention_step"][count]
        sdpa, auto = (sorted(runs[name])[len(runs[name]) // 2] * 1e3 for name in ("sdpa", "auto"))
        ratio = document["attention_step"][f"{count}_over_sdpa"]["auto"]
        lines.append(f"| {count} x 16,384 rows | {sdpa:,.2f} | {auto:,.2f} | **{ratio:.3f}** |")
    return "\n".join(lines)


def served_runs(root: Path, name: str, runs: tuple[str, ...]) -> str:
    """A served_bench results file's client runs: traffic, latency and first-step figures (the
    client's summary; p95 is its nearest rank)."""
    path = f"benchmarks/results/{name}.json"
    document = load(root, name)
    lines = [
        provenance(document, path) + ":",
        "",
        "| run | wall s | req/min | mean latency s | p95 latency s | mean first step s | max first step s "
        "| step interval s | peak pack |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        summary = document["runs"][run]["summary"]
        latency, first = summary["latency_s"], summary["time_to_first_step_s"]
        lines.append(
            f"| `{run}` | {summary['wall_s']:.2f} | {summary['throughput_req_per_min']:.2f} | {latency['mean']:.2f} "
            f"| {latency['p95']:.2f} | {first['mean']:.2f} | {first['max']:.2f} "
            f"| {summary['step_interval_s']['mean']:.3f} | {summary['peak_pack_size']} |"
        )
    return "\n".join(lines)


def served_c(root: Path) -> str:
    """(c) of the final served run: 3 interleaved pairs of request mode and step mode, 4 slots."""
    name = "served_bench_h200_issue16_final_c"
    document = load(root, name)
    pairs = document["c_step4_over_request_pairs"]
    ratios = ", ".join(f"{ratio:.4f}" for ratio in pairs["runs"])
    return (
        served_runs(root, name, tuple(document["runs"]))
        + f"\n\nStep mode 4 slots / request mode, throughput per pair: {ratios}; median **{pairs['median']:.4f}**."
    )


def served_f(root: Path) -> str:
    """(f) of the final served run: the step loop in-process against the served step interval."""
    path = "benchmarks/results/served_bench_h200_issue16_final_fd.json"
    document = load(root, "served_bench_h200_issue16_final_fd")
    lines = [
        provenance(document, path) + ":",
        "",
        "| rows | steps | in-process ms (16 threads) | in-process ms (1 thread) | in-process ms, synchronised "
        "every step | served ms | served - in-process ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for part in ("in_process", "in_process_128"):
        loop = document[part]
        served, alone = loop["served_seconds_per_step"] * 1e3, loop["seconds_per_step"] * 1e3
        lines.append(
            f"| {loop['rows']:,} | {loop['steps']} | {alone:.2f} | {loop['seconds_per_step_1_thread'] * 1e3:.2f} "
            f"| {loop['seconds_per_step_synced'] * 1e3:.2f} | {served:.2f} | {served - alone:+.2f} |"
        )
    return "\n".join(lines)


def full_model_runs(root: Path) -> str:
    """The full-size DiT served on one GPU: runs A and B from h200_full_model.json's summary (s/step
    and rows/step from the DiT's /metrics counters, peak GiB from nvidia-smi)."""
    path = "benchmarks/results/h200_full_model.json"
    document = load(root, "h200_full_model")
    summary = document["summary"]
    lines = [
        provenance(document, path) + ":",
        "",
        "| run | requests | wall s | mean latency s | max latency s | s/step | rows/step | peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in ("a", "b"):
        client = document["runs"][f"run_{run}"]["summary"]
        lines.append(
            f"| run_{run} | {client['num_requests']} | {summary[f'run_{run}_wall_s']:.2f} "
            f"| {summary[f'run_{run}_latency_s']:.2f} | {client['latency_s']['max']:.2f} "
            f"| {summary[f'run_{run}_seconds_per_step']:.3f} | {summary[f'run_{run}_rows_per_step']:,.0f} "
            f"| {summary[f'peak_gpu_memory_gib_{run}']:.2f} |"
        )
    return "\n".join(lines)


def registry_cpu(root: Path) -> str:
    """CPU ms per registry call, SQLite against the old JSON store, from registry_cpu.json's summary
    (keys `<call>_<state>`: admit / boundary / finish in the states empty, full_memories, live_2000)."""
    path = "benchmarks/results/registry_cpu.json"
    document = load(root, "registry_cpu")
    hardware = document["hardware"]
    lines = [
        f"{hardware['machine']} ({hardware['cpu_model']}), Python {document['python']}, SQLite {document['sqlite']}, "
        f"{document['date']}: `{document['command']}` (`{path}`):",
        "",
        "| call | state | SQLite median ms | SQLite p99 ms | JSON median ms | JSON p99 ms | JSON / SQLite (median) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, row in document["summary"].items():
        call, state = key.split("_", 1)
        lines.append(
            f"| `{call}` | {state.replace('_', ' ')} | {row['current_median_ms']:.3f} | {row['current_p99_ms']:.3f} "
            f"| {row['old_median_ms']:.3f} | {row['old_p99_ms']:.3f} | **{row['old_over_current_median']:.0f}x** |"
        )
    return "\n".join(lines)


def conditioned_steps(root: Path) -> str:
    """fl2va pack step vs t2va pack of the same rows, and the keyframe cost, from
    conditioned_bench_h200.json (benchmarks/conditioned_bench.py)."""
    path = "benchmarks/results/conditioned_bench_h200.json"
    document = load(root, "conditioned_bench_h200")
    lines = [
        f"{document['device']} (`{document['config']}` DiT), torch {document['torch']}, {document['date']}: "
        f"`{document['command']}` (`{path}`):",
        "",
        "| pack | rows per request (condition rows) | fl2va step ms | t2va step ms | fl2va / t2va (median of 3) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in document["step"].items():
        lines.append(
            f"| {name} | {row['rows_per_request']:,} ({row['condition_rows_per_request']:,}) "
            f"| {row['fl2va_step_s'] * 1e3:.1f} | {row['t2va_step_s'] * 1e3:.1f} | {row['fl2va_over_t2va']:.4f} |"
        )
    key = document["keyframe"]
    lines += [
        "",
        f"One {key['png_bytes'] / 2**20:.1f} MiB 1344 x 768 PNG keyframe: decoded, checked and fitted to 672 x 384 in "
        f"{key['decode_and_fit_s'] * 1e3:.1f} ms (CPU), encoded by this project's video VAE in "
        f"{key['vae_encode_s'] * 1e3:.2f} ms (GPU).",
    ]
    return "\n".join(lines)
