import json
import subprocess
import sys

import pytest

from h3_core.scheduler import DEFAULT_POLICY, POLICIES
from h3_core.simulate import (
    LOADED_COST,
    REFERENCE_COST,
    SMALL_ROWS,
    WORKLOADS,
    compare,
    main,
    make_workload,
    percentile,
    simulate,
    summarize,
)

METRICS = {
    "mean_latency_s",
    "p95_latency_s",
    "mean_time_to_first_step_s",
    "throughput_per_min",
    "completed",
    "submitted",
}


def test_percentile_is_the_nearest_rank():
    # the ceil(p n / 100)-th smallest: always one of the values, never interpolated
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0  # 2nd of 4
    assert percentile([4.0, 1.0, 3.0, 2.0], 51) == 3.0  # ceil(2.04) = 3rd
    assert percentile([10.0, 12.0, 19.0], 95) == 19.0  # ceil(2.85) = 3rd
    assert percentile([10.0, 12.0, 19.0], 66) == 12.0  # ceil(1.98) = 2nd
    assert percentile(list(range(21)), 95) == 19  # ceil(19.95) = 20th of 0..20
    assert percentile(list(range(100)), 7) == 6  # the 7th exactly, though 0.07 * 100 > 7 in floats
    assert percentile(list(range(20)), 95) == 18  # the 19th exactly
    assert percentile([10.0, 12.0, 19.0], 100) == 19.0
    assert percentile([10.0, 12.0, 19.0], 0) == 10.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError) as error:
        percentile([1.0], 101)
    assert str(error.value) == "percentile p=101 is out of range: allowed 0..100"


def test_burst_golden_per_policy():
    """4 x (16,384 rows, 30 steps) at t = 0; one encoder hands them to the DiT at 0.1, 0.2, 0.3,
    0.4 s; a solo step takes 0.01 + 0.26 = 0.27 s, k co-batched 0.01 + 0.26 k s; the VAE (0.52 s)
    takes them in finishing order."""
    workload = make_workload("burst")
    done = {policy: [round(c.done_s, 4) for c in simulate(workload, policy)] for policy in POLICIES}
    first = {policy: [round(c.first_step_s, 4) for c in simulate(workload, policy)] for policy in POLICIES}
    # request: 30 x 0.27 = 8.1 s each, back to back from 0.1 s.
    assert done["request"] == [8.72, 16.82, 24.92, 33.02]
    assert first["request"] == [0.1, 8.2, 16.3, 24.4]
    # fifo: 1 solo step (-> 0.37), 1 step of 3 (0.79 s -> 1.16), 28 steps of 4 (1.05 s -> 30.56:
    # the first is done), 1 step of 3 (-> 31.35: two more), 1 solo step (-> 31.62); VAE queue.
    assert done["fifo"] == [31.08, 31.87, 32.39, 32.91]
    assert first["fifo"] == [0.1, 0.37, 0.37, 1.16]
    # srpt: each newcomer's first step comes first (0.1, 0.37, 0.64, 0.91 -> 1.18), then equal
    # remaining work runs in arrival order, 29 x 0.27 = 7.83 s each.
    assert done["srpt"] == [9.53, 17.36, 25.19, 33.02]
    assert first["srpt"] == [0.1, 0.37, 0.64, 0.91]
    assert summarize(workload, simulate(workload, "request")) == {
        "mean_latency_s": 20.87,
        "p95_latency_s": 33.02,
        "mean_time_to_first_step_s": 12.0,
        "throughput_per_min": 7.2683,
        "completed": 4,
        "submitted": 4,
    }  # 4 x 60 / 33.02
    assert summarize(workload, simulate(workload, "fifo")) == {
        "mean_latency_s": 32.0625,
        "p95_latency_s": 32.91,
        "mean_time_to_first_step_s": 0.25,
        "throughput_per_min": 7.2926,
        "completed": 4,
        "submitted": 4,
    }
    assert summarize(workload, simulate(workload, "srpt")) == {
        "mean_latency_s": 21.275,
        "p95_latency_s": 33.02,
        "mean_time_to_first_step_s": 0.255,
        "throughput_per_min": 7.2683,
        "completed": 4,
        "submitted": 4,
    }


def test_reference_under_request_golden():
    """Arrivals at the DiT every 5 s from 0.1 s, 20 x 0.26 = 5.2 s each: request k waits 0.2 k s;
    latency = 0.1 + 0.2 k + 5.2 + 0.52 s."""
    workload = make_workload("reference")
    assert workload.cost == REFERENCE_COST
    assert summarize(workload, simulate(workload, "request")) == {
        "mean_latency_s": 6.72,
        "p95_latency_s": 7.62,
        "mean_time_to_first_step_s": 0.9,
        "throughput_per_min": 11.4025,
        "completed": 10,
        "submitted": 10,
    }  # 600 / 52.62


def test_mixed_workload_is_seeded():
    workload = make_workload("mixed")
    assert workload.cost == LOADED_COST and len(workload.requests) == 200
    assert sum(r.rows == SMALL_ROWS for r in workload.requests) == 131
    assert round(workload.requests[-1].submit_s, 4) == 741.5293
    assert make_workload("mixed", 0) == workload and make_workload("mixed", 1) != workload


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_policy_completes_every_request_exactly_once(name):
    workload = make_workload(name)
    for policy in POLICIES:
        assert sorted(c.request for c in simulate(workload, policy)) == list(range(len(workload.requests)))


def test_default_policy_meets_the_targets():
    """Issue 5 targets: (a) mean time to first step >= 5x lower than request's, mean latency
    <= 1.05x request's; (b) mean latency <= 0.7x request's and fifo's, p95 <= 1.1x request's."""
    reference = compare(make_workload("reference"))
    default, request = reference[reference["default"]], reference["request"]
    assert 5 * default["mean_time_to_first_step_s"] <= request["mean_time_to_first_step_s"]
    assert default["mean_latency_s"] <= 1.05 * request["mean_latency_s"]
    mixed = compare(make_workload("mixed"))
    default, request, fifo = mixed[mixed["default"]], mixed["request"], mixed["fifo"]
    assert default["mean_latency_s"] <= 0.7 * min(request["mean_latency_s"], fifo["mean_latency_s"])
    assert default["p95_latency_s"] <= 1.1 * request["p95_latency_s"]


def test_cli_prints_one_json_object_with_every_policy():
    out = subprocess.run(
        [sys.executable, "-m", "h3_core.simulate", "--workload", "burst", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    results = json.loads(out)
    assert set(results) == set(POLICIES) | {"default"} and results["default"] == DEFAULT_POLICY
    assert all(set(results[policy]) == METRICS for policy in POLICIES)
    assert results == compare(make_workload("burst"))


def test_cli_table_and_cost_override(capsys):
    main(["--workload", "burst"])
    assert capsys.readouterr().out.splitlines() == [
        "workload burst: 4 requests; simulated, step cost 0.01 s + 1.587e-05 s/row, encode 0.1 s, decode 0.52 s, "
        "srpt row budget 16384",
        "policy            mean latency s  p95 latency s  mean TTFS s  req/min  completed",
        "request                    20.87          33.02        12.00     7.27     4/4",
        "fifo                       32.06          32.91         0.25     7.29     4/4",
        "srpt (default)             21.27          33.02         0.26     7.27     4/4",
    ]
    # reference with c0 = 0.01 s: 20 x 0.27 = 5.4 s each, request k waits 0.4 k s.
    main(["--workload", "reference", "--c0", "0.01", "--json"])
    assert json.loads(capsys.readouterr().out)["request"]["mean_latency_s"] == 7.82
    # A 32,768-row budget lets srpt pack two 16k-row requests (0.53 s a step): 0 solo (-> 0.37),
    # 1 + 2 (-> 0.9), 3 + 0 (-> 1.43), 0 + 1 x 28 (-> 16.27), 1 + 2 (-> 16.8), 2 + 3 x 28
    # (-> 31.64), 3 (-> 31.91); VAE done at 16.79, 17.32, 32.16, 32.68.
    main(["--workload", "burst", "--row-budget", "32768", "--json"])
    assert json.loads(capsys.readouterr().out)["srpt"]["mean_latency_s"] == 24.7375


def test_unknown_workload():
    with pytest.raises(ValueError) as error:
        make_workload("steady")
    assert str(error.value) == "workload='steady' is not one of reference, mixed, burst"
