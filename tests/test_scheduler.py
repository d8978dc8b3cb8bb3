import math

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.model import H3DiT
from h3_core.serving.dit.scheduler import DEFAULT_POLICY, POLICIES, Job, Overloaded, Scheduler
from h3_core.serving.dit.simulate import SimState


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


def steps_of(scheduler, arrivals, boundaries):
    """Step boundaries 0, 1, 2, ... (1 s steps, `boundaries` of them); arrivals[k] join before
    boundary k. Returns {name: [boundaries at which its job was packed]}."""
    packed = {}
    for now in range(boundaries):
        for j in arrivals.get(now, []):
            scheduler.add(j)
        for name in step(scheduler, float(now)):
            packed.setdefault(name, []).append(now)
    return packed


@pytest.mark.parametrize("priority", [0, -100])
@pytest.mark.parametrize("max_wait_s, victim_steps", [(5.0, [6, 11, 16]), (1000.0, None)])
def test_a_stream_of_top_priorities_cannot_hold_a_job_back_past_max_wait_s(priority, max_wait_s, victim_steps):
    """srpt, 2 documents a forward: a priority-100 newcomer of one step arrives at every boundary
    and a priority-100 job of 60 steps takes the other place. The victim (3 steps, arriving at
    0.5 s) outranks neither, so without the longest wait it never runs. With max_wait_s = 5 s
    it is overdue at 5.5 s and first-ranked at boundary 6 (max_wait_s plus less than one step),
    then again 5 s after each of its steps; the newcomers still run at their arrival."""
    scheduler = Scheduler(max_num_seqs=2, max_batch_rows=100, max_waiting=8, max_wait_s=max_wait_s)
    arrivals = {now: [job(f"top{now}", 10, 1, arrival_s=float(now), priority=100)] for now in range(60)}
    arrivals[0].append(job("long", 10, 60, priority=100))
    arrivals[1] = [job("victim", 10, 3, arrival_s=0.5, priority=priority)] + arrivals[1]
    packed = steps_of(scheduler, arrivals, 60)
    assert packed.get("victim") == victim_steps
    assert all(packed[f"top{now}"] == [now] for now in range(60))
    assert len(packed["long"]) == 60 - (3 if victim_steps else 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_longest_wait_holds_under_every_policy(policy):
    """Two priority-1 jobs of 60 steps arrive first; under request the first runs alone, under
    fifo the two fill the 2-document pack, under srpt they outrank the victim. Each job left
    out gets a step max_wait_s = 5 s after its previous one (or its arrival), the longest
    waiting first: the second long job at 5 (request) and the victim at 6, 11 and 16."""
    scheduler = Scheduler(max_num_seqs=2, max_batch_rows=100, max_waiting=8, policy=policy, max_wait_s=5.0)
    first, second = job("first", 10, 60, priority=1), job("second", 10, 60, priority=1)
    packed = steps_of(scheduler, {0: [first, second], 1: [job("victim", 10, 3, arrival_s=0.5)]}, 20)
    assert packed["victim"] == [6, 11, 16]
    gaps = [b - a for name in ("first", "second") for a, b in zip(packed[name], packed[name][1:], strict=False)]
    assert max(gaps) <= 6 and scheduler.line == ([second] if policy == "request" else [])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("max_wait_s, bounded", [(4.0, True), (1000.0, False)])
def test_under_overload_every_wait_stays_within_max_wait_s_plus_one_step_per_live_job(policy, max_wait_s, bounded):
    """Two arrivals at every boundary (priorities 100 and -100, 1-8 steps) keep the scheduler at
    its capacity of 2 + 4 jobs (the rest are refused), so several jobs are overdue at once: a
    job then waits for the ones overdue before it, one step each. Every wait for a step (since
    arrival or the previous step) stays within max_wait_s + (max_num_seqs + max_waiting) steps;
    without the longest wait it does not."""
    scheduler = Scheduler(max_num_seqs=2, max_batch_rows=100, max_waiting=4, policy=policy, max_wait_s=max_wait_s)
    waiting_since, longest = {}, 0.0
    for now in range(200):
        for k, priority in enumerate((100, -100)):
            newcomer = job(f"{now}-{k}", 10 + 40 * k, 1 + (3 * now + k) % 8, arrival_s=float(now), priority=priority)
            try:
                scheduler.add(newcomer)
                waiting_since[newcomer.request_id] = float(now)
            except Overloaded:
                pass
        for name in step(scheduler, float(now)):
            longest = max(longest, now - waiting_since[name])
            waiting_since[name] = float(now)
    longest = max([longest] + [200 - since for name, since in waiting_since.items() if name in names(scheduler.jobs)])
    assert (longest <= 4.0 + 6) == bounded, longest


def test_mixed_sizes_frame_counts_and_step_counts_cobatch():
    dit = H3DiT(get_config("tiny"))
    engine = Engine(
        dit, None, None, limits=RequestLimits(max_height=128, max_width=128, max_num_frames=73, max_steps=30)
    )
    text = torch.zeros(3, dit.cfg.text_dim)
    requests = [
        GenerationRequest("x", 64, 96, 22, 10, seed=1, request_id="a", num_outputs=2),
        GenerationRequest("x", 32, 64, 5, 30, seed=2, request_id="b"),
        GenerationRequest("x", 128, 128, 73, 12, seed=3, request_id="c"),
    ]
    jobs = [
        Job(key=r.request_id, request_id=r.request_id, states=engine.prepare(r, text), arrival_s=0.0) for r in requests
    ]
    # (rows, steps, outputs); srpt's remaining work: b 1,920 < a 2,560 < c 7,680 row-steps
    assert [(j.rows, j.total_steps, len(j.states)) for j in jobs] == [(256, 10, 2), (64, 30, 1), (640, 12, 1)]
    for policy in ("fifo", "srpt"):
        scheduler = Scheduler(max_num_seqs=4, max_batch_rows=960, max_waiting=8, policy=policy)
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
    for max_wait_s in (0.0, math.inf, math.nan):
        with pytest.raises(ValueError) as error:
            Scheduler(4, 100, 8, max_wait_s=max_wait_s)
        assert str(error.value) == f"max_wait_s={max_wait_s} is out of range: allowed finite > 0 seconds"
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
