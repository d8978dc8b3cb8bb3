"""What every generated docs table shares (benchmarks/render_docs.py): reading a results file of
benchmarks/results/ (`load`), crediting a figure to the run that measured it (`provenance`,
`key_source` for a merged file's figures through its `summary_history`, `Sources` for a table's
footnotes), a key's replacements over the merges (`history`), and the issues' acceptance TARGETS
with their comparisons and formats (`shown`).
"""

from __future__ import annotations

import json
import operator
from pathlib import Path

RESULTS = Path("benchmarks/results")

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


def shown(key: str, value) -> str:
    """A summary value as the docs print it: TARGETS' format for its keys, else 4 significant
    digits for a float."""
    if key in TARGETS:
        return TARGETS[key][3].format(value).lower()
    return f"{value:.4g}" if isinstance(value, float) else str(value)
