"""Sequence parallelism (h3_core.parallel, issue 17) on the CPU, in-process.

The split and the Ulysses attention: every rank of 2, 4 or 8 run as a thread of this process
(an all-to-all through a barrier), for packs whose documents fall every way across the ranks;
bitwise equal to one device. The driver and its worker processes over gloo (2 ranks, tiny,
seeded random weights): bitwise equal to one device, and a worker that exits, hangs, raises
or is killed while idle; the step loop over them with three requests in one pack when a worker
is lost (one restart, then the step completes for all or fails for all) and when a rank raises
for one request (no restart, only that request fails). Torch runs one CPU thread here, as
h3_dit's cpu_threads does (the parity rule in the module docstring)."""

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.parallel.exchange import Arena
from h3_core.parallel.ulysses import Shares, forward_share, release_peers
from h3_core.parallel.workers import SequenceParallelDiT, WorkerFailed, WorkerLost, rank_devices
from h3_core.serving.dit.events import Arrival, Ended, Result
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings
from h3_core.weights.checkpoint import load_dit
from server.repository import InstanceGroup, config_texts, plan
from server.sizing import Machine

from .serving import ROOT

WEIGHTS = "random:0"
TINY = get_config("tiny")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dit():
    model = H3DiT(TINY)
    load_dit(model, WEIGHTS)
    return model.eval()


def pack(shapes: list[tuple[int, int, int, int]], seed: int = 0):
    """(video, audio, text, batch) of requests of (text_len, height, width, num_frames), random
    rows, timesteps differing per request."""
    layouts = [L.make_layout(*shape) for shape in shapes]
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(sum(lay.video_rows for lay in layouts), 96, generator=g)
    audio = torch.randn(sum(lay.audio_rows for lay in layouts), 32, generator=g)
    text = torch.randn(sum(lay.text_len for lay in layouts), TINY.text_dim, generator=g)
    t_video = [0.1 + 0.2 * i for i in range(len(layouts))]
    return video, audio, text, L.pack_requests(layouts, t_video, [t + 0.05 for t in t_video])


# Requests of 64 rows (41 used), 64 rows (64 used: no padding document), 128 rows (125 used) and
# 384 rows (331 used), packed so that shares are all padding, part padding, hold several small
# documents, or cut a document in two or three.
R64, R64_FULL, R128, R384 = (17, 64, 64, 5), (44, 32, 64, 5), (9, 64, 96, 22), (9, 128, 128, 39)
PACKS = {
    "one 64-row request": [R64],
    "128 + 64 + 64": [R128, R64, R64_FULL],
    "384 + 128": [R384, R128],
    "64 + 384": [R64, R384],
}


def test_pack_sizes_and_shares():
    assert [pack(shapes)[3].total_rows for shapes in PACKS.values()] == [64, 256, 512, 448]
    assert L.make_layout(*R64_FULL).used == 64 and L.make_layout(*R64).used == 41
    assert (Shares(64, 2).share, Shares(64, 2).padded, Shares(64, 2).bounds(1)) == (64, 128, (64, 128))
    assert (Shares(256, 8).share, Shares(256, 8).bounds(3), Shares(256, 8).bounds(4)) == (64, (192, 256), (256, 320))
    assert (Shares(448, 2).share, Shares(448, 2).padded) == (256, 512)  # rank 1: 192 rows and 64 of padding
    assert (Shares(512, 4).share, Shares(16_384, 2).share, Shares(65_536, 8).share) == (128, 8192, 8192)
    rows = torch.arange(448.0)[:, None]
    assert torch.equal(Shares(448, 2).take(1, rows)[:, 0], torch.cat([torch.arange(256.0, 448.0), torch.zeros(64)]))


class ThreadExchange:
    """The all-to-all among `world` threads of this process: each rank's thread calls of(rank)."""

    def __init__(self, world: int):
        self.world, self.barrier, self.sent = world, threading.Barrier(world, timeout=60), [None] * world

    def of(self, rank: int):
        def exchange(send: torch.Tensor) -> torch.Tensor:
            self.sent[rank] = send
            self.barrier.wait()
            received = torch.stack([self.sent[source][rank] for source in range(self.world)])
            self.barrier.wait()
            return received

        return exchange


def on_threads(dit, video, audio, text, batch, world: int):
    """forward_share of every rank, each on a thread; its video and audio rows in rank order."""
    exchange, parts, errors = ThreadExchange(world), [None] * world, []

    def run(rank: int) -> None:
        try:
            parts[rank] = forward_share(dit, video, audio, text, batch, rank, world, exchange.of(rank))
        except Exception as error:  # noqa: BLE001 - re-raised below
            errors.append(error)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return parts


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("name", list(PACKS))
def test_every_rank_count_equals_one_device_bitwise(dit, name, world):
    video, audio, text, batch = pack(PACKS[name])
    one_video, one_audio = dit(video, audio, text, batch)
    parts = on_threads(dit, video, audio, text, batch, world)
    assert torch.equal(torch.cat([part[0] for part in parts]), one_video)
    assert torch.equal(torch.cat([part[1] for part in parts]), one_audio)
    shares = Shares(batch.total_rows, world)
    for rank, (video_part, audio_part) in enumerate(parts):  # each rank returns the rows of its share
        first, end = shares.bounds(rank)
        in_share = ((batch.video_rows >= first) & (batch.video_rows < end)).sum().item()
        assert video_part.shape == (in_share, 96)
        assert audio_part.shape[0] == ((batch.audio_rows >= first) & (batch.audio_rows < end)).sum().item()
    if name == "one 64-row request":
        assert all(part[0].shape[0] == part[1].shape[0] == 0 for part in parts[1:])  # all-padding shares


@pytest.mark.parametrize("world", [2, 4])
def test_release_peers_makes_the_all_to_alls_of_a_step(dit, world):
    video, audio, text, batch = pack(PACKS["384 + 128"])

    def recording(sent: list):
        def exchange(send: torch.Tensor) -> torch.Tensor:  # the all-to-all's shapes, not its data
            sent.append((tuple(send.shape), send.dtype))
            return send

        return exchange

    stepped, released, rest = [], [], []
    forward_share(dit, video, audio, text, batch, world - 1, world, recording(stepped))
    assert release_peers(dit, batch, world, recording(released), 0) == 2 * TINY.num_layers
    assert released == stepped and len(stepped) == 2 * TINY.num_layers
    assert stepped[:2] == [
        ((world, 3, 512 // world, 8 // world, 16), torch.float32),  # 512 rows, 8 heads of 16
        ((world, 512 // world, 8 // world, 16), torch.float32),
    ]
    assert release_peers(dit, batch, world, recording(rest), 3) == 2 * TINY.num_layers - 3
    assert rest == stepped[3:]


def test_arena_round_trip_and_growth():
    arena, block = Arena(), None
    video, audio, text, batch = pack(PACKS["128 + 64 + 64"])
    carried = arena.carried(arena.pack((batch, video, "label", None)), seen=0)
    assert carried[0] is arena.block and arena.generation == 1  # the block travels once
    (got_batch, got_video, label, nothing), block = Arena.unpack(carried, block)
    assert (label, nothing, got_batch.layouts, got_batch.total_rows) == ("label", None, batch.layouts, batch.total_rows)
    assert torch.equal(got_video, video) and torch.equal(got_batch.cu_seqlens, batch.cu_seqlens)
    assert got_batch.cu_seqlens.dtype == torch.int32 and got_batch.position_ids.dtype == torch.float64
    again = arena.carried(arena.pack((text,)), seen=1)
    assert again[0] is None  # the receiver holds the block
    assert torch.equal(Arena.unpack(again, block)[0][0], text)
    big = torch.randn(1 << 19)  # 2 MiB: more than the first block (1 MiB)
    grown = arena.carried(arena.pack((big,)), seen=1)
    assert grown[0] is arena.block and arena.generation == 2 and arena.block.numel() == 2 << 20
    assert torch.equal(Arena.unpack(grown, block)[0][0], big)


def test_sp_degree_must_divide_the_heads_and_gpus_must_exist():
    message = "h3_dit parameter sp_degree=3 does not divide the 8 attention heads of config tiny: choose a divisor of 8"
    with pytest.raises(ValueError) as info:
        load_engine("tiny", WEIGHTS, with_encoder=False, with_vaes=False, sp_degree=3)
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        SequenceParallelDiT(get_config("demo"), WEIGHTS, "cpu", 8)
    assert "sp_degree=8 does not divide the 4 attention heads of config demo" in str(info.value)
    assert rank_devices("cpu", 4) == ["cpu"] * 4
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError) as info:
            rank_devices("cuda:1", 2)
        assert str(info.value) == "sp_degree=2 on cuda:1 needs GPUs 1..2, but 0 are visible"


# -- worker processes over gloo ------------------------------------------------------------------


@pytest.fixture(scope="module")
def workers():
    """The driver of 2 ranks over gloo (collective and step timeout 3 s)."""
    runner = SequenceParallelDiT(TINY, WEIGHTS, "cpu", 2, timeout_s=3.0)
    yield runner
    runner.close()


def check_step(runner, dit, name: str = "384 + 128") -> None:
    video, audio, text, batch = pack(PACKS[name])
    got_video, got_audio = runner(video, audio, text, batch)
    one_video, one_audio = dit(video, audio, text, batch)
    assert torch.equal(got_video, one_video) and torch.equal(got_audio, one_audio)


def test_two_ranks_over_gloo_equal_one_device_bitwise(workers, dit):
    for name in PACKS:
        check_step(workers, dit, name)
    assert len(workers.last_stats) == 2 and all(stats["forward_s"] > 0 for stats in workers.last_stats)
    video, audio, text, batch = pack(PACKS["64 + 384"])
    workers(video, audio, text, batch, profile=True)
    assert [len(stats["exchange_s"]) for stats in workers.last_stats] == [2 * TINY.num_layers] * 2


def restarts_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().endswith("and retrying the step")]


def test_a_worker_that_exits_mid_step_is_replaced_and_the_step_retried(workers, dit, caplog):
    starts = workers.starts
    workers.inject_fault("exit")
    with caplog.at_level(logging.ERROR, logger="h3_dit.sequence_parallel"):
        check_step(workers, dit)
    assert workers.starts == starts + 1
    assert restarts_logged(caplog) == [
        "sequence-parallel rank 1 (cpu) exited with code 3 during a step; restarting the 2 sequence-parallel "
        "workers and retrying the step"
    ]


def test_a_hung_worker_is_replaced_after_the_timeout_and_the_step_retried(workers, dit, caplog):
    starts = workers.starts
    workers.inject_fault("hang")
    with caplog.at_level(logging.ERROR, logger="h3_dit.sequence_parallel"):
        check_step(workers, dit)
    assert workers.starts == starts + 1
    (logged,) = restarts_logged(caplog)
    # the driver's 3 s deadline, or rank 0's 3 s collective timeout, whichever comes first
    assert "did not answer within 3 s during a step" in logged or "all-to-all failed on rank 0" in logged, logged


def test_a_rank_whose_computation_raises_fails_the_step_without_a_retry_or_restart(workers, dit):
    starts, processes = workers.starts, [worker.process for worker in workers.workers]
    workers.inject_fault("raise")
    video, audio, text, batch = pack(PACKS["384 + 128"])
    with pytest.raises(WorkerFailed) as info:
        workers(video, audio, text, batch)
    assert str(info.value) == "sequence-parallel rank 1: RuntimeError: injected fault in sequence-parallel rank 1"
    check_step(workers, dit)  # rank 1 released rank 0: the same workers step on
    assert workers.starts == starts and [worker.process for worker in workers.workers] == processes


def test_a_worker_lost_again_after_the_restart_fails_the_step_with_both_causes(workers, dit, monkeypatch):
    starts, start = workers.starts, workers.start

    def start_and_exit_again() -> None:
        start()
        workers.inject_fault("exit")

    monkeypatch.setattr(workers, "start", start_and_exit_again)
    workers.inject_fault("exit")
    video, audio, text, batch = pack(PACKS["384 + 128"])
    with pytest.raises(WorkerLost) as info:
        workers(video, audio, text, batch)
    lost = "sequence-parallel rank 1 (cpu) exited with code 3 during a step"
    assert str(info.value) == f"{lost}; after a restart of the workers, again: {lost}"
    assert workers.starts == starts + 1 and workers.workers == []  # one restart; the next step starts new ones
    monkeypatch.undo()
    check_step(workers, dit)
    assert workers.starts == starts + 2


def test_a_worker_killed_while_idle_is_replaced_before_the_next_step(workers, dit, caplog):
    starts, victim = workers.starts, workers.workers[1].process
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    with caplog.at_level(logging.ERROR, logger="h3_dit.sequence_parallel"):
        check_step(workers, dit)
    assert workers.starts == starts + 1
    assert "sequence-parallel rank 1 exited with code -9 while idle; restarting the workers" in caplog.messages


# -- the step loop over the workers -----------------------------------------------------------------

# three requests of different sizes, 2 steps each, packed into one forward at their first step
REQUESTS = [(32, 64, 5, 1), (64, 64, 9, 2), (32, 32, 1, 3)]  # height, width, num_frames, seed


def serve(dit, faults: dict[str, str] | None = None) -> list:
    """REQUESTS r0, r1, r2 through a StepLoop over `dit` (inject_fault per request id in
    `faults`), each execute delivering every live request as Triton does; every event sent."""
    faults = faults or {}
    settings = DitSettings(allow_fault_injection=True, sp_degree=2)
    with tempfile.TemporaryDirectory() as folder:
        loop = StepLoop(Engine(dit, None, None), settings, Registry(folder, "h3_dit_0"))
        arrivals = [
            Arrival(
                handle=f"r{i}",
                key=i + 1,
                request_id=f"r{i}",
                new=True,
                request_json=[
                    json.dumps(dict(height=h, width=w, num_frames=f, seed=seed, num_inference_steps=2)).encode()
                ],
                text_embeds=torch.randn(1, 3, TINY.text_dim, generator=torch.Generator().manual_seed(seed)).numpy(),
                parameters_json=json.dumps({"inject_fault": faults[f"r{i}"]} if f"r{i}" in faults else {}),
            )
            for i, (h, w, f, seed) in enumerate(REQUESTS)
        ]
        events = []
        while arrivals:
            live = loop.iterate(arrivals, events.append)
            arrivals = [arrival for arrival in arrivals if arrival.handle in live]
            for arrival in arrivals:
                arrival.new = False
    return events


@pytest.fixture(scope="module")
def served_alone(dit):
    """Each request's Result served by the one-process DiT, by request id."""
    return {event.request_id: event for event in serve(dit) if isinstance(event, Result)}


def assert_served(events: list, expected: dict, ids: list[str]) -> None:
    results = {event.request_id: event for event in events if isinstance(event, Result)}
    assert sorted(results) == ids
    for request_id in ids:
        assert torch.equal(results[request_id].video_latent, expected[request_id].video_latent)
        assert torch.equal(results[request_id].audio_latent, expected[request_id].audio_latent)
        assert results[request_id].info["largest_pack"] == 3


def test_a_lost_worker_costs_the_pack_one_restart_and_every_request_completes(workers, served_alone, caplog):
    starts = workers.starts
    with caplog.at_level(logging.ERROR, logger="h3_dit.sequence_parallel"):
        events = serve(workers, {"r1": "worker_exit"})
    assert_served(events, served_alone, ["r0", "r1", "r2"])
    assert workers.starts == starts + 1
    assert restarts_logged(caplog) == [
        "sequence-parallel rank 1 (cpu) exited with code 3 during a step; restarting the 2 sequence-parallel "
        "workers and retrying the step"
    ]


def test_a_rank_that_raises_for_one_request_fails_it_alone_without_a_restart(workers, served_alone):
    starts = workers.starts
    events = serve(workers, {"r1": "worker_raise"})
    assert_served(events, served_alone, ["r0", "r2"])
    message = (
        "denoise step 1 failed: sequence-parallel rank 1: RuntimeError: injected fault in sequence-parallel rank 1"
    )
    assert [event for event in events if isinstance(event, Ended)] == [Ended("r1", "r1", "INTERNAL", message, 0, 2)]
    assert workers.starts == starts


def test_a_worker_lost_again_after_the_restart_fails_the_whole_pack_without_solo_retries(workers, monkeypatch, caplog):
    starts, start = workers.starts, workers.start

    def start_and_exit_again() -> None:
        start()
        workers.inject_fault("exit")

    monkeypatch.setattr(workers, "start", start_and_exit_again)
    with caplog.at_level(logging.ERROR, logger="h3_dit.sequence_parallel"):
        events = serve(workers, {"r1": "worker_exit"})
    lost = "sequence-parallel rank 1 (cpu) exited with code 3 during a step"
    message = f"denoise step 1 failed: {lost}; after a restart of the workers, again: {lost}"
    # in the pack's order: r1's 9 frames are served as 22 (17n+5), the most rows, packed last
    assert events == [Ended(f"r{i}", f"r{i}", "INTERNAL", message, 0, 2) for i in (0, 2, 1)]
    assert workers.starts == starts + 1 and len(restarts_logged(caplog)) == 1  # no restart per request


def test_close_ends_the_workers():
    runner = SequenceParallelDiT(TINY, WEIGHTS, "cpu", 1)  # one rank: the same driver and worker code
    processes = [worker.process for worker in runner.workers]
    runner.close()
    assert [process.exitcode for process in processes] == [0] and runner.workers == []


# -- the writer ------------------------------------------------------------------------------------


def test_the_writer_gives_each_instance_sp_degree_gpus(tmp_path):
    wide = {"h3_encoder": {"encoder_path": "/encoder-5120"}}  # bench reads 5120-wide text states
    machine = Machine(32, {gpu: 140 << 30 for gpu in range(4)})
    repository = plan(
        "bench", "random:0", "cuda", [0, 1, 2, 3], overrides={**wide, "h3_dit": {"sp_degree": 2}}, machine=machine
    )
    assert repository.groups["h3_dit"] == InstanceGroup("KIND_GPU", 1, (0, 2))  # instances x sp_degree = GPUs
    assert repository.groups["h3_vae"] == InstanceGroup("KIND_GPU", 1, (0,))
    assert repository.dit.sp_degree == 2 and repository.dit.cpu_threads == 5  # 32 cores / (1 + 1 + 2 x 2)
    assert (
        "h3_dit.sp_degree 2: each of the 2 h3_dit instances runs its steps over 2 worker processes (sequence "
        "parallelism): the instance on GPU 0 drives GPUs [0, 1]; the instance on GPU 2 drives GPUs [2, 3]"
    ) in repository.notes
    assert repository.idle_reason.endswith(
        "A sequence-parallel worker that has not answered a step after a quarter of it (15 s) is replaced and the "
        "step retried, within the rest."
    )
    texts = config_texts(repository)
    assert "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0, 2 ] } ]" in texts["h3_dit"]
    assert '{ key: "sp_degree" value: { string_value: "2" } }' in texts["h3_dit"]
    cpu = plan("tiny", dit_instances=2, overrides={"h3_dit": {"sp_degree": 4}}, machine=Machine(16, {}))
    assert cpu.groups["h3_dit"] == InstanceGroup("KIND_CPU", 2) and cpu.dit.cpu_threads == 1  # 16 / (2 + 2 x 4)


@pytest.mark.parametrize(
    "gpus,sp_degree,config,message",
    [
        ([0, 2], 2, "bench", "GPUs [0, 2] are not consecutive: with sp_degree=2 an h3_dit instance drives 2 "),
        ([0, 1, 2], 2, "bench", "h3_dit parameter sp_degree=2 does not divide the 3 GPUs [0, 1, 2]: each h3_dit "),
        ([], 3, "tiny", "h3_dit parameter sp_degree=3 does not divide the 8 attention heads of config tiny"),
        ([], 0, "tiny", "h3_dit parameter sp_degree=0 is out of range: allowed >= 1"),
        ([], "two", "tiny", "h3_dit parameter sp_degree='two' is not a valid int"),
    ],
)
def test_the_writer_refuses_gpus_and_degrees_that_do_not_fit(gpus, sp_degree, config, message):
    overrides = {"h3_encoder": {"encoder_path": "/encoder-5120"}} if config == "bench" else {}
    with pytest.raises(ValueError) as info:
        plan(
            config,
            "random:0",
            "cuda" if gpus else "cpu",
            gpus,
            overrides={**overrides, "h3_dit": {"sp_degree": sp_degree}},
        )
    assert str(info.value).startswith(message)


def test_the_benchmark_runs_its_in_process_part_on_the_cpu(tmp_path):
    # benchmarks/sequence_parallel_bench.py's CPU smoke mode (tiny, 2 ranks over gloo); its served
    # part runs the same servers as tests/test_serving_sequence_parallel.py
    run = subprocess.run(
        [sys.executable, "benchmarks/sequence_parallel_bench.py", "--out", str(tmp_path), "--parts", "inprocess"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "sequence_parallel_bench.json").read_text())
    one, two, summary = report["in_process"]["sp1"], report["in_process"]["sp2"], report["summary"]
    assert (report["hardware"], report["setting"]["config"], report["setting"]["sp_degree"]) == ("CPU", "tiny", 2)
    assert sorted(two["packs"]) == ["192", "768"]  # one request of 192 rows (64x96, 22 frames), four packed
    for rows, pack in two["packs"].items():
        assert pack["rows"] == int(rows) and len(pack["steps_s"]) == 2
        assert summary[f"sp2_over_sp1_step_time_{rows}"] == pack["step_s"] / one["packs"][rows]["step_s"]
        assert len(pack["all_to_all_s_per_layer_by_rank"]) == 2
        assert pack["all_to_all_bytes_per_layer"] == 4 * Shares(int(rows), 2).share * TINY.attn_width * 4
    assert summary["bitwise_checks"] == 9 and summary["bitwise_all_equal"] is True
    assert "bitwise in_process: velocities of one step, mixed" in run.stdout


def test_a_driver_that_ends_without_closing_its_workers_exits_at_once():
    # multiprocessing joins a process's children at exit: without the driver's exit handler that
    # waited for good on workers reading their pipes (an h3_dit whose initialize() failed)
    script = (
        "import torch\n"
        "from h3_core.config import get_config\n"
        "from h3_core.parallel.workers import SequenceParallelDiT\n"
        "torch.set_num_threads(1)\n"
        "runner = SequenceParallelDiT(get_config('tiny'), 'random:0', 'cpu', 2)\n"
        "raise SystemExit('ends without closing its workers')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr.strip().splitlines()[-1]) == (1, "ends without closing its workers")
