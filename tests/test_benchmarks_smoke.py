"""CPU smoke runs of the benchmark tools: reports produced and well formed (no timing checks)."""
import json
import math
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


SERVED_RUNS = {  # run -> (h3_dit execution_mode, scheduling_policy, max_num_seqs) on the CPU (2 requests in c)
    "c_request_mode": ("request", "fifo", "2"),
    "c_step_1_slot": ("step", "fifo", "1"),
    "c_step_2_slots": ("step", "fifo", "2"),
    "d_request": ("step", "request", "4"),
    "d_fifo": ("step", "fifo", "4"),
    "d_srpt": ("step", "srpt", "4"),
    "f_served": ("step", "srpt", "4"),
}


def test_served_bench_cpu_smoke(tmp_path):
    from h3_core.checkpoint_setup import DEFAULT_ROOT, create_checkpoint

    create_checkpoint("tiny", DEFAULT_ROOT / "tiny")  # the CPU setting serves checkpoints/tiny
    out, work = tmp_path / "out", tmp_path / "work"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "served_bench.py"), "--out", str(out),
                          "--work", str(work)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "served_bench.json").read_text())
    assert report["hardware"] == "CPU" and report["setting"]["config"] == "tiny"
    assert report["command"].endswith("--scenarios c d f")
    assert list(report["runs"]) == list(SERVED_RUNS)
    for name, (mode, policy, slots) in SERVED_RUNS.items():
        document = report["runs"][name]
        requests = {"c": report["setting"]["c_requests"], "d": report["setting"]["d_requests"], "f": 1}[name[0]]
        summary = document["summary"]
        assert (summary["num_requests"], summary["completed"], summary["failed"]) == (requests, requests, 0), name
        dit = document["h3_dit"]
        assert (dit["config_name"], dit["device"]) == ("tiny", "cpu")
        assert (dit["execution_mode"], dit["scheduling_policy"], dit["max_num_seqs"]) == (mode, policy, slots), name
        assert document["label"] == name and document["config"]["no_mp4"] is True
        assert all(r["success"] for r in document["requests"])
        assert (out / f"timeline_{name}.png").stat().st_size > 0
    assert [report["runs"][name]["h3_dit"]["row_budget"] for name in ("d_request", "d_fifo", "d_srpt", "f_served")] == [
        "4096"] * 4
    for key in ("step4_over_request_throughput_c", "step1_over_request_throughput_c", "server_overhead_fraction_f",
                "default_over_request_mean_latency_d", "request_over_default_time_to_first_step_d"):
        assert isinstance(report["summary"][key], float) and math.isfinite(report["summary"][key]), key
    in_process = report["in_process"]
    assert in_process["seconds_per_step"] > 0 and in_process["seconds_per_step_1_thread"] > 0
    assert in_process["served_seconds_per_step"] == report["runs"]["f_served"]["summary"]["step_interval_s"]["mean"]
    assert in_process["steps"] == report["setting"]["c_steps"]
    assert "in-process step" in run.stdout
