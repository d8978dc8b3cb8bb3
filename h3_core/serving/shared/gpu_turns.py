"""Turns on one GPU between h3_dit's packed steps and h3_vae's decode tiles, across processes.

Two processes computing on one GPU time-slice it: a decode beside a DiT instance made that
instance's steps 2.1x slower while it ran (docs/multi_gpu.md). With turns the two never compute at
once. The DiT instance holds the GPU's turn for each packed step, from its launch until the device
has finished it (`GpuTurns.step`). h3_vae decodes in tiles (h3_core.model.vae.DECODE_TILE_LATENTS
latent frames each) and takes the turn for its tiles in the gaps between steps (`GpuTurns.tiles`).

While a DiT instance waits for the turn, h3_vae gives it up after the tile in which its turn reached
`share` x the last step's seconds (at least one tile per turn), so a waiting step is delayed by at
most that plus one tile. While h3_vae waits for the turn, a DiT instance about to step lets it take
the turn first, so that a DiT stepping without pause leaves h3_vae one turn between any two steps
(a lock alone would let the DiT take it back at once). While no DiT instance waits, tiles follow one
another at full speed. A step therefore costs (1 + about `share`) x its time while
a decode runs, and a decode takes at least about one step while the DiT steps without pause (its
own time / `share` when that is longer; docs/deploy_h200.md measures both).

The turn is an exclusive flock on <folder>/gpu-<uuid>.turn, where <folder> is the server's shared
folder (h3_core.serving.shared.registry.server_folder) and <uuid> the GPU's, so that every process of the
server that names the GPU, under any index, meets the same lock. A DiT instance waiting for the turn
holds a shared flock on gpu-<uuid>.want, h3_vae waiting for it one on gpu-<uuid>.tiles-want. The
turn file holds the last step's seconds (a little-endian float64) and how many turns the DiT
instances and h3_vae have taken (two uint64), each written by the holder of the turn. The kernel
drops a dead process's flocks, so a crash on one side never blocks the other.

Waits are bounded, logged and never poll: a waiting side blocks in flock(2) on a helper thread of
its own open of the file while it waits on a condition with a deadline (`TurnClock`), which
`stop()` also ends. A DiT step waits at most `wait_limit_s` for the turn (h3_dit passes
max_sequence_idle / TURN_WAIT_FRACTION: server.sizing counts that wait in the idle timeout), h3_vae
at most TILES_WAIT_LIMIT_S; then the work runs without the turn (time-slicing the GPU) and a warning
is logged. Such a timeout is remembered until the other side is seen taking a turn (its count in
the turn file moves) or the turn is found free: until then each step (or tile) takes the turn only
if it is free at once, so a stuck h3_vae costs one wait, not one per step.
"""

import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch

# of the last step's seconds: a turn while a DiT step waits; with the tile that ends the turn, a
# waiting step is delayed about 5 % at most (docs/deploy_h200.md)
DEFAULT_SHARE = 0.04
# A DiT step waits at most max_sequence_idle / TURN_WAIT_FRACTION for its turn (h3_dit's wait_limit_s),
# so that an execute holding that wait and its steps stays within the idle timeout (server.sizing):
# 15 s at the 60 s floor, far above a turn (0.04 x a step of seconds) and above a hook VAE's
# whole-clip decode, which is one tile.
TURN_WAIT_FRACTION = 4
# Seconds h3_vae waits for the turn before a tile runs without it (an h3_dit step stuck): a step
# holds the turn for one step only, a few seconds for the largest sized pack (server.sizing).
TILES_WAIT_LIMIT_S = 60.0
# Seconds h3_vae, having given the turn up to a waiting step, waits at least for that step to take
# it before asking again (at most two steps' time: with two DiT instances a step may always wait).
HANDOVER_MIN_S = 1.0
_TURN_FILE = struct.Struct("<dQQ")  # last step's seconds, turns taken by DiT steps, turns taken by h3_vae
SIDES = ("step", "tiles")
log = logging.getLogger("h3_dit")


def gpu_key(device: str | torch.device) -> str:
    """The name of CUDA device `device`'s turn files: its UUID (torch.cuda.get_device_properties).
    Raises ValueError for a device that is not a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"GPU turns need a CUDA device, got {device}")
    return str(torch.cuda.get_device_properties(device).uuid)


class TurnClock:
    """The clock of the turns' deadlines: time.monotonic, and a wait on a condition until a
    predicate holds or a deadline passes (threading.Condition.wait_for). Tests pass a fake one."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.monotonic()

    def wait(self, condition: threading.Condition, predicate: Callable[[], bool], deadline: float) -> bool:
        """Wait (holding `condition`) until predicate() or now() >= deadline; returns predicate()."""
        return condition.wait_for(predicate, max(0.0, deadline - self.now()))


class GpuTurns:
    """One process's side of the turns on one GPU (module docstring).

    Args:
        folder: the server's shared folder (created if missing).
        key: the GPU's name in the file names (gpu_key(device) on a GPU).
        share: the fraction of the last step's seconds that a turn of `tiles` may last while a
            DiT instance waits (h3_vae's turn_share, checked by VaeSettings: finite, > 0).
        synchronize: waits until the device has finished the work queued so far (on a GPU
            torch.cuda.synchronize of its device); called after every tile and before every
            turn is given up (an error it raises is raised after the turn is given up).
        wait_limit_s: seconds a step (or a tile) waits for the turn before it runs without it.
        clock: the deadlines' clock (TurnClock).

    One DiT process per GPU (what the writer places) gets h3_vae one turn between any two steps;
    with two, h3_vae waits at most for the step that holds the turn and one that was already
    blocked on it (tests/test_gpu_turns.py).

    Raises OSError when the files cannot be opened.
    """

    def __init__(
        self,
        folder: str | Path,
        key: str,
        share: float,
        synchronize: Callable[[], None],
        wait_limit_s: float = TILES_WAIT_LIMIT_S,
        clock: TurnClock | None = None,
    ):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.share, self.synchronize, self.wait_limit_s = share, synchronize, wait_limit_s
        self.clock = clock or TurnClock()
        self.paths = {name: folder / f"gpu-{key}.{name}" for name in ("turn", "want", "tiles-want")}
        self.turn, self.want, self.tiles_want = (
            os.open(path, os.O_RDWR | os.O_CREAT, 0o600) for path in self.paths.values()
        )
        self.tiling = threading.Lock()  # one decode of this process takes turns at a time
        self.wake = threading.Condition()  # a helper took a lock, or stop()
        self.stopped = False
        self.holding: int | None = None  # the open file that holds the turn (tiles)
        self.since = 0.0
        # after a timeout: the other side's count of turns then (remembered until it moves)
        self.timed_out_at: dict[str, int | None] = {side: None for side in SIDES}

    @property
    def held(self) -> bool:
        """Whether this process's decode holds the turn now."""
        return self.holding is not None

    @classmethod
    def on_device(
        cls,
        folder: str | Path,
        device: str | torch.device,
        share: float = DEFAULT_SHARE,
        wait_limit_s: float = TILES_WAIT_LIMIT_S,
    ) -> "GpuTurns":
        """The turns of CUDA device `device` (gpu_key), synchronizing that device."""
        device = torch.device(device)
        return cls(folder, gpu_key(device), share, lambda: torch.cuda.synchronize(device), wait_limit_s)

    def stop(self) -> None:
        """End every wait at once, now and later (model unload, drain): work runs without the turn."""
        with self.wake:
            self.stopped = True
            self.wake.notify_all()

    def close(self) -> None:
        """stop(), and close the files (giving up any turn held)."""
        self.stop()
        if self.holding is not None:
            os.close(self.holding)
            self.holding = None
        for fd in (self.turn, self.want, self.tiles_want):
            os.close(fd)

    def _read(self) -> tuple[float, int, int]:
        data = os.pread(self.turn, _TURN_FILE.size, 0)
        return _TURN_FILE.unpack(data) if len(data) == _TURN_FILE.size else (0.0, 0, 0)

    def last_step_s(self) -> float:
        """Seconds of the last step a DiT instance took on this GPU (0.0 before the first)."""
        return self._read()[0]

    def turns_taken(self, side: str) -> int:
        """How many turns `side` ("step": the DiT instances, "tiles": h3_vae) has taken on this GPU."""
        return self._read()[1 + SIDES.index(side)]

    def _record(self, side: str, step_s: float | None = None) -> None:
        """Count a turn of `side` (and store a step's seconds); the caller holds the turn."""
        values = list(self._read())
        values[1 + SIDES.index(side)] += 1
        if step_s is not None:
            values[0] = step_s
        os.pwrite(self.turn, _TURN_FILE.pack(*values), 0)

    def dit_waiting(self) -> bool:
        """Whether a DiT instance waits for the turn now."""
        return _held_by_others(self.want)

    def tiles_waiting(self) -> bool:
        """Whether h3_vae waits for the turn now."""
        return _held_by_others(self.tiles_want)

    def _lock(self, name: str, deadline: float) -> int | None:
        """An open of file `name` holding an exclusive flock on it, taken before `deadline` (on
        self.clock) unless stop() was called; None otherwise. No polling: a helper thread blocks
        in flock(2) and, when it gets the lock after the caller gave up, closes the file."""
        fd = os.open(self.paths[name], os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        if self.stopped or self.clock.now() >= deadline:  # no wait: no helper left blocked behind
            os.close(fd)
            return None
        state = {"taken": False, "abandoned": False}

        def take() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self.wake:
                if state["abandoned"]:
                    os.close(fd)
                else:
                    state["taken"] = True
                    self.wake.notify_all()

        threading.Thread(target=take, name=f"gpu-turns-{name}", daemon=True).start()
        with self.wake:
            if self.clock.wait(self.wake, lambda: state["taken"] or self.stopped, deadline) and state["taken"]:
                return fd
            if state["taken"]:  # stopped as it came
                os.close(fd)
            else:
                state["abandoned"] = True
            return None

    def _wait_for_other(self, name: str, deadline: float) -> None:
        """Wait (bounded) until nobody holds a shared flock on `name` (the other side, waiting,
        has taken the turn and let go of its want file)."""
        fd = self._lock(name, deadline)
        if fd is not None:
            os.close(fd)

    def _take(self, side: str, want: int, other_want: str | None) -> int | None:
        """The turn for `side`: announce it (a shared flock on `want`), first let the other side,
        when it waits (`other_want` given), take the turn, then take it. Waits at most
        wait_limit_s, or not at all while a remembered timeout holds (module docstring); logs a
        timeout. Returns the open file holding the turn, or None (run without it)."""
        other = SIDES[1 - SIDES.index(side)]
        stuck = self.timed_out_at[side] is not None and self.timed_out_at[side] == self.turns_taken(other)
        deadline = self.clock.now() + (0.0 if stuck else self.wait_limit_s)
        fcntl.flock(want, fcntl.LOCK_SH)
        try:
            if other_want is not None and not stuck:
                self._wait_for_other(other_want, deadline)
            fd = self._lock("turn", deadline)
        finally:
            fcntl.flock(want, fcntl.LOCK_UN)
        if fd is not None:
            self.timed_out_at[side] = None
        elif not stuck and not self.stopped:
            self.timed_out_at[side] = self.turns_taken(other)
            who = "h3_vae stuck in a decode?" if side == "step" else "an h3_dit step stuck?"
            what = "steps run" if side == "step" else "tiles run"
            log.warning(
                "GPU turns: the turn was not given in %g s (%s): %s without it until it is free again",
                self.wait_limit_s,
                who,
                what,
            )
        return fd

    @contextmanager
    def step(self, timed: bool = True) -> Iterator[None]:
        """The DiT's side: hold the turn for one packed step (or, with timed False, other device
        work of the step loop, such as the step cache's plan). Waits (announcing itself in the
        want file) for the turn, letting a waiting h3_vae take it first; on leaving, waits for
        the device to finish, stores the step's seconds (turn taken to device done; timed only)
        and gives the turn up, also when the block raised. Without the turn (module docstring:
        a bounded wait) the block runs without it."""
        fd = self._take("step", self.want, "tiles-want")
        start = time.perf_counter()
        try:
            yield
        finally:
            try:
                self.synchronize()
                if fd is not None:
                    self._record("step", time.perf_counter() - start if timed else None)
            finally:
                if fd is not None:
                    os.close(fd)

    @contextmanager
    def tiles(self) -> Iterator[Callable[[], AbstractContextManager[None]]]:
        """h3_vae's side: the turns of one decode. Yields `tile`, a context manager factory to run
        each tile in (`with tile(): ...`); the turn held is given up when the decode ends, also when
        it raised. One decode of this process at a time (the others wait here). Each tile waits for
        the device to finish it before the next begins."""
        with self.tiling:
            try:
                yield self._tile
            finally:
                self._give_up()

    @contextmanager
    def _tile(self) -> Iterator[None]:
        """One tile of the decode in `tiles`: take the turn unless held (giving it up first when a
        DiT step waits and this turn has lasted its share, then waiting until no step waits, at
        most two steps' time, HANDOVER_MIN_S at least), run the tile (without the turn after a
        bounded wait), wait for the device."""
        if self.held and self.dit_waiting() and time.perf_counter() - self.since >= self.share * self.last_step_s():
            self._give_up()
            # until no step waits: the waiting one has the turn; with two DiT instances one may
            # always wait, so at most two steps' time (at least HANDOVER_MIN_S)
            handover = min(self.wait_limit_s, max(HANDOVER_MIN_S, 2 * self.last_step_s()))
            self._wait_for_other("want", self.clock.now() + handover)
        if not self.held:
            self.holding = self._take("tiles", self.tiles_want, None)
            if self.holding is not None:
                self._record("tiles")
            self.since = time.perf_counter()
        yield
        self.synchronize()  # the tile is done on the device: the turn's length counts device time

    def _give_up(self) -> None:
        if self.held:
            try:
                self.synchronize()
            finally:
                os.close(self.holding)
                self.holding = None


def _held_by_others(fd: int) -> bool:
    """Whether another open file holds a flock on `fd`'s file (a non-blocking exclusive flock fails)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def decode_tiles(turns: "GpuTurns | None") -> AbstractContextManager[Callable[[], AbstractContextManager[None]]]:
    """The context of one decode: turns.tiles() with turns, else one that yields
    contextlib.nullcontext as the tile (h3_core.model.vae.decode_clip's default)."""
    return turns.tiles() if turns is not None else nullcontext(nullcontext)
