import math

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.model import H3DiT
from h3_core.serving.scheduler import DEFAULT_POLICY, POLICIES, Job, Overloaded, Scheduler
from h3_core.serving.simulate import SimState


def job(name, rows, steps, arrival_s=0.0, priority=0, outputs=1):
    return Job(
        key=name,
        request_id=name,
        states=[SimState(rows, steps) for _ in range(outputs)],
        arrival_s=arrival_s,
        priority=priority,
    )


def names(jobs):
    return [j.request_id for j in jobs]


def step(scheduler, now):
    """One step boundary at `now`: schedule, advance the pack one step, retire finished jobs.
    Returns the pack's names."""
    pack = scheduler.schedule(now)
    for j in pack:
        for state in j.states:
            state.step_index += 1
        if j.finished:
            scheduler.remove(j)
    return names(pack)


def run_script(policy, arrivals):
    """Steps 0, 1, 2, ... (1 s each); arrivals[k] join before step k. Returns the packs."""
    scheduler = Scheduler(max_num_seqs=2, max_batch_rows=100, max_waiting=8, policy=policy, row_budget=60)
    packs, now = [], 0
    while now < len(arrivals) or scheduler.jobs:
        for j in arrivals[now] if now < len(arrivals) else []:
            scheduler.add(j)
        packs.append(step(scheduler, now))
        now += 1
    return packs


def script():
    """A (50 rows, 3 steps) and B (40 rows, 2 steps) at step 0; C (20 rows, 1 step) and
    D (60 rows, 2 steps) at step 1."""
    return [[job("A", 50, 3, 0.0), job("B", 40, 2, 0.0)], [job("C", 20, 1, 1.0), job("D", 60, 2, 1.0)]]


def test_policies_and_default():
    assert POLICIES == ("request", "fifo", "srpt")
    assert DEFAULT_POLICY == "srpt"


def test_request_runs_one_job_to_completion_in_arrival_order():
    assert run_script("request", script()) == [["A"], ["A"], ["A"], ["B"], ["B"], ["C"], ["D"], ["D"]]


def test_fifo_admits_in_arrival_order_and_advances_every_admitted_job():
    # step 1: C waits (2 documents already); step 2: B left, A + C = 70 rows; D (60) waits for A.
    assert run_script("fifo", script()) == [["A", "B"], ["A", "B"], ["A", "C"], ["D"], ["D"]]


def test_fifo_head_of_line_blocks_a_later_job_that_would_fit():
    scheduler = Scheduler(max_num_seqs=4, max_batch_rows=100, max_waiting=8, policy="fifo")
    for j in (job("A", 60, 5), job("B", 50, 5), job("C", 10, 5)):
        scheduler.add(j)
    assert names(scheduler.schedule(0.0)) == ["A"]


def test_srpt_pick_order():
    # step 0: B (80 row-steps) before A (150); A would pass the 60-row budget.
    # step 1: newcomers first (C 20, D 120, A 150), then B; D and A exceed the budget, B fits.
    # step 2: D (newcomer, 120) before A (newcomer, 150). step 3: A's first step before D's
    # second. Then least remaining work: D (60) before A (100).
    assert run_script("srpt", script()) == [["B"], ["C", "B"], ["D"], ["A"], ["D"], ["A"], ["A"]]


def test_srpt_preemption_keeps_the_step_index():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=8)
    big = job("big", 50, 4)
    scheduler.add(big)
    assert [step(scheduler, 0.0), step(scheduler, 1.0)] == [["big"], ["big"]]
    scheduler.add(job("small", 50, 1, arrival_s=2.0))
    assert step(scheduler, 2.0) == ["small"]
    assert big.step_index == 2 and scheduler.queue_position(big) == 1
    assert [step(scheduler, 3.0), step(scheduler, 4.0)] == [["big"], ["big"]]
    assert big.finished and scheduler.jobs == []


def test_srpt_priority_runs_first_despite_more_work():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=8)
    for j in (job("small", 10, 1), job("urgent", 100, 30, priority=2), job("normal", 100, 30, priority=1)):
        scheduler.add(j)
    assert [step(scheduler, 0.0) for _ in range(3)] == [["urgent"], ["urgent"], ["urgent"]]
    assert [scheduler.queue_position(scheduler.jobs[i]) for i in range(3)] == [2, 0, 1]


@pytest.mark.parametrize("aging_s, large_steps", [(5.0, list(range(5, 15))), (math.inf, [])])
def test_aging_lets_a_large_job_finish_under_an_endless_stream_of_small_ones(aging_s, large_steps):
    """One small 1-step job arrives at every step; each would take the step before the large one
    (newcomer, less work). After aging_s = 5 s the large job outranks every newcomer and runs
    its 10 steps back to back; without aging it never runs."""
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=1000, aging_s=aging_s)
    large = job("large", 100, 10)
    scheduler.add(large)
    ran = []
    for now in range(100):
        scheduler.add(job(f"small{now}", 10, 1, arrival_s=float(now)))
        if step(scheduler, float(now)) == ["large"]:
            ran.append(now)
    assert ran == large_steps
    assert large.finished == (aging_s == 5.0)


def test_mixed_sizes_frame_counts_and_step_counts_cobatch():
    dit = H3DiT(get_config("tiny"))
    engine = Engine(
        dit, None, None, limits=RequestLimits(max_height=128, max_width=128, max_num_frames=64, max_steps=30)
    )
    text = torch.zeros(3, dit.cfg.text_dim)
    requests = [
        GenerationRequest("x", 64, 96, 22, 10, seed=1, request_id="a", num_outputs=2),
        GenerationRequest("x", 32, 64, 5, 30, seed=2, request_id="b"),
        GenerationRequest("x", 128, 128, 57, 12, seed=3, request_id="c"),
    ]
    jobs = [
        Job(key=r.request_id, request_id=r.request_id, states=engine.prepare(r, text), arrival_s=0.0) for r in requests
    ]
    # (rows, steps, outputs); srpt's remaining work: b 1,920 < a 2,560 < c 6,912 row-steps
    assert [(j.rows, j.total_steps, len(j.states)) for j in jobs] == [(256, 10, 2), (64, 30, 1), (576, 12, 1)]
    for policy in ("fifo", "srpt"):
        scheduler = Scheduler(max_num_seqs=4, max_batch_rows=896, max_waiting=8, policy=policy)
        for j in jobs:
            scheduler.add(j)
        assert names(scheduler.schedule(0.0)) == (["a", "b", "c"] if policy == "fifo" else ["b", "a", "c"])


def test_refuses_a_job_that_never_fits_one_forward():
    scheduler = Scheduler(max_num_seqs=2, max_batch_rows=1000, max_waiting=8)
    with pytest.raises(ValueError) as error:
        scheduler.add(job("big", 1001, 5))
    assert str(error.value) == "rows=1001 is out of range: allowed 1..1000 (max_batch_rows)"
    with pytest.raises(ValueError) as error:
        scheduler.add(job("many", 100, 5, outputs=3))
    assert str(error.value) == "num_outputs=3 is out of range: allowed 1..2 (max_num_seqs)"
    scheduler.add(job("fits", 500, 5, outputs=2))
    assert names(scheduler.jobs) == ["fits"]


@pytest.mark.parametrize("policy", POLICIES)
def test_refuses_a_newcomer_finding_max_num_seqs_plus_max_waiting_jobs(policy):
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=2, policy=policy)
    running = job("running", 10, 2)
    scheduler.add(running)
    assert names(scheduler.schedule(0.0)) == ["running"]
    scheduler.add(job("w1", 10, 5, arrival_s=1.0))
    scheduler.add(job("w2", 10, 5, arrival_s=1.0))
    with pytest.raises(Overloaded) as error:
        scheduler.add(job("w3", 10, 5, arrival_s=1.0))
    assert str(error.value) == "the DiT holds 3 requests, its capacity max_num_seqs + max_waiting = 1 + 2; retry later"
    scheduler.remove(running)
    assert names(scheduler.schedule(1.0)) == ["w1"]
    scheduler.add(job("w3", 10, 5, arrival_s=1.0))
    assert names(scheduler.jobs) == ["w1", "w2", "w3"]


def test_srpt_preemption_never_takes_the_count_past_the_capacity():
    # Four started one-output jobs fill the pack and two wait. A 3-output newcomer with the least
    # work ranks first and shrinks the pack to 2 jobs, leaving 5 outside it: counted that way the
    # next newcomer met "5 requests are waiting (max_waiting=3)". The live jobs number 7 =
    # max_num_seqs + max_waiting, as they did before the pack shrank.
    scheduler = Scheduler(max_num_seqs=4, max_batch_rows=100, max_waiting=3, policy="srpt")
    for name in "abcdef":
        scheduler.add(job(name, 10, 10))
    assert step(scheduler, 0.0) == ["a", "b", "c", "d"]
    scheduler.add(job("three", 10, 2, arrival_s=1.0, outputs=3))
    assert step(scheduler, 1.0) == ["three", "e"]
    assert names(scheduler.line) == ["f", "a", "b", "c", "d"] and len(scheduler.jobs) == 7
    with pytest.raises(Overloaded) as error:
        scheduler.add(job("one", 10, 5, arrival_s=2.0))
    assert str(error.value) == "the DiT holds 7 requests, its capacity max_num_seqs + max_waiting = 4 + 3; retry later"
    # the row budget shrinks the pack too: the line outgrows max_waiting, the capacity holds
    scheduler = Scheduler(max_num_seqs=4, max_batch_rows=100, max_waiting=2, policy="srpt", row_budget=30)
    for name in "abcdef":
        scheduler.add(job(name, 20, 10))
    assert step(scheduler, 0.0) == ["a"]
    assert names(scheduler.line) == ["b", "c", "d", "e", "f"]
    with pytest.raises(Overloaded) as error:
        scheduler.add(job("g", 20, 10))
    assert str(error.value) == "the DiT holds 6 requests, its capacity max_num_seqs + max_waiting = 4 + 2; retry later"


@pytest.mark.parametrize("policy,admitted,refused", [("request", 17, 23), ("fifo", 18, 22), ("srpt", 20, 20)])
def test_live_jobs_never_pass_the_capacity_under_a_burst(policy, admitted, refused):
    # 40 arrivals of 1..3 outputs over 20 steps: the live jobs reach, never pass, max_num_seqs +
    # max_waiting = 12 (h3_dit's 14 sequence slots less 2 for cancel requests); the line reaches 11.
    scheduler = Scheduler(max_num_seqs=4, max_batch_rows=100, max_waiting=8, policy=policy, row_budget=60)
    outcomes, most_live, longest_line = [], 0, 0
    for now in range(20):
        for k in range(2):
            try:
                scheduler.add(job(f"{now}-{k}", 10 + 10 * k, 3 + now % 5, arrival_s=now, outputs=1 + (now + k) % 3))
                outcomes.append("admitted")
            except Overloaded:
                outcomes.append("refused")
            most_live = max(most_live, len(scheduler.jobs))
        step(scheduler, float(now))
        longest_line = max(longest_line, len(scheduler.line))
    assert (outcomes.count("admitted"), outcomes.count("refused"), most_live, longest_line) == (
        admitted,
        refused,
        12,
        11,
    )


def test_bad_constructor_arguments():
    with pytest.raises(ValueError) as error:
        Scheduler(4, 100, 8, policy="lifo")
    assert str(error.value) == "scheduling_policy='lifo' is not one of request, fifo, srpt"
    with pytest.raises(ValueError) as error:
        Scheduler(4, 100, 8, row_budget=101)
    assert str(error.value) == "row_budget=101 is out of range: allowed 1..100 (max_batch_rows)"
    with pytest.raises(ValueError) as error:
        Scheduler(4, 100, 8, aging_s=0.0)
    assert str(error.value) == "aging_s=0.0 is out of range: allowed > 0"
    assert Scheduler(4, 100, 8).row_budget == 100


def test_queue_positions_follow_the_policy_order():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=8, policy="srpt")
    jobs = [job("long", 10, 30), job("short", 10, 2), job("mid", 10, 10)]
    for j in jobs:
        scheduler.add(j)
    assert [scheduler.queue_position(j) for j in jobs] == [1, 2, 3]  # before the first schedule: arrival order
    assert names(scheduler.schedule(0.0)) == ["short"]
    late = job("late", 10, 1, arrival_s=0.5)
    scheduler.add(late)
    assert [scheduler.queue_position(j) for j in jobs + [late]] == [2, 0, 1, 3]
    fifo = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=8, policy="fifo")
    for j in jobs:
        fifo.add(j)
    fifo.schedule(0.0)
    assert [fifo.queue_position(j) for j in jobs] == [0, 1, 2]


def test_schedule_without_now_reads_the_monotonic_clock():
    scheduler = Scheduler(max_num_seqs=4, max_batch_rows=100, max_waiting=8)
    assert scheduler.schedule() == []
    scheduler.add(Job(key=1, request_id="r", states=[SimState(10, 3)]))
    assert names(scheduler.schedule()) == ["r"]
