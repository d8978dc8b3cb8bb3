"""The requests of every h3_dit instance of one server, shared through one JSON file under a
file lock: which request ids are live and on which instance, cancels by id, ids that finished
recently, and each instance's load. Triton-free.

Why: with several DiT instances (one per GPU) a cancel-by-id control request lands on any one
of them, so the answer and the effect must not depend on where it lands; and h3_encoder refuses
newcomers early when every instance is full (Triton's backlog in front of the DiT is unbounded
and invisible). Every operation reads, changes and writes the file under an exclusive fcntl
lock, so an answer is always consistent with what the holder of the request does:

- cancel(id): live on any instance -> "cancelled" (flag set; the holder ends it with CANCELLED
  at its next step boundary, or instead of its result if the flag lands during its last step);
  finished within EARLY_CANCEL_SECONDS -> "finished" (nothing changes); otherwise "unknown",
  remembered for EARLY_CANCEL_SECONDS so a request with that id that arrives then is cancelled
  before it starts. A finished id is never planted.
- admit(id): refused when the id is live anywhere; True when an early cancel was waiting for it.
- boundary(ids): the live ids of this instance whose cancel flag is set.
- finish(id, load): forget a live id, remember it as finished, publish the instance's load without
  it; True when its cancel flag was set.

Announcements: a cheap signal that something new is headed for the DiT, so that an execute()
stops taking steps (h3_core.serving.step_loop.StepLoop.another_step) when a newcomer or a control request
waits for the next one. h3_encoder announces every generation request it passes on, h3_vae
before it sends a cancel control request for a gone client, and cancel() when it flags a request
live on another instance (that instance reads the flag at its next execute). `announce()` adds to
a counter and stamps the time (this registry's clock; cancel() adds to the counter alone, as
nothing travels) in ANNOUNCEMENTS_FILE: 16 bytes rewritten under the lock, so no announcement is
lost (no mtime granularity) and the storage stays bounded. `announcements()` and
`seconds_since_announcement()` read it without the lock (one pread, a few microseconds: the DiT
asks at every step boundary). A read that races a write may see a mix of the two values: any
value other than the one the execute started with stops it, and one equal to it is corrected by
the next read, one step later.

The folder is one per tritonserver process (the model stubs are its children and share
os.getppid()): `<tmp>/h3-triton-<server pid>-<its start time>/registry.json`, removed when the
last DiT instance leaves; its memories are bounded by IDS_REMEMBERED and EARLY_CANCEL_SECONDS,
ids by protocol.MAX_REQUEST_ID_CHARS (checked in the step loop).
"""

import fcntl
import json
import math
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from ..protocol import EARLY_CANCEL_SECONDS
from .scheduler import DitLoad

IDS_REMEMBERED = 1024  # bound on each memory of ids (early cancels, finished ids)
ANNOUNCEMENTS_FILE = "announcements"  # beside registry.json
ANNOUNCEMENT = struct.Struct("<Qd")  # how many announcements so far, the registry clock at the last one


def server_folder(server_pid: int | None = None) -> Path:
    """The shared folder of the tritonserver with pid `server_pid` (None: the calling model
    stub's parent, the server): `<tmp>/h3-triton-<pid>-<its start time in clock ticks>`, so a
    later process that reuses the pid never meets a dead server's ids."""
    pid = os.getppid() if server_pid is None else server_pid
    started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22, starttime
    return Path(tempfile.gettempdir()) / f"h3-triton-{pid}-{started}"


class Registry:
    """The shared registry in `folder` as seen by DiT instance `instance` ("" for a reader
    such as the encoder). clock: wall seconds (time.time; instances share it)."""

    def __init__(self, folder: Path, instance: str = "", clock: Callable[[], float] = time.time):
        self.folder, self.instance, self.clock = Path(folder), instance, clock
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "registry.json"

    @contextmanager
    def _lock(self):
        """The registry's exclusive lock, held for the block."""
        self.folder.mkdir(parents=True, exist_ok=True)  # again: the last DiT instance to leave removes it
        with open(self.folder / "registry.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def _state(self, write: bool = True):
        """The registry's content under the lock, expired memories dropped; written back when
        `write`."""
        with self._lock():
            try:
                state = json.loads(self.path.read_text()) if self.path.exists() else {}
            except ValueError:
                state = {}
            for name in ("live", "cancels", "finished", "loads"):
                state.setdefault(name, {})
            now = self.clock()
            for name in ("cancels", "finished"):
                kept = sorted((t, k) for k, t in state[name].items() if now - t < EARLY_CANCEL_SECONDS)[
                    -IDS_REMEMBERED:
                ]
                state[name] = {k: t for t, k in kept}
            yield state, now
            if write:
                temporary = self.path.with_suffix(".tmp")
                temporary.write_text(json.dumps(state))
                os.replace(temporary, self.path)

    def cancel(self, request_id: str) -> str:
        """Cancel by id; returns one of protocol.CANCEL_STATES (see the module docstring). A
        request live on another instance is announced: its holder reads the flag at its next
        execute, which the announcement brings forward."""
        with self._state() as (state, now):
            if request_id in state["live"]:
                state["cancels"][request_id] = now
                if state["live"][request_id] != self.instance:
                    self._add_announcements(1, stamp=False)  # nothing travels: the flag is here already
                return "cancelled"
            if request_id in state["finished"]:
                return "finished"
            state["cancels"][request_id] = now
            return "unknown"

    def admit(self, request_id: str) -> bool:
        """Register a newcomer's id on this instance. Returns True when a cancel was waiting for
        it (the id is then not registered: the request ends before it starts). Raises ValueError
        when the id is live on some instance."""
        with self._state() as (state, now):
            if request_id in state["live"]:
                raise ValueError(f"request id {request_id!r} is already running; ids must be unique")
            if state["cancels"].pop(request_id, None) is not None:
                state["finished"][request_id] = now
                return True
            state["live"][request_id] = self.instance
            return False

    def boundary(self, request_ids: list[str], load: DitLoad) -> set[str]:
        """At a step boundary: publish this instance's load; return which of its live ids have
        been cancelled."""
        with self._state() as (state, _):
            state["loads"][self.instance] = asdict(load)
            return {request_id for request_id in request_ids if request_id in state["cancels"]}

    def finish(self, request_id: str, load: DitLoad | None = None) -> bool:
        """Forget a live id of this instance and remember it as finished; publish `load` (this
        instance's load without the request) when given, so that the encoder's refusal does not
        wait for the next execute. Returns whether its cancel flag was set."""
        with self._state() as (state, now):
            state["live"].pop(request_id, None)
            if load is not None:
                state["loads"][self.instance] = asdict(load)
            state["finished"][request_id] = now
            return state["cancels"].pop(request_id, None) is not None

    def leave(self) -> None:
        """This instance stops (model unload): its load and live ids are removed; the last
        instance to leave removes the registry's files."""
        with self._state() as (state, _):
            state["loads"].pop(self.instance, None)
            state["live"] = {k: v for k, v in state["live"].items() if v != self.instance}
            last = not state["loads"]
        if last:
            shutil.rmtree(self.folder, ignore_errors=True)

    def announce(self, count: int = 1) -> None:
        """Announce `count` requests headed for the DiT (see the module docstring)."""
        with self._lock():
            self._add_announcements(count)

    def _add_announcements(self, count: int, stamp: bool = True) -> None:
        """Add `count` to the counter and, with `stamp`, record the time (a request is on its
        way); the caller holds the lock."""
        fd = os.open(self.folder / ANNOUNCEMENTS_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            total, last = self._unpack(os.pread(fd, ANNOUNCEMENT.size, 0))
            os.pwrite(fd, ANNOUNCEMENT.pack(total + count, self.clock() if stamp else last), 0)
        finally:
            os.close(fd)

    def _read_announcements(self) -> tuple[int, float]:
        """(announcements so far, registry clock at the last one), without the lock; (0, -inf)
        before the first one."""
        try:
            fd = os.open(self.folder / ANNOUNCEMENTS_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return 0, -math.inf
        try:
            return self._unpack(os.pread(fd, ANNOUNCEMENT.size, 0))
        finally:
            os.close(fd)

    @staticmethod
    def _unpack(data: bytes) -> tuple[int, float]:
        return ANNOUNCEMENT.unpack(data) if len(data) == ANNOUNCEMENT.size else (0, -math.inf)

    def announcements(self) -> int:
        """How many announcements were made in this server so far (no lock; microseconds)."""
        return self._read_announcements()[0]

    def seconds_since_announcement(self) -> float:
        """Seconds on this registry's clock since the last announcement of a request on its way
        (announce(); inf before the first)."""
        return self.clock() - self._read_announcements()[1]

    def refusal(self) -> str | None:
        """The UNAVAILABLE message when every DiT instance that reported is full (the emptiest
        one's), else None (also when none has reported yet)."""
        with self._state(write=False) as (state, _):
            loads = [DitLoad(**load) for load in state["loads"].values()]
        if not loads or not all(load.full for load in loads):
            return None
        return min(loads, key=lambda load: load.held).message()
