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

The docs' targets (>= 0.75 etc.) are the issues' acceptance targets, kept in doc_sources.TARGETS.
The tables themselves: docs_benchmarks_tables.py (README's headline, docs/benchmarks.md) and
docs_operating_tables.py (the operating manuals); what they share: doc_sources.py.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from doc_sources import load
from docs_benchmarks_tables import (
    conditioned_steps,
    engine_attention,
    engine_fused,
    engine_packing,
    engine_roofline,
    engine_step,
    full_model_runs,
    h200_headline,
    h200_history,
    h200_targets,
    registry_cpu,
    served_c,
    served_f,
    served_runs,
)
from docs_operating_tables import (
    cache_curve,
    cache_speed,
    clip768,
    clip768_headline,
    decode_placement,
    fp8_comparison,
    full_model_qwen3vl,
    full_model_qwen3vl_figure,
    lora_demo,
    official_layout,
    ref_kv_reuse,
    sequence_parallel_bitwise,
    sequence_parallel_max_diff,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")
DOC_PATTERNS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"<!-- generated: (?P<name>[^>]*?) -->(?P<body>.*?)<!-- end generated -->", re.DOTALL)
START = re.compile(r"<!-- generated: (?P<name>[^>]*?) -->")

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
    "lora_demo_cpu table": lora_demo,
    "h200x2_sequence_parallel bitwise": sequence_parallel_bitwise,
    "h200x2_sequence_parallel max_abs_diff": sequence_parallel_max_diff,
    "registry_cpu calls": registry_cpu,
    "clip768 table": clip768,
    "ref_kv_reuse_cpu table": ref_kv_reuse("ref_kv_reuse_cpu"),
    "clip768 headline": clip768_headline,
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
