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
folder (h3_core.serving.registry.server_folder) and <uuid> the GPU's, so that every process of the
server that names the GPU, under any index, meets the same lock. A DiT instance waiting for the turn
holds a shared flock on gpu-<uuid>.want, h3_vae waiting for it one on gpu-<uuid>.tiles-want; the
last step's seconds are the turn file's first 8 bytes
(a little-endian float64). The kernel drops a dead process's flocks, so a crash on one side never
blocks the other.
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
POLL_S = 0.0005  # seconds between looks at whether the other side, waiting, has taken the turn
# seconds a DiT step waits for the turn before it steps without it (time-slicing the GPU), so that an
# h3_vae stuck in a decode stalls no step for longer: far above a turn (0.04 x a step of seconds)
# and above a hook VAE's whole-clip decode, which is one tile
STEP_WAIT_LIMIT_S = 60.0
_STEP_SECONDS = struct.Struct("<d")
log = logging.getLogger("h3_dit")


def gpu_key(device: str | torch.device) -> str:
    """The name of CUDA device `device`'s turn files: its UUID (torch.cuda.get_device_properties).
    Raises ValueError for a device that is not a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"GPU turns need a CUDA device, got {device}")
    return str(torch.cuda.get_device_properties(device).uuid)


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
        step_wait_limit_s: seconds `step` waits for the turn before it steps without it.

    The guarantee of one turn between two steps holds for one DiT process per GPU (the writer
    places one); with more, h3_vae still gets turns, later.

    Raises OSError when the files cannot be opened.
    """

    def __init__(
        self,
        folder: str | Path,
        key: str,
        share: float,
        synchronize: Callable[[], None],
        step_wait_limit_s: float = STEP_WAIT_LIMIT_S,
    ):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.share, self.synchronize, self.step_wait_limit_s = share, synchronize, step_wait_limit_s
        self.turn = os.open(folder / f"gpu-{key}.turn", os.O_RDWR | os.O_CREAT, 0o600)
        self.want = os.open(folder / f"gpu-{key}.want", os.O_RDWR | os.O_CREAT, 0o600)
        self.tiles_want = os.open(folder / f"gpu-{key}.tiles-want", os.O_RDWR | os.O_CREAT, 0o600)
        self.tiling = threading.Lock()  # one decode of this process takes turns at a time
        self.held, self.since = False, 0.0

    @classmethod
    def on_device(cls, folder: str | Path, device: str | torch.device, share: float = DEFAULT_SHARE) -> "GpuTurns":
        """The turns of CUDA device `device` (gpu_key), synchronizing that device."""
        device = torch.device(device)
        return cls(folder, gpu_key(device), share, lambda: torch.cuda.synchronize(device))

    def close(self) -> None:
        """Close the files (giving up any turn held)."""
        for fd in (self.turn, self.want, self.tiles_want):
            os.close(fd)

    def last_step_s(self) -> float:
        """Seconds of the last step a DiT instance took on this GPU (0.0 before the first)."""
        data = os.pread(self.turn, _STEP_SECONDS.size, 0)
        return _STEP_SECONDS.unpack(data)[0] if len(data) == _STEP_SECONDS.size else 0.0

    def dit_waiting(self) -> bool:
        """Whether a DiT instance waits for the turn now."""
        return _held_by_others(self.want)

    def tiles_waiting(self) -> bool:
        """Whether h3_vae waits for the turn now."""
        return _held_by_others(self.tiles_want)

    @contextmanager
    def step(self) -> Iterator[None]:
        """The DiT's side: hold the turn for one packed step. Waits (announcing itself in the want
        file) for the turn, letting a waiting h3_vae take it first; on leaving, waits for the device
        to finish the step, stores its seconds (turn taken to device done) and gives the turn up,
        also when the step raised. Without the turn after step_wait_limit_s seconds (an h3_vae
        stuck in a decode) it logs a warning and steps without it."""
        deadline = time.monotonic() + self.step_wait_limit_s
        fcntl.flock(self.want, fcntl.LOCK_SH)
        try:
            while self.tiles_waiting() and time.monotonic() < deadline:  # until h3_vae holds the turn
                time.sleep(POLL_S)
            held = _lock_before(self.turn, deadline)
        finally:
            fcntl.flock(self.want, fcntl.LOCK_UN)
        if not held:
            log.warning(
                "GPU turns: the turn was not given in %g s (h3_vae stuck in a decode?): this step runs without it",
                self.step_wait_limit_s,
            )
        start = time.perf_counter()
        try:
            yield
        finally:
            try:
                self.synchronize()
                if held:
                    os.pwrite(self.turn, _STEP_SECONDS.pack(time.perf_counter() - start), 0)
            finally:
                if held:
                    fcntl.flock(self.turn, fcntl.LOCK_UN)

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
        DiT step waits and this turn has lasted its share), run the tile, wait for the device."""
        if self.held and self.dit_waiting() and time.perf_counter() - self.since >= self.share * self.last_step_s():
            self._give_up()
            while self.dit_waiting():  # until the waiting instance holds the turn; then wait for its step
                time.sleep(POLL_S)
        if not self.held:
            fcntl.flock(self.tiles_want, fcntl.LOCK_SH)
            try:
                fcntl.flock(self.turn, fcntl.LOCK_EX)
            finally:
                fcntl.flock(self.tiles_want, fcntl.LOCK_UN)
            self.held, self.since = True, time.perf_counter()
        yield
        self.synchronize()  # the tile is done on the device: the turn's length counts device time

    def _give_up(self) -> None:
        if self.held:
            try:
                self.synchronize()
            finally:
                self.held = False
                fcntl.flock(self.turn, fcntl.LOCK_UN)


def _held_by_others(fd: int) -> bool:
    """Whether another open file holds a flock on `fd`'s file (a non-blocking exclusive flock fails)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _lock_before(fd: int, deadline: float) -> bool:
    """Take an exclusive flock on `fd`, polling until time.monotonic() reaches `deadline`.
    Returns whether it was taken."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def decode_tiles(turns: "GpuTurns | None") -> AbstractContextManager[Callable[[], AbstractContextManager[None]]]:
    """The context of one decode: turns.tiles() with turns, else one that yields
    contextlib.nullcontext as the tile (h3_core.model.vae.decode_clip's default)."""
    return turns.tiles() if turns is not None else nullcontext(nullcontext)
