"""CPU smoke runs of the benchmark tools: reports produced and well formed (no timing checks)."""
import json
import subprocess
import sys

from .serving import ROOT


def test_engine_bench_cpu_smoke(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_bench.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "engine_bench.json").read_text())
    assert report["config"] == "tiny" and report["hardware"] == "CPU"
    assert sorted(report["a_step"]) == ["1", "2", "3", "4"]
    assert len(report["b_fused_vs_separate"]) == 2
    assert sorted(report["e_packing_curve"], key=int) == ["128", "256"]
    assert set(report["summary"]) == {"step_mfu", "fused_over_separate_3x16384", "pack8_speedup_256_rows_e",
                                      "pack8_min_speedup_e"}
    assert "(e) rows/request" in run.stdout
