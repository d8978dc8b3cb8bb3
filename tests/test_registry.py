"""h3_core.serving.registry: the request ids, cancels and loads shared by a server's DiT instances."""

import subprocess
import sys
from pathlib import Path

import pytest

from h3_core.protocol import EARLY_CANCEL_SECONDS
from h3_core.serving import registry as registry_module
from h3_core.serving.registry import Registry
from h3_core.serving.scheduler import DitLoad, Job, Overloaded, Scheduler
from h3_core.serving.simulate import SimState


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cancel_states_and_their_memory(tmp_path):
    clock = Clock()
    dit, other = Registry(tmp_path, "h3_dit_0", clock), Registry(tmp_path, "h3_dit_1", clock)
    assert dit.admit("live") is False
    assert dit.admit("done") is False and dit.finish("done") is False
    assert [other.cancel(i) for i in ("live", "done", "early")] == ["cancelled", "finished", "unknown"]
    assert dit.boundary(["live"], DitLoad(1, 4, 8)) == {"live"}
    assert dit.finish("live") is True  # its cancel flag was set
    assert other.admit("done") is False  # a finished id planted nothing
    assert other.admit("early") is True  # the early cancel was waiting for it
    with pytest.raises(ValueError, match="^request id 'done' is already running; ids must be unique$"):
        dit.admit("done")
    assert dit.cancel("later") == "unknown"
    clock.now += EARLY_CANCEL_SECONDS
    assert dit.admit("later") is False  # forgotten after EARLY_CANCEL_SECONDS


def test_memories_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "IDS_REMEMBERED", 8)
    clock = Clock()
    registry = Registry(tmp_path, "h3_dit_0", clock)
    for k in range(13):
        clock.now += 0.001
        registry.cancel(f"id-{k}")
    with registry._state(write=False) as (state, _):
        assert sorted(state["cancels"]) == sorted(f"id-{k}" for k in range(5, 13))


def test_the_encoder_is_refused_only_when_every_instance_is_full(tmp_path):
    first, second, encoder = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path, "h3_dit_1"), Registry(tmp_path)
    assert encoder.refusal() is None  # nothing reported yet
    first.boundary([], DitLoad(held=5, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() == "the DiT holds 5 requests, its capacity max_num_seqs + max_waiting = 4 + 1; retry later"
    second.boundary([], DitLoad(held=4, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() is None
    second.leave()
    first.boundary([], DitLoad(held=4, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() is None


def test_the_scheduler_refuses_with_the_same_words():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=0)
    scheduler.add(Job(key=1, request_id="a", states=[SimState(10, 3)]))
    with pytest.raises(Overloaded) as error:
        scheduler.add(Job(key=2, request_id="b", states=[SimState(10, 3)]))
    assert str(error.value) == DitLoad(1, 1, 0).message()


def test_the_last_instance_to_leave_removes_the_folder(tmp_path):
    folder = tmp_path / "h3-triton-1-2"
    first, second = Registry(folder, "h3_dit_0_0"), Registry(folder, "h3_dit_0_1")
    first.boundary([], DitLoad(0, 4, 8))
    second.boundary([], DitLoad(0, 4, 8))
    first.leave()
    assert (folder / "registry.json").is_file()
    second.leave()
    assert not folder.exists()


def test_a_finished_request_publishes_the_load_without_it(tmp_path):
    dit, encoder = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path)
    dit.admit("a")
    dit.boundary(["a"], DitLoad(held=1, max_num_seqs=1, max_waiting=0))
    assert encoder.refusal() is not None
    assert dit.finish("a", DitLoad(held=0, max_num_seqs=1, max_waiting=0)) is False
    assert encoder.refusal() is None  # at once, not at the instance's next execute


# -- announcements: something new is headed for the DiT ------------------------------------------


def test_announcements_count_exactly_and_stamp_the_time(tmp_path):
    clock = Clock()
    encoder, dit, other = Registry(tmp_path, "", clock), Registry(tmp_path, "h3_dit_0"), Registry(tmp_path, "h3_dit_1")
    assert (dit.announcements(), dit.seconds_since_announcement()) == (0, float("inf"))
    encoder.announce()
    clock.now += 0.25
    encoder.announce(3)
    clock.now += 0.5
    assert (Registry(tmp_path, "h3_dit_0", clock).announcements(), encoder.seconds_since_announcement()) == (4, 0.5)
    dit.admit("here")
    assert dit.cancel("here") == "cancelled" and dit.cancel("nowhere") == "unknown"
    assert dit.announcements() == 4  # its holder took the cancel, nobody else needs to hear of it
    dit.admit("there")
    assert other.cancel("there") == "cancelled"
    # a cancel for a request on another instance counts, but nothing is on its way: no new stamp
    assert (dit.announcements(), encoder.seconds_since_announcement()) == (5, 0.5)
    assert (tmp_path / registry_module.ANNOUNCEMENTS_FILE).stat().st_size == registry_module.ANNOUNCEMENT.size


ANNOUNCER = """
import sys, threading
from h3_core.serving.registry import Registry
registry, each = Registry(sys.argv[1]), int(sys.argv[2])
threads = [threading.Thread(target=lambda: [registry.announce() for _ in range(each)]) for _ in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def test_concurrent_announcers_lose_nothing(tmp_path):
    """4 processes of 2 threads each, 150 announcements per thread, while this process announces
    2 at a time and reads: the count ends at exactly 4 x 2 x 150 + 2 x 100, and every read is at
    most that."""
    root = Path(__file__).resolve().parents[1]
    announcers = [subprocess.Popen([sys.executable, "-c", ANNOUNCER, str(tmp_path), "150"], cwd=root) for _ in range(4)]
    registry, seen = Registry(tmp_path), []
    for _ in range(100):
        registry.announce(2)
        seen.append(registry.announcements())
    assert [announcer.wait(60) for announcer in announcers] == [0] * 4
    assert registry.announcements() == 4 * 2 * 150 + 2 * 100
    assert max(seen) <= registry.announcements() and seen[-1] >= 200
