"""benchmarks/client_runs.py: the one builder of bench_client.py command lines that the served
benchmarks share, and the /metrics totals read around a run."""

import sys

from .serving import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import client_runs  # noqa: E402 - after the sys.path set-up above


def test_a_command_has_every_flag_given_in_one_order_and_the_extra_flags_last(tmp_path):
    command = client_runs.bench_client_command(
        "127.0.0.1:8001",
        metrics_url="http://127.0.0.1:8002/metrics",
        shape=(64, 96, 22),
        steps=3,
        num_prompts=2,
        max_concurrency=0,
        warmup_requests=1,
        warmup_steps=2,
        label="c_step_1_slot",
        output_json=tmp_path / "bench.json",
        output_png=tmp_path / "timeline.png",
        extra=["--arrival-interval", "0.3"],
    )
    assert command == [
        sys.executable,
        "benchmarks/bench_client.py",
        *("--url", "127.0.0.1:8001", "--metrics-url", "http://127.0.0.1:8002/metrics"),
        *("--height", "64", "--width", "96", "--num-frames", "22", "--steps", "3"),
        *("--num-prompts", "2", "--max-concurrency", "0", "--warmup-requests", "1", "--warmup-steps", "2"),
        "--no-mp4",
        *("--label", "c_step_1_slot", "--output-json", str(tmp_path / "bench.json")),
        *("--output-png", str(tmp_path / "timeline.png"), "--arrival-interval", "0.3"),
    ]


def test_a_flag_not_given_is_left_to_bench_client_and_mp4_drops_no_mp4():
    """url None: bench_client.py reads H3_GRPC_URL; no warm-up request unless asked for."""
    assert client_runs.bench_client_command(None, mp4=True) == [
        sys.executable,
        "benchmarks/bench_client.py",
        "--warmup-requests",
        "0",
    ]
    assert (ROOT / client_runs.BENCH_CLIENT).is_file()


PAGE = """\
h3_step_seconds_sum{model="h3_dit",instance="0"} 1.5
h3_step_seconds_sum{model="h3_dit",instance="1"} 0.5
h3_step_seconds_count{model="h3_dit",instance="0"} 3
h3_pack_rows_sum{model="h3_dit",instance="0"} 384
h3_pack_rows_count{model="h3_dit",instance="0"} 3
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="h3_vae",version="1"} 7
nv_inference_exec_count{model="h3_dit",version="1"} 3
"""


def test_dit_totals_sum_each_series_and_per_model_adds_tritons_counters(monkeypatch):
    monkeypatch.setattr(client_runs, "read_metrics", lambda url: PAGE)
    totals = {
        "h3_step_seconds_sum": 2.0,
        "h3_step_seconds_count": 3.0,
        "h3_pack_rows_sum": 384.0,
        "h3_pack_rows_count": 3.0,
    }
    assert client_runs.dit_totals("http://unused/metrics") == totals
    per_model = client_runs.dit_totals("http://unused/metrics", per_model=True)
    assert len(per_model) == 4 + len(client_runs.SERVED_MODELS) * len(client_runs.TRITON_TOTALS)
    assert per_model["h3_vae.nv_inference_exec_count"] == 7.0
    assert per_model["h3_dit.nv_inference_exec_count"] == 3.0
    assert per_model["h3_encoder.nv_inference_exec_count"] == 0.0
    monkeypatch.setattr(client_runs, "read_metrics", lambda url: None)  # nothing answers
    assert client_runs.dit_totals("http://unused/metrics") == dict.fromkeys(totals, 0.0)
