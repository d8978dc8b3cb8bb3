"""A pool of worker threads that keeps order per key: tasks with the same key run one at a time,
in submission order; tasks with different keys run in parallel on up to `workers` threads.

h3_vae decodes on it (key: the request id), so one request's outputs leave in order while
different requests' decodes overlap, and the model's execute() returns at once (progress and
early ends pass through without waiting for any decode). Triton-free.
"""

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class OrderedPool:
    """Run submitted callables on `workers` daemon threads (workers >= 1; ValueError otherwise).
    Tasks handle their own errors: one that raises is logged (logger h3_core.serving.vae.ordered_pool) and
    the pool keeps running."""

    def __init__(self, workers: int, name: str = "ordered-pool"):
        if workers < 1:
            raise ValueError(f"workers={workers} is out of range: allowed >= 1")
        self.pending: OrderedDict[str, deque] = OrderedDict()  # key -> its tasks not started, oldest key first
        self.running: set[str] = set()  # keys with a task running now
        self.condition = threading.Condition()
        self.closed = False
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self.threads:
            thread.start()

    def submit(self, key: str, task: Callable[[], None]) -> None:
        """Queue `task` behind the earlier tasks of `key`. Raises RuntimeError after close()."""
        with self.condition:
            if self.closed:
                raise RuntimeError("the pool is closed")
            self.pending.setdefault(key, deque()).append(task)
            self.condition.notify()

    def _next(self) -> tuple[str, Callable[[], None]] | None:
        """The oldest key with a task and none running, and its first task (under the lock)."""
        for key, tasks in self.pending.items():
            if key not in self.running:
                task = tasks.popleft()
                if not tasks:
                    del self.pending[key]
                self.running.add(key)
                return key, task
        return None

    def _work(self) -> None:
        while True:
            with self.condition:
                while (item := self._next()) is None:
                    if self.closed:
                        return
                    self.condition.wait()
            key, task = item
            try:
                task()
            except Exception:  # noqa: BLE001 - logged; the worker lives on
                log.exception("task of %s failed", key)
            finally:
                with self.condition:
                    self.running.discard(key)
                    self.condition.notify_all()

    def close(self) -> None:
        """Run the queued tasks, then stop the threads (returns when they have)."""
        with self.condition:
            self.closed = True
            self.condition.notify_all()
        for thread in self.threads:
            thread.join()
