"""benchmarks/render_docs.py: the docs' generated blocks agree with benchmarks/results/*.json, and
a figure that disagrees with its JSON (in the doc or in the JSON) is detected."""

import json
import shutil
import sys

import pytest

from .serving import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import render_docs  # noqa: E402 - after the sys.path set-up above


def test_docs_agree_with_results():
    assert render_docs.stale(ROOT) == {}


def test_every_block_is_used_in_the_docs():
    text = "".join(path.read_text() for path in render_docs.documents(ROOT))
    used = {match["name"] for match in render_docs.BLOCK.finditer(text)}
    assert used == set(render_docs.BLOCKS)


@pytest.fixture
def copy(tmp_path):
    """README.md, docs/*.md and benchmarks/results/ copied under tmp_path."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(
        ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png", "demo_model", "full_model")
    )
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    return tmp_path


def test_tampered_doc_figure_is_detected(copy, capsys):
    readme = copy / "README.md"
    text = readme.read_text()
    assert "| 1.79x | not measured |" in text
    readme.write_text(text.replace("| 1.79x | not measured |", "| 4.33x | not measured |"))
    diffs = render_docs.stale(copy)
    assert list(diffs) == ["README.md"]
    assert (
        "-| 8 packed vs one at a time, 256-row requests: throughput (`pack8_speedup_256_rows_e`) | 4.33x"
        in (diffs["README.md"])
    )
    assert (
        "+| 8 packed vs one at a time, 256-row requests: throughput (`pack8_speedup_256_rows_e`) | 1.79x"
        in (diffs["README.md"])
    )
    assert render_docs.main(["--check", "--root", str(copy)]) == 1
    assert "4.33x" in capsys.readouterr().out
    assert render_docs.main(["--root", str(copy)]) == 0
    assert readme.read_text() == text
    assert render_docs.main(["--check", "--root", str(copy)]) == 0


def test_changed_result_is_detected(copy):
    path = copy / "benchmarks" / "results" / "h200x2_sequence_parallel_inductor_deterministic.json"
    document = json.loads(path.read_text())
    document["bitwise"]["in_process"]["velocities of one step, (384, 672, 209)"]["max_abs_diff"] = 0.0312
    path.write_text(json.dumps(document))
    diffs = render_docs.stale(copy)
    assert sorted(diffs) == ["docs/gpu_host.md", "docs/multi_gpu.md", "docs/parity.md"]
    assert (
        "+differ by up to <!-- generated: h200x2_sequence_parallel max_abs_diff -->0.031" in (diffs["docs/parity.md"])
    )
    assert "| 0.0235 | 0.0312 |" in diffs["docs/parity.md"]


def test_merged_summary_without_a_source_is_refused(copy):
    path = copy / "benchmarks" / "results" / "h200.json"
    merged = json.loads(path.read_text())
    merged["summary"]["step_mfu"] = 0.9
    path.write_text(json.dumps(merged))
    with pytest.raises(ValueError, match=r"no source in summary_history holds summary\['step_mfu'\] = 0.9"):
        render_docs.stale(copy)


def test_render_refuses_unknown_and_unterminated_blocks():
    with pytest.raises(ValueError, match="x.md: unknown generated block 'h200 nothing'"):
        render_docs.render("<!-- generated: h200 nothing -->\n<!-- end generated -->", ROOT, "x.md")
    with pytest.raises(ValueError, match=r"x.md: <!-- generated: h200 headline --> has no <!-- end generated -->"):
        render_docs.render("<!-- generated: h200 headline -->\n| a |\n", ROOT, "x.md")
    with pytest.raises(ValueError, match="x.md: inline block 'h200 headline' renders more than one line"):
        render_docs.render("a <!-- generated: h200 headline -->x<!-- end generated -->", ROOT, "x.md")


def test_inline_block_renders_the_figure_alone():
    text = "up to <!-- generated: h200x2_sequence_parallel max_abs_diff -->?<!-- end generated --> max abs"
    assert render_docs.render(text, ROOT) == (
        "up to <!-- generated: h200x2_sequence_parallel max_abs_diff -->0.026<!-- end generated --> max abs"
    )
