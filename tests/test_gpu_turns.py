"""h3_core.serving.shared.gpu_turns on the CPU: the flock turns between a DiT's steps and h3_vae's decode
tiles (two GpuTurns on one folder and key stand for the two processes: flocks of separate opens
conflict within a process too), their order, the share of a turn, crash safety, the settings and
the step loop taking each step in a turn. Orders and counts only, no timings."""

import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from h3_core.model.vae import DECODE_TILE_LATENTS, create_vaes, decode_clip, frames_to_uint8, groups_to_frames
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared import gpu_turns
from h3_core.serving.shared.gpu_turns import HANDOVER_MIN_S, TILES_WAIT_LIMIT_S, GpuTurns, TurnClock
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings, VaeSettings
from tests.step_loop_harness import Client, Clock, assert_solo
from tests.test_step_loop import engine  # noqa: F401 - engine is a fixture

ROOT = Path(__file__).resolve().parents[1]


def turns(folder: Path, share: float = 0.05, synced: list | None = None, name: str = "") -> GpuTurns:
    return GpuTurns(folder, "gpu-test", share, lambda: synced.append(name) if synced is not None else None)


def turn_is_free(folder: Path) -> bool:
    """Whether nobody holds the turn (a non-blocking exclusive flock of a fresh open succeeds)."""
    fd = os.open(folder / "gpu-gpu-test.turn", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def wait_for(condition) -> None:
    """Poll `condition` until it holds (an order, not a timing: the bound only stops a hang)."""
    for _ in range(20000):
        if condition():
            return
        time.sleep(0.001)
    raise AssertionError("condition never held")


def decode_with_a_step(folder: Path, share: float, tiles: int = 3) -> list[str]:
    """A decode of `tiles` tiles; while its first tile runs, a DiT step starts waiting for the turn.
    Returns the order of tiles and the step."""
    dit, vae, events = turns(folder), turns(folder, share), []

    def take_step():
        with dit.step():
            events.append("step")

    step = threading.Thread(target=take_step)
    with vae.tiles() as tile:
        for index in range(tiles):
            with tile():
                events.append(f"tile {index}")
                if index == 0:
                    step.start()
                    wait_for(vae.dit_waiting)
    step.join()
    return events


def test_a_waiting_step_takes_the_gpu_after_the_current_tile(tmp_path):
    # no step seen yet: a turn's share of it is 0 s, so the turn ends after one tile
    assert decode_with_a_step(tmp_path, share=0.05) == ["tile 0", "step", "tile 1", "tile 2"]


def test_a_turn_lasts_its_share_of_the_last_step_while_a_step_waits(tmp_path):
    dit = turns(tmp_path)
    with dit.step():
        time.sleep(0.01)
    assert turns(tmp_path).last_step_s() >= 0.01
    # a share far above the decode's length: the waiting step comes after the whole decode
    assert decode_with_a_step(tmp_path, share=1e9) == ["tile 0", "tile 1", "tile 2", "step"]


def test_a_dit_stepping_without_pause_leaves_a_waiting_decode_one_turn_between_steps(tmp_path):
    dit, vae, events = turns(tmp_path), turns(tmp_path, share=1e-9), []

    def decode():
        with vae.tiles() as tile:
            for index in range(3):
                with tile():
                    events.append(f"tile {index}")
                    wait_for(vae.dit_waiting)  # the next step asks for the GPU while this tile runs

    decoder = threading.Thread(target=decode)
    for index in range(4):
        with dit.step():
            events.append(f"step {index}")
            if index == 0:
                decoder.start()
            if index < 3:
                wait_for(dit.tiles_waiting)  # the decode asks for the GPU while this step runs
    decoder.join()
    assert events == ["step 0", "tile 0", "step 1", "tile 1", "step 2", "tile 2", "step 3"]


def test_tiles_run_at_once_while_no_step_waits_and_synchronize_before_the_turn_ends(tmp_path):
    synced = []
    vae = turns(tmp_path, synced=synced, name="vae")
    with vae.tiles() as tile:
        for _ in range(3):
            with tile():
                assert not turn_is_free(tmp_path)
    assert synced == ["vae"] * 4  # after each tile, and as the turn is given up
    assert turn_is_free(tmp_path)


def test_a_step_holds_the_turn_until_the_device_is_done_also_when_it_raises(tmp_path):
    seen = []
    dit = GpuTurns(tmp_path, "gpu-test", 0.05, lambda: seen.append(turn_is_free(tmp_path)))
    with pytest.raises(RuntimeError, match="forward failed"):
        with dit.step():
            raise RuntimeError("forward failed")
    assert seen == [False] and turn_is_free(tmp_path)


def test_a_decode_that_raises_gives_the_turn_up(tmp_path):
    vae = turns(tmp_path)
    with pytest.raises(ValueError, match="bad latents"):
        with vae.tiles() as tile:
            with tile():
                raise ValueError("bad latents")
    assert turn_is_free(tmp_path)


def test_a_process_killed_holding_the_turn_blocks_nobody(tmp_path):
    code = (
        "import sys, time; from h3_core.serving.shared.gpu_turns import GpuTurns; "
        "t = GpuTurns(sys.argv[1], 'gpu-test', 0.05, lambda: None); s = t.step(); s.__enter__(); "
        "print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert select.select([holder.stdout], [], [], 120)[0], "the holder never took the turn"
        assert holder.stdout.readline().strip() == "held"
        assert not turn_is_free(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    events = []
    with turns(tmp_path).tiles() as tile:
        with tile():
            events.append("tile")
    assert events == ["tile"]


class FakeClock(TurnClock):
    """A clock whose waits end at once: a wait that its predicate does not end moves the clock to
    the deadline. `waited` lists the seconds of each wait that reached its deadline."""

    def __init__(self):
        self.t, self.waited = 1000.0, []

    def now(self) -> float:
        return self.t

    def wait(self, condition, predicate, deadline) -> bool:
        if predicate():
            return True
        self.waited.append(deadline - self.t)
        self.t = max(self.t, deadline)
        return predicate()


STEP_TIMEOUT = (
    "GPU turns: the turn was not given in 15 s (h3_vae stuck in a decode?): steps run without it until it is free again"
)


def test_a_stuck_decode_costs_one_bounded_wait_until_h3_vae_is_seen_taking_a_turn(tmp_path, caplog):
    """Issue 43 item 1: the first step behind a decode stuck in its tile waits wait_limit_s (fake
    seconds) and steps without the turn; the next steps do not wait again while h3_vae has taken
    no new turn; once the turn is free a step takes it; once h3_vae takes a turn again (stuck
    again), a step waits again."""
    clock, events = FakeClock(), []
    vae = turns(tmp_path)
    dit = GpuTurns(tmp_path, "gpu-test", 0.05, lambda: events.append(turn_is_free(tmp_path)), 15.0, clock)
    with caplog.at_level(logging.WARNING, logger="h3_dit"):
        with vae.tiles() as tile:
            with tile():  # a decode stuck in its tile: it holds the turn
                for _ in range(3):
                    with dit.step():
                        pass
                assert (clock.waited, events, vae.held) == ([15.0], [False] * 3, True)
        # the decode ended: the turn is free once the step's abandoned wait let go of it
        wait_for(lambda: not any(thread.name == "gpu-turns-turn" for thread in threading.enumerate()))
        with dit.step():
            pass
        assert events[3] is False and dit.turns_taken("step") == 1 and turn_is_free(tmp_path)
        with vae.tiles() as tile:
            with tile():  # h3_vae took a turn: it is alive, a step waits for it again
                with dit.step():
                    pass
    assert clock.waited == [15.0, 15.0] and dit.turns_taken("tiles") == 2
    assert [record.getMessage() for record in caplog.records] == [STEP_TIMEOUT, STEP_TIMEOUT]
    assert dit.last_step_s() > 0.0  # only the step in the turn stored its time


def test_h3_vae_waits_for_a_stuck_step_at_most_its_limit(tmp_path, caplog):
    clock, events = FakeClock(), []
    dit = turns(tmp_path)
    vae = GpuTurns(tmp_path, "gpu-test", 0.05, lambda: None, clock=clock)
    with caplog.at_level(logging.WARNING, logger="h3_dit"):
        with dit.step():  # a step stuck on the device
            with vae.tiles() as tile:
                for index in range(2):
                    with tile():
                        events.append((f"tile {index}", vae.held))
    assert events == [("tile 0", False), ("tile 1", False)] and clock.waited == [TILES_WAIT_LIMIT_S]
    assert [record.getMessage() for record in caplog.records] == [
        "GPU turns: the turn was not given in 60 s (an h3_dit step stuck?): tiles run without it until it is free again"
    ]


@pytest.mark.parametrize("last_step_s, handover_s", [(0.0, HANDOVER_MIN_S), (2.0, 4.0), (100.0, 15.0)])
def test_h3_vae_hands_the_turn_over_within_two_steps_while_a_step_always_waits(tmp_path, last_step_s, handover_s):
    """Having given the turn up to a waiting step, h3_vae waits until no step waits. With two DiT
    instances one may always wait (here a shared flock on the want file held for good): that wait
    ends after two steps' time (HANDOVER_MIN_S at least, the wait limit at most: fake seconds),
    and the next tile takes the turn again."""
    clock, events = FakeClock(), []
    vae = GpuTurns(tmp_path, "gpu-test", 1e-9, lambda: None, 15.0, clock)
    os.pwrite(vae.turn, gpu_turns._TURN_FILE.pack(last_step_s, 0, 0), 0)  # the last step's seconds
    waiting = os.open(tmp_path / "gpu-gpu-test.want", os.O_RDWR)
    try:
        with vae.tiles() as tile:
            with tile():
                events.append(("tile 0", vae.held))
                fcntl.flock(waiting, fcntl.LOCK_SH)  # a DiT step waits, and never stops waiting
            with tile():
                events.append(("tile 1", vae.held))
    finally:
        os.close(waiting)
    assert events == [("tile 0", True), ("tile 1", True)] and clock.waited == [handover_s]
    assert vae.turns_taken("tiles") == 2


def test_stop_ends_a_wait_at_once_and_nothing_polls(tmp_path, monkeypatch, caplog):
    """A decode waiting for the turn behind a step (wait limit: a day) ends its wait when its
    GpuTurns stops (model unload, drain); no side sleeps to poll (time.sleep fails here)."""

    def sleep(seconds):
        pytest.fail("GPU turns polled")

    monkeypatch.setattr(
        gpu_turns, "time", SimpleNamespace(monotonic=time.monotonic, perf_counter=time.perf_counter, sleep=sleep)
    )
    dit, vae, events = turns(tmp_path), GpuTurns(tmp_path, "gpu-test", 0.05, lambda: None, 86400.0), []

    def decode():
        with vae.tiles() as tile:
            with tile():
                events.append(("tile", vae.held))

    decoder = threading.Thread(target=decode)
    with caplog.at_level(logging.WARNING, logger="h3_dit"):
        with dit.step():
            decoder.start()
            wait_for(dit.tiles_waiting)
            vae.stop()
            decoder.join()
            events.append("step")
    assert events == [("tile", False), "step"] and caplog.records == []


def test_two_dits_on_one_gpu_leave_h3_vae_a_turn_after_the_step_in_flight(tmp_path):
    """Two DiT instances step on one GPU: A steps, h3_vae asks for the turn, B and then A ask for
    their next steps. h3_vae decodes before either of them."""
    first, second, vae, events = turns(tmp_path), turns(tmp_path), turns(tmp_path, share=1e-9), []

    def take_step(dit, name):
        with dit.step():
            events.append(name)

    def decode():
        with vae.tiles() as tile:
            for index in range(2):
                with tile():
                    events.append(f"tile {index}")

    threads = [threading.Thread(target=decode), threading.Thread(target=take_step, args=(second, "B"))]
    with first.step():
        events.append("A 1")
        threads[0].start()
        wait_for(first.tiles_waiting)
        threads[1].start()
        wait_for(first.dit_waiting)
        threads.append(threading.Thread(target=take_step, args=(first, "A 2")))
        threads[2].start()
    for thread in threads:
        thread.join()
    assert events[:2] == ["A 1", "tile 0"] and sorted(events[2:]) == ["A 2", "B", "tile 1"]


def test_the_step_loop_plans_a_cached_request_inside_a_turn(engine, tmp_path):  # noqa: F811
    """The step cache's plan computes on the device: it takes a turn of its own (untimed)."""
    held, folder = [], tmp_path / "server"
    dit = GpuTurns(folder, "gpu-test", 0.05, lambda: held.append(not turn_is_free(folder)))
    loop = StepLoop(
        engine, DitSettings(max_steps=20), Registry(tmp_path / "registry", "i0"), MetricsRecord(), Clock(), turns=dit
    )
    client = Client(loop)
    client.send("cached", steps=4, seed=1, parameters={"cache_threshold": 0.5})
    while client.live:
        client.iterate()
    (result,) = [event for event in client.events if type(event).__name__ == "Result"]
    # 4 boundaries, each with a plan in a turn, and 4 steps (2 skipped, each still in a turn)
    assert result.info["skipped_steps"] == 2
    assert held == [True] * 8 and dit.turns_taken("step") == 8


def test_decode_clip_runs_each_tile_inside_a_turn_and_tiles_change_no_value():
    video_vae, audio_vae = create_vaes(1)
    latents = 2 + 5 * 2  # 12 latent frames: 3 video tiles of 5, 5, 2
    video = torch.randn(24, latents, 2, 3, generator=torch.Generator().manual_seed(0))
    audio = torch.randn(2, 32, 65, generator=torch.Generator().manual_seed(1))
    entered = []

    class Tile:
        def __enter__(self):
            entered.append(len(entered))

        def __exit__(self, *exc):
            return False

    frames, waveform = decode_clip(video_vae, audio_vae, 39, video, audio, Tile)
    assert DECODE_TILE_LATENTS == 5 and entered == [0, 1, 2, 3]  # 3 video tiles + the audio
    with torch.inference_mode():
        whole = frames_to_uint8(groups_to_frames(video_vae.decoder(video.transpose(0, 1))))
    assert torch.equal(frames, whole)
    assert torch.equal(waveform, decode_clip(video_vae, audio_vae, 39, video, audio)[1])


def test_the_step_loop_takes_each_step_in_a_turn_and_settles_it_before_the_next(engine, tmp_path):  # noqa: F811
    held = []
    folder = tmp_path / "server"
    dit = GpuTurns(folder, "gpu-test", 0.05, lambda: held.append(not turn_is_free(folder)))
    loop = StepLoop(
        engine,
        DitSettings(max_steps=20, execute_budget_s=0.0),
        Registry(tmp_path / "registry", "i0"),
        MetricsRecord(),
        Clock(),
        turns=dit,
    )
    client = Client(loop)
    client.send("a", steps=3, seed=1)
    client.send("b", steps=2, seed=2)
    while client.live:
        client.iterate()
        assert loop.in_flight is None  # settled in the execute that launched it
    assert held == [True, True, True]  # three packed steps, each done on the device inside its turn
    assert turn_is_free(folder) and dit.last_step_s() > 0
    results = {result.request_id: result for result in client.events if type(result).__name__ == "Result"}
    assert_solo(engine, results["a"], 3, 1)
    assert_solo(engine, results["b"], 2, 2)


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            lambda: VaeSettings(gpu_turns=True, device="cpu"),
            "h3_vae parameter gpu_turns=true needs a CUDA device, got device='cpu'",
        ),
        (lambda: VaeSettings(turn_share=0.0), "h3_vae parameter turn_share=0.0 is out of range: allowed finite > 0"),
        (
            lambda: VaeSettings(turn_share=float("inf")),
            "h3_vae parameter turn_share=inf is out of range: allowed finite > 0",
        ),
        (
            lambda: DitSettings(gpu_turns=True, device="cpu"),
            "h3_dit parameter gpu_turns=true needs device cuda and sp_degree 1, got device='cpu' and sp_degree=1",
        ),
        (
            lambda: DitSettings(gpu_turns=True, device="cuda", sp_degree=2),
            "h3_dit parameter gpu_turns=true needs device cuda and sp_degree 1, got device='cuda' and sp_degree=2",
        ),
    ],
)
def test_turn_settings_are_checked(settings, message):
    with pytest.raises(ValueError) as error:
        settings()
    assert str(error.value) == message
