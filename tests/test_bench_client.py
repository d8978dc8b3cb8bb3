"""benchmarks/bench_client.py and bench_report.py: pure functions on hand-made records (golden
strings and numbers) and a CPU smoke run against the session tritonserver (reports well formed;
no timing assertions)."""

import json
import math
import os
import random
import re
import subprocess
import sys

import pytest
from PIL import Image

from server.environment import pick_free_ports

from .serving import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_client  # noqa: E402 - after the sys.path set-up above
from bench_client import PROMPT_TEMPLATE, GpuMemorySampler, arrival_offsets, main  # noqa: E402 - after the sys.path set-up above
from bench_report import (  # noqa: E402 - after the sys.path set-up above
    BANNER_WIDTH,
    TIMELINE_WIDTH,
    RequestRecord,
    format_report,
    peak_outstanding,
    render_timeline,
    step_interval,
    summarize,
)

STAGES = {"queue", "encode", "denoise", "decode"}


def records():
    """r0 waits 2 s then computes 8 (16 steps, last at 9.5: 0.5 s apart); r1 waits 9 then
    computes 10 (10 steps, last at 19: 1 s apart); r2 is refused after 1 s; r3 succeeded without
    a progress response (no first step, so no step interval)."""
    return [
        RequestRecord(
            0,
            submit_s=0.0,
            first_step_s=2.0,
            last_step_s=9.5,
            complete_s=10.0,
            success=True,
            largest_pack=1,
            stage_seconds=dict(queue=0.5, encode=0.25, denoise=7.0, decode=1.0),
            server_info={"num_inference_steps": 16},
        ),
        RequestRecord(
            1,
            submit_s=1.0,
            first_step_s=10.0,
            last_step_s=19.0,
            complete_s=20.0,
            success=True,
            largest_pack=3,
            stage_seconds=dict(queue=8.5, encode=0.25, denoise=9.0, decode=1.0),
            server_info={"num_inference_steps": 10},
        ),
        RequestRecord(2, submit_s=5.0, complete_s=6.0, error_code="UNAVAILABLE", error="queue full"),
        RequestRecord(
            3,
            submit_s=12.0,
            complete_s=24.0,
            success=True,
            largest_pack=2,
            stage_seconds=dict(queue=0.0, encode=0.25, denoise=10.0, decode=1.0),
            server_info={"num_inference_steps": 12},
        ),
    ]


# ---- pure functions -----------------------------------------------------------------------------


def test_peak_outstanding_counts_half_open_intervals():
    def rec(i, s, c):
        return RequestRecord(i, submit_s=s, complete_s=c, success=True)

    assert peak_outstanding(records()) == 3  # at t=5: r0, r1, r2
    assert peak_outstanding([rec(0, 0.0, 2.0), rec(1, 2.0, 4.0), rec(2, 4.0, 6.0)]) == 1  # back to back
    assert peak_outstanding([rec(0, 0.0, 5.0), rec(1, 1.0, 2.0), rec(2, 1.5, 3.0), rec(3, 2.0, 4.0)]) == 3
    assert peak_outstanding([rec(0, 0.0, None), rec(1, 9.0, 10.0)]) == 2  # never completed: still out
    assert peak_outstanding([]) == 0


def test_timeline_golden_one_column_per_second():
    assert render_timeline(records(), 24.0, width=24) == [
        "    0s        10s       20s",
        "r0 |--========              |",
        "r1 | ---------==========    |",
        "r2 |     -                  | FAILED UNAVAILABLE",
        "r3 |            ============|",
    ]


def test_timeline_golden_default_width():
    lines = render_timeline(records(), 24.0)
    assert lines == [
        "    0s             5s             10s            15s            20s",
        "r0 |------========================                                          |",
        "r1 |   ---------------------------==============================            |",
        "r2 |               ---                                                      | FAILED UNAVAILABLE",
        "r3 |                                    ====================================|",
    ]
    assert all(len(line.split("|")[1]) == TIMELINE_WIDTH for line in lines[1:])


def test_timeline_short_request_gets_a_column_and_sub_second_ticks():
    short = [
        RequestRecord(0, submit_s=0.0, first_step_s=0.01, complete_s=0.02, success=True),
        RequestRecord(10, submit_s=0.0, first_step_s=0.32, complete_s=0.4, success=True),
    ]
    assert render_timeline(short, 0.4, width=8) == [
        "     0s",
        "r0  |=       |",  # computing wins a column it shares with waiting
        "r10 |------==|",
    ]
    assert render_timeline(short, 0.4, width=16)[0] == "     0s      0.2s"


def test_summarize_golden():
    # successful latencies 10 (r0), 19 (r1), 12 (r3); times to first step 2 (r0), 9 (r1); the
    # percentiles are nearest ranks: p50 the 2nd smallest of 3 (of 2: the 1st), p95 the 3rd.
    assert summarize(records()) == {
        "num_requests": 4,
        "completed": 3,
        "failed": 1,
        "error_codes": {"UNAVAILABLE": 1},
        "wall_s": 24.0,
        "throughput_req_per_min": 7.5,
        "latency_s": {"mean": 41.0 / 3, "p50": 12.0, "p95": 19.0, "max": 19.0},
        "time_to_first_step_s": {"mean": 5.5, "p50": 2.0, "max": 9.0},
        "step_interval_s": {"mean": 0.75, "p50": 0.5},  # r0 (9.5 - 2) / 15, r1 (19 - 10) / 9; r3 none
        "peak_outstanding": 3,
        "peak_pack_size": 3,
        "peak_gpu_memory_mb": None,
        "peak_gpu_memory_source": None,
        "stage_seconds_mean": {"queue": 3.0, "encode": 0.25, "denoise": 26.0 / 3, "decode": 1.0},
    }
    # GPU memory: the server's INFO wins over the metrics endpoint; neither -> None ("n/a").
    assert summarize(records(), 1234.5)["peak_gpu_memory_mb"] == 1234.5
    with_info = records()
    with_info[0].peak_memory_mb = 900.0
    assert summarize(with_info, 1234.5)["peak_gpu_memory_source"] == "INFO peak_memory_mb"
    # A failed request's step interval does not count; no interval at all -> None.
    failed_r1 = records()
    failed_r1[1].success = False
    assert summarize(failed_r1)["step_interval_s"] == {"mean": 0.5, "p50": 0.5}
    assert summarize(records()[2:])["step_interval_s"] == {"mean": None, "p50": None}


def test_step_interval_golden():
    def rec(first, last, info):
        return RequestRecord(
            0, submit_s=0.0, first_step_s=first, last_step_s=last, complete_s=9.0, success=True, server_info=info
        )

    assert step_interval(rec(1.0, 4.0, {"num_inference_steps": 4})) == 1.0
    assert step_interval(rec(0.5, 2.0, {"num_inference_steps": 7})) == 0.25
    assert step_interval(rec(1.0, 1.75, {"num_inference_steps": 2})) == 0.75
    assert step_interval(rec(None, 4.0, {"num_inference_steps": 4})) is None  # no first step
    assert step_interval(rec(1.0, None, {"num_inference_steps": 4})) is None  # no last step
    assert step_interval(rec(1.0, 1.0, {"num_inference_steps": 1})) is None  # one step: no interval
    assert step_interval(rec(1.0, 4.0, {"num_inference_steps": 0})) is None
    assert step_interval(rec(1.0, 4.0, {})) is None  # INFO without num_inference_steps
    assert step_interval(rec(1.0, 4.0, None)) is None  # no server INFO (failed request)


def test_report_golden_lines():
    summary = summarize(records())
    config = dict(
        label="golden",
        url="h:1",
        height=64,
        width=96,
        num_frames=9,
        steps=2,
        max_concurrency=2,
        request_rate=math.inf,
        arrival_interval=None,
        warmup_requests=0,
        seed=0,
    )
    text = format_report(summary, config, render_timeline(records(), summary["wall_s"]))
    lines = text.splitlines()
    assert lines[0] == "================= Serving Benchmark Result ================="
    assert len(lines[0]) == BANNER_WIDTH
    for line in [
        "Request shape (HxW, frames, steps):     64x96, 9, 2",
        "Arrivals:                               all at t=0 (rate inf)",
        "Benchmark duration (s):                 24.000",
        "Completed requests:                     3/4",
        "Failed requests:                        1 (UNAVAILABLE x1)",
        "Request throughput (req/min):           7.50",
        "Mean latency (s):                       13.667",
        "P50 latency (s):                        12.000",
        "P95 latency (s):                        19.000",
        "Max latency (s):                        19.000",
        "Mean time to first step (s):            5.500",
        "P50 time to first step (s):             2.000",
        "Max time to first step (s):             9.000",
        "Mean step interval (s):                 0.750",
        "Peak outstanding requests (client):     3",
        "Peak pack size (largest_pack):          3",
        "Peak GPU memory (MB):                   n/a",
        "denoise:                                8.667",
        "=" * BANNER_WIDTH,
        "r2 |               ---                                                      | FAILED UNAVAILABLE",
    ]:
        assert line in lines
    assert all(len(line) == BANNER_WIDTH for line in lines if line.startswith("---"))
    assert not any("queue delay" in line for line in lines)  # time to first step, under one name
    interval = dict(config, arrival_interval=5.0, max_concurrency=0)
    text = format_report(summary, interval, [])
    assert "Arrivals:                               every 5 s" in text
    assert "Max concurrency:                        unlimited" in text


def test_arrivals_fixed_poisson_and_all_at_once():
    assert arrival_offsets(3, arrival_interval=2.5) == [0.0, 2.5, 5.0]
    assert arrival_offsets(3) == [0.0, 0.0, 0.0]
    rng, expected, t = random.Random(7), [], 0.0
    for _ in range(5):
        expected.append(t)
        t += rng.expovariate(0.5)
    assert arrival_offsets(5, request_rate=0.5, seed=7) == expected
    assert arrival_offsets(5, request_rate=0.5, seed=8) != expected


def test_gpu_memory_sampler_keeps_the_largest_gpu_in_mb(monkeypatch):
    pages = iter(
        [
            "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes\n"
            "# TYPE nv_gpu_memory_used_bytes gauge\n"
            'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1234567890\n'
            'nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 1.5e+09\n'
            'nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 150000000000\n',
            None,  # the endpoint did not answer
            'h3_active_requests{model="h3_dit"} 0\n',  # a server without GPU metrics
            'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1000000\n',
        ]
    )
    monkeypatch.setattr(bench_client, "read_metrics", lambda url: next(pages))
    sampler = GpuMemorySampler("http://h:1/metrics")
    assert sampler.peak_mb is None
    peaks = []
    for _ in range(4):
        sampler.sample()
        peaks.append(sampler.peak_mb)
    assert peaks == [1500.0, 1500.0, 1500.0, 1500.0]
    monkeypatch.setattr(bench_client, "read_metrics", lambda url: 'h3_active_requests{model="h3_dit"} 0\n')
    without_gpu = GpuMemorySampler("http://h:1/metrics")
    without_gpu.sample()
    assert without_gpu.peak_mb is None


# ---- CPU smoke runs against the session server ------------------------------------------------

TIMELINE_LINE = re.compile(rf"^r(\d+) +\|[-= ]{{{TIMELINE_WIDTH}}}\|")


def test_cli_smoke_run_writes_json_png_and_report(server, tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = [
        "--num-prompts",
        "4",
        "--max-concurrency",
        "2",
        "--steps",
        "2",
        "--num-frames",
        "9",
        "--height",
        "64",
        "--width",
        "96",
        "--warmup-requests",
        "1",
        "--warmup-steps",
        "1",
        "--no-mp4",
        "--seed",
        "5",
        "--label",
        "smoke",
        "--output-json",
        str(out_json),
        "--output-png",
        str(out_png),
    ]
    env = dict(os.environ, H3_GRPC_URL=server.grpc_url, H3_METRICS_URL=server.metrics_url)  # --url's default
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_client.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert done.stderr.startswith("warm-up: 1 request(s), not measured\n")
    assert re.search(r"requests: 100%\|[^|]+\| 4/4 ", done.stderr)  # the progress bar, at its end

    document = json.loads(out_json.read_text())
    assert set(document) == {"label", "date", "command", "config", "summary", "timeline", "requests"}
    assert document["label"] == "smoke"
    assert document["command"] == " ".join([sys.executable, "benchmarks/bench_client.py", *argv])
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", document["date"])
    assert document["config"]["url"] == server.grpc_url and document["config"]["request_rate"] is None
    assert document["config"]["no_mp4"] is True and document["config"]["warmup_steps"] == 1
    summary = document["summary"]
    assert (summary["num_requests"], summary["completed"], summary["failed"]) == (4, 4, 0)
    assert set(summary) >= {
        "wall_s",
        "throughput_req_per_min",
        "latency_s",
        "time_to_first_step_s",
        "step_interval_s",
        "peak_outstanding",
        "peak_pack_size",
        "peak_gpu_memory_mb",
        "stage_seconds_mean",
    }
    assert set(summary["latency_s"]) == {"mean", "p50", "p95", "max"}
    assert set(summary["step_interval_s"]) == {"mean", "p50"}
    assert set(summary["stage_seconds_mean"]) == STAGES
    assert all(v is not None for v in summary["stage_seconds_mean"].values())
    assert 1 <= summary["peak_outstanding"] <= 2 and 1 <= summary["peak_pack_size"] <= 2
    requests = document["requests"]
    assert [r["index"] for r in requests] == [0, 1, 2, 3]
    assert [r["prompt"] for r in requests] == [PROMPT_TEMPLATE.format(i=i) for i in range(4)]
    for r in requests:
        assert r["success"] and r["error_code"] is None
        assert r["submit_s"] <= r["first_step_s"] <= r["last_step_s"] <= r["complete_s"]
        assert set(r["stage_seconds"]) == STAGES and r["largest_pack"] in (1, 2)
        assert r["server_info"]["seed"] == 5 + r["index"] and r["server_info"]["num_inference_steps"] == 2
    # 2 steps: a request's step interval is its last step - its first step.
    intervals = [r["last_step_s"] - r["first_step_s"] for r in requests]
    assert summary["step_interval_s"]["mean"] == pytest.approx(sum(intervals) / 4, abs=1e-12)
    assert document["timeline"][1:] == [line for line in report.splitlines() if TIMELINE_LINE.match(line)]

    with Image.open(out_png) as image:
        assert image.format == "PNG" and image.size[0] > 0 and image.size[1] > 0
        image.load()

    assert "================= Serving Benchmark Result =================" in report
    assert "Completed requests:                     4/4" in report
    assert re.search(r"^Mean step interval \(s\): +\d+\.\d{3}$", report, re.M)
    assert re.search(r"^Peak GPU memory \(MB\): +(n/a|\d+\.\d)", report, re.M)
    timeline = [line for line in report.splitlines() if TIMELINE_LINE.match(line)]
    assert [int(TIMELINE_LINE.match(line).group(1)) for line in timeline] == [0, 1, 2, 3]
    assert all("=" in line for line in timeline)


def test_failed_requests_are_recorded_with_their_code(server, capsys):
    # HEIGHT 33 is not a multiple of 32: every request is refused at once with INVALID_ARG.
    code = main(
        [
            "--url",
            server.grpc_url,
            "--num-prompts",
            "2",
            "--max-concurrency",
            "0",
            "--height",
            "33",
            "--steps",
            "2",
            "--warmup-requests",
            "0",
            "--arrival-interval",
            "0",
        ]
    )
    captured = capsys.readouterr()
    report = captured.out
    assert code == 1
    assert re.search(r"requests: 100%\|[^|]+\| 2/2 .*failed=2\]", captured.err)
    assert "Completed requests:                     0/2" in report
    assert "Failed requests:                        2 (INVALID_ARG x2)" in report
    assert "Mean latency (s):                       n/a" in report
    assert "Mean step interval (s):                 n/a" in report
    assert len([line for line in report.splitlines() if line.endswith("| FAILED INVALID_ARG")]) == 2
    assert "Request shape (HxW, frames, steps):     33xdefault, default, 2" in report  # what was sent


def test_failed_warmup_stops_before_the_measured_phase(server, capsys):
    code = main(["--url", server.grpc_url, "--num-prompts", "2", "--height", "33", "--warmup-requests", "1"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err == (
        "warm-up: 1 request(s), not measured\n"
        "warm-up request 0 failed: INVALID_ARG: height=33 is out of range: allowed multiples of "
        "32 in 32..256; no measured requests were sent\n"
    )


def test_no_server_sends_nothing_and_shows_no_progress_bar(capsys):
    (port,) = pick_free_ports(1)
    assert main(["--url", f"127.0.0.1:{port}", "--num-prompts", "2", "--warmup-requests", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"cannot reach Triton at 127.0.0.1:{port}: failed to connect to all addresses; last error: UNKNOWN: "
        f"ipv4:127.0.0.1:{port}: Failed to connect to remote host: Connection refused; start the server first "
        "(python -m server.launch) or give its gRPC address with --url\n"
    )


@pytest.mark.parametrize("flags", [["--warmup-steps", "0"], ["--timeout", "-5"]])
def test_bad_warmup_steps_and_timeout_are_flag_errors(flags, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--num-prompts", "1", *flags])
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python benchmarks/bench_client.py: error: --warmup-steps must be >= 1 and --timeout > 0"
    )


def test_a_mixed_workload_draws_the_same_shapes_for_the_same_seed():
    mix = bench_client.parse_mix("0.4:64x96x22:20,0.3:384x672x22:20,0.3:384x672x209:30")
    assert mix == [(0.4, 64, 96, 22, 20), (0.3, 384, 672, 22, 20), (0.3, 384, 672, 209, 30)]
    args = type("Args", (), dict(height=None, width=None, num_frames=None, steps=None, mix=mix, seed=0, no_mp4=True))
    drawn = [bench_client._generate_kwargs(args, i, None) for i in range(6)]
    assert [(d["height"], d["num_frames"], d["num_inference_steps"], d["seed"]) for d in drawn] == [
        (64, 22, 20, 0),
        (64, 22, 20, 1),
        (384, 22, 20, 2),
        (64, 22, 20, 3),
        (64, 22, 20, 4),
        (64, 22, 20, 5),
    ]
    assert bench_client._generate_kwargs(args, 0, 2)["num_inference_steps"] == 2  # a warm-up keeps its steps
    with pytest.raises(ValueError, match=r"^--mix entry '1:64x96:3' is not WEIGHT:HxWxF:STEPS"):
        bench_client.parse_mix("1:64x96:3")
