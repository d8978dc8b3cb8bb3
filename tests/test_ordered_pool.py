"""h3_core.serving.vae.ordered_pool: one key's tasks in order, different keys in parallel."""

import threading

import pytest

from h3_core.serving.vae.ordered_pool import OrderedPool


def test_one_keys_tasks_run_in_order_while_another_key_runs_beside_them():
    pool, done, gate = OrderedPool(2), [], threading.Event()
    pool.submit("a", lambda: (gate.wait(10), done.append("a0")))  # holds one worker until b has run
    pool.submit("a", lambda: done.append("a1"))
    pool.submit("b", lambda: (done.append("b0"), gate.set()))
    pool.close()
    assert done == ["b0", "a0", "a1"]


def test_a_failing_task_does_not_stop_the_pool(caplog):
    pool, done = OrderedPool(1), []
    pool.submit("a", lambda: 1 / 0)
    pool.submit("a", lambda: done.append("after"))
    pool.close()
    assert done == ["after"] and "task of a failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_bad_worker_counts_and_closed_pools_are_refused():
    with pytest.raises(ValueError, match=r"^workers=0 is out of range: allowed >= 1$"):
        OrderedPool(0)
    pool = OrderedPool(1)
    pool.close()
    with pytest.raises(RuntimeError, match="^the pool is closed$"):
        pool.submit("a", lambda: None)
