"""Sequence parallelism: one packed DiT forward over sp_degree devices (Ulysses), run by worker
processes that one DiT instance starts and supervises (issue 17; docs/model.md §1.2, §2.5-2.6, §5.3).
The split of a pack and one rank's step: h3_core.parallel.ulysses; what crosses between the
processes: h3_core.parallel.exchange; the processes: here.

Processes. `SequenceParallelDiT` is the Engine's `dit` in the DiT instance's own process (the
driver): it holds no weights and never takes part in a collective. It starts one worker process
per rank (multiprocessing's fork server); each loads the weights onto its device and warms up
alone (the compilation), and once every rank has, they join a process group (NCCL on CUDA, gloo on
the CPU; rendezvous through a TCPStore the driver hosts) whose collective timeout is `timeout_s`. Each
step the driver sends every worker the pack (CPU tensors through a pipe: torch moves them
through shared memory) and waits for every share's rows.

Failures are of two kinds, and each costs at most one restart of the workers.
- The group's (WorkerLost, a GroupFailure): a worker that exits is noticed at once (its process
  sentinel), one that hangs when the step outlasts `timeout_s`, and a collective that fails or
  times out on a rank (a peer gone) is reported by that rank; a worker that cannot start is one
  too. The driver kills every worker (SIGKILL: a rank stuck in a collective or a CUDA call reads
  no pipe), starts new ones ONCE and retries the whole step once; if that fails too, the forward
  raises WorkerLost naming both causes and the step loop fails every request of the pack with it
  (INTERNAL), retrying none alone (h3_core/serving/dit/packed_step.py, PackedStep.launch): a request's
  solo retry would only restart the workers again.
- A request's (WorkerFailed): an exception in a rank's own computation (not in a collective).
  That rank makes the step's remaining all-to-alls with zeros (ulysses.release_peers), so its
  peers finish the step and the workers serve on; the forward raises WorkerFailed and the step
  loop retries the pack's requests one at a time on the same workers, so only a request whose
  own forward fails ends (no restart). Should the release fail (a peer gone), it is the group's.
h3_dit sets timeout_s to a quarter of max_sequence_idle_microseconds (SP_TIMEOUT_FRACTION): the
failed try, the restart and the retried step must fit in the idle timeout, or Triton reaps the
live sequences (server.sizing.idle_timeout sizes it so). Workers exit when the driver's process is
gone (a watchdog thread) or their pipe closes.
"""

import atexit
import datetime
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import DiTConfig, get_config
from ..diffusion.engine import Engine, GroupFailure
from ..model.dit import H3DiT, use_bitwise_cublas
from ..model.fp8 import build_dit
from ..model.packed import PackedBatch
from ..weights.checkpoint import load_dit
from .exchange import Arena, CollectiveError, CollectiveExchange
from .ulysses import check_sp_degree, forward_share, release_peers

log = logging.getLogger("h3_dit.sequence_parallel")

SP_TIMEOUT_FRACTION = 4  # h3_dit: timeout_s = max_sequence_idle_microseconds / 4
DEFAULT_TIMEOUT_S = 60.0  # in-process users (benchmarks, tests)
START_TIMEOUT_S = 1800.0  # loading the weights and compiling, per start of the workers
STOP_WAIT_S = 10.0  # longest wait for a killed or closing worker to be reaped
PARENT_POLL_S = 0.5  # how often a worker checks that the driver's process still exists
EXIT_GRACE_S = 2.0  # after a failed collective: how long to wait for the rank whose exit caused it
FAULTS = ("exit", "hang", "raise")  # SequenceParallelDiT.inject_fault (tests only)


def rank_devices(device: str | torch.device, sp_degree: int) -> list[str]:
    """The devices of the ranks of a DiT instance on `device`: the CPU for every rank on the CPU;
    on CUDA the sp_degree consecutive GPUs from the instance's own (cuda:g -> cuda:g .. g+sp-1;
    server.repository places instances so). Raises ValueError when those GPUs are not visible."""
    device = torch.device(device)
    if device.type == "cpu":
        return ["cpu"] * sp_degree
    first = 0 if device.index is None else device.index
    visible = torch.cuda.device_count()
    if first + sp_degree > visible:
        raise ValueError(
            f"sp_degree={sp_degree} on cuda:{first} needs GPUs {first}..{first + sp_degree - 1}, "
            f"but {visible} are visible"
        )
    return [f"cuda:{first + rank}" for rank in range(sp_degree)]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to start: its rank of `world` on `device`, the DiT (config
    name, weight source, attention backend, quantization), torch CPU threads, the collective timeout, and the
    driver's TCPStore port and start number (a fresh rendezvous prefix per start)."""

    rank: int
    world: int
    device: str
    config_name: str
    source: str
    attention_backend: str
    quantization: str
    cpu_threads: int
    timeout_s: float
    store_port: int
    start: int


def exit_with_parent() -> None:
    """Exit (code 0) once the process that started this one is gone: a watchdog thread, since
    the main thread may be stuck in a collective."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="h3-sp-parent-watch", daemon=True).start()


def load_worker(spec: WorkerSpec) -> H3DiT:
    """This rank's DiT on its device as load_engine makes it (bitwise cuBLAS setting, weights,
    quantization, compiled blocks on CUDA), warmed up alone: the compilation and first-use set-up happen before
    the process group exists, so no rendezvous or collective waits on another rank's compiler."""
    torch.set_num_threads(spec.cpu_threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        use_bitwise_cublas()
    dit = build_dit(get_config(spec.config_name), spec.attention_backend, device, spec.quantization)
    load_dit(dit, spec.source)
    if device.type == "cuda":
        dit.compile_blocks()
    Engine(dit.eval(), None, None).warm_up()
    return dit


def join_group(spec: WorkerSpec) -> CollectiveExchange:
    """Join the ranks' process group (NCCL on CUDA, gloo on the CPU; collective timeout
    spec.timeout_s) through the driver's TCPStore, under this start's prefix."""
    device = torch.device(spec.device)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.PrefixStore(
        f"start-{spec.start}", dist.TCPStore("127.0.0.1", spec.store_port, is_master=False, timeout=timeout)
    )
    options = {"device_id": device} if device.type == "cuda" else {}
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=spec.rank, world_size=spec.world, timeout=timeout, **options)
    return CollectiveExchange(spec.rank, device)


def worker_main(spec: WorkerSpec, conn: multiprocessing.connection.Connection) -> None:
    """A worker process: load and warm up (reply ("loaded",)), join the process group when the
    driver says "join" (reply ("ready",); ("lost", message) when it could not start), then answer
    each step message (batch, video, audio, text, fault, profile) with ("ok", video rows, audio
    rows, stats), or ("lost", message) when a collective failed, or ("error", message) when its
    own computation raised and it released its peers (ulysses.release_peers; ("lost", message)
    when that failed); stop at None or when the pipe closes. Messages both ways go through an
    Arena; fault is None or (rank, kind) for CollectiveExchange.fault. stats: forward_s (seconds
    of forward_share, device synchronised) and, when profiled, exchange_s (seconds of each
    all-to-all)."""
    exit_with_parent()
    arena, seen, block = Arena(), 0, None  # replies' arena, its generation the driver holds, the steps' block

    def reply(message) -> None:
        nonlocal seen
        conn.send(arena.carried(arena.pack(message), seen))
        seen = arena.generation

    try:
        dit = load_worker(spec)
        reply(("loaded",))
        if conn.recv() != "join":  # sent once every rank has loaded
            return
        exchange = join_group(spec)
    except EOFError:
        return
    except Exception as error:  # noqa: BLE001 - reported to the driver, which raises it
        reply(("lost", f"rank {spec.rank} could not start: {describe(error)}"))
        return
    reply(("ready",))
    while True:
        try:
            carried = conn.recv()
        except EOFError:
            break
        if carried is None:
            break
        (batch, video, audio, text, fault, profile), block = Arena.unpack(carried, block)
        exchange.fault = fault[1] if fault is not None and fault[0] == spec.rank else None
        exchange.profile, exchange.seconds, exchange.calls = profile, [], 0
        try:
            start = time.perf_counter()
            video_part, audio_part = forward_share(dit, video, audio, text, batch, spec.rank, spec.world, exchange)
            exchange.synchronize()
            stats = {"forward_s": time.perf_counter() - start}
            if profile:
                stats["exchange_s"] = exchange.seconds
            reply(("ok", video_part, audio_part, stats))
        except CollectiveError as error:
            reply(("lost", str(error)))
        except Exception as error:  # noqa: BLE001 - reported to the driver, which raises it
            cause = f"rank {spec.rank}: {describe(error)}"
            try:
                release_peers(dit, batch, spec.world, exchange, exchange.calls)
            except Exception as failure:  # noqa: BLE001 - the group is unusable: the driver restarts it
                reply(("lost", f"{cause}; releasing its peers failed: {describe(failure)}"))
            else:
                reply(("error", cause))
    if dist.is_initialized():
        dist.destroy_process_group()


def describe(error: Exception) -> str:
    """The exception's type and the first line of its text; its traceback goes to this process's
    stderr (the server log)."""
    traceback.print_exception(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else 'no detail'}"


# -- the driver ----------------------------------------------------------------------------------


class WorkerLost(GroupFailure):
    """A worker exited, hung past the timeout, could not start, or a collective failed: the step
    is retried once on new workers; raised by the forward when that retry fails too."""


class WorkerFailed(RuntimeError):
    """A rank's own computation raised for this step; its peers were released, so the workers
    serve on (a request's error: the step loop retries the pack's requests alone)."""


@dataclass
class Worker:
    """A worker process as the driver sees it: its pipe, the generation of the driver's step
    block it holds (`seen`) and the block of its replies (`block`)."""

    rank: int
    device: str
    process: multiprocessing.Process
    conn: multiprocessing.connection.Connection
    seen: int = 0
    block: torch.Tensor | None = None


# Drivers whose workers run: stopped at interpreter exit, before multiprocessing joins its
# children (atexit runs last-registered first), which would otherwise wait for good on workers
# still reading their pipes (a driver that raised, an h3_dit whose initialize() failed).
_RUNNING: set["SequenceParallelDiT"] = set()


@atexit.register
def _stop_running() -> None:
    for driver in list(_RUNNING):
        driver.stop()


def exit_of(worker: Worker, when: str) -> WorkerLost:
    """The WorkerLost naming `worker`'s exit code (its process reaped first, 1 s at most)."""
    worker.process.join(1.0)
    return WorkerLost(
        f"sequence-parallel rank {worker.rank} ({worker.device}) exited with code {worker.process.exitcode} {when}"
    )


class SequenceParallelDiT:
    """Runs H3DiT.forward over `sp_degree` worker processes, one per rank (module docstring).
    Used as an Engine's `dit`: call it like H3DiT.forward; `cfg` and `device` as H3DiT's.

    Args:
        cfg: the DiT config (its heads must divide by sp_degree).
        source: the weight source every worker loads (h3_core.weights.checkpoint.load_dit).
        device: the instance's device: where the driver keeps latents and returns velocities,
            and the first rank's (rank_devices gives the others).
        sp_degree: ranks (>= 2 in serving; 1 runs one worker, for tests).
        attention_backend: the backend each rank runs per document (h3_core.model.attention).
        timeout_s: a worker that has not answered a step this many seconds after it was sent is
            hung; also each collective's timeout in the process group.
        quantization: h3_dit's, applied by every rank (h3_core.model.fp8.build_dit).
        start_timeout_s: the longest a start of the workers (weights, warm-up) may take.
    Raises ValueError for sp_degree / GPUs (check_sp_degree, rank_devices) and WorkerLost (from
    `start`, naming the rank and the cause) for workers that cannot start.

    Workers start from multiprocessing's fork server (torch imported there once, so a restart
    costs the weights and the warm-up, not the imports); as with every start method but fork,
    each worker imports the parent's __main__ module again: a script that uses this class must
    guard its entry point (if __name__ == "__main__") and keeps its start-up imports light
    (tritonserver's python stub has no such module).
    """

    def __init__(
        self,
        cfg: DiTConfig,
        source: str,
        device: str | torch.device,
        sp_degree: int,
        attention_backend: str = "sdpa",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        quantization: str = "none",
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        check_sp_degree(cfg, sp_degree)
        self.cfg, self.device, self.sp_degree = cfg, torch.device(device), sp_degree
        self.devices = rank_devices(device, sp_degree)
        self.source, self.attention_backend, self.quantization = str(source), attention_backend, quantization
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.cpu_threads = torch.get_num_threads()  # the workers use the instance's setting
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.arena = Arena()  # the steps' tensors, read by every worker
        self.workers: list[Worker] = []
        self.starts = 0  # starts of the workers: 1 + restarts
        self.start_seconds: list[float] = []  # seconds of each start
        self.fault: str | None = None  # inject_fault's, sent with the next step
        self.last_stats: list[dict] = []  # each rank's stats of the last step
        self.start()

    # -- the step ------------------------------------------------------------------------------

    def __call__(
        self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, batch: PackedBatch, profile: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One packed forward (arguments and results as H3DiT.forward's, results on `device`).
        A lost worker costs one restart of every worker and one retry of the step; `profile`
        records each all-to-all's seconds in last_stats (device synchronised around each).
        Raises WorkerLost (a GroupFailure) naming both causes when the retry fails too (the
        workers are then stopped; the next step starts new ones), WorkerFailed when a rank's
        computation raised (the message names the rank and the cause; the workers serve on)."""
        try:
            return self.attempt(video, audio, text, batch, profile)
        except WorkerLost as lost:
            first = lost
            log.error("%s; restarting the %d sequence-parallel workers and retrying the step", lost, self.sp_degree)
        try:
            return self.attempt(video, audio, text, batch, profile)
        except WorkerLost as lost:
            raise WorkerLost(f"{first}; after a restart of the workers, again: {lost}") from lost

    def attempt(self, video, audio, text, batch, profile: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One try of a step: (re)start the workers where needed, send, collect. On WorkerLost
        every worker is killed (the next try starts new ones); on WorkerFailed they serve on."""
        try:
            dead = [worker for worker in self.workers if not worker.process.is_alive()]
            if dead:
                log.error(
                    "sequence-parallel rank %d exited with code %s while idle; restarting the workers",
                    dead[0].rank,
                    dead[0].process.exitcode,
                )
                self.stop()
            if not self.workers:
                self.start()
            fault = None if self.fault is None else (self.sp_degree - 1, self.fault)
            self.fault = None
            packed = self.arena.pack((batch, video, audio, text, fault, profile))
            for worker in self.workers:
                self.send(worker, self.arena.carried(packed, worker.seen))
                worker.seen = self.arena.generation
            replies = self.collect(self.timeout_s, "during a step")
        except WorkerLost:
            self.stop()
            raise
        self.last_stats = [reply[3] for reply in replies]
        video_v = torch.cat([reply[1] for reply in replies]).to(self.device)
        audio_v = torch.cat([reply[2] for reply in replies]).to(self.device)
        return video_v, audio_v

    def inject_fault(self, fault: str) -> None:
        """Tests: at the next step the last rank, at its first all-to-all, exits ("exit"), hangs
        ("hang") or raises ("raise"). Raises ValueError for another fault."""
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {FAULTS}")
        self.fault = fault

    # -- the workers ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start one worker per rank, wait until each has loaded and warmed up, then let them all
        join the process group at once (each phase within start_timeout_s). Raises WorkerLost
        (workers killed)."""
        self.starts += 1
        began = time.monotonic()
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["h3_core.parallel.workers"])
        if not os.path.basename(sys.executable).startswith("python"):  # an embedding program, not Python
            context.set_executable(shutil.which("python3") or sys.executable)
        for rank, device in enumerate(self.devices):
            spec = WorkerSpec(
                rank,
                self.sp_degree,
                device,
                self.cfg.name,
                self.source,
                self.attention_backend,
                self.quantization,
                self.cpu_threads,
                self.timeout_s,
                self.store.port,
                self.starts,
            )
            mine, theirs = context.Pipe()
            process = context.Process(target=worker_main, args=(spec, theirs), name=f"h3-sp-rank{rank}")
            process.start()
            theirs.close()
            self.workers.append(Worker(rank, device, process, mine))
        _RUNNING.add(self)
        try:
            self.collect(self.start_timeout_s, "while loading")  # each rank loads and compiles alone
            for worker in self.workers:
                self.send(worker, "join")
            self.collect(self.start_timeout_s, "while joining the process group")
        except WorkerLost:
            self.stop()
            raise
        self.start_seconds.append(time.monotonic() - began)
        log.info(
            "%d sequence-parallel workers on %s ready in %.1f s (start %d)",
            self.sp_degree,
            ", ".join(dict.fromkeys(self.devices)),
            self.start_seconds[-1],
            self.starts,
        )

    def send(self, worker: Worker, message) -> None:
        try:
            worker.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            worker.process.join(1.0)
            raise WorkerLost(
                f"sequence-parallel rank {worker.rank} ({worker.device}) exited with code {worker.process.exitcode}"
            ) from None

    def collect(self, timeout_s: float, when: str) -> list[tuple]:
        """One reply from every worker, in rank order, within timeout_s. Raises WorkerLost (a
        worker exited, did not answer in time, or reported a failed collective), else
        WorkerFailed once every worker has answered when one reported an error (the first)."""
        deadline = time.monotonic() + timeout_s
        replies: dict[int, tuple] = {}
        while len(replies) < len(self.workers):
            waiting = [worker for worker in self.workers if worker.rank not in replies]
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = ", ".join(str(worker.rank) for worker in waiting)
                raise WorkerLost(f"sequence-parallel rank(s) {ranks} did not answer within {timeout_s:g} s {when}")
            ready = multiprocessing.connection.wait(
                [worker.conn for worker in waiting] + [worker.process.sentinel for worker in waiting], left
            )
            for worker in waiting:
                if worker.conn in ready or worker.process.sentinel in ready:
                    try:
                        replies[worker.rank] = self.receive(worker, when)
                    except WorkerLost as lost:
                        raise self.exited([w for w in waiting if w is not worker], when) or lost from None
        errors = [replies[worker.rank][1] for worker in self.workers if replies[worker.rank][0] == "error"]
        if errors:
            raise WorkerFailed(f"sequence-parallel {errors[0]}")
        return [replies[worker.rank] for worker in self.workers]

    def exited(self, workers: list[Worker], when: str) -> WorkerLost | None:
        """A rank's failed collective is most often the echo of another rank's exit, which its
        process sentinel may show a moment later: the first of `workers` that has exited within
        EXIT_GRACE_S, as the WorkerLost to report (the cause, not the echo), or None."""
        if workers:
            multiprocessing.connection.wait([worker.process.sentinel for worker in workers], EXIT_GRACE_S)
        return next((exit_of(worker, when) for worker in workers if not worker.process.is_alive()), None)

    def receive(self, worker: Worker, when: str) -> tuple:
        """The worker's reply, read when its pipe or its process sentinel is ready. Raises
        WorkerLost for a "lost" reply or a worker that exited."""
        if worker.conn.poll():
            try:
                reply, worker.block = Arena.unpack(worker.conn.recv(), worker.block)
            except (EOFError, ConnectionResetError):
                reply = None
            if reply is not None and reply[0] == "lost":
                raise WorkerLost(f"sequence-parallel {reply[1]} {when}")
            if reply is not None:
                return reply
        raise exit_of(worker, when)

    def stop(self) -> None:
        """Kill every worker (SIGKILL) and reap it."""
        for worker in self.workers:
            worker.process.kill()
        for worker in self.workers:
            worker.process.join(STOP_WAIT_S)
            worker.conn.close()
        self.workers = []
        _RUNNING.discard(self)

    def close(self) -> None:
        """Ask every worker to exit, wait up to STOP_WAIT_S, then kill what is left."""
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, ConnectionResetError, EOFError):
                pass
        for worker in self.workers:
            worker.process.join(STOP_WAIT_S)
        self.stop()
