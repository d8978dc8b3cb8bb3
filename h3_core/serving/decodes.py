"""h3_vae's open decodes and their keep-alives, Triton-free (the adapter injects the stub calls).

A result reaches h3_vae as one request whose decode may wait for a worker and then run for
seconds (a 256 x 256 x 121 clip: about 7 s on the CPU). Nothing reaches the client meanwhile, and a
proxy in front of the server cuts a stream that carries no data for its idle timeout (nginx's
gRPC proxy: 60 s; HTTP/2 pings do not count, they are hop by hop). `Decodes` keeps every open
decode and sends each a keep-alive response after `heartbeat_s` seconds without a response,
from one thread, under h3_vae's stub lock.
"""

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("h3_vae")


@dataclass(eq=False)
class Decode:
    """One open decode: request_id (the client's request), reply (the adapter's sender, opaque
    here), keepalive (the request's `keepalive` parameter), last_sent (clock seconds of the last
    response sent for it; its arrival at first), running (a worker decodes it; False: queued)."""

    request_id: str
    reply: Any
    keepalive: bool
    last_sent: float
    running: bool = False


class Decodes:
    """The open decodes of h3_vae and their keep-alive thread. Every method but close() is called
    with `lock` held (h3_vae's stub_lock), and the thread takes it for its sends, so that a
    keep-alive never follows the request's final flag: the adapter removes a decode (`finish`)
    under the lock before it sends that flag.

    Args:
        lock: h3_vae's stub_lock.
        heartbeat_s: seconds without a response after which a decode with keepalive on gets a
            keep-alive (VaeSettings.heartbeat_s).
        send_keepalive: send_keepalive(decode) sends one keep-alive response on decode.reply
            (under `lock`). If it raises, the error is logged and that decode gets no more
            keep-alives; the others go on.
        log_line: log_line(text) writes one line to the server log (under `lock`).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        lock: threading.Lock,
        heartbeat_s: float,
        send_keepalive: Callable[[Decode], None],
        log_line: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.lock, self.heartbeat_s, self.clock = lock, heartbeat_s, clock
        self.send_keepalive, self.log_line = send_keepalive, log_line
        self.open: list[Decode] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="h3_vae-keepalive", daemon=True)
        self.thread.start()

    def add(self, request_id: str, reply, keepalive: bool) -> Decode:
        """Open a queued decode (under `lock`)."""
        decode = Decode(request_id, reply, keepalive, self.clock())
        self.open.append(decode)
        return decode

    def start(self, decode: Decode) -> None:
        """A worker took `decode` (under `lock`)."""
        decode.running = True

    def finish(self, decode: Decode) -> None:
        """Close `decode`: no keep-alive is sent for it after this (under `lock`)."""
        self.open.remove(decode)

    def counts(self) -> tuple[int, int]:
        """(queued, running) open decodes (under `lock`)."""
        running = sum(decode.running for decode in self.open)
        return len(self.open) - running, running

    def keep_alive(self) -> float:
        """Send a keep-alive to each open decode with keepalive on that got no response for
        heartbeat_s seconds (under `lock`). Returns the seconds until the next one is due
        (heartbeat_s when none is open)."""
        now, due = self.clock(), self.heartbeat_s
        for decode in [decode for decode in self.open if decode.keepalive]:
            if now - decode.last_sent >= self.heartbeat_s:
                try:
                    self.send_keepalive(decode)
                except Exception:  # noqa: BLE001 - this decode's keep-alives stop; the others go on
                    decode.keepalive = False
                    self.log_line(
                        f"h3_vae: a keep-alive of request {decode.request_id} could not be sent:\n"
                        f"{traceback.format_exc()}"
                    )
                    continue
                decode.last_sent = now
            due = min(due, decode.last_sent + self.heartbeat_s - now)
        return due

    def _run(self) -> None:
        due = self.heartbeat_s
        while not self.closed.wait(max(due, 0.001)):
            try:
                with self.lock:
                    due = self.keep_alive()
            except Exception:  # noqa: BLE001 - the thread lives on (the server log itself failed)
                log.exception("keep-alive round failed")
                due = self.heartbeat_s

    def close(self) -> None:
        """Stop the keep-alive thread (waits up to 10 s)."""
        self.closed.set()
        self.thread.join(timeout=10)
