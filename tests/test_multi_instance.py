"""End-to-end (issue 14, part 2 on the CPU): two h3_dit instances in one server.

Placement (both instances serve, the totals add up), sequence affinity (a request's steps all
run on its instance: its output equals its output on the single-instance server), cancel by id
landing on either instance (h3_core.serving.shared.registry), and per-instance metrics whose sums are the
server's totals."""

import threading
import time

import pytest

from client.api import H3Client, H3Error
from server.process import TritonServer, metric_samples, read_metrics

from .serving import generate_in_thread, model_repository_copy

LONG = dict(height=64, width=96, num_frames=22, num_inference_steps=4000, progress_every=1)  # cancelled long before
SHORT = dict(
    prompt="a short one",
    height=64,
    width=64,
    num_frames=9,
    num_inference_steps=3,
    seed=8,
    return_frames=True,
    return_audio=True,
    return_mp4=False,
)


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory):
    repo = model_repository_copy(tmp_path_factory.mktemp("multi") / "repo", dit_instances=2, max_steps="4000")
    with TritonServer(repo, free_ports=True, log_file=tmp_path_factory.mktemp("log") / "server.log") as server:
        yield server, H3Client(server.grpc_url, idle_timeout_s=120)


def per_instance(server, name: str) -> dict[str, float]:
    return {s.labels["instance"]: s.value for s in metric_samples(read_metrics(server.metrics_url), name)}


def test_requests_spread_over_both_instances_and_cancels_reach_either(two_instances):
    server, client = two_instances
    outcome, running = {}, [threading.Event() for _ in range(4)]
    threads = [
        generate_in_thread(
            client,
            outcome,
            i,
            prompt=f"long {i}",
            seed=i,
            request_id=f"multi-{i}",
            **LONG,
            on_progress=lambda *_, i=i: running[i].set(),
        )
        for i in range(4)
    ]
    assert all(event.wait(60) for event in running)
    # the gauges are set at the end of an execute, which may run several steps after a progress
    # response (execute_budget_s): read them until both instances have reported their requests
    deadline = time.monotonic() + 60
    active = per_instance(server, "h3_active_requests")
    while sum(active.values()) != 4 and time.monotonic() < deadline:
        time.sleep(0.05)
        active = per_instance(server, "h3_active_requests")
    # Triton places each newcomer on the lowest free sequence slot; which instance that is depends
    # on timing, so only the totals are exact here (the H200 run measures the balance)
    assert sorted(active) == ["h3_dit_0_0", "h3_dit_0_1"] and sum(active.values()) == 4
    assert [client.cancel(f"multi-{i}") for i in range(4)] == ["cancelled"] * 4
    assert client.cancel("multi-unknown") == "unknown"
    for thread in threads:
        thread.join(60)
    for i in range(4):
        assert isinstance(outcome[i], H3Error) and outcome[i].code == "CANCELLED"
        assert outcome[i].message.startswith(f"request multi-{i} cancelled by request at step ")


def test_a_request_equals_its_single_instance_output_on_either_instance(two_instances, client):
    server, multi = two_instances
    single = client.generate(**SHORT)[0]  # the session server: one instance
    before = sum(per_instance(server, "h3_completions_total").values())
    outcome = {}
    threads = [generate_in_thread(multi, outcome, i, **SHORT, request_id=f"same-{i}") for i in range(4)]
    for thread in threads:
        thread.join(60)
    for i in range(4):
        assert outcome[i][0].frames.tobytes() == single.frames.tobytes()
        assert outcome[i][0].audio.tobytes() == single.audio.tobytes()
    completions = per_instance(server, "h3_completions_total")
    assert sum(completions.values()) == before + 4 and len(completions) == 2
    assert sorted(per_instance(server, "h3_pack_rows_count")) == ["h3_dit_0_0", "h3_dit_0_1"]  # histograms too
    assert [multi.cancel(f"same-{i}") for i in range(4)] == ["finished"] * 4
