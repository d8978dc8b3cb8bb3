"""CPU smoke runs of the benchmark tools. No timing checks; every number the scripts report is
checked against a value derived here: analytic counts (rows, FLOPs) from the request shapes
and the tiny config, and summaries recomputed from the raw timings and per-request records."""

import json
import math
import subprocess
import sys

import pytest

from .serving import ROOT

# The CPU setting's requests, 64x96, 22 frames, 9 text tokens: 9 text rows, 2 x 37 audio rows
# (round(22 / 24 fps x 40 Hz) per channel), 7 latent frames x (64/16/2) x (96/16/2) = 42 video rows:
# 125 used, padded to 128. At 128x192: 7 x 4 x 6 = 168 video rows, 251 used, padded to 256.
USED_ROWS = {128: 125, 256: 251}


def tiny_step_flops(rows: int, used: int) -> int:
    """h3_spec §8 for the tiny DiT (hidden H 96, attention width A 128, MLP F 256, 2 layers):
    per layer 2 S (4 A H + 3 F H) + 4 U^2 A, plus 2 S 256 H for the patch projections."""
    hidden, attn, ffn, layers = 96, 128, 256, 2
    return layers * (2 * rows * (4 * attn * hidden + 3 * ffn * hidden) + 4 * used**2 * attn) + 2 * rows * 256 * hidden


def test_engine_bench_cpu_smoke(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_bench.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "engine_bench.json").read_text())
    assert report["config"] == "tiny" and report["hardware"] == "CPU"
    assert tiny_step_flops(128, 125) == 85_206_016
    rate = report["matmul_flops_per_s"]
    for n, step in report["a_step"].items():  # 1..4 requests of 128 rows
        assert (step["rows"], step["flops"]) == (128 * int(n), int(n) * 85_206_016), n
        assert step["mfu"] == pytest.approx(step["flops"] / step["seconds"] / rate, rel=1e-12)
    assert sorted(report["a_step"]) == ["1", "2", "3", "4"]
    runs = report["b_fused_vs_separate"]
    assert len(runs) == 2
    for r in runs:
        assert r["separate_ms"] == pytest.approx(sum(v["ms"] for v in r["separate"].values()), rel=1e-12)
        assert r["fused_ms"] == pytest.approx(sum(v["ms"] for v in r["fused"].values()), rel=1e-12)
        assert r["fused_over_separate"] == pytest.approx(r["fused_ms"] / r["separate_ms"], rel=1e-12)
    curve = report["e_packing_curve"]
    assert {int(rows): v["used_rows"] for rows, v in curve.items()} == USED_ROWS
    for v in curve.values():
        assert v["speedup"] == pytest.approx(8 * v["one_s"] / v["eight_packed_s"], rel=1e-12)
    assert report["summary"] == {
        "step_mfu": report["a_step"]["1"]["mfu"],
        "fused_over_separate_3x16384": max(r["fused_over_separate"] for r in runs),
        "pack8_speedup_256_rows_e": curve["256"]["speedup"],
        "pack8_min_speedup_e": min(v["speedup"] for v in curve.values()),
    }
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
ONE_AT_A_TIME = {"c_request_mode", "c_step_1_slot", "d_request", "f_served"}  # never 2 requests in a step


def check_summary(name: str, document: dict, steps: int) -> None:
    """The run's summary against the numbers recomputed from its per-request records."""
    requests, summary = document["requests"], document["summary"]
    latency = sorted(r["complete_s"] - r["submit_s"] for r in requests)
    first_steps = [r["first_step_s"] - r["submit_s"] for r in requests]
    intervals = [(r["last_step_s"] - r["first_step_s"]) / (steps - 1) for r in requests]
    wall = max(r["complete_s"] for r in requests) - min(r["submit_s"] for r in requests)
    assert summary["wall_s"] == pytest.approx(wall, abs=1e-9), name
    assert summary["throughput_req_per_min"] == pytest.approx(len(requests) * 60 / wall, rel=1e-9), name
    assert summary["latency_s"]["mean"] == pytest.approx(sum(latency) / len(latency), rel=1e-9), name
    # nearest rank: for n <= 19 requests p95 is the largest; p50 the ceil(n/2)-th smallest
    assert summary["latency_s"]["p95"] == pytest.approx(latency[-1], abs=1e-9), name
    assert summary["latency_s"]["p50"] == pytest.approx(latency[math.ceil(len(latency) / 2) - 1], abs=1e-9), name
    assert summary["time_to_first_step_s"]["mean"] == pytest.approx(sum(first_steps) / len(first_steps), rel=1e-9)
    assert summary["step_interval_s"]["mean"] == pytest.approx(sum(intervals) / len(intervals), rel=1e-9), name
    assert summary["peak_pack_size"] == max(r["largest_pack"] for r in requests), name


def test_served_bench_cpu_smoke(tmp_path):
    from h3_core.checkpoint_setup import DEFAULT_ROOT, create_checkpoint

    create_checkpoint("tiny", DEFAULT_ROOT / "tiny")  # the CPU setting serves checkpoints/tiny
    out, work = tmp_path / "out", tmp_path / "work"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "served_bench.py"), "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "served_bench.json").read_text())
    setting = report["setting"]
    assert report["hardware"] == "CPU" and setting["config"] == "tiny"
    assert (setting["height"], setting["width"], setting["num_frames"]) == (64, 96, 22)
    assert report["command"].endswith("--scenarios c d f")
    assert list(report["runs"]) == list(SERVED_RUNS)
    runs = {name: document["summary"] for name, document in report["runs"].items()}
    for name, (mode, policy, slots) in SERVED_RUNS.items():
        document = report["runs"][name]
        count, steps = {
            "c": (setting["c_requests"], setting["c_steps"]),
            "d": (setting["d_requests"], setting["d_steps"]),
            "f": (1, setting["c_steps"]),
        }[name[0]]
        summary = runs[name]
        assert (summary["num_requests"], summary["completed"], summary["failed"]) == (count, count, 0), name
        dit = document["h3_dit"]
        assert (dit["config_name"], dit["device"]) == ("tiny", "cpu")
        assert (dit["execution_mode"], dit["scheduling_policy"], dit["max_num_seqs"]) == (mode, policy, slots), name
        assert document["label"] == name and document["config"]["no_mp4"] is True
        requests = document["requests"]
        assert [r["index"] for r in requests] == list(range(count))
        for r in requests:  # what the server generated is what bench_client asked for
            assert r["success"], (name, r)
            info = r["server_info"]
            assert (info["height"], info["width"], info["num_frames"]) == (64, 96, 22), name
            assert (info["num_inference_steps"], info["seed"]) == (steps, r["index"]), name
            assert 1 <= r["largest_pack"] <= int(slots), name
        if name in ONE_AT_A_TIME:
            assert summary["peak_pack_size"] == 1, name
        check_summary(name, document, steps)
        assert (out / f"timeline_{name}.png").stat().st_size > 0
    assert [report["runs"][name]["h3_dit"]["row_budget"] for name in ("d_request", "d_fifo", "d_srpt", "f_served")] == [
        "4096"
    ] * 4
    throughput = {name: summary["throughput_req_per_min"] for name, summary in runs.items()}
    mean_latency = {name: summary["latency_s"]["mean"] for name, summary in runs.items()}
    first_step = {name: summary["time_to_first_step_s"]["mean"] for name, summary in runs.items()}
    in_process = report["in_process"]
    (f_request,) = report["runs"]["f_served"]["requests"]
    served_step = (f_request["last_step_s"] - f_request["first_step_s"]) / (setting["c_steps"] - 1)
    assert in_process["served_seconds_per_step"] == pytest.approx(served_step, rel=1e-9)
    assert in_process["seconds_per_step"] > 0 and in_process["seconds_per_step_1_thread"] > 0
    assert in_process["steps"] == setting["c_steps"]
    assert report["summary"] == pytest.approx(
        {
            "step1_over_request_throughput_c": throughput["c_step_1_slot"] / throughput["c_request_mode"],
            "step4_over_request_throughput_c": throughput["c_step_2_slots"] / throughput["c_request_mode"],
            "fifo_over_request_mean_latency_d": mean_latency["d_fifo"] / mean_latency["d_request"],
            "request_over_fifo_time_to_first_step_d": first_step["d_request"] / first_step["d_fifo"],
            "fifo_over_request_throughput_d": throughput["d_fifo"] / throughput["d_request"],
            "default_over_request_mean_latency_d": mean_latency["d_srpt"] / mean_latency["d_request"],
            "request_over_default_time_to_first_step_d": first_step["d_request"] / first_step["d_srpt"],
            "default_over_request_throughput_d": throughput["d_srpt"] / throughput["d_request"],
            "server_overhead_fraction_f": served_step / in_process["seconds_per_step"] - 1,
        },
        rel=1e-9,
    )
    assert "in-process step" in run.stdout


def test_full_model_bench_cpu_smoke(tmp_path):
    """benchmarks/full_model_bench.py's CPU path (about 30 s): the tiny DiT from random:0, 64x96x22
    requests of 2 steps (a 45-token prompt: 45 + 74 + 42 = 161 rows, padded to 192), a tiny 50-layer
    Qwen3-VL, no GPU memory figures."""
    out, work = tmp_path / "out", tmp_path / "work"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "full_model_bench.py"), "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "full_model_bench.json").read_text())
    settings, summary, runs = report["settings"], report["summary"], report["runs"]
    assert report["hardware"] == "CPU" and settings["config"] == "tiny" and settings["weights"] == "random:0"
    assert settings["h3_vae"] == {"checkpoint_dir": "random:0", "device": "cpu"}
    assert settings["dit_parameters"] == 762_544 and settings["rows_per_request"] == 192
    assert list(runs) == ["warmup", "run_a", "run_b"] and report["errors"] == {}
    steps = settings["steps"]
    for name, count, run_steps in (("warmup", 1, 2), ("run_a", 1, steps), ("run_b", settings["b_requests"], steps)):
        document = runs[name]
        assert (document["summary"]["completed"], document["summary"]["failed"]) == (count, 0), name
        for r in document["requests"]:
            info = r["server_info"]
            assert (info["height"], info["width"], info["num_frames"], info["num_inference_steps"]) == (
                64,
                96,
                22,
                run_steps,
            ), name
        check_summary(name, document, run_steps)
        dit = document["dit_steps"]  # every request-step of the run packed 192 rows
        assert dit["h3_pack_rows_sum"] == 192 * count * run_steps, name
        assert run_steps <= dit["steps"] == dit["h3_pack_rows_count"] <= count * run_steps, name
        assert dit["seconds_per_step"] == pytest.approx(dit["h3_step_seconds_sum"] / dit["steps"], rel=1e-12)
        assert document["peak_gpu_memory_mib"] is None and document["peak_gpu_memory_mib_per_process"] == {}
    assert runs["run_a"]["dit_steps"]["steps"] == steps
    assert report["processes"] == ["benchmark", "h3_dit_0_0", "h3_encoder_0_0", "h3_vae_0_0", "tritonserver"]
    tiny = report["qwen3vl"]["dims"]
    h, heads, kv, d, mlp = (
        tiny[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    )
    per_layer = h * d * (2 * heads + 2 * kv) + 2 * d + 3 * h * mlp + 2 * h
    assert summary["qwen3vl_params"] == summary["qwen3vl_params_expected"] == tiny["vocab_size"] * h + 50 * per_layer
    assert 0 <= report["qwen3vl"]["bytes"] - 2 * summary["qwen3vl_params"] < 1024  # bf16, + the RoPE buffers
    assert summary["qwen3vl_gib"] == report["qwen3vl"]["bytes"] / 2**30
    assert summary["qwen3vl_encode_ms_9"] > 0 and summary["qwen3vl_encode_ms_256"] > 0
    assert summary["qwen3vl_error"] is None
    a, b = runs["run_a"], runs["run_b"]
    assert summary == {  # copied, not recomputed: equal as floats
        "reference_run_b_wall_s": 174.8,
        "load_seconds": summary["load_seconds"],
        "gpu_memory_used_gib_loaded": None,
        "run_a_wall_s": a["summary"]["wall_s"],
        "run_a_latency_s": a["summary"]["latency_s"]["mean"],
        "run_a_failed": 0,
        "run_a_seconds_per_step": a["dit_steps"]["seconds_per_step"],
        "run_a_rows_per_step": 192,
        "peak_gpu_memory_gib_a": None,
        "peak_gpu_memory_gib_per_process_a": {},
        "gpu_memory_used_gib_dit_server": None,
        "qwen3vl_params": summary["qwen3vl_params"],
        "qwen3vl_params_expected": summary["qwen3vl_params"],
        "qwen3vl_gib": summary["qwen3vl_gib"],
        "qwen3vl_encode_ms_9": report["qwen3vl"]["encode_ms_9"],
        "qwen3vl_encode_ms_256": report["qwen3vl"]["encode_ms_256"],
        "gpu_memory_used_gib_dit_plus_qwen3vl": None,
        "peak_gpu_memory_gib_qwen3vl": None,
        "qwen3vl_error": None,
        "run_b_wall_s": b["summary"]["wall_s"],
        "run_b_latency_s": b["summary"]["latency_s"]["mean"],
        "run_b_failed": 0,
        "run_b_seconds_per_step": b["dit_steps"]["seconds_per_step"],
        "run_b_rows_per_step": b["dit_steps"]["rows_per_step"],
        "peak_gpu_memory_gib_b": None,
        "peak_gpu_memory_gib_per_process_b": {},
        "run_b_over_reference_wall": b["summary"]["wall_s"] / 174.8,
        "gpu_memory_used_gib_server_idle_after_b": None,
    }
    assert str(tmp_path) not in json.dumps(report)  # written as $WORK / $OUT
    assert any(line.startswith("run_b ") for line in run.stdout.splitlines())
