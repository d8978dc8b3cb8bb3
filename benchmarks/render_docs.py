"""The docs' measured tables, rendered from the results files in benchmarks/results/.

README.md and docs/*.md hold generated blocks between marker comments:

    <!-- generated: NAME -->
    ...rendered markdown...
    <!-- end generated -->

NAME is one of BLOCKS (its first word is the results file the block reads, e.g. `h200 headline`
reads benchmarks/results/h200.json). A block whose start marker is followed by a newline is a
table (or paragraph); a block on one line is an inline figure inside prose. Every table names the
hardware, the command and the date of its figures from the results file's own fields; figures of
a merged file (h200.json, written by bench_report.py --merge-into) are credited to the source
file of that merge whose `summary` holds the same value, found through `summary_history`.

    python benchmarks/render_docs.py           # rewrite the blocks in place
    python benchmarks/render_docs.py --check   # print the diff, exit 1 when a doc is out of date

The docs' targets (>= 0.75 etc.) are the issues' acceptance targets, kept here in TARGETS.
"""

from __future__ import annotations

import argparse
import difflib
import json
import operator
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")
DOC_PATTERNS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"<!-- generated: (?P<name>[^>]*?) -->(?P<body>.*?)<!-- end generated -->", re.DOTALL)
START = re.compile(r"<!-- generated: (?P<name>[^>]*?) -->")

# key: (what it measures, comparison, target, value format)
TARGETS: dict[str, tuple[str, str, float | bool, str]] = {
    "step_mfu": ("16,384-row step: model FLOP/s over the probe's bf16 matmul rate", ">=", 0.75, "{:.3f}"),
    "fused_over_separate_3x16384": (
        "one 3 x 16,384-row step over three separate ones (kernel time)",
        "<=",
        1.0,
        "{:.3f}",
    ),
    "roofline_ratio_max": ("step time over its roofline floor, worst pack", "<=", 2.0, "{:.2f}"),
    "small_step_ms_128": ("128-row step, ms", "<=", 5.0, "{:.2f}"),
    "pack8_speedup_256_rows_e": ("8 packed 256-row requests vs one at a time: throughput", ">=", 2.0, "{:.2f}"),
    "pack8_min_speedup_e": ("packing gain, lowest over 128 to 16,384 rows", ">=", 0.98, "{:.3f}"),
    "bitwise_solo_packed_request": ("solo == packed == request mode, torch.equal", "==", True, "{}"),
    "step4_over_request_throughput_c": ("(c) step mode 4 slots / request mode: throughput", ">=", 1.0, "{:.4f}"),
    "default_over_request_mean_latency_d": ("(d) default policy / request mode: mean latency", "<=", 1.05, "{:.3f}"),
    "request_over_default_time_to_first_step_d": (
        "(d) request mode / default policy: mean time to first step",
        ">=",
        5.0,
        "{:.2f}",
    ),
    "server_overhead_fraction_f": ("(f) served / in-process step - 1, 16,384 rows", "<=", 0.01, "{:.4f}"),
    "server_overhead_ms_128": ("(f) served - in-process step, 128 rows, ms", "<=", 1.0, "{:.2f}"),
    "fp8_bitwise_solo_packed_request": ("fp8: solo == packed == request mode, torch.equal", "==", True, "{}"),
    "fp8_speedup_16384_h3": ("fp8: bf16 / fp8 step time, h3 DiT, 16,384 rows, same run", ">=", 1.2, "{:.3f}"),
    "fp8_dit_weight_gib": ("fp8: h3 DiT weights in GPU memory, GiB", "<=", 45.0, "{:.2f}"),
    "fp8_demo_min_ssim": ("fp8: demo clips against bf16, lowest SSIM", ">=", 0.97, "{:.4f}"),
    "fp8_demo_min_psnr_db": ("fp8: demo clips against bf16, lowest PSNR, dB", ">=", 34.0, "{:.2f}"),
    "fp8_step_s_16384_h3": ("fp8: h3 DiT step, 16,384 rows, s (moonshot: 2 x H100's 1.32)", "<=", 1.32, "{:.3f}"),
}
COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq}

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


def load(root: Path, name: str) -> dict:
    """benchmarks/results/<name>.json under `root`, parsed. Raises FileNotFoundError."""
    return json.loads((root / RESULTS / f"{name}.json").read_text())


def provenance(document: dict, path: str) -> str:
    """'hardware, torch T, date: `command` (path)' from a results document's own fields."""
    torch = f", torch {document['torch']}" if "torch" in document else ""
    return f"{document['hardware']}{torch}, {document['date']}: `{document['command']}` (`{path}`)"


class Sources:
    """Numbered footnotes naming where each figure of a table was measured."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def cite(self, line: str) -> str:
        """The footnote mark '[n]' for `line`, adding it on first use."""
        if line not in self.lines:
            self.lines.append(line)
        return f"[{self.lines.index(line) + 1}]"

    def render(self) -> list[str]:
        return ["", *(f"[{n}] {line}  " for n, line in enumerate(self.lines, 1))]


def key_source(root: Path, merged: dict, key: str) -> str:
    """The provenance of merged["summary"][key]: the latest source file of merged's
    `summary_history` whose own summary holds the same value. Raises ValueError when none does
    (the merged summary no longer agrees with the files it was merged from)."""
    value = merged["summary"][key]
    for entry in reversed(merged.get("summary_history", [])):
        for source in reversed(entry["sources"]):
            document = json.loads((root / source["file"]).read_text())
            if document.get("summary", {}).get(key) == value:
                return provenance(document, source["file"])
    raise ValueError(f"no source in summary_history holds summary[{key!r}] = {value!r}")


def history(merged: dict, key: str) -> list[tuple[dict, object, object]]:
    """(summary_history entry, value before, value after) for each merge that replaced `key`,
    oldest first; the last one's 'after' is the current summary value."""
    changes = [
        (entry, entry["replaced"][key]) for entry in merged.get("summary_history", []) if key in entry["replaced"]
    ]
    afters = [before for _, before in changes[1:]] + [merged["summary"][key]]
    return [(entry, before, after) for (entry, before), after in zip(changes, afters[: len(changes)], strict=True)]


def _value(key: str, value) -> str:
    """A summary value as the docs print it: TARGETS' format for its keys, else 4 significant
    digits for a float."""
    if key in TARGETS:
        return TARGETS[key][3].format(value).lower()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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
        lines.append(
            f"| `{key}` | {what} | {comparison} {_value(key, target)} | {_value(key, value)} | {met} | {mark} |"
        )
    return "\n".join(lines + sources.render())


def h200_history(root: Path) -> str:
    """h200.json's summary_history: every replaced value, with the merge's date and sources."""
    merged = load(root, "h200")
    lines = ["| merged | key | before | after | merged from |", "|---|---|---:|---:|---|"]
    for key in merged["summary"]:
        for entry, before, after in history(merged, key):
            files = ", ".join(f"`{Path(source['file']).name}`" for source in entry["sources"])
            lines.append(f"| {entry['merged']} | `{key}` | {_value(key, before)} | {_value(key, after)} | {files} |")
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
    ]
    return "\n".join(lines + sources.render())


BLOCKS: dict[str, Callable[[Path], str]] = {
    "conditioned_bench_h200 steps": conditioned_steps,
    "h200 headline": h200_headline,
    "h200 targets": h200_targets,
    "h200 summary_history": h200_history,
    "engine_bench_h200 step": engine_step,
    "engine_bench_h200 fused": engine_fused,
    "engine_bench_h200 packing": engine_packing,
    "engine_bench_h200 roofline": engine_roofline,
    "engine_bench_h200_flash_attn4 attention": engine_attention,
    "served_bench_h200_issue16_final_c runs": served_c,
    "served_bench_h200_issue16_final_fd d": lambda root: served_runs(
        root, "served_bench_h200_issue16_final_fd", ("d_request", "d_fifo", "d_srpt")
    ),
    "served_bench_h200_issue16_final_fd f": served_f,
    "h200_full_model runs": full_model_runs,
    "fp8_h200 comparison": fp8_comparison,
    "cache_demo_cpu curve": cache_curve,
    "cache_speed_h200 table": cache_speed,
    "decode_placement_h200 table": decode_placement,
    "h200_full_model_qwen3vl table": full_model_qwen3vl,
    **{
        f"h200_full_model_qwen3vl {key}": full_model_qwen3vl_figure(key)
        for key in ("run_a_wall_s", "run_b_wall_s", "peak_gib")
    },
    "official_layout_h200 table": official_layout,
    "h200x2_sequence_parallel bitwise": sequence_parallel_bitwise,
    "h200x2_sequence_parallel max_abs_diff": sequence_parallel_max_diff,
    "registry_cpu calls": registry_cpu,
    "clip768 table": clip768,
    "clip768 bf16_s": lambda root: f"{load(root, 'clip768')['summary']['clip768_5s_bf16_s']:.1f}",
}


def render(text: str, root: Path, where: str = "text") -> str:
    """`text` with every generated block's body replaced by BLOCKS[name](root): a block whose
    marker ends its line gets '\\n' + table + '\\n', an inline one the figure alone. Raises
    ValueError for an unknown block name, a start marker without its end marker, or an inline
    block whose rendering spans lines (`where` names the document in the message)."""
    for match in START.finditer(text):
        if not BLOCK.match(text, match.start()):
            raise ValueError(f"{where}: <!-- generated: {match['name']} --> has no <!-- end generated -->")

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"{where}: unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        rendered = BLOCKS[name](root)
        if match["body"].startswith("\n"):
            rendered = f"\n{rendered}\n"
        elif "\n" in rendered:
            raise ValueError(f"{where}: inline block {name!r} renders more than one line")
        return f"<!-- generated: {name} -->{rendered}<!-- end generated -->"

    return BLOCK.sub(replace, text)


def documents(root: Path) -> list[Path]:
    """README.md and docs/*.md under `root`, sorted."""
    return sorted(path for pattern in DOC_PATTERNS for path in root.glob(pattern))


def stale(root: Path) -> dict[str, str]:
    """{document path relative to root: unified diff} for each document whose generated blocks
    differ from their rendering; empty when every doc agrees with its results files."""
    diffs = {}
    for path in documents(root):
        name = str(path.relative_to(root))
        text = path.read_text()
        rendered = render(text, root, name)
        if rendered != text:
            lines = difflib.unified_diff(
                text.splitlines(keepends=True), rendered.splitlines(keepends=True), name, f"{name} (rendered)"
            )
            diffs[name] = "".join(lines)
    return diffs


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks (or with --check only report them); returns the exit status:
    1 when --check finds a stale document, else 0."""
    parser = argparse.ArgumentParser(description="Render the docs' measured tables from benchmarks/results.")
    parser.add_argument("--check", action="store_true", help="print the diff and exit 1 when a doc is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    if args.check:
        diffs = stale(args.root)
        for diff in diffs.values():
            print(diff, end="")
        if diffs:
            print(
                f"render_docs.py: {len(diffs)} document(s) differ from benchmarks/results: run "
                "python benchmarks/render_docs.py",
                file=sys.stderr,
            )
        return 1 if diffs else 0
    for path in documents(args.root):
        text = path.read_text()
        rendered = render(text, args.root, str(path.relative_to(args.root)))
        if rendered != text:
            path.write_text(rendered)
            print(f"wrote {path.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
