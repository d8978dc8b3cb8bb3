"""h3_vae's cancels for clients that are gone, Triton-free (the adapter injects the send).

Triton 2.51 never tells h3_dit that an ensemble request's client left, but every h3_vae request
the ensemble makes after that is marked cancelled; h3_dit sends each silent live request a
heartbeat, so h3_vae sees the request again within a bounded time (docs/reliability.md) and
cancels it by id on h3_dit through `GoneClients`.
"""

import logging
import queue
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable

from .registry import IDS_REMEMBERED, Registry

log = logging.getLogger("h3_vae")


class GoneClients:
    """Cancels by id, on h3_dit, the requests whose client is gone, on one thread (execute()
    never waits for them), each id once (a bounded memory of IDS_REMEMBERED ids). Each cancel is
    announced in `registry` first (outside `lock`: no stub call), so that an h3_dit execute taking
    several steps ends at its next step boundary and takes it in.

    Args:
        registry: the server's Registry (or an object with its `announce()`).
        send_cancel: send_cancel(request_id) sends the cancel and waits for its answer; it
            touches the Triton stub, so it runs under `lock`. An exception it raises is logged
            and the next cancel is sent all the same.
        log_line: log_line(text) writes one line to the server log (under `lock`: it is a stub
            call in h3_vae).
        lock: h3_vae's stub_lock.
    """

    def __init__(
        self,
        registry: Registry,
        send_cancel: Callable[[str], None],
        log_line: Callable[[str], None],
        lock: threading.Lock,
    ):
        self.registry, self.send_cancel, self.log_line, self.lock = registry, send_cancel, log_line, lock
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

    def _run(self) -> None:
        while (request_id := self.queue.get()) is not None:
            try:
                self.registry.announce()
                with self.lock:
                    self.send_cancel(request_id)
                    self.log_line(f"h3_vae: request {request_id}: its client is gone; cancelled")
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
