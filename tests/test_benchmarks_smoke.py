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
