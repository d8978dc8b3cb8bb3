"""CPU smoke runs of the benchmark tools. No timing checks; every number the scripts report is
checked against a value derived here: analytic counts (rows, FLOPs) from the request shapes
and the tiny config, and summaries recomputed from the raw timings and per-request records."""

import json
import math
import os
import statistics
import subprocess
import sys
import time

import pytest

from .serving import ROOT

# The CPU setting's requests, 64x96, 22 frames, 9 text tokens: 9 text rows, 2 x 37 audio rows
# (round(22 / 24 fps x 40 Hz) per channel), 7 latent frames x (64/16/2) x (96/16/2) = 42 video rows:
# 125 used, padded to 128. At 128x192: 7 x 4 x 6 = 168 video rows, 251 used, padded to 256.
USED_ROWS = {128: 125, 256: 251}


def tiny_step_flops(rows: int, used: int) -> int:
    """docs/model.md §8 for the tiny DiT (hidden H 96, attention width A 128, MLP F 256, 2 layers):
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
    assert report["config"] == "tiny" and report["hardware"] == "CPU" and report["weights"] == "random:0"
    assert (report["row_tile"], report["compiled_blocks"], report["cublas_workspace_config"]) == (64, False, None)
    assert report["compile_seconds"] > 0 and report["compile"] == {  # the first step's seconds, copied
        "compile_seconds": report["compile_seconds"],
        "recompiles": 0,
        "graph_breaks": 0,
        "unique_graphs": 0,  # nothing is compiled on the CPU
    }
    assert "cuda_graphs" not in report and report["attention"] == "sdpa"
    assert tiny_step_flops(128, 125) == 85_206_016
    probes = report["matmul_probes_flops_per_s"]
    rate = report["matmul_flops_per_s"]
    assert len(probes) == 2 and rate == max(probes)  # start and end of the run; the higher one
    for n, step in report["a_step"].items():  # 1..4 requests of 128 rows
        assert (step["rows"], step["flops"]) == (128 * int(n), int(n) * 85_206_016), n
        assert step["mfu"] == pytest.approx(step["flops"] / step["seconds"] / rate, rel=1e-12)
    assert sorted(report["a_step"]) == ["1", "2", "3", "4"]
    runs = report["b_fused_vs_separate"]
    assert [r["order"] for r in runs] == [["separate", "fused"], ["fused", "separate"]]  # 3 runs on CUDA
    for r in runs:
        assert r["separate_ms"] == pytest.approx(sum(v["ms"] for v in r["separate"].values()), rel=1e-12)
        assert r["fused_ms"] == pytest.approx(sum(v["ms"] for v in r["fused"].values()), rel=1e-12)
        assert r["fused_over_separate"] == pytest.approx(r["fused_ms"] / r["separate_ms"], rel=1e-12)
        assert r["fused_over_separate_wall"] == pytest.approx(r["fused_wall_ms"] / r["separate_wall_ms"], rel=1e-12)
    ratios = [r["fused_over_separate"] for r in runs]
    walls = [r["fused_over_separate_wall"] for r in runs]
    assert report["b_summary"] == {
        "kernel_time": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": ratios},
        "wall": {"median": statistics.median(walls), "min": min(walls), "max": max(walls), "runs": walls},
    }
    curve = report["e_packing_curve"]
    assert {int(rows): v["used_rows"] for rows, v in curve.items()} == USED_ROWS
    for v in curve.values():  # 8 packed: the CPU's blocks are not compiled, so no row bound
        assert v["packed"] == 8 and v["speedup"] == pytest.approx(8 * v["one_s"] / v["packed_s"], rel=1e-12)
    attention_step = report["attention_step"]  # sdpa vs auto in the DiT step, 1 run on the CPU
    for n in ("1", "3"):
        assert sorted(attention_step[n]) == ["auto", "sdpa"] and len(attention_step[n]["sdpa"]) == 1
        assert attention_step[f"{n}_over_sdpa"] == {
            "sdpa": 1.0,
            "auto": attention_step[n]["auto"][0] / attention_step[n]["sdpa"][0],
        }
    roofline = report["roofline"]
    assert list(roofline) == ["1x128", "4x128"]
    weight_bytes = 4 * 762_544  # the tiny DiT's parameters, float32
    for name, requests in (("1x128", 1), ("4x128", 4)):
        v = roofline[name]
        assert (v["rows"], v["requests"], v["flops"]) == (128 * requests, requests, requests * 85_206_016), name
        assert v["weight_bytes"] == weight_bytes and v["weight_read_seconds"] == weight_bytes / 4.8e12
        assert v["compute_seconds"] == v["flops"] / rate
        assert v["floor_seconds"] == max(v["weight_read_seconds"], v["compute_seconds"]) == v["compute_seconds"]
        assert v["bound"] == "compute" and v["over_floor"] == v["seconds"] / v["floor_seconds"]
        assert v["mfu"] == v["flops"] / v["seconds"] / rate
        assert v["kernel_ms"] is None and v["launches"] is None  # profiled on CUDA only
    bitwise = report["bitwise"]
    assert {name: (v["rows"], v["steps"], v["pack_sizes"]) for name, v in bitwise.items()} == {
        "3x128": ([128] * 3, [2, 3, 2], [3, 3, 1]),
        "64+128+256": ([64, 128, 256], [2, 3, 2], [3, 3, 1]),
    }
    for name, v in bitwise.items():  # the CPU's 64-row tiles are bitwise
        assert v["packed_vs_solo_max_difference"] == v["packed_vs_request_mode_max_difference"] == 0.0, name
        assert v["bitwise"] is True, name
    assert report["summary"] == {
        "compile_seconds": report["compile_seconds"],
        "step_mfu": report["a_step"]["1"]["mfu"],
        "fused_over_separate_3x16384": statistics.median(ratios),
        "fused_over_separate_3x16384_min": min(ratios),
        "fused_over_separate_3x16384_max": max(ratios),
        "fused_over_separate_wall_3x16384": statistics.median(walls),
        "pack8_speedup_256_rows_e": curve["256"]["speedup"],
        "pack8_min_speedup_e": min(v["speedup"] for v in curve.values()),
        "roofline_ratio_max": max(v["over_floor"] for v in roofline.values()),
        "small_step_ms_128": roofline["1x128"]["seconds"] * 1e3,
        "bitwise_solo_packed_request": True,
    }
    assert "(e) rows/request" in run.stdout and "roofline" in run.stdout and "bitwise" in run.stdout


def test_engine_bench_bitwise_check_sees_a_pack_dependent_step():
    """engine_bench.bitwise reports a step whose output depends on the pack: here every packed
    forward (more than one request) is off by 2^-10, so the packed step differs from the solo one
    and the packed run's latents from request mode's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine_bench

    from h3_core.factory import load_engine

    engine = load_engine("tiny", "random:0", "cpu", with_encoder=False, with_vaes=False)
    packs = {"2x128": [128, 128]}
    assert engine_bench.bitwise(engine, packs)["2x128"]["bitwise"] is True
    denoise_step = engine.denoise_step

    def pack_dependent(states):
        out = denoise_step(states)
        return out if len(states) == 1 else [(video + 2**-10, audio) for video, audio in out]

    engine.denoise_step = pack_dependent
    result = engine_bench.bitwise(engine, packs)["2x128"]
    assert result["bitwise"] is False
    assert result["packed_vs_solo_max_difference"] > 0 and result["packed_vs_request_mode_max_difference"] > 0


SERVED_RUNS = {  # run -> (h3_dit execution_mode, scheduling_policy, max_num_seqs) on the CPU (2 requests in c)
    "c_request_mode_1": ("request", "fifo", "2"),
    "c_step_2_slots_1": ("step", "fifo", "2"),
    "c_step_1_slot": ("step", "fifo", "1"),
    "d_request": ("step", "request", "4"),
    "d_fifo": ("step", "fifo", "4"),
    "d_srpt": ("step", "srpt", "4"),
    "f_served": ("step", "srpt", "4"),
    "f_served_128": ("step", "srpt", "4"),  # the same server as f_served, a 32x32, 22-frame request
}
ONE_AT_A_TIME = {"c_request_mode_1", "c_step_1_slot", "d_request", "f_served", "f_served_128"}  # 1 request a step


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
    from h3_core.weights.checkpoint_setup import DEFAULT_ROOT, create_checkpoint

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
    assert (setting["c_repeats"], setting["f_small"], setting["f_small_steps"]) == (1, [32, 32, 22], 5)
    assert report["command"].endswith("--scenarios c c1 d f")
    assert list(report["runs"]) == list(SERVED_RUNS)
    assert list(report["run_seconds"]) == [*list(SERVED_RUNS)[:-1], "in_process"]  # f_served_128 shares f's server
    assert report["skipped"] == [] and report["errors"] == {} and report["h3_dit_overrides"] == {}
    runs = {name: document["summary"] for name, document in report["runs"].items()}
    for name, (mode, policy, slots) in SERVED_RUNS.items():
        document = report["runs"][name]
        count, steps = {
            "c": (setting["c_requests"], setting["c_steps"]),
            "d": (setting["d_requests"], setting["d_steps"]),
            "f": (1, setting["f_small_steps"] if name == "f_served_128" else setting["c_steps"]),
        }[name[0]]
        shape = (32, 32, 22) if name == "f_served_128" else (64, 96, 22)
        summary = runs[name]
        assert (summary["num_requests"], summary["completed"], summary["failed"]) == (count, count, 0), name
        dit = document["h3_dit"]
        assert (dit["config_name"], dit["device"]) == ("tiny", "cpu")
        assert (dit["execution_mode"], dit["scheduling_policy"], dit["max_num_seqs"]) == (mode, policy, slots), name
        assert document["label"] == name and document["config"]["no_mp4"] is True
        assert document["server"] == ("f_served" if name == "f_served_128" else name)
        requests = document["requests"]
        assert [r["index"] for r in requests] == list(range(count))
        for r in requests:  # what the server generated is what bench_client asked for
            assert r["success"], (name, r)
            info = r["server_info"]
            assert (info["height"], info["width"], info["num_frames"]) == shape, name
            assert (info["num_inference_steps"], info["seed"]) == (steps, r["index"]), name
            assert 1 <= r["largest_pack"] <= int(slots), name
        dit_steps = document["dit_steps"]  # /metrics over the client run: its warm-up request's 2 steps too
        assert dit_steps["steps"] == dit_steps["h3_step_seconds_count"] == dit_steps["h3_pack_rows_count"], name
        assert dit_steps["rows_per_step"] == dit_steps["h3_pack_rows_sum"] / dit_steps["h3_pack_rows_count"], name
        if name in ONE_AT_A_TIME:
            assert summary["peak_pack_size"] == 1, name
            assert dit_steps["steps"] == 2 + count * steps, name
        check_summary(name, document, steps)
        assert (out / f"timeline_{name}.png").stat().st_size > 0
    assert report["runs"]["f_served_128"]["dit_steps"]["rows_per_step"] == 128  # the 11-token prompt, 32x32x22
    row_budgets = [report["runs"][name]["h3_dit"]["row_budget"] for name in list(SERVED_RUNS)[3:]]
    assert row_budgets == ["4096"] * 5
    throughput = {name: summary["throughput_req_per_min"] for name, summary in runs.items()}
    mean_latency = {name: summary["latency_s"]["mean"] for name, summary in runs.items()}
    first_step = {name: summary["time_to_first_step_s"]["mean"] for name, summary in runs.items()}
    served_steps = {}
    for key, name, steps, shape in (
        ("in_process", "f_served", setting["c_steps"], [64, 96, 22]),
        ("in_process_128", "f_served_128", setting["f_small_steps"], [32, 32, 22]),
    ):
        in_process = report[key]
        (f_request,) = report["runs"][name]["requests"]
        served_steps[key] = (f_request["last_step_s"] - f_request["first_step_s"]) / (steps - 1)
        assert in_process["served_seconds_per_step"] == pytest.approx(served_steps[key], rel=1e-9)
        assert in_process["served_rows_per_step"] == report["runs"][name]["dit_steps"]["rows_per_step"]
        for field in ("seconds_per_step", "seconds_per_step_1_thread", "seconds_per_step_synced", "warm_up_seconds"):
            assert in_process[field] > 0, (key, field)
        assert (in_process["steps"], in_process["shape"], in_process["rows"]) == (steps, shape, 128), key
    pair = throughput["c_step_2_slots_1"] / throughput["c_request_mode_1"]
    assert report["c_step4_over_request_pairs"] == {"median": pair, "min": pair, "max": pair, "runs": [pair]}
    assert report["summary"] == pytest.approx(
        {
            "step4_over_request_throughput_c": pair,
            "step4_over_request_throughput_c_min": pair,
            "step4_over_request_throughput_c_max": pair,
            "step4_over_request_throughput_c_pairs": 1,
            "step1_over_request_throughput_c": throughput["c_step_1_slot"] / throughput["c_request_mode_1"],
            "fifo_over_request_mean_latency_d": mean_latency["d_fifo"] / mean_latency["d_request"],
            "request_over_fifo_time_to_first_step_d": first_step["d_request"] / first_step["d_fifo"],
            "fifo_over_request_throughput_d": throughput["d_fifo"] / throughput["d_request"],
            "default_over_request_mean_latency_d": mean_latency["d_srpt"] / mean_latency["d_request"],
            "request_over_default_time_to_first_step_d": first_step["d_request"] / first_step["d_srpt"],
            "default_over_request_throughput_d": throughput["d_srpt"] / throughput["d_request"],
            "server_overhead_fraction_f": served_steps["in_process"] / report["in_process"]["seconds_per_step"] - 1,
            "server_overhead_ms_128": (served_steps["in_process_128"] - report["in_process_128"]["seconds_per_step"])
            * 1e3,
            "server_overhead_fraction_f_128": served_steps["in_process_128"]
            / report["in_process_128"]["seconds_per_step"]
            - 1,
        },
        rel=1e-9,
    )
    assert "in_process_128: 128 rows" in run.stdout


def test_served_bench_budget_skips_what_would_not_fit(tmp_path, monkeypatch, capsys):
    """--budget-s: a run starts only while the seconds spent plus the longest run so far stay
    within the budget; skipped runs are listed, and the summary has what the finished ones give.
    served_run is replaced by a stand-in of 0.3 s (no server), so this takes about a second."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import served_bench

    def fake_served_run(server_name, setting, checkpoint, encoder_path, dit, clients, work, out, cuda, args):
        time.sleep(0.3)
        summary = {
            "wall_s": 1.0,
            "throughput_req_per_min": 60.0,
            "latency_s": {"mean": 1.0, "p95": 1.0},
            "time_to_first_step_s": {"mean": 0.1},
            "step_interval_s": {"mean": 0.01},
            "peak_pack_size": 1,
        }
        dit_steps = {"seconds_per_step": 0.01, "rows_per_step": 128.0}
        return {c.name: {"summary": summary, "dit_steps": dit_steps, "server_ready_s": 0.0} for c in clients}

    monkeypatch.setattr(served_bench, "served_run", fake_served_run)
    monkeypatch.setattr(sys, "argv", ["served_bench.py", "--out", str(tmp_path), "--budget-s", "0.5"])
    served_bench.main()
    report = json.loads((tmp_path / "served_bench.json").read_text())
    assert list(report["runs"]) == ["c_request_mode_1"]  # 0.3 s spent + 0.3 s longest > 0.5 s: no second run
    assert report["skipped"] == [*list(SERVED_RUNS)[1:-1]]  # every later server start, f's once
    assert report["summary"] == {} and report["errors"] == {} and "in_process" not in report
    assert report["command"].endswith("--scenarios c c1 d f --budget-s 0.5")
    assert "skipped" in capsys.readouterr().out


def test_served_bench_draws_the_gpu_checkpoint_with_the_bitwise_cublas_setting(tmp_path, monkeypatch):
    """On CUDA the bench checkpoint's DiT is built with the default row tile, which wants
    CUBLAS_WORKSPACE_CONFIG=:0:0; prepare_weights sets it for the draw only, so the servers it
    starts later inherit the environment as it was (stand-ins for the draw and the encoder)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import served_bench

    seen = []

    def fake_create_checkpoint(config, folder, device):
        seen.append((config, device, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return True

    monkeypatch.setattr(served_bench, "create_checkpoint", fake_create_checkpoint)
    monkeypatch.setattr(served_bench, "write_bench_text_encoder", lambda folder, width: None)
    monkeypatch.setattr(served_bench.torch.cuda, "empty_cache", lambda: None)
    for before in (None, ":4096:8"):
        if before is None:
            monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        else:
            monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", before)
        checkpoint, encoder = served_bench.prepare_weights(served_bench.GPU, tmp_path, cuda=True)
        assert (checkpoint, encoder) == (tmp_path / "checkpoints" / "bench", str(tmp_path / "bench_text_encoder"))
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == before
    assert seen == [("bench", "cuda", ":0:0")] * 2


def test_merge_results_files_new_summaries_beside_the_old():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_report import merge_results

    target = {
        "hardware": "GPU X",
        "measurements": {"engine_bench": {"a_step": 1}},
        "summary": {"step_mfu": 0.5, "pack8_min_speedup_e": 0.99, "step4_over_request_throughput_c": 0.996},
    }
    engine = {"hardware": "GPU X", "date": "2026-12-01", "command": "e", "a_step": 2, "summary": {"step_mfu": 0.8}}
    engine["summary"]["small_step_ms_128"] = 4.0
    served = {"hardware": "GPU X", "date": "2026-12-01", "command": "s", "runs": {}, "summary": {}}
    served["summary"]["step4_over_request_throughput_c"] = 1.01
    merged = merge_results(target, [("e.json", engine), ("s.json", served)], today="2026-12-02")
    assert list(merged["summary"].items()) == [
        ("step_mfu", 0.8),
        ("pack8_min_speedup_e", 0.99),  # not re-measured: kept
        ("step4_over_request_throughput_c", 1.01),
        ("small_step_ms_128", 4.0),
    ]
    assert merged["summary_history"] == [
        {
            "merged": "2026-12-02",
            "sources": [
                {"file": "e.json", "measurement": "engine_bench_2026-12-01", "command": "e"},
                {"file": "s.json", "measurement": "served_bench_2026-12-01", "command": "s"},
            ],
            "replaced": {"step_mfu": 0.5, "step4_over_request_throughput_c": 0.996},
        }
    ]
    assert merged["measurements"]["engine_bench"] == {"a_step": 1}  # the earlier record stays as it was
    assert merged["measurements"]["engine_bench_2026-12-01"]["a_step"] == 2
    assert merged["measurements"]["served_bench_2026-12-01"]["runs"] == {}
    assert target["summary"]["step_mfu"] == 0.5  # the target itself is not changed
    again = merge_results(merged, [("e2.json", engine)], today="2026-12-02")
    assert "engine_bench_2026-12-01_2" in again["measurements"] and again["summary_history"][-1]["replaced"] == {}
    with pytest.raises(ValueError, match="ran on 'CPU'"):
        merge_results(target, [("cpu.json", {**engine, "hardware": "CPU"})])


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
    assert settings["h3_vae"] == {"checkpoint_dir": "random:0", "device": "cpu", "decode_workers": 2}
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
    assert report["processes"] == [
        "benchmark",
        "h3_cancel_0_0",
        "h3_dit_0_0",
        "h3_encoder_0_0",
        "h3_vae_0_0",
        "tritonserver",
    ]
    assert settings["encoder"] == "bench" and settings["h3_encoder"]["device"] == "cpu"
    qwen3vl = report["qwen3vl"]
    dims = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    assert {
        k: v
        for k, v in qwen3vl["dims"].items()
        if k in (*dims, "vocab_size", "num_hidden_layers", "max_position_embeddings")
    } == {
        "hidden_size": 384,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "vocab_size": 263,
        "num_hidden_layers": 50,
        "max_position_embeddings": 4096,
    }
    # Qwen3VLDims.parameters' formula on those dims, by hand: 263 x 384 token embedding, and per layer
    # q/k/v/o 384 x 32 x (2 x 4 + 2 x 2) = 147,456, q/k norms 2 x 32, MLP 3 x 384 x 128 = 147,456, norms 2 x 384
    qwen3vl_params = 263 * 384 + 50 * (147_456 + 64 + 147_456 + 768)
    assert qwen3vl_params == 14_888_192
    assert qwen3vl["parameters"] == qwen3vl["parameters_expected"] == qwen3vl_params  # counted on the built model
    assert 0 <= qwen3vl["bytes"] - 2 * qwen3vl_params < 1024  # bf16, + the RoPE buffers
    for tokens in (9, 256):
        times = qwen3vl[f"encode_ms_{tokens}_all"]
        assert len(times) == 3 and min(times) > 0 and qwen3vl[f"encode_ms_{tokens}"] == statistics.median(times)
    load_seconds = summary.pop("load_seconds")  # the server's start to ready, as the script logged it
    assert load_seconds > 0 and f"server ready in {load_seconds:.1f} s" in run.stdout
    a, b = runs["run_a"], runs["run_b"]
    assert summary == {  # copied from the runs and the probe (their values checked above): equal as floats
        "reference_run_b_wall_s": 174.8,
        "gpu_memory_used_gib_loaded": None,
        "run_a_wall_s": a["summary"]["wall_s"],
        "run_a_latency_s": a["summary"]["latency_s"]["mean"],
        "run_a_failed": 0,
        "run_a_seconds_per_step": a["dit_steps"]["seconds_per_step"],
        "run_a_rows_per_step": 192,
        "run_a_stage_seconds": [r["stage_seconds"] for r in a["requests"]],
        "peak_gpu_memory_gib_a": None,
        "peak_gpu_memory_gib_per_process_a": {},
        "gpu_memory_used_gib_dit_server": None,
        "qwen3vl_params": qwen3vl_params,
        "qwen3vl_params_expected": qwen3vl_params,
        "qwen3vl_gib": qwen3vl["bytes"] / 2**30,
        "qwen3vl_encode_ms_9": qwen3vl["encode_ms_9"],
        "qwen3vl_encode_ms_256": qwen3vl["encode_ms_256"],
        "gpu_memory_used_gib_dit_plus_qwen3vl": None,
        "peak_gpu_memory_gib_qwen3vl": None,
        "qwen3vl_error": None,
        "run_b_wall_s": b["summary"]["wall_s"],
        "run_b_latency_s": b["summary"]["latency_s"]["mean"],
        "run_b_failed": 0,
        "run_b_seconds_per_step": b["dit_steps"]["seconds_per_step"],
        "run_b_rows_per_step": b["dit_steps"]["rows_per_step"],
        "run_b_stage_seconds": [r["stage_seconds"] for r in b["requests"]],
        "peak_gpu_memory_gib_b": None,
        "peak_gpu_memory_gib_per_process_b": {},
        "run_b_over_reference_wall": b["summary"]["wall_s"] / 174.8,
        "gpu_memory_used_gib_server_idle_after_b": None,
    }
    assert str(tmp_path) not in json.dumps(report)  # written as $WORK / $OUT
    assert any(line.startswith("run_b ") for line in run.stdout.splitlines())


def test_full_model_bench_serves_qwen3vl_cpu_smoke(tmp_path):
    """--encoder qwen3vl on the CPU (about 25 s, run a only): h3_encoder serves a tiny 50-layer
    Qwen3-VL of the tiny DiT's text width from a folder without weights (encoder_weights random:0),
    beside h3_dit at 32,768 rows and one decode worker; each request's stage seconds are recorded.
    Its stages are a and b: the probe is refused."""
    out, work = tmp_path / "out", tmp_path / "work"
    script = [sys.executable, str(ROOT / "benchmarks" / "full_model_bench.py"), "--out", str(out), "--work", str(work)]
    run = subprocess.run(
        [*script, "--encoder", "qwen3vl", "--stages", "a"], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "full_model_bench.json").read_text())
    settings, summary, runs = report["settings"], report["summary"], report["runs"]
    assert (
        report["command"]
        == "PYTHONUNBUFFERED=1 python3 benchmarks/full_model_bench.py --out DIR --encoder qwen3vl --stages a"
    )
    assert list(runs) == ["warmup", "run_a"] and report["errors"] == {} and "qwen3vl" not in report
    encoder = settings["h3_encoder"]
    assert (encoder["encoder_weights"], encoder["hidden_layer"], encoder["device"]) == ("random:0", 50, "cpu")
    assert encoder["dims"]["hidden_size"] == 384 and encoder["dims"]["num_hidden_layers"] == 50
    assert encoder["text_decoder_parameters"] == 14_888_192  # as the probe's in test_full_model_bench_cpu_smoke
    assert (settings["h3_dit"]["max_batch_rows"], settings["h3_dit"]["row_budget"]) == ("32768", "32768")
    assert settings["h3_vae"] == {"checkpoint_dir": "random:0", "device": "cpu", "decode_workers": 1}
    folder = work / "qwen3vl_tiny"
    assert (folder / "config.json").is_file() and not list(folder.glob("*.safetensors*"))
    served = (work / "model_repository" / "h3_encoder" / "config.pbtxt").read_text()
    assert '{ key: "encoder_weights" value: { string_value: "random:0" } }' in served
    assert f'{{ key: "encoder_path" value: {{ string_value: "{folder}" }} }}' in served
    a = runs["run_a"]
    assert (a["summary"]["completed"], a["summary"]["failed"]) == (1, 0) and settings["rows_per_request"] == 192
    stages = summary["run_a_stage_seconds"]
    assert stages == [r["server_info"]["stage_seconds"] for r in a["requests"]] and len(stages) == 1
    assert sorted(stages[0]) == ["decode", "denoise", "encode", "queue"] and stages[0]["encode"] > 0
    assert "run_a mean stage s: queue " in run.stdout
    refused = subprocess.run([*script, "--encoder", "qwen3vl", "--stages", "qwen3vl"], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].endswith(
        "error: --stages qwen3vl: with --encoder qwen3vl choose from a, b (the Qwen3-VL is served, no probe runs)"
    )


def test_official_layout_bench_cpu_smoke(tmp_path):
    """benchmarks/official_layout_bench.py's CPU path (about a minute): the tiny official-layout
    checkpoint with an 8-layer tiny Qwen3-VL written, read, served through server.launch with
    hidden_layer 8, one 96x64, 22-frame request of 2 steps; the page cache is left alone."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "official_layout_bench.py"), "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "official_layout_bench.json").read_text())
    settings, results = report["settings"], report["results"]
    assert report["hardware"] == "CPU" and report["errors"] == {}
    assert settings["write_command"] == (
        "python3 -m h3_core.weights.official_checkpoint $WORK/checkpoint --config tiny --text-encoder tiny "
        "--text-encoder-layers 8 --device cpu"
    )
    assert settings["launch_command"].startswith(
        "python3 -m server.launch --config tiny --checkpoint $WORK/checkpoint --set h3_vae.trust_remote_code=true "
        "--set h3_encoder.hidden_layer=8 --free-ports"
    )
    checkpoint = tmp_path / "checkpoint"
    text_config = json.loads((checkpoint / "text_encoder" / "config.json").read_text())["text_config"]
    assert (text_config["num_hidden_layers"], text_config["hidden_size"]) == (8, 384)
    write = results["write"]
    files = {name: [p for p in (checkpoint / name).rglob("*") if p.is_file()] for name in write["folders_bytes"]}
    sizes = {  # serving the VAEs' remote code has since written its __pycache__
        name: sum(p.stat().st_size for p in paths if "__pycache__" not in p.parts) for name, paths in files.items()
    }
    assert write["folders_bytes"] == sizes and write["bytes"] == sum(sizes.values())
    assert results["page_cache"]["dropped"] is False
    load = results["load"]
    for name in ("transformer", "text_encoder"):
        files = sorted((checkpoint / name).glob("*.safetensors"))
        assert load[name]["files"] == len(files) and load[name]["bytes"] == sum(f.stat().st_size for f in files)
        assert load[name]["bytes_per_s"] == pytest.approx(load[name]["bytes"] / load[name]["seconds"], rel=1e-12)
    full = results["full_model_load"]
    assert full["extrapolated"] is True
    assert (full["dit_bytes"], full["qwen3vl_text_decoder_50_layers_bytes"]) == (66_280_430_080, 2 * 25_157_829_120)
    assert full["total_seconds"] == pytest.approx(
        full["dit_bytes"] / load["transformer"]["bytes_per_s"]
        + full["qwen3vl_text_decoder_50_layers_bytes"] / load["text_encoder"]["bytes_per_s"],
        rel=1e-12,
    )
    serve = results["serve"]
    assert 0 < serve["launch_to_ready_s"] < serve["launch_to_stop_s"] and serve["success"] is True
    info = serve["server_info"]
    assert (info["height"], info["width"], info["num_frames"], info["num_inference_steps"]) == (64, 96, 22, 2)
    assert serve["stage_seconds"] == info["stage_seconds"] and sorted(info["stage_seconds"]) == [
        "decode",
        "denoise",
        "encode",
        "queue",
    ]
    assert str(tmp_path) not in json.dumps(report)
    assert run.stdout.splitlines()[-1].startswith("request   success True")


def test_clip768_bench_cpu_smoke(tmp_path):
    """benchmarks/clip768_bench.py's CPU path, every stage (about 30-50 s): the tiny DiT at 96 x 64
    px, 22 frames; the profile (bf16, fp8 quantised while loading, fp8 with host AdaLN weights and
    one admission fill of a 49-forward schedule), the AdaLN trajectories of 8
    requests (8 steps: full packs from step 7) with the table bitwise equal to none, our VAEs'
    decode, and the served clip beside a tiny Qwen3-VL with the clip's canvas limits."""
    out, work = tmp_path / "out", tmp_path / "work"
    script = [sys.executable, str(ROOT / "benchmarks" / "clip768_bench.py"), "--out", str(out), "--work", str(work)]
    flags = ["--stages", "profile", "adaln", "decode", "served", "--adaln-steps", "8", "--clips", "1"]
    flags += ["--warmup-steps", "1"]
    run = subprocess.run([*script, *flags], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "clip768_bench.json").read_text())
    summary = report["summary"]
    assert report["errors"] == {} and report["hardware"] == "CPU"
    command = "PYTHONUNBUFFERED=1 python3 benchmarks/clip768_bench.py --out DIR --work WORK"
    assert report["command"] == " ".join([command, *flags])
    for name in ("bf16", "fp8"):
        profile = report["profile"][name]
        assert profile["rows"] == summary[f"step768_{name}_rows"] == 192
        assert report["loads"][name]["load_peak_gib"] is None is summary[f"{name}_load_peak_gib"]
        assert set(profile["kernels"]) <= {"attention", "gemm", "norm", "elementwise/copy"} and profile["kernels"]
        assert len(profile["step_s"]["runs"]) == 2
    # fp8 with host AdaLN weights: one pass fills the 49-forward schedule's 97 values (t = 0 once, 48
    # video and 48 audio values), bitwise the device-resident fp8 DiT's; no GPU memory figures on the CPU
    host = report["adaln_host"]
    assert (host["schedule_values"], host["filled"], host["passes"], host["bitwise"]) == (97, 97, 1, True)
    assert host["host_weight_gib"] == 715_008 / 2**30  # (18 x 2 + 2) x 96 x (48 + 1) float32
    assert summary["adaln_host_fill_49_s"] == host["fill_s"] > 0 and summary["adaln_host_bitwise"] is True
    assert summary["fp8_dit_gpu_gib_adaln_off"] is None is summary["fp8_dit_gpu_gib"]
    assert summary["fp8_adaln_off_fits_h100"] is None and "fp8_adaln_off_h100_need_gib" not in summary
    runs = report["adaln"]["runs"]
    assert set(runs) == {"mixed_table", "single_table", "mixed_no_table", "single_no_table"}
    mixed, single = runs["mixed_table"], runs["single_table"]
    assert mixed["requests"] == [1, 2, 3, 4, 5, 6, 7, 8, 7, 6, 5, 4, 3, 2, 1] and single["requests"] == [8] * 8
    # a cold table: the first step's 1.0 (video and audio), then each newly admitted request's
    # video and audio values; a single pack fills the same 15 values
    assert mixed["fills"] == [1] + [2] * 7 + [0] * 7 and single["fills"] == [1] + [2] * 7
    assert runs["mixed_no_table"]["fills"] == [0] * 15 and mixed["captures"] == 0
    assert summary["adaln_table_bitwise"] is True and summary["adaln_fills_per_step_mixed"] == 1.0
    assert summary["adaln_mixed_over_single_8x128"] == pytest.approx(
        mixed["mean_full_step_s"] / single["mean_full_step_s"], rel=1e-12
    )
    assert report["decode"]["frames"] == [22, 64, 96, 3] and summary["decode768_5s_peak_gib"] is None
    assert summary["decode768_5s_s"] == report["decode"]["seconds"]["median"] > 0
    served = report["served"]
    assert list(served["runs"]) == ["cold", "clip_0"] and served["settings"]["max_batch_rows"] == "4096"
    assert (served["settings"]["max_height"], served["settings"]["max_width"]) == ("64", "96")
    info = served["runs"]["clip_0"]["requests"][0]["server_info"]
    assert (info["height"], info["width"], info["num_frames"], info["num_inference_steps"]) == (64, 96, 22, 2)
    assert summary["clip768_5s_bf16_clips"] == 1 and summary["clip768_5s_bf16_rows"] == 192
    assert summary["clip768_5s_bf16_s"] == served["runs"]["clip_0"]["summary"]["wall_s"]
    assert summary["clip768_5s_bf16_denoise_s"] == info["stage_seconds"]["denoise"]
    assert summary["clip768_5s_bf16_cold_s"] == served["runs"]["cold"]["summary"]["wall_s"]
    assert [row["gpu_s_per_clip"] for row in report["published"]] == [297.5, 317.4, 342.0, 594.7]
