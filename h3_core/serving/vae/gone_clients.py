"""h3_vae's cancels for clients that are gone, Triton-free.

Triton 2.51 never tells h3_dit that an ensemble request's client left, but every h3_vae request
the ensemble makes after that is marked cancelled; h3_dit sends each silent live request a
heartbeat, so h3_vae sees the request again within a bounded time (docs/reliability.md) and
cancels it by id in the registry through `GoneClients`, as h3_cancel does a client's cancel: no
request travels to h3_dit, whose execute may be busy with a whole generation (execution mode
"request"); the holder reads the cancel at its next step boundary.
"""

import logging
import queue
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable

from h3_core.serving.shared.registry import IDS_REMEMBERED, Registry, record_cancel

log = logging.getLogger("h3_vae")


class GoneClients:
    """Cancels by id the requests whose client is gone, on one thread (execute() never waits for
    the registry), each id once while its request lives (a bounded memory of IDS_REMEMBERED ids,
    each forgotten when its request ends: `forget`, so a later request that reuses the id and is
    abandoned too is cancelled as well), with
    registry.record_cancel: a request live in the DiT is flagged and announced (Registry.cancel),
    so that an h3_dit execute taking several steps ends at its next step boundary and reads the
    flag, and one in execution mode "request" reads it at its next step boundary.

    Args:
        registry: the server's Registry (or an object with its `cancel(request_id)`).
        log_line: log_line(text) writes one line to the server log; it runs under `lock` (a stub
            call in h3_vae). A cancel that fails is logged and the next one is made all the same.
        lock: h3_vae's stub_lock.
    """

    def __init__(self, registry: Registry, log_line: Callable[[str], None], lock: threading.Lock):
        self.registry, self.log_line, self.lock = registry, log_line, lock
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="h3_vae-gone-clients", daemon=True)
        self.thread.start()

    def cancel(self, request_id: str) -> None:
        """Queue the cancel of `request_id` (ignored when empty or already queued once)."""
        if request_id and request_id not in self.cancelled:
            self.cancelled[request_id] = None
            while len(self.cancelled) > IDS_REMEMBERED:
                self.cancelled.popitem(last=False)
            self.queue.put(request_id)

    def forget(self, request_id: str) -> None:
        """The request `request_id` ended (its last response passed h3_vae): a later cancel of the
        id is queued again."""
        self.cancelled.pop(request_id, None)

    def _run(self) -> None:
        while (request_id := self.queue.get()) is not None:
            try:
                state = record_cancel(self.registry, request_id)
                with self.lock:
                    self.log_line(f"h3_vae: request {request_id}: its client is gone; cancel by id: {state}")
            except Exception:  # noqa: BLE001 - one failed cancel must not stop the later ones
                self._log_failure(request_id, traceback.format_exc())

    def _log_failure(self, request_id: str, trace: str) -> None:
        """Log a failed cancel in the server log; if even that fails, in Python's log."""
        try:
            with self.lock:
                self.log_line(f"h3_vae: cancel of request {request_id} (client gone) failed:\n{trace}")
        except Exception:  # noqa: BLE001 - the server log itself failed
            log.exception("cancel of request %s (client gone) failed:\n%s", request_id, trace)

    def close(self) -> None:
        """Stop the thread after the cancels queued so far (waits up to 10 s)."""
        self.queue.put(None)
        self.thread.join(timeout=10)
