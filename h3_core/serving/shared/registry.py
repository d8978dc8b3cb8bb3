"""The requests of every h3_dit instance of one server, shared through one SQLite database:
which request ids are live and on which instance, cancels by id, ids that finished recently, and
each instance's load. Triton-free.

Why: a cancel by id is answered here, out of band, by whichever model takes it (h3_cancel,
where clients send them; h3_vae for a gone client; any DiT instance called directly), so the
answer and the effect do not depend on where it lands and never wait for an execute busy with a
whole generation (execution mode "request" reads the flags at every step boundary); and
h3_encoder refuses newcomers early when every instance is full (Triton's backlog in front of the
DiT is unbounded and invisible). Every operation is one short SQLite transaction (writers take SQLite's write lock
with BEGIN IMMEDIATE, shared by every process of the server), so an answer is always consistent
with what the holder of the request does:

- cancel(id): live on any instance -> "cancelled" (flag set; the holder ends it with CANCELLED
  at its next step boundary, or instead of its result if the flag lands during its last step);
  finished within EARLY_CANCEL_SECONDS -> "finished" (nothing changes); otherwise "unknown",
  remembered for EARLY_CANCEL_SECONDS so a request with that id that arrives then is cancelled
  before it starts. A finished id is never planted.
- admit(id): refused when the id is live anywhere; True when an early cancel was waiting for it.
- hold(id), held_cancelled(id), release(id): h3_encoder's ids while it decodes their media (live
  on ENCODER_INSTANCE, so a cancel answers "cancelled" and the encoder stops between files).
- publish_and_read_cancels(ids, load): writes this instance's load, returns its live ids whose cancel
  flag is set (once an execute, at its first step boundary).
- finish(id, load): forget a live id, remember it as finished, publish the instance's load without
  it; True when its cancel flag was set.

Storage (DATABASE_FILE; WAL journal; synchronous=OFF, so no fsync: a commit survives a crash of
the process, not of the machine, which ends the server anyway; a busy timeout of BUSY_TIMEOUT_S):
one row per id in each of the tables `live` (id -> instance, indexed by instance), `cancels` and
`finished` (id -> registry clock at the cancel / the end, indexed by time), and one row per
instance in `loads`. Each write transaction first forgets the cancels and finished ids older than
EARLY_CANCEL_SECONDS; each memory keeps its IDS_REMEMBERED newest ids. So a call costs index
lookups, not a pass over the memories. A store SQLite cannot read is refused when a Registry opens
it (RuntimeError naming the file); it is never reset, which would forget live ids and cancels.

Announcements: a cheap signal that something new is headed for the DiT, so that an execute()
stops taking steps (h3_core.serving.dit.step_loop.StepLoop.another_step) when a newcomer or a cancel
waits for the next one. h3_encoder announces every generation request it passes on, and
cancel() each cancel of a request live on another instance than its caller's (h3_cancel's and
h3_vae's registries are instance "": every cancel they flag is announced; the holder reads the
flag at its next execute, or at its next step boundary in execution mode "request"). `announce()`
adds to a counter and stamps the time (this registry's clock; cancel() adds to the counter alone, as
nothing travels) in ANNOUNCEMENTS_FILE: 16 bytes rewritten inside a write transaction, so no
announcement is lost (no mtime granularity) and the storage stays bounded. `announcements()` and
`seconds_since_announcement()` read it without any lock (one pread, a few microseconds: the DiT
asks at every step boundary). A read that races a write may see a mix of the two values: any
value other than the one the execute started with stops it, and one equal to it is corrected by
the next read, one step later.

Dead instances: every DiT instance records its process (pid and start time) in `instances` when
its Registry opens, and clears the rows a former process of the same instance left (Triton
restarts a dead stub under the same name). Each write transaction first removes the live ids and
the load of every instance whose process is gone (one /proc read per instance), and refusal()
ignores their loads: a DiT killed with requests in flight leaves no id refused, no cancel
answered "cancelled" and no stale "not full" load that would turn off the encoder's refusal. A
live instance's load stays valid however old (an idle instance publishes nothing).

Failures: a transaction whose COMMIT fails is rolled back (else the connection would stay inside
it and every later BEGIN would fail). The store must be in WAL mode (checked as it opens) on a
local filesystem: WAL's shared memory index does not work across machines, so a folder on a
network filesystem (NETWORK_FILESYSTEMS, by statfs(2) f_type) is refused with a RuntimeError
naming it.

The folder is one per tritonserver process (the model stubs are its children and share
os.getppid()): `<tmp>/h3-triton-ns<pid namespace inode>-<server pid>-<its start time>/`. Nothing
in it is deleted while the server runs (a file deleted under a process that has it open would
split the registry in two); server_folder() removes the folders of servers that are gone (in this
PID namespace, a pid that no longer runs the process of that start time), so the next server
start cleans up after a SIGKILLed one. A folder of another PID namespace (another container
sharing the host's /tmp) is never judged, so two containers never delete each other's live
folders (a dead container's folders stay until /tmp is cleaned). Its memories are bounded by
IDS_REMEMBERED and EARLY_CANCEL_SECONDS, ids by protocol.MAX_REQUEST_ID_CHARS (checked in the
step loop).
"""

import ctypes
import ctypes.util
import json
import math
import os
import re
import shutil
import sqlite3
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from h3_core.protocol import EARLY_CANCEL_SECONDS

IDS_REMEMBERED = 1024  # bound on each memory of ids (early cancels, finished ids)
DATABASE_FILE = "registry.sqlite3"
BUSY_TIMEOUT_S = 30.0  # how long a call waits for another process's write transaction
ANNOUNCEMENTS_FILE = "announcements"  # beside DATABASE_FILE
ANNOUNCEMENT = struct.Struct("<Qd")  # how many announcements so far, the registry clock at the last one
# ns<pid namespace inode>-<server pid>-<its start time in clock ticks>
SERVER_FOLDER = re.compile(r"h3-triton-ns(\d+)-(\d+)-(\d+)")
MEMORIES = ("cancels", "finished")  # the tables of remembered ids: request_id -> registry clock
ENCODER_INSTANCE = "h3_encoder"  # the `live` rows of ids h3_encoder holds while it decodes their media (hold)
SCHEMA = """
CREATE TABLE IF NOT EXISTS live (request_id TEXT PRIMARY KEY, instance TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS live_by_instance ON live (instance);
CREATE TABLE IF NOT EXISTS cancels (request_id TEXT PRIMARY KEY, at REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cancels_by_time ON cancels (at, request_id);
CREATE TABLE IF NOT EXISTS finished (request_id TEXT PRIMARY KEY, at REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS finished_by_time ON finished (at, request_id);
CREATE TABLE IF NOT EXISTS loads (
    instance TEXT PRIMARY KEY, held INTEGER NOT NULL, max_num_seqs INTEGER NOT NULL, max_waiting INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS instances (instance TEXT PRIMARY KEY, pid INTEGER NOT NULL, started TEXT NOT NULL)
WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS loras (name TEXT PRIMARY KEY, path TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lora_reports (
    instance TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL, report TEXT NOT NULL,
    PRIMARY KEY (instance, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lora_version (one INTEGER PRIMARY KEY CHECK (one = 0), version INTEGER NOT NULL);
"""
# statfs(2) f_type of network filesystems (linux/magic.h and the filesystems' own headers)
NETWORK_FILESYSTEMS = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x00C36400: "ceph",
    0x01021997: "9p",
    0x5346414F: "afs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x73757245: "coda",
    0x564C: "ncp",
}


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22,
    proc(5)); None when no such process runs (gone, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]  # fields[0] is field 3, the state


def pid_namespace() -> int:
    """The inode of this process's PID namespace (/proc/self/ns/pid): equal for every process
    of one container, different between containers."""
    return os.stat("/proc/self/ns/pid").st_ino


def filesystem_type(path: Path) -> int:
    """statfs(2) f_type of the filesystem holding `path` (its magic number, linux/magic.h).
    Raises OSError when statfs fails."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buffer = ctypes.create_string_buffer(256)  # struct statfs (120 bytes on x86_64); f_type comes first
    if libc.statfs(os.fsencode(path), buffer) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), str(path))
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def remove_dead_server_folders(parent: Path) -> None:
    """Remove the folders `h3-triton-ns<pid namespace>-<pid>-<start time>` in `parent` of this
    PID namespace whose server is gone: no process `pid` runs, or one that started at another
    time (the pid was reused). Other names and other namespaces' folders are left alone; a live
    server's folder is kept."""
    namespace = str(pid_namespace())
    for folder in parent.glob("h3-triton-*"):
        match = SERVER_FOLDER.fullmatch(folder.name)
        if match and match[1] == namespace and folder.is_dir() and _start_time(int(match[2])) != match[3]:
            shutil.rmtree(folder, ignore_errors=True)  # another start may be removing it too


def server_folder(server_pid: int | None = None) -> Path:
    """The shared folder of the tritonserver with pid `server_pid` (None: the calling model
    stub's parent, the server; it runs in this process's PID namespace):
    `<tmp>/h3-triton-ns<pid namespace inode>-<pid>-<its start time in clock ticks>`, so a later
    process that reuses the pid never meets a dead server's ids, nor a server of another
    container sharing /tmp this one's. The folders of dead
    servers beside it are removed first (remove_dead_server_folders): each model stub calls this
    as it starts. Raises ProcessLookupError when no process `server_pid` runs."""
    pid = os.getppid() if server_pid is None else server_pid
    started = _start_time(pid)
    if started is None:
        raise ProcessLookupError(f"no process {pid} runs: it has no registry folder")
    parent = Path(tempfile.gettempdir())
    remove_dead_server_folders(parent)
    return parent / f"h3-triton-ns{pid_namespace()}-{pid}-{started}"


@dataclass(frozen=True)
class DitLoad:
    """One h3_dit instance: `held` live requests, capacity max_num_seqs + max_waiting."""

    held: int
    max_num_seqs: int
    max_waiting: int

    @property
    def full(self) -> bool:
        return self.held >= self.max_num_seqs + self.max_waiting

    def message(self) -> str:
        """The UNAVAILABLE text for a newcomer (the scheduler's Overloaded says the same)."""
        return (
            f"the DiT holds {self.held} requests, its capacity max_num_seqs + max_waiting = {self.max_num_seqs} + "
            f"{self.max_waiting}; retry later"
        )


class Registry:
    """The shared registry in `folder` (created if missing) as seen by DiT instance `instance`
    ("" for a reader such as the encoder). clock: wall seconds (time.time; instances share it).
    One SQLite connection per Registry, used by one thread at a time. A DiT instance's Registry
    records this process as the instance's and clears the rows a former process of it left.

    Raises RuntimeError naming the folder when it is on a network filesystem
    (NETWORK_FILESYSTEMS), naming DATABASE_FILE's path when SQLite cannot read it (not a
    database, a damaged one: sqlite3.DatabaseError, chained; the file is left as it is) or
    cannot put it in WAL mode."""

    def __init__(self, folder: Path, instance: str = "", clock: Callable[[], float] = time.time):
        self.folder, self.instance, self.clock = Path(folder), instance, clock
        self.folder.mkdir(parents=True, exist_ok=True)
        kind = NETWORK_FILESYSTEMS.get(filesystem_type(self.folder))
        if kind is not None:
            raise RuntimeError(
                f"the registry folder {self.folder} is on a network filesystem ({kind}): SQLite's WAL "
                "needs a local one; set TMPDIR to a local folder"
            )
        self.path = self.folder / DATABASE_FILE
        self._thread_lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            (journal,) = self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            self._db.execute("PRAGMA synchronous=OFF")  # no fsync: the store lives and dies with its server
            self._db.executescript(SCHEMA)
            problems = [row[0] for row in self._db.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise RuntimeError(f"the registry {self.path} is unreadable: {error}") from error
        if problems != ["ok"]:
            self._db.close()
            raise RuntimeError(f"the registry {self.path} is damaged: {'; '.join(problems)}")
        if journal != "wal":
            self._db.close()
            raise RuntimeError(f"the registry {self.path} could not use journal_mode=WAL: SQLite kept {journal!r}")
        if instance:
            with self._transaction():
                self._db.execute("DELETE FROM loads WHERE instance = ?", (instance,))
                self._db.execute("DELETE FROM live WHERE instance = ?", (instance,))
                self._db.execute(
                    "INSERT OR REPLACE INTO instances VALUES (?, ?, ?)",
                    (instance, os.getpid(), _start_time(os.getpid())),
                )

    @contextmanager
    def _transaction(self):
        """One write transaction, held for the block (BEGIN IMMEDIATE: SQLite's write lock, which
        every process of the server shares; rolled back when the block raises). Memories older
        than EARLY_CANCEL_SECONDS and the rows of dead instances are removed first. Yields the
        registry clock's now. A COMMIT that fails is rolled back (its error raised), so the
        connection never stays inside a transaction."""
        with self._thread_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                now = self.clock()
                for memory in MEMORIES:
                    self._db.execute(f"DELETE FROM {memory} WHERE at <= ?", (now - EARLY_CANCEL_SECONDS,))
                self._remove_dead_instances()
                yield now
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _dead_instances(self) -> list[str]:
        """The instances whose recorded process no longer runs (gone, or its pid reused)."""
        rows = self._db.execute("SELECT instance, pid, started FROM instances").fetchall()
        return [instance for instance, pid, started in rows if _start_time(pid) != started]

    def _remove_dead_instances(self) -> None:
        """Remove the rows of every dead instance; the caller holds a write transaction."""
        for instance in self._dead_instances():
            for table in ("live", "loads", "instances", "lora_reports"):
                self._db.execute(f"DELETE FROM {table} WHERE instance = ?", (instance,))

    def _remember(self, memory: str, request_id: str, now: float) -> None:
        """Remember `request_id` at `now` in `memory` (one of MEMORIES), keeping its
        IDS_REMEMBERED newest ids (ties by id); the caller holds a write transaction."""
        self._db.execute(f"INSERT OR REPLACE INTO {memory} VALUES (?, ?)", (request_id, now))
        self._db.execute(
            f"DELETE FROM {memory} WHERE request_id IN "
            f"(SELECT request_id FROM {memory} ORDER BY at DESC, request_id DESC LIMIT -1 OFFSET ?)",
            (IDS_REMEMBERED,),
        )

    def _has(self, table: str, request_id: str) -> bool:
        return self._db.execute(f"SELECT 1 FROM {table} WHERE request_id = ?", (request_id,)).fetchone() is not None

    def _publish(self, load: DitLoad) -> None:
        """Record this instance's load; the caller holds a write transaction."""
        self._db.execute(
            "INSERT OR REPLACE INTO loads VALUES (?, ?, ?, ?)",
            (self.instance, load.held, load.max_num_seqs, load.max_waiting),
        )

    def cancel(self, request_id: str) -> str:
        """Cancel by id; returns one of protocol.CANCEL_STATES (see the module docstring). A
        request live on another instance is announced: its holder reads the flag at its next
        execute, which the announcement brings forward."""
        with self._transaction() as now:
            holder = self._db.execute("SELECT instance FROM live WHERE request_id = ?", (request_id,)).fetchone()
            if holder is not None:
                self._remember("cancels", request_id, now)
                if holder[0] != self.instance:
                    self._add_announcements(1, stamp=False)  # nothing travels: the flag is here already
                return "cancelled"
            if self._has("finished", request_id):
                return "finished"
            self._remember("cancels", request_id, now)
            return "unknown"

    def admit(self, request_id: str) -> bool:
        """Register a newcomer's id on this instance. Returns True when a cancel was waiting for
        it (the id is then not registered: the request ends before it starts). Raises ValueError
        when the id is live on some instance."""
        with self._transaction() as now:
            if self._has("live", request_id):
                raise ValueError(f"request id {request_id!r} is already running; ids must be unique")
            if self._db.execute("DELETE FROM cancels WHERE request_id = ?", (request_id,)).rowcount:
                self._remember("finished", request_id, now)
                return True
            self._db.execute("INSERT INTO live VALUES (?, ?)", (request_id, self.instance))
            return False

    def publish_and_read_cancels(self, request_ids: list[str], load: DitLoad) -> set[str]:
        """At a step boundary: publish this instance's load; return which of its live ids have
        been cancelled (one primary-key lookup per id in `request_ids`)."""
        with self._transaction():
            self._publish(load)
            rows = self._db.execute(
                "SELECT cancels.request_id FROM json_each(?) AS ids JOIN cancels ON cancels.request_id = ids.value",
                (json.dumps(request_ids),),
            )
            return {row[0] for row in rows}

    def finish(self, request_id: str, load: DitLoad | None = None) -> bool:
        """Forget a live id of this instance and remember it as finished; publish `load` (this
        instance's load without the request) when given, so that the encoder's refusal does not
        wait for the next execute. Returns whether its cancel flag was set."""
        with self._transaction() as now:
            self._db.execute("DELETE FROM live WHERE request_id = ?", (request_id,))
            if load is not None:
                self._publish(load)
            self._remember("finished", request_id, now)
            return self._db.execute("DELETE FROM cancels WHERE request_id = ?", (request_id,)).rowcount > 0

    def leave(self) -> None:
        """This instance stops (model unload): its load and live ids are removed. Nothing is
        deleted from the folder (other processes may have the database open); the folder goes
        when the server is gone (remove_dead_server_folders, at the next start)."""
        with self._transaction():
            for table in ("loads", "live", "instances", "lora_reports"):
                self._db.execute(f"DELETE FROM {table} WHERE instance = ?", (self.instance,))

    def announce(self, count: int = 1) -> None:
        """Announce `count` requests headed for the DiT (see the module docstring)."""
        with self._transaction():
            self._add_announcements(count)

    def _add_announcements(self, count: int, stamp: bool = True) -> None:
        """Add `count` to the counter and, with `stamp`, record the time (a request is on its
        way); the caller holds a write transaction, which serialises the writers."""
        fd = os.open(self.folder / ANNOUNCEMENTS_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            total, last = self._unpack(os.pread(fd, ANNOUNCEMENT.size, 0))
            os.pwrite(fd, ANNOUNCEMENT.pack(total + count, self.clock() if stamp else last), 0)
        finally:
            os.close(fd)

    def _read_announcements(self) -> tuple[int, float]:
        """(announcements so far, registry clock at the last one), without any lock; (0, -inf)
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
        one's), else None (also when none has reported yet). The loads of dead instances are
        ignored. One read, no write lock."""
        with self._thread_lock:
            dead = set(self._dead_instances())
            rows = self._db.execute("SELECT instance, held, max_num_seqs, max_waiting FROM loads").fetchall()
        loads = [DitLoad(*row[1:]) for row in rows if row[0] not in dead]
        if not loads or not all(load.full for load in loads):
            return None
        return min(loads, key=lambda load: load.held).message()

    def hold(self, request_id: str) -> bool:
        """h3_encoder holds `request_id` while it decodes the request's media: live on the
        instance ENCODER_INSTANCE, so that a cancel by id answers "cancelled" and flags it
        (held_cancelled). Returns True when a cancel was already waiting for it (nothing is held,
        the id is remembered as finished: the request ends at once, as admit's). An id live
        elsewhere (a duplicate, which h3_dit refuses) is left alone and not held. Release it with
        release()."""
        with self._transaction() as now:
            if self._db.execute("DELETE FROM cancels WHERE request_id = ?", (request_id,)).rowcount:
                self._remember("finished", request_id, now)
                return True
            self._db.execute("INSERT OR IGNORE INTO live VALUES (?, ?)", (request_id, ENCODER_INSTANCE))
            return False

    def held_cancelled(self, request_id: str) -> bool:
        """Whether a cancel by id flagged `request_id` (one read, no write lock): h3_encoder asks
        between a request's files."""
        with self._thread_lock:
            return self._has("cancels", request_id)

    def release(self, request_id: str, ended: bool = False) -> None:
        """h3_encoder lets go of a held id. Passed on to h3_dit (ended False), its cancel flag,
        if any, stays: h3_dit's admit() ends it before it starts. Ended in the encoder (refused,
        cancelled: ended True), the flag is consumed and the id remembered as finished, as
        finish() does."""
        with self._transaction() as now:
            self._db.execute("DELETE FROM live WHERE request_id = ? AND instance = ?", (request_id, ENCODER_INSTANCE))
            if ended:
                self._db.execute("DELETE FROM cancels WHERE request_id = ?", (request_id,))
                self._remember("finished", request_id, now)

    # The LoRA adapters the server should hold (docs/lora.md §"Serving"): `loras` (name -> path, as the
    # operator gave it), a version counted up by every change, and each DiT instance's report per name.

    def lora_version(self) -> int:
        """The version of the adapter table (0 before any adapter was named): one read, no write lock."""
        with self._thread_lock:
            row = self._db.execute("SELECT version FROM lora_version").fetchone()
        return 0 if row is None else row[0]

    def wanted_loras(self) -> tuple[int, dict[str, str]]:
        """(version, {name: path}) of the adapter table, read together."""
        with self._thread_lock:
            self._db.execute("BEGIN")
            try:
                row = self._db.execute("SELECT version FROM lora_version").fetchone()
                names = dict(self._db.execute("SELECT name, path FROM loras ORDER BY name"))
            finally:
                self._db.execute("COMMIT")
        return (0 if row is None else row[0]), names

    def seed_loras(self, loras: dict[str, str]) -> None:
        """The adapters named at start (h3_dit's `loras`): written once per server, by the first
        instance (a table already versioned is kept: run-time loads and unloads stand)."""
        with self._transaction():
            if self._db.execute("SELECT 1 FROM lora_version").fetchone() is None:
                self._db.executemany("INSERT OR REPLACE INTO loras VALUES (?, ?)", list(loras.items()))
                self._db.execute("INSERT INTO lora_version VALUES (0, 1)")

    def change_lora(self, name: str, path: str | None) -> int:
        """Add adapter `name` at `path` to the table, or drop it (path None); returns the new
        version. Raises ValueError (the control's INVALID_ARG) for a name already there, or
        one not there to drop."""
        with self._transaction():
            present = self._db.execute("SELECT 1 FROM loras WHERE name = ?", (name,)).fetchone() is not None
            if path is not None and present:
                raise ValueError(f"LoRA adapter {name!r} is already loaded: unload it first")
            if path is None and not present:
                raise ValueError(f"LoRA adapter {name!r} is not loaded")
            if path is None:
                self._db.execute("DELETE FROM loras WHERE name = ?", (name,))
            else:
                self._db.execute("INSERT INTO loras VALUES (?, ?)", (name, path))
            self._db.execute(
                "INSERT INTO lora_version VALUES (0, 1) ON CONFLICT (one) DO UPDATE SET version = version + 1"
            )
            return self._db.execute("SELECT version FROM lora_version").fetchone()[0]

    def report_lora(self, name: str, version: int, report: dict | None) -> None:
        """This instance's state of adapter `name` at table `version`: a dict with "state"
        ("loaded", "failed", "unloading", "unloaded") and its details, or None to forget it."""
        with self._transaction():
            self._db.execute("DELETE FROM lora_reports WHERE instance = ? AND name = ?", (self.instance, name))
            if report is not None:
                self._db.execute(
                    "INSERT INTO lora_reports VALUES (?, ?, ?, ?)", (self.instance, name, version, json.dumps(report))
                )

    def lora_reports(self) -> dict[str, dict[str, dict]]:
        """{instance: {name: report}} of every live DiT instance (one without reports: {}), each
        report with its "version" added."""
        with self._thread_lock:
            dead = set(self._dead_instances())
            instances = [row[0] for row in self._db.execute("SELECT instance FROM instances ORDER BY instance")]
            rows = self._db.execute("SELECT instance, name, version, report FROM lora_reports").fetchall()
        reports = {instance: {} for instance in instances if instance not in dead}
        for instance, name, version, report in rows:
            if instance in reports:
                reports[instance][name] = {**json.loads(report), "version": version}
        return reports


class CancelNotRecorded(RuntimeError):
    """A cancel by id failed in the registry (record_cancel; the registry's error is chained)."""


def record_cancel(registry: Registry, request_id: str) -> str:
    """The answer to a cancel-by-id control request, whichever model takes it (h3_cancel, where
    clients send them, or h3_dit called directly): `registry.cancel(request_id)`, one of
    protocol.CANCEL_STATES. Raises CancelNotRecorded when the registry raises, its message the
    client's: "the cancel of request ID could not be recorded (ERROR TYPE: TEXT); see the server
    log"."""
    try:
        return registry.cancel(request_id)
    except Exception as error:  # noqa: BLE001 - the caller answers INTERNAL with this message
        raise CancelNotRecorded(
            f"the cancel of request {request_id} could not be recorded ({type(error).__name__}: {error}); "
            "see the server log"
        ) from error
