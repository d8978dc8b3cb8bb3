"""h3_core.serving.shared.registry: the request ids, cancels and loads shared by a server's DiT instances."""

import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import pytest

from h3_core.protocol import EARLY_CANCEL_SECONDS
from h3_core.serving.dit.scheduler import Job, Overloaded, Scheduler
from h3_core.serving.dit.simulate import SimState
from h3_core.serving.shared import registry as registry_module
from h3_core.serving.shared.registry import DitLoad, Registry, server_folder


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
    assert dit.publish_and_read_cancels(["live"], DitLoad(1, 4, 8)) == {"live"}
    assert dit.finish("live") is True  # its cancel flag was set
    assert other.admit("done") is False  # a finished id planted nothing
    assert other.admit("early") is True  # the early cancel was waiting for it
    with pytest.raises(ValueError, match="^request id 'done' is already running; ids must be unique$"):
        dit.admit("done")
    assert dit.cancel("later") == "unknown"
    clock.now += EARLY_CANCEL_SECONDS
    assert dit.admit("later") is False  # forgotten after EARLY_CANCEL_SECONDS


def test_the_encoder_holds_the_ids_whose_media_it_decodes(tmp_path):
    """Issue 41 item 6: while h3_encoder holds an id a cancel answers "cancelled" and flags it; a
    held id released when passed on keeps its flag for h3_dit's admit; one released as ended is
    finished; an early cancel ends a newcomer at hold(); an id live on a DiT is not taken over."""
    clock = Clock()
    encoder, cancels, dit = Registry(tmp_path, "", clock), Registry(tmp_path, "", clock), Registry(tmp_path, "d", clock)
    assert encoder.hold("decoding") is False and encoder.held_cancelled("decoding") is False
    assert cancels.cancel("decoding") == "cancelled" and encoder.held_cancelled("decoding") is True
    encoder.release("decoding", ended=True)
    assert cancels.cancel("decoding") == "finished"
    assert encoder.hold("passed") is False
    assert cancels.cancel("passed") == "cancelled"
    encoder.release("passed")  # passed on to h3_dit: its flag waits there
    assert dit.admit("passed") is True
    assert cancels.cancel("early") == "unknown" and encoder.hold("early") is True
    assert cancels.cancel("early") == "finished"
    assert dit.admit("running") is False and encoder.hold("running") is False
    encoder.release("running", ended=False)  # not the encoder's: left live on the DiT
    assert (
        dit.publish_and_read_cancels(["running"], DitLoad(1, 4, 8)) == set()
        and cancels.cancel("running") == "cancelled"
    )


def test_memories_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "IDS_REMEMBERED", 8)
    clock = Clock()
    registry = Registry(tmp_path, "h3_dit_0", clock)
    for k in range(13):
        clock.now += 0.001
        registry.cancel(f"id-{k}")
    # the 8 newest early cancels wait for their ids; the 5 oldest were forgotten
    assert [registry.admit(f"id-{k}") for k in range(13)] == [False] * 5 + [True] * 8
    for k in range(13):
        clock.now += 0.001
        registry.finish(f"done-{k}")
    assert [registry.cancel(f"done-{k}") for k in range(13)] == ["unknown"] * 5 + ["finished"] * 8


def test_the_encoder_is_refused_only_when_every_instance_is_full(tmp_path):
    first, second, encoder = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path, "h3_dit_1"), Registry(tmp_path)
    assert encoder.refusal() is None  # nothing reported yet
    first.publish_and_read_cancels([], DitLoad(held=5, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() == "the DiT holds 5 requests, its capacity max_num_seqs + max_waiting = 4 + 1; retry later"
    second.publish_and_read_cancels([], DitLoad(held=4, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() is None
    second.leave()
    first.publish_and_read_cancels([], DitLoad(held=4, max_num_seqs=4, max_waiting=1))
    assert encoder.refusal() is None


def test_the_scheduler_refuses_with_the_same_words():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=0)
    scheduler.add(Job(key=1, request_id="a", states=[SimState(10, 3)]))
    with pytest.raises(Overloaded) as error:
        scheduler.add(Job(key=2, request_id="b", states=[SimState(10, 3)]))
    assert str(error.value) == DitLoad(1, 1, 0).message()


def test_leaving_forgets_the_instance_and_deletes_nothing(tmp_path):
    """leave() removes the instance's load and live ids; the store stays (another process may be
    inside a transaction), and so do the memories: a dead server's folder goes at the next start."""
    folder = tmp_path / "h3-triton-1-2"
    first, second, encoder = Registry(folder, "h3_dit_0_0"), Registry(folder, "h3_dit_0_1"), Registry(folder)
    assert first.admit("a") is False and second.admit("b") is False
    first.publish_and_read_cancels(["a"], DitLoad(1, 1, 0))
    second.publish_and_read_cancels(["b"], DitLoad(2, 2, 0))
    assert encoder.refusal() == DitLoad(1, 1, 0).message()  # the emptiest full instance's
    first.leave()
    assert encoder.refusal() == DitLoad(2, 2, 0).message()
    assert second.cancel("a") == "unknown"  # "a" left with its instance; the cancel waits for it
    second.leave()
    assert encoder.refusal() is None
    assert sorted(path.name for path in folder.iterdir() if not path.name.endswith(("-wal", "-shm"))) == [
        registry_module.DATABASE_FILE
    ]
    again = Registry(folder, "h3_dit_0_0")
    assert again.admit("b") is False and again.admit("a") is True


def test_a_finished_request_publishes_the_load_without_it(tmp_path):
    dit, encoder = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path)
    dit.admit("a")
    dit.publish_and_read_cancels(["a"], DitLoad(held=1, max_num_seqs=1, max_waiting=0))
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
from h3_core.serving.shared.registry import Registry
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


# -- the store: damage, concurrent writers, dead servers' folders -------------------------------


def test_a_store_sqlite_cannot_read_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "text" / Registry(tmp_path / "first", "h3_dit_0").path.name
    path.parent.mkdir()
    path.write_bytes(b'{"live": {"a": "h3_dit_0"}, "canc')  # a JSON store cut short
    with pytest.raises(
        RuntimeError, match=f"^the registry {re.escape(str(path))} is unreadable: file is not a database$"
    ):
        Registry(path.parent, "h3_dit_0")
    assert path.read_bytes() == b'{"live": {"a": "h3_dit_0"}, "canc'  # left as it is, not reset

    damaged = tmp_path / "damaged" / registry_module.DATABASE_FILE
    damaged.parent.mkdir()
    with closing(sqlite3.connect(damaged)) as db, db:
        db.executescript(registry_module.SCHEMA)
        db.executemany("INSERT INTO cancels VALUES (?, ?)", [(f"id-{k:04d}", float(k)) for k in range(500)])
    data = bytearray(damaged.read_bytes())
    data[4096:8192] = b"\xa5" * 4096  # page 2, the root of the first table
    damaged.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=f"^the registry {re.escape(str(damaged))} is (unreadable|damaged): "):
        Registry(damaged.parent, "h3_dit_0")


def write_through_one_instance(folder: Path, instance: int, each: int) -> None:
    """Instance `instance` of a server in a process of its own: `each` requests admitted, stepped
    and finished, each announced, plus `each` early cancels; then it leaves."""
    registry = Registry(folder, f"h3_dit_{instance}")
    for k in range(each):
        request_id = f"{instance}-{k}"
        registry.announce()
        assert registry.admit(request_id) is False
        assert registry.publish_and_read_cancels([request_id], DitLoad(1, 4, 8)) == set()
        assert registry.finish(request_id, DitLoad(0, 4, 8)) is False
        assert registry.cancel(f"early-{request_id}") == "unknown"
    registry.leave()


def test_concurrent_writers_lose_no_update(tmp_path):
    """4 instances in processes of their own write at once and leave: every finished id, early
    cancel and announcement of every one of them is there afterwards."""
    processes = [
        multiprocessing.get_context("fork").Process(target=write_through_one_instance, args=(tmp_path, instance, 60))
        for instance in range(4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0] * 4
    registry = Registry(tmp_path, "h3_dit_4")
    ids = [f"{instance}-{k}" for instance in range(4) for k in range(60)]
    assert [registry.cancel(request_id) for request_id in ids] == ["finished"] * 240
    assert [registry.admit(f"early-{request_id}") for request_id in ids] == [True] * 240
    assert registry.announcements() == 240
    assert registry.refusal() is None


SERVER = """
import os, time
from h3_core.serving.shared.registry import Registry, server_folder
Registry(server_folder(os.getpid()), "h3_dit_0").admit("a")
print("ready", flush=True)
time.sleep(600)
"""


def test_a_dead_servers_folder_is_removed_at_the_next_start(tmp_path, monkeypatch):
    """Two servers' registries in TMPDIR; one server is SIGKILLed. The next start (server_folder)
    removes its folder and that of a pid reused by another process, keeps the live one's and other
    names."""
    root = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    dead, live = (
        subprocess.Popen([sys.executable, "-c", SERVER], cwd=root, env=environment, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    )
    try:
        assert (dead.stdout.readline(), live.stdout.readline()) == ("ready\n", "ready\n")
        dead.kill()
        assert dead.wait(60) == -signal.SIGKILL
        namespace = registry_module.pid_namespace()
        [live_folder] = tmp_path.glob(f"h3-triton-ns{namespace}-{live.pid}-*")
        assert len(list(tmp_path.glob(f"h3-triton-ns{namespace}-{dead.pid}-*"))) == 1
        (tmp_path / f"h3-triton-ns{namespace}-{os.getpid()}-1").mkdir()  # this pid, another start time
        (tmp_path / "h3-triton-notes").mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        mine = server_folder(os.getpid())
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted([live_folder.name, "h3-triton-notes"])
        assert (live_folder / registry_module.DATABASE_FILE).is_file()
        assert mine.parent == tmp_path and mine.name.startswith(f"h3-triton-ns{namespace}-{os.getpid()}-")
    finally:
        live.kill()
        live.wait(60)


def test_another_containers_folders_are_never_removed(tmp_path, monkeypatch):
    """Two containers share the host's /tmp: each server's folder names its PID namespace, and a
    start removes only dead folders of its own namespace. The other container's folder, whose pid
    runs nothing (or something else) here, is kept; a dead one of this namespace goes."""
    here, other = registry_module.pid_namespace(), registry_module.pid_namespace() + 1
    dead_pid = 2**22 + 1  # above pid_max's default: no process of that pid runs here
    theirs = tmp_path / f"h3-triton-ns{other}-{dead_pid}-5"
    mine_dead = tmp_path / f"h3-triton-ns{here}-{dead_pid}-5"
    for folder in (theirs, mine_dead):
        Registry(folder, "h3_dit_0").admit("a")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = server_folder(os.getpid())
    assert sorted(path.name for path in tmp_path.iterdir()) == [theirs.name]
    assert Registry(theirs).cancel("a") == "cancelled"  # its rows untouched
    assert mine.name == f"h3-triton-ns{here}-{os.getpid()}-{registry_module._start_time(os.getpid())}"


# -- failures: a COMMIT that fails, a journal that is not WAL, a network filesystem ------------


class FailingCommits:
    """A sqlite3 connection whose next `failures` COMMITs raise (as SQLITE_BUSY or a full disk
    would), leaving the transaction open as SQLite does."""

    def __init__(self, db: sqlite3.Connection, failures: int):
        self.db, self.failures = db, failures

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database is locked")
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_a_failed_commit_is_rolled_back_and_the_registry_goes_on(tmp_path):
    dit = Registry(tmp_path, "h3_dit_0")
    dit._db = FailingCommits(dit._db, failures=2)
    with pytest.raises(sqlite3.OperationalError, match="^database is locked$"):
        dit.admit("a")
    with pytest.raises(sqlite3.OperationalError, match="^database is locked$"):
        dit.cancel("early")
    assert dit._db.in_transaction is False
    # nothing of the failed transactions stayed; the next ones work
    assert dit.admit("a") is False and dit.admit("early") is False
    assert Registry(tmp_path).cancel("a") == "cancelled"


def test_a_journal_that_is_not_wal_is_refused(tmp_path, monkeypatch):
    connect = sqlite3.connect

    class NotWal(FailingCommits):
        def execute(self, sql: str, *args):
            return self.db.execute("PRAGMA journal_mode" if sql == "PRAGMA journal_mode=WAL" else sql, *args)

    monkeypatch.setattr(registry_module.sqlite3, "connect", lambda *a, **k: NotWal(connect(*a, **k), 0))
    path = tmp_path / registry_module.DATABASE_FILE
    with pytest.raises(RuntimeError) as error:
        Registry(tmp_path, "h3_dit_0")
    assert str(error.value) == f"the registry {path} could not use journal_mode=WAL: SQLite kept 'delete'"


@pytest.mark.parametrize("magic, name", [(0x6969, "nfs"), (0xFF534D42, "cifs"), (0x00C36400, "ceph")])
def test_a_folder_on_a_network_filesystem_is_refused(tmp_path, monkeypatch, magic, name):
    assert registry_module.filesystem_type(tmp_path) not in registry_module.NETWORK_FILESYSTEMS  # a local one
    monkeypatch.setattr(registry_module, "filesystem_type", lambda path: magic)
    with pytest.raises(RuntimeError) as error:
        Registry(tmp_path / "server", "h3_dit_0")
    assert str(error.value) == (
        f"the registry folder {tmp_path / 'server'} is on a network filesystem ({name}): SQLite's WAL "
        "needs a local one; set TMPDIR to a local folder"
    )
    assert not (tmp_path / "server" / registry_module.DATABASE_FILE).exists()


# -- dead instances ------------------------------------------------------------------------------

DEAD_INSTANCE = """
import sys
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.registry import DitLoad
registry = Registry(sys.argv[1], "h3_dit_1")
assert registry.admit("failed") is False
registry.publish_and_read_cancels(["failed"], DitLoad(held=1, max_num_seqs=4, max_waiting=0))
"""


def test_a_dead_instances_rows_are_forgotten(tmp_path):
    """A DiT instance in a process of its own admits a request, publishes a load that is not full
    and dies without leaving (SIGKILL, a crash): its request is not cancelled, its id is free again
    and its load no longer turns the encoder's refusal off."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", DEAD_INSTANCE, str(tmp_path)], cwd=root, check=True, timeout=120)
    full, encoder = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path)
    full.publish_and_read_cancels([], DitLoad(held=1, max_num_seqs=1, max_waiting=0))
    assert encoder.refusal() == DitLoad(1, 1, 0).message()
    assert encoder.cancel("failed") == "unknown"
    assert full.admit("failed") is True  # the early cancel above waited for it, as for any unknown id


def test_an_instance_that_opens_again_clears_its_former_rows(tmp_path):
    before = Registry(tmp_path, "h3_dit_0")
    assert before.admit("a") is False
    before.publish_and_read_cancels(["a"], DitLoad(held=1, max_num_seqs=4, max_waiting=0))
    encoder, other = Registry(tmp_path), Registry(tmp_path, "h3_dit_1")
    other.publish_and_read_cancels([], DitLoad(held=1, max_num_seqs=1, max_waiting=0))
    assert encoder.refusal() is None
    Registry(tmp_path, "h3_dit_0")  # the instance restarted (Triton restarts a dead stub under its name)
    assert encoder.cancel("a") == "unknown"
    assert encoder.refusal() == DitLoad(1, 1, 0).message()
