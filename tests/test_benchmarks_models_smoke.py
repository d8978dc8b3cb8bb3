"""CPU smoke runs of the model benchmarks (full_model_bench, with MiniLM and with Qwen3-VL;
official_layout_bench; clip768_bench). No timing checks; every number the scripts report is
checked against a value derived here (tests/test_benchmarks_smoke.py's check_summary)."""

import json
import statistics
import subprocess
import sys

import pytest

from .serving import ROOT
from .test_benchmarks_smoke import check_summary


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
