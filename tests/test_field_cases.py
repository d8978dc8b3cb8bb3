"""The field bug cases of docs/failure_classes.md against our system, end to end.

Elsewhere: C8's "a step slower than Triton's 1 s default is not aborted" in test_faults.py;
C18 (packed = solo, bitwise) in test_engine.py, test_model.py and test_serving.py; C12 in
test_layout.py; C13 on small packs for every CPU backend in test_attention_backends.py.
"""

import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from client.api import H3Client, H3Error
from h3_core.model.attention import Documents, get_attention_backend
from h3_core.serving.shared.settings import MIN_EXECUTE_STEPS
from server.process import TritonServer, dit_stubs, metric_samples, stub_pids
from server.repository import plan, write_repository

from .serving import ROOT, idle_metrics, model_repository_copy, raw_stream
from .serving import generate_in_thread as start
from .test_bad_input import SEQUENCE_END, dit_inputs, int64, prompt

LARGEST = dict(height=256, width=256, num_frames=121, num_inference_steps=2, return_frames=True, return_audio=True)


def metrics_text(metrics_url: str) -> str:
    return urllib.request.urlopen(metrics_url, timeout=10).read().decode()


def sample(text: str, name: str, **labels) -> float:
    """The value of the first sample of `name` whose labels include `labels`."""
    return metric_samples(text, name, **labels)[0].value


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_field_case_c1_start_and_end_on_one_request_is_refused_at_once(server):
    log_before = len(server.log_text())
    _, direct = raw_stream(
        server.grpc_url,
        dit_inputs(fields=b'{"num_inference_steps": 3}'),
        model="h3_dit",
        sequence_id=9_300_001,
        sequence_start=True,
        sequence_end=True,
        timeout_s=30,
    )
    _, ensemble = raw_stream(
        server.grpc_url,
        [prompt(), int64("NUM_INFERENCE_STEPS", 3)],
        sequence_id=9_300_002,
        sequence_start=True,
        sequence_end=True,
        timeout_s=30,
    )
    for error in (direct, ensemble):
        assert error.code == "INVALID_ARG" and error.message == SEQUENCE_END
    # the hang's signature; Triton still logs "sequence_utils.cc:54] Invalid argument: ... must
    # specify the START flag" once per refused request while it releases the sequence
    assert "Failed to release request" not in server.log_text()[log_before:]


def test_field_case_c1_perf_analyzer_without_the_end_override_stops_at_once(server, tmp_path):
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"PROMPT": ["a red ball"], "NUM_INFERENCE_STEPS": [2]}]}))
    run = subprocess.run(
        [
            str(ROOT / "scripts" / "perf_analyzer.sh"),
            "-m",
            "h3_pipeline",
            "-i",
            "grpc",
            "-u",
            server.grpc_url,
            "--streaming",
            "--input-data",
            str(data),
            "--sequence-id-range",
            "100000:200000",
            "--concurrency-range",
            "2",
            "--request-count",
            "4",
        ],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
    )
    assert run.returncode == 99, run.stdout + run.stderr
    assert f"Thread [0] had error: in ensemble 'h3_pipeline', INVALID_ARG: {SEQUENCE_END}" in run.stderr


def test_field_case_c3_cancel_stops_the_request_wherever_it_is(server, client):
    decodes = sample(metrics_text(server.metrics_url), "h3_vae_decodes_total")
    # (a) cancelled before it reaches the DiT (while in the encoder or on its way)
    assert client.cancel("c3-early") == "unknown"
    with pytest.raises(H3Error) as info:
        client.generate("early", num_inference_steps=3, request_id="c3-early")
    assert info.value.code == "CANCELLED"
    assert info.value.message == "request c3-early was cancelled before it started (step 0 of 3)"
    # (b) mid-denoise, packed with a neighbour that runs on
    outcome = {}
    threads = [
        start(client, outcome, key, prompt=key, num_inference_steps=400, request_id=f"c3-{key}")
        for key in ("victim", "neighbour")
    ]
    assert wait_until(lambda: server.h3_metrics()["h3_active_requests"] == 2, 60)
    assert client.cancel("c3-victim") == "cancelled"
    threads[0].join(60)
    assert outcome["victim"].code == "CANCELLED"
    assert outcome["victim"].message.startswith("request c3-victim cancelled by request at step ")
    assert wait_until(lambda: server.h3_metrics()["h3_active_requests"] == 1, 10)  # the neighbour alone
    assert "neighbour" not in outcome  # still running
    assert client.cancel("c3-neighbour") == "cancelled"
    threads[1].join(60)
    metrics = idle_metrics(server)
    assert metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0  # no state left
    assert (
        sample(metrics_text(server.metrics_url), "h3_vae_decodes_total") == decodes
    )  # h3_vae only passed the endings on


def test_field_case_c4_soak():
    """scripts/soak.py at a size for make test (64 requests, 8 at a time; the standalone soak runs
    longer): one final response each, outputs byte-identical to their references, no state left."""
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    soak = sys.modules["soak"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(soak)
    summary = soak.run(soak.parser().parse_args(["--requests", "64", "--warmup", "14", "--concurrency", "8"]))
    assert summary["final_responses_per_request"] == {1: 64}
    assert summary["outputs_not_identical"] == [] and summary["cancelled_with_results"] == []
    assert summary["completed_without_all_outputs"] == [] and set(summary["errors"]) <= {"CANCELLED"}
    assert summary["outputs_compared"] > 32 and summary["errors"]["CANCELLED"] > 5
    assert summary["dit_rss_kb"]["growth"] < 0.05
    assert summary["left_at_end"] == {"h3_active_requests": 0, "h3_waiting_requests": 0, "pending": 0}
    assert summary["in_flight_at_stop"] == 0
    assert summary["passed"]


class ShmServer(TritonServer):
    """tritonserver in its own mount namespace with a /dev/shm of `shm_size` (like docker --shm-size)."""

    def __init__(self, *args, shm_size: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.shm_size = shm_size

    def command(self) -> list[str]:
        mount = f'mount -t tmpfs -o size={self.shm_size} tmpfs /dev/shm && exec "$0" "$@"'
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", mount] + super().command()


@pytest.mark.skipif(
    subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0,
    reason="needs unshare -m (a private /dev/shm)",
)
def test_field_case_c5_shared_memory_sizing(tmp_path):
    repo = model_repository_copy(tmp_path / "repo")
    with ShmServer(repo, free_ports=True, shm_size="64m") as server:  # size: docs/operations.md §"Reliability"
        client, outcome = H3Client(server.grpc_url, idle_timeout_s=300), {}
        for thread in [start(client, outcome, i, prompt=f"largest {i}", seed=i, **LARGEST) for i in range(4)]:
            thread.join(300)
        assert [outcome[i][0].frames.shape for i in range(4)] == [(124, 256, 256, 3)] * 4  # 121 asked: 124 served
    with ShmServer(repo, free_ports=True, shm_size="16m") as server:  # undersized
        client = H3Client(server.grpc_url, idle_timeout_s=300)
        with pytest.raises(H3Error) as info:
            client.generate("largest", **LARGEST)
        assert info.value.code == "UNAVAILABLE"
        assert re.match(
            r"the result of request h3c-[0-9a-f]{32} could not be sent: Failed to increase the shared memory "
            r"pool size for key '[^']+' to \d+ bytes",
            info.value.message,
        )
        assert client.generate("a normal one", num_inference_steps=2)[0].info["num_frames"] == 22


def launcher_urls(log_path, count: int = 1, timeout_s: float = 120) -> dict:
    """Wait until the launcher has logged `count` ready lines; its URLs and server pid."""
    assert wait_until(lambda: len(re.findall(r"ready (in|again)", log_path.read_text())) >= count, timeout_s), (
        log_path.read_text()
    )
    text = log_path.read_text()
    ready = re.search(r"\(pid (\d+)\): grpc=(\S+) http=\S+ metrics=(\S+)", text)
    pids = re.findall(r"\(pid (\d+)\)", text)
    return {"pid": int(pids[-1]), "grpc": ready.group(2), "metrics": ready.group(3)}


def test_field_case_c6_a_dead_or_stalled_dit_is_visible_and_the_launcher_restarts_it(tmp_path):
    repo = model_repository_copy(tmp_path / "repo", allow_fault_injection="true", max_steps="400")
    log = tmp_path / "launcher.log"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.launch",
            "--model-repository",
            str(repo),
            "--free-ports",
            "--quiet",
            "--supervise",
            "--stale-after",
            "3",
        ],
        cwd=ROOT,
        stderr=log.open("w"),
    )
    try:
        urls = launcher_urls(log)
        client, outcome = H3Client(urls["grpc"], idle_timeout_s=60), {}
        # 1. the DiT process dies (SIGKILL) with a request in flight
        pending = start(client, outcome, "killed", prompt="in flight", num_inference_steps=400)
        assert wait_until(lambda: sample(metrics_text(urls["metrics"]), "h3_active_requests") == 1, 60)
        (dit,) = dit_stubs(stub_pids(urls["pid"]))
        os.kill(dit, signal.SIGKILL)
        pending.join(60)
        assert outcome["killed"].code == "UNAVAILABLE"  # from Triton (~3 s) or, if first, the restart
        assert outcome["killed"].message in (
            "Stub process 'h3_dit_0_0' is not healthy.",
            "Stream removed (Socket closed)",
        )
        urls = launcher_urls(log, count=2)
        # the launcher sees the stub gone, or tritonserver aborting first (Triton 2.51 sometimes
        # aborts, SIGABRT, when a stub dies mid-response; seen once under load, 2026-12-01)
        assert re.search(
            rf"(the h3_dit process \(pid {dit}\) is gone|tritonserver exited with code -6): restarting tritonserver",
            log.read_text(),
        )
        assert client.generate("after the restart", num_inference_steps=2)[0].info["num_frames"] == 22
        # 2. a step stalls inside the DiT: Triton notices nothing, the heartbeat stops
        pending = start(client, outcome, "stalled", prompt="stalled", num_inference_steps=3, inject_fault="slow:60")
        assert wait_until(lambda: sample(metrics_text(urls["metrics"]), "h3_execute_in_progress") == 1, 30)
        beat = sample(metrics_text(urls["metrics"]), "h3_heartbeat_timestamp_seconds")
        time.sleep(1)
        assert sample(metrics_text(urls["metrics"]), "h3_heartbeat_timestamp_seconds") == beat
        pending.join(60)
        assert outcome["stalled"].code == "UNAVAILABLE"  # the restart closed the stream
        urls = launcher_urls(log, count=3)
        assert re.search(
            r"the h3_dit heartbeat of h3_dit_0_0 is \d+ s old with work pending: restarting tritonserver",
            log.read_text(),
        )
        assert client.generate("after the second restart", num_inference_steps=2)[0].info["num_frames"] == 22
        # 3. SIGTERM with a request in flight: drained, then a prompt exit
        pending = start(client, outcome, "stopped", prompt="in flight at the stop", num_inference_steps=400)
        assert wait_until(lambda: sample(metrics_text(urls["metrics"]), "h3_active_requests") == 1, 60)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 128 + signal.SIGTERM
        pending.join(60)
        assert outcome["stopped"].code == "CANCELLED"
        assert outcome["stopped"].message.endswith(" of 400")
        assert "cancelled because the server is shutting down at step " in outcome["stopped"].message
        assert re.search(r"tritonserver stopped \(exit code [01]\)", log.read_text())  # 1: slow unload
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def perf_analyzer_c7(server, data, export) -> subprocess.CompletedProcess:
    """perf_analyzer streaming h3_pipeline at concurrency 2 (6 requests of `data`, progress every
    step), its profile exported to `export`; asserts that it exited 0."""
    run = subprocess.run(
        [
            str(ROOT / "scripts" / "perf_analyzer.sh"),
            "-m",
            "h3_pipeline",
            "-i",
            "grpc",
            "-u",
            server.grpc_url,
            "--streaming",
            "--input-data",
            str(data),
            "--request-parameter",
            "sequence_end:false:bool",
            "--request-parameter",
            "progress_every:1:int",
            "--sequence-id-range",
            "100000:200000",
            "--concurrency-range",
            "2",
            "--request-count",
            "6",
            "--profile-export-file",
            str(export),
        ],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def test_field_case_c7_perf_analyzer_latency_is_the_final_responses(server, tmp_path):
    data, export = tmp_path / "input.json", tmp_path / "profile.json"
    data.write_text(json.dumps({"data": [{"PROMPT": ["a red ball"], "NUM_INFERENCE_STEPS": [6]}]}))
    # perf_analyzer 2.51 once left the export empty while exiting 0 and printing its latency (a
    # fresh-clone CI run, 2026-12-01; reruns were fine): such a run is made once more
    for _ in range(2):
        export.unlink(missing_ok=True)  # perf_analyzer refuses an export path that exists
        run = perf_analyzer_c7(server, data, export)
        if export.exists() and export.stat().st_size > 0:
            break
    assert export.exists() and export.stat().st_size > 0, run.stdout + run.stderr
    latency_us = float(re.search(r"Concurrency: 2, throughput: \S+ infer/sec, latency (\d+) usec", run.stdout).group(1))
    # the export holds the binary outputs as raw bytes: not UTF-8, control characters in strings
    profile = json.loads(export.read_bytes().decode("utf-8", "replace"), strict=False)
    requests = profile["experiments"][0]["requests"]
    # 6 progress responses, the result, and the empty final response that ends h3_vae's answer to it
    assert [len(r["response_timestamps"]) for r in requests] == [8] * 6
    last_progress_us = np.mean([(r["response_timestamps"][5] - r["timestamp"]) / 1000 for r in requests])
    assert latency_us > last_progress_us


@pytest.fixture(scope="module")
def reaping(tmp_path_factory):
    """A server whose h3_dit has Triton's default 1 s max_sequence_idle_microseconds and fault
    injection on. Its tests leave ensemble requests in flight that Triton 2.51 cannot end."""
    tmp = tmp_path_factory.mktemp("reaping")
    dit = {"allow_fault_injection": "true", "max_steps": "400"}
    repo = write_repository(tmp / "repo", plan(overrides={"h3_dit": dit}, idle_timeout_s=1))
    # exit_timeout_secs 1: Triton waits that long for the requests it cannot end, then exits
    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log", exit_timeout_secs=1) as server:
        yield server


def test_field_case_c8_a_reaped_sequence_never_blocks_closing_the_stream(reaping):
    responses, dit = queue.Queue(), grpcclient.InferenceServerClient(reaping.grpc_url)
    dit.start_stream(callback=lambda result, error: responses.put((result, error)))
    dit.async_stream_infer(
        "h3_pipeline",
        [prompt(), int64("NUM_INFERENCE_STEPS", 5)],
        request_id="c8-slow",
        parameters={"progress_every": 1, "inject_fault": "slow:1.5"},
        enable_empty_final_response=True,
    )
    received = [responses.get(timeout=60)]  # the first step's progress
    try:
        while True:
            received.append(responses.get(timeout=5))
    except queue.Empty:
        pass  # silent: Triton reaped the sequence after the execute of its first 1.5 s steps
    # the progress of the steps of one execute (at least one, at most MIN_EXECUTE_STEPS while
    # nothing is announced), then nothing
    assert 1 <= len(received) <= MIN_EXECUTE_STEPS and all(error is None for _, error in received)
    closing = threading.Thread(target=lambda: (dit.stop_stream(cancel_requests=True), dit.close()), daemon=True)
    closing.start()
    closing.join(60)
    assert not closing.is_alive(), "closing the stream of a reaped sequence blocked"
    client = H3Client(reaping.grpc_url, idle_timeout_s=60)
    for _ in range(2):  # the DiT forgets the vanished job within a few steps of other work
        client.generate("after the reap", num_inference_steps=3)
    assert idle_metrics(reaping)["h3_active_requests"] == 0
    assert "must specify the START flag" in reaping.log_text()


def test_bad_input_reused_live_sequence_id_is_refused(reaping):
    # Triton 2.51 ends the live sequence when a START request reuses its id, and would route the
    # newcomer's responses to the first client: h3_dit refuses the newcomer and drops the first
    # job; its client sees nothing more (it ends at its own timeout) or, when Triton delivers the
    # request once more, a CANCELLED: final response.
    responses, first = queue.Queue(), grpcclient.InferenceServerClient(reaping.grpc_url)
    first.start_stream(callback=lambda result, error: responses.put((result, error)))
    first.async_stream_infer(
        "h3_pipeline",
        [prompt(), int64("NUM_INFERENCE_STEPS", 400)],
        request_id="first-9400001",
        parameters={"progress_every": 1},
        sequence_id=9_400_001,
        sequence_start=True,
        enable_empty_final_response=True,
    )
    assert responses.get(timeout=60)[1] is None  # running
    _, error = raw_stream(reaping.grpc_url, [prompt()], sequence_id=9_400_001, sequence_start=True, timeout_s=30)
    assert error.code == "INVALID_ARG"
    assert error.message == (
        "sequence id 9400001 belongs to request first-9400001, which Triton has now ended; do not send sequence_id"
    )
    assert wait_until(lambda: reaping.h3_metrics()["h3_active_requests"] == 0, 60)
    time.sleep(1)
    kinds = []  # the first client gets progress, then nothing or (if Triton delivers it again) CANCELLED
    while not responses.empty():
        result, error = responses.get()
        assert error is None
        info = result.as_numpy("INFO")
        kinds.append(json.loads(info.reshape(-1)[0]) if info.size else "empty final")
    ended = [kind for kind in kinds if kind != "empty final" and kind["kind"] != "progress"]
    assert ended == [] or ended == [
        {
            "kind": "error",
            "request_id": "first-9400001",
            "code": "CANCELLED",
            "message": "request first-9400001 was dropped: another request reused its sequence id 9400001",
        }
    ]
    first.stop_stream(cancel_requests=True)
    first.close()
    assert (
        H3Client(reaping.grpc_url, idle_timeout_s=60).generate("after", num_inference_steps=2)[0].info["num_frames"]
        == 22
    )


def test_field_case_c9_each_request_owns_its_step_counter(client):
    requests = [
        dict(prompt="equal steps one", num_inference_steps=12, seed=1),
        dict(prompt="equal steps two", height=96, width=64, num_inference_steps=12, seed=2),
        dict(prompt="more steps", height=64, width=64, num_frames=9, num_inference_steps=20, seed=3),
    ]
    outcome = {}
    threads = [
        start(client, outcome, i, **request, progress_every=1, return_frames=True) for i, request in enumerate(requests)
    ]
    for thread in threads:
        thread.join(120)
    assert max(outcome[i][0].info["largest_pack"] for i in range(3)) >= 2
    for i, request in enumerate(requests):
        packed = outcome[i][0]
        assert [step for step, _, position in packed.progress if position == 0] == list(
            range(1, request["num_inference_steps"] + 1)
        )
        assert packed.frames.tobytes() == client.generate(**request, return_frames=True)[0].frames.tobytes()


def test_field_case_c13_strided_qkv_views_equal_contiguous_copies_on_a_3_x_16384_row_pack():
    # the field case's size on the CPU (tiny's 8 heads x 16), the default sdpa backend; smaller
    # packs and every CPU backend: test_attention_backends.py
    q, k, v = torch.randn(3 * 16384, 3, 8, 16, generator=torch.Generator().manual_seed(0)).unbind(1)
    documents = Documents(torch.tensor([0, 16384, 32768, 49152], dtype=torch.int32), 49152, "cpu")
    sdpa = get_attention_backend("sdpa", torch.device("cpu"), torch.float32)
    assert not q.is_contiguous()
    assert torch.equal(sdpa(q, k, v, documents), sdpa(q.contiguous(), k.contiguous(), v.contiguous(), documents))


def pack_sizes(server) -> dict[str, float]:
    """Cumulative h3_pack_requests histogram: bucket bound -> packs with at most that many outputs."""
    buckets = metric_samples(metrics_text(server.metrics_url), "h3_pack_requests_bucket", model="h3_dit")
    return {sample.labels["le"]: sample.value for sample in buckets}


@pytest.mark.parametrize("concurrency", [1, 2, 4])
def test_field_case_c15_packs_grow_to_the_configured_capacity(server, client, concurrency):
    before = pack_sizes(server)
    outcome, barrier = {}, threading.Barrier(concurrency)

    def run(i):
        barrier.wait(30)
        outcome[i] = client.generate(f"load {i}", num_inference_steps=60, seed=i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    after = pack_sizes(server)
    packs = {le: after[le] - before[le] for le in after}
    below = {1: "1", 2: "1", 4: "3"}[concurrency]  # bucket bound just below the capacity reached
    assert packs["+Inf"] >= 60
    assert packs[str(concurrency)] == packs["+Inf"]  # never more than the concurrency
    assert concurrency == 1 or packs[below] < packs["+Inf"]  # packs of `concurrency` requests formed


def test_field_case_c16_a_deadline_ends_cancelled_with_nothing_delivered_or_completes(server, client):
    expiries = server.h3_metrics()["h3_deadline_expiries_total"]
    # two higher-priority requests fill the pack (2 + 2 outputs = max_num_seqs), so it queues
    blockers = [
        threading.Thread(
            target=raw_stream,
            args=(server.grpc_url, [prompt(), int64("NUM_INFERENCE_STEPS", 400), int64("NUM_OUTPUTS", 2)]),
            kwargs=dict(parameters={"request_priority": 1}, request_id=f"c16-blocker-{i}", timeout_s=120),
        )
        for i in range(2)
    ]
    for thread in blockers:
        thread.start()
    assert wait_until(lambda: server.h3_metrics()["h3_active_requests"] == 2, 60)
    with pytest.raises(H3Error) as info:
        client.generate("queued behind two", num_inference_steps=30, deadline_s=0.5, progress_every=1)
    for i in range(2):
        assert client.cancel(f"c16-blocker-{i}") == "cancelled"
    for thread in blockers:
        thread.join(60)
    assert info.value.code == "CANCELLED"
    assert re.fullmatch(r"request h3c-[0-9a-f]{32} deadline of 0.5 s expired at step 0 of 30", info.value.message)
    metrics = idle_metrics(server)
    assert metrics["h3_deadline_expiries_total"] == expiries + 1
    assert metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0
    (result,) = client.generate("nothing in the way", num_inference_steps=30, deadline_s=60)
    assert result.info["num_inference_steps"] == 30 and len(result.video_mp4) > 0
    assert server.h3_metrics()["h3_deadline_expiries_total"] == expiries + 1


def test_a_top_priority_request_cannot_hold_a_priority_0_one_back_past_max_wait_s(tmp_path):
    """One document a forward, max_wait_s 0.5 s: a priority-100 request of 2,000 steps runs, a
    priority-0 request of 2 steps arrives. srpt ranks the newcomer behind it, so without the
    longest wait it would wait for all 2,000 steps; it gets each of its steps after waiting
    0.5 s and finishes while the long request is still running (the cancel finds it live)."""
    repo = model_repository_copy(tmp_path / "repo", max_num_seqs="1", max_wait_s="0.5", max_steps="2000")
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        client, outcome = H3Client(server.grpc_url, idle_timeout_s=120), {}
        blocker = start(
            client, outcome, "top", prompt="top", num_inference_steps=2000, request_priority=100, request_id="top"
        )
        assert wait_until(lambda: server.h3_metrics()["h3_active_requests"] == 1, 60)
        progress = []
        (result,) = client.generate(
            "priority 0", num_inference_steps=2, progress_every=1, on_progress=lambda *p: progress.append(p)
        )
        assert client.cancel("top") == "cancelled"
        blocker.join(60)
    # a progress response also goes out when its queue position changes (the same step again)
    assert result.info["num_inference_steps"] == 2 and sorted({p[:2] for p in progress if p[0] > 0}) == [(1, 2), (2, 2)]
    assert isinstance(outcome["top"], H3Error) and outcome["top"].code == "CANCELLED"


# Steps a request-mode generation may take between a cancel and its effect: the cancel's own round
# trip (a new gRPC channel, h3_cancel, the registry) and the progress responses on their way to the
# client, on a loaded 2-core machine. Without h3_cancel the answer waited for the whole generation.
CANCEL_BOUND_STEPS = 100


def test_request_mode_cancels_reach_the_generation_on_one_dit_instance(tmp_path):
    """Execution mode "request" runs a whole generation inside one h3_dit execute, and a request
    queued for h3_dit waits for that execute to end. With ONE DiT instance both cancels still
    reach the generation at its next step boundary (the registry, read there): a second client's
    H3Client.cancel goes to h3_cancel and is answered "cancelled" within CANCEL_BOUND_STEPS steps
    of the victim, whose stream then ends CANCELLED before its last step, with no result; and a
    client that closes its stream is noticed by h3_vae, which records the cancel in the registry
    (no control request to h3_dit): the request leaves the DiT before its last step."""
    repo = model_repository_copy(
        tmp_path / "repo", execution_mode="request", scheduling_policy="request", max_steps="400"
    )
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        client, outcome, seen = H3Client(server.grpc_url, idle_timeout_s=120), {}, []
        running = start(
            client,
            outcome,
            "victim",
            prompt="victim",
            num_inference_steps=400,
            request_id="rm-victim",
            progress_every=1,
            on_progress=lambda step, total, position: seen.append(step),
        )
        assert wait_until(lambda: seen, 60)
        sent_at = seen[-1]
        assert H3Client(server.grpc_url, idle_timeout_s=60).cancel("rm-victim") == "cancelled"
        answered_at = seen[-1]
        running.join(60)
        assert answered_at - sent_at <= CANCEL_BOUND_STEPS, (sent_at, answered_at)
        assert isinstance(outcome["victim"], H3Error) and outcome["victim"].code == "CANCELLED"
        ended = re.fullmatch(r"request rm-victim cancelled by request at step (\d+) of 400", outcome["victim"].message)
        assert ended and int(ended.group(1)) < 400

        gone, steps = grpcclient.InferenceServerClient(server.grpc_url), queue.Queue()

        def progress(result, error) -> None:  # an error comes only with the stop (cancel_requests=True)
            if result is not None:
                steps.put(int(result.as_numpy("PROGRESS").reshape(-1)[0]))

        gone.start_stream(callback=progress)
        gone.async_stream_infer(
            "h3_pipeline",
            [prompt(b"gone"), int64("NUM_INFERENCE_STEPS", 400)],
            request_id="rm-gone",
            parameters={"progress_every": 1},
            enable_empty_final_response=True,
        )
        while (last_seen := steps.get(timeout=60)) < 3:
            pass
        gone.stop_stream(cancel_requests=True)
        gone.close()
        pattern = re.compile(
            r"request rm-gone ended CANCELLED: request rm-gone cancelled by request at step (\d+) of 400"
        )
        assert wait_until(lambda: pattern.search(server.log_text()), 60)
        left_at = int(pattern.search(server.log_text()).group(1))
        assert left_at < 400 and left_at - last_seen <= CANCEL_BOUND_STEPS, (last_seen, left_at)
        assert client.generate("after", num_inference_steps=2)[0].info["num_frames"] == 22
