import json
import subprocess
import sys

import pytest

from h3_core.serving.dit.scheduler import DEFAULT_POLICY, POLICIES
from h3_core.serving.dit.simulate import (
    LARGE_ROWS,
    LOADED_COST,
    REFERENCE_COST,
    ROOT_RESULTS,
    SMALL_ROWS,
    WORKLOADS,
    CostModel,
    SimRequest,
    Workload,
    capacity,
    compare,
    fit_step_cost,
    main,
    make_workload,
    measured_steps,
    parse_mix,
    percentile,
    replicas_needed,
    simulate,
    summarize,
)

METRICS = {
    "mean_latency_s",
    "p95_latency_s",
    "mean_time_to_first_step_s",
    "p95_time_to_first_step_s",
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
        "p95_time_to_first_step_s": 24.0,
        "throughput_per_min": 7.2683,
        "completed": 4,
        "submitted": 4,
    }  # 4 x 60 / 33.02
    assert summarize(workload, simulate(workload, "fifo")) == {
        "mean_latency_s": 32.0625,
        "p95_latency_s": 32.91,
        "mean_time_to_first_step_s": 0.25,
        "p95_time_to_first_step_s": 0.76,
        "throughput_per_min": 7.2926,
        "completed": 4,
        "submitted": 4,
    }
    assert summarize(workload, simulate(workload, "srpt")) == {
        "mean_latency_s": 21.275,
        "p95_latency_s": 33.02,
        "mean_time_to_first_step_s": 0.255,
        "p95_time_to_first_step_s": 0.51,
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
        "p95_time_to_first_step_s": 1.8,
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
        [sys.executable, "-m", "h3_core.serving.dit.simulate", "--workload", "burst", "--json"],
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


# -- several replicas ------------------------------------------------------------------------------


def test_round_robin_over_two_replicas_golden():
    """burst over 2 replicas: requests 0, 2 to replica 0 and 1, 3 to replica 1, each replica's own
    encoder hands them over at 0.1 and 0.2 s. srpt per replica: 0.1 -> 0.37 the first, its
    newcomer's first step -> 0.64, then 29 x 0.27 s each in arrival order (-> 8.47, -> 16.30),
    VAE +0.52 s."""
    completions = simulate(make_workload("burst"), "srpt", replicas=2, routing="round_robin")
    assert [(c.request, c.replica, round(c.done_s, 4), round(c.first_step_s, 4)) for c in completions] == [
        (0, 0, 8.99, 0.1),
        (1, 1, 8.99, 0.1),
        (2, 0, 16.82, 0.37),
        (3, 1, 16.82, 0.37),
    ]


ALTERNATING = Workload(
    "alternating",
    [
        SimRequest(0.0, LARGE_ROWS, 30),
        SimRequest(0.001, SMALL_ROWS, 20),
        SimRequest(0.002, LARGE_ROWS, 30),
        SimRequest(0.003, SMALL_ROWS, 20),
    ],
    LOADED_COST,
)


def test_least_outstanding_rows_spreads_what_round_robin_piles_up():
    """large, small, large, small over 2 replicas: round robin sends both large requests to
    replica 0; least_rows sends the second large one to replica 1 (1,280 rows outstanding against
    16,384) and the last small one to replica 0 (16,384 against 17,664)."""
    placed = {
        routing: sorted((c.request, c.replica) for c in simulate(ALTERNATING, "srpt", replicas=2, routing=routing))
        for routing in ("round_robin", "least_rows")
    }
    assert placed == {"round_robin": [(0, 0), (1, 1), (2, 0), (3, 1)], "least_rows": [(0, 0), (1, 1), (2, 1), (3, 0)]}
    p95 = {
        routing: summarize(ALTERNATING, simulate(ALTERNATING, "srpt", replicas=2, routing=routing))["p95_latency_s"]
        for routing in ("round_robin", "least_rows")
    }
    assert p95 == {"round_robin": 16.818, "least_rows": 9.3262}


@pytest.mark.parametrize("routing", ["round_robin", "least_rows"])
def test_every_request_completes_once_on_several_replicas(routing):
    workload = make_workload("mixed", rate_per_min=20)
    completions = simulate(workload, "srpt", replicas=3, routing=routing)
    assert sorted(c.request for c in completions) == list(range(200))
    assert {c.replica for c in completions} == {0, 1, 2}
    assert [c.done_s for c in completions] == sorted(c.done_s for c in completions)


def test_bad_replicas_or_routing_are_refused():
    with pytest.raises(ValueError) as error:
        simulate(make_workload("burst"), "srpt", replicas=0)
    assert (
        str(error.value)
        == "replicas=0 routing='round_robin': need replicas >= 1 and one of ('round_robin', 'least_rows')"
    )
    with pytest.raises(ValueError):
        simulate(make_workload("burst"), "srpt", replicas=2, routing="random")


def test_mixed_workload_rate_count_and_mix():
    workload = make_workload("mixed", rate_per_min=60, count=50, mix=parse_mix("1:4096:10"))
    assert len(workload.requests) == 50 and {(r.rows, r.steps) for r in workload.requests} == {(4096, 10)}
    # Poisson arrivals at 1 a second: 49 gaps of mean 1 s
    assert round(workload.requests[-1].submit_s, 4) == 56.1018
    assert make_workload("mixed", rate_per_min=60, count=50) != make_workload("mixed", rate_per_min=30, count=50)
    with pytest.raises(ValueError) as error:
        make_workload("mixed", rate_per_min=0)
    assert str(error.value) == "the mixed workload needs count > 0 and rate > 0, got 200 and 0"


def test_parse_mix():
    assert parse_mix("0.7:1280:20,0.3:16384:30") == ((0.7, 1280, 20), (0.3, 16384, 30))
    with pytest.raises(ValueError) as error:
        parse_mix("0.7:1280")
    assert str(error.value) == "--mix entry '0.7:1280' is not WEIGHT:ROWS:STEPS (e.g. 0.3:16384:30)"
    with pytest.raises(ValueError) as error:
        parse_mix("0:1280:20")
    assert str(error.value) == "--mix entry '0:1280:20': weight, rows and steps must be > 0"


def test_step_cost_fit():
    assert fit_step_cost([(0, 1.0), (10, 21.0), (20, 41.0)]) == CostModel(c0=1.0, c1=2.0, encode_s=0.1, decode_s=0.52)
    with pytest.raises(ValueError) as error:
        fit_step_cost([(16384, 0.35), (16384, 0.36)])
    assert (
        str(error.value) == "a step cost fit needs steps of at least two row counts, got [(16384, 0.35), (16384, 0.36)]"
    )
    steps = measured_steps(ROOT_RESULTS / "h200.json")
    assert [rows for rows, _ in steps] == [16384, 32768, 49152, 65536, 128, 256, 1024, 4096, 16384]
    cost = fit_step_cost(steps)
    assert (round(cost.c0, 5), round(cost.c1 * 1e5, 4)) == (0.02225, 2.0837)  # seconds, seconds per 100,000 rows


def test_capacity_on_h200_step_costs():
    """Mixed workload, 200 requests, bounds p95 time to first step 1 s and p95 latency 60 s."""
    cost = fit_step_cost(measured_steps(ROOT_RESULTS / "h200.json"))
    rows = capacity([8, 32], cost, max_ttfs_s=1.0, max_p95_s=60.0)
    assert [(row["rate_per_min"], row["load"]) for row in rows] == [(8, 0.5351), (32, 2.1404)]
    assert [(row["round_robin"]["replicas"], row["least_rows"]["replicas"]) for row in rows] == [(1, 1), (3, 3)]
    assert rows[1]["least_rows"] == {"replicas": 3, "p95_time_to_first_step_s": 0.2916, "p95_latency_s": 17.9045}
    # with a bound no replica count meets: None, and the last run's figures
    replicas, summary = replicas_needed(make_workload("burst"), "round_robin", 0.0, 1.0, max_replicas=2)
    assert (replicas, summary["p95_latency_s"]) == (None, 16.82)


def test_cli_replicas_and_capacity(capsys):
    main(["--workload", "burst", "--replicas", "2", "--routing", "least_rows"])
    assert capsys.readouterr().out.splitlines()[0] == (
        "workload burst: 4 requests; simulated, step cost 0.01 s + 1.587e-05 s/row, encode 0.1 s, decode 0.52 s, "
        "srpt row budget 16384, 2 replicas (least_rows)"
    )
    main(["--workload", "mixed", "--step-costs", str(ROOT_RESULTS / "h200.json"), "--capacity", "8,32"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        "| req/min | load | round_robin: replicas | p95 TTFS s | p95 latency s | least_rows: replicas | p95 TTFS s "
        "| p95 latency s |",
        "|---|---|---|---|---|---|---|---|",
        "| 8 | 0.54 | 1 | 0.32 | 20.83 | 1 | 0.32 | 20.83 |",
        "| 32 | 2.14 | 3 | 0.33 | 23.41 | 3 | 0.29 | 17.90 |",
    ]
    with pytest.raises(SystemExit) as exit_:
        main(["--workload", "burst", "--capacity", "8"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "python -m h3_core.serving.dit.simulate: error: --capacity takes the mixed workload"
    )
