"""h3_vae's open decodes and their keep-alives, Triton-free (the adapter injects the stub calls).

A result reaches h3_vae as one request whose decode may wait for a worker and then run for
seconds (a 256 x 256 x 121 clip: about 7 s on the CPU). Nothing reaches the client meanwhile, and a
proxy in front of the server cuts a stream that carries no data for its idle timeout (nginx's
gRPC proxy: 60 s; HTTP/2 pings do not count, they are hop by hop). `Decodes` keeps every open
decode and sends each a keep-alive response after `heartbeat_s` seconds without a response,
from one thread, under h3_vae's stub lock. It also bounds the decodes a server holds
(`max_queued_decodes` waiting beyond the `decode_workers` running: a result beyond that is refused
at once, `BacklogFull`) and counts them for the gauge h3_vae_decodes{state="queued"|"running"},
which a stop waits for (server.drain, TritonServer.drain).
"""

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from h3_core.config import (
    AUDIO_CHANNELS,
    AUDIO_LATENT_CHANNELS,
    VIDEO_LATENT_CHANNELS,
    VIDEO_SPATIAL_DOWNSAMPLE,
    audio_latent_frames,
    latent_frames,
)
from h3_core.diffusion.request import RequestLimits, check_canvas
from h3_core.protocol import AUDIO_LATENT, VIDEO_LATENT

log = logging.getLogger("h3_vae")


class BacklogFull(Exception):
    """A result arrived while decode_workers + max_queued_decodes decodes were open."""


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
        workers, max_queued: VaeSettings.decode_workers and max_queued_decodes; `add` refuses a
            decode while workers + max_queued are open.
        heartbeat_s: seconds without a response after which a decode with keepalive on gets a
            keep-alive (VaeSettings.heartbeat_s).
        send_keepalive: send_keepalive(decode) sends one keep-alive response on decode.reply
            (under `lock`). If it raises, the error is logged and that decode gets no more
            keep-alives; the others go on.
        log_line: log_line(text) writes one line to the server log (under `lock`).
        publish: publish(queued, running) after every change of `counts()` (under `lock`).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        lock: threading.Lock,
        workers: int,
        max_queued: int,
        heartbeat_s: float,
        send_keepalive: Callable[[Decode], None],
        log_line: Callable[[str], None],
        publish: Callable[[int, int], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.lock, self.workers, self.max_queued = lock, workers, max_queued
        self.heartbeat_s, self.clock = heartbeat_s, clock
        self.send_keepalive, self.log_line, self.publish = send_keepalive, log_line, publish
        self.open: list[Decode] = []
        self.closed, self.wake = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="h3_vae-keepalive", daemon=True)
        self.thread.start()

    def add(self, request_id: str, reply, keepalive: bool, silent_s: float = 0.0) -> Decode:
        """Open a queued decode (under `lock`). silent_s: seconds since the client last got a
        response for the request (the DiT's result INFO "silent_s"; taken within 0..heartbeat_s),
        so its first keep-alive comes heartbeat_s after that response, not after the result's
        arrival here. Raises BacklogFull, naming the count and the settings, while workers +
        max_queued decodes are open."""
        if len(self.open) >= self.workers + self.max_queued:
            raise BacklogFull(
                f"the decode backlog is full: {len(self.open)} decodes open, decode_workers + max_queued_decodes "
                f"= {self.workers} + {self.max_queued}"
            )
        decode = Decode(request_id, reply, keepalive, self.clock() - min(max(silent_s, 0.0), self.heartbeat_s))
        self.open.append(decode)
        self.publish(*self.counts())
        self.wake.set()  # the thread's next round may be due sooner
        return decode

    def start(self, decode: Decode) -> None:
        """A worker took `decode` (under `lock`)."""
        decode.running = True
        self.publish(*self.counts())

    def finish(self, decode: Decode) -> None:
        """Close `decode`: no keep-alive is sent for it after this (under `lock`)."""
        self.open.remove(decode)
        self.publish(*self.counts())

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
        while True:
            self.wake.wait(max(due, 0.001))  # a round when one is due, or when a decode is added
            self.wake.clear()
            if self.closed.is_set():
                return
            try:
                with self.lock:
                    due = self.keep_alive()
            except Exception:  # noqa: BLE001 - the thread lives on (the server log itself failed)
                log.exception("keep-alive round failed")
                due = self.heartbeat_s

    def close(self) -> None:
        """Stop the keep-alive thread (waits up to 10 s)."""
        self.closed.set()
        self.wake.set()
        self.thread.join(timeout=10)


RESULT_FIELDS = ("height", "width", "num_frames")


def check_result(info: dict, video_shape: tuple, audio_shape: tuple, limits: RequestLimits) -> None:
    """Check a response with latents before its decode: INFO a result of integer height, width
    (pixels) and num_frames within `limits` (h3_vae's own: INFO can be forged by a direct
    caller), video latent [1, 24, latent_frames(num_frames), height / 16, width / 16] and audio
    latent [1, 2, 32, audio_latent_frames(num_frames)]. Raises ValueError naming the field and
    its allowed range, or the latent and the shape it needs."""
    if info["kind"] != "result" or any(type(info.get(name)) is not int for name in RESULT_FIELDS):
        raise ValueError(f"INFO of a response with latents must be a result holding integers {list(RESULT_FIELDS)}")
    height, width, num_frames = (info[name] for name in RESULT_FIELDS)
    check_canvas(height, width, num_frames, limits)
    cell = VIDEO_SPATIAL_DOWNSAMPLE
    needed = {
        VIDEO_LATENT: (1, VIDEO_LATENT_CHANNELS, latent_frames(num_frames), height // cell, width // cell),
        AUDIO_LATENT: (1, AUDIO_CHANNELS, AUDIO_LATENT_CHANNELS, audio_latent_frames(num_frames)),
    }
    for name, shape in ((VIDEO_LATENT, video_shape), (AUDIO_LATENT, audio_shape)):
        if tuple(shape) != needed[name]:
            raise ValueError(
                f"{name} is {list(shape)}; height={height}, width={width}, num_frames={num_frames} need "
                f"{list(needed[name])}"
            )
