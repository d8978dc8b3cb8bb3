"""The Videos API's jobs in SQLite: one file, WAL mode, every commit synced (synchronous=FULL), so
a job that was answered to a client survives a killed front end or a power cut. Two connections,
each under its lock, serve every thread of the front end: one writes, one reads, so reads go on
(WAL) while a write waits for the file's lock. A write waits at most BUSY_TIMEOUT_S for a lock
another process holds, then raises sqlite3.OperationalError "database is locked" (the app answers
503). Transitions of a job's state happen only while it is active (queued or in_progress):
whichever of finishing, failing, cancelling or deleting comes first wins, and the others see that
they lost.

Each job has an `owner`: the SHA-256 of the API key that made it (auth.owner_of), NULL without
keys. A store made before owners existed gains the column when opened; its jobs are owned by no
key (only an admin key sees them).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

ACTIVE = ("queued", "in_progress")
ENDED = ("completed", "failed", "cancelled")
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order, for listing
    id TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,            -- unix seconds
    status TEXT NOT NULL,                   -- ACTIVE or ENDED
    request TEXT NOT NULL,                  -- JSON: fields.parse_create's request, seed filled in
    attempts INTEGER NOT NULL DEFAULT 0,    -- submissions to Triton so far
    triton_request_id TEXT,                 -- the id of the latest submission
    step INTEGER NOT NULL DEFAULT 0,        -- DiT steps done
    total_steps INTEGER,
    queue_position INTEGER NOT NULL DEFAULT 0,
    preview_step INTEGER,                   -- the step of the latest preview image on disk
    outputs TEXT,                           -- JSON: the server's INFO of each output, once completed
    error_code TEXT,
    error_message TEXT,
    completed_at INTEGER,                   -- unix seconds it ended (completed, failed or cancelled)
    expires_at INTEGER,                     -- unix seconds its files and record are removed
    owner TEXT                              -- auth.owner_of the creator's key; NULL: no key
)
"""
# the place of each removed job (deleted or expired), so a list's `after` cursor that names it
# goes on from where it stood; kept as long as an ended job (forget)
GONE_SCHEMA = """
CREATE TABLE IF NOT EXISTS gone (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,                   -- its jobs.seq
    owner TEXT,
    removed_at INTEGER NOT NULL             -- unix seconds
)
"""
BUSY_TIMEOUT_S = 2.0  # the longest a statement waits for the file's lock held by another process
_ACTIVE_SQL = "status IN ('queued', 'in_progress')"
REQUEST_BEFORE_INPUTS = {"task": None, "fit": None, "inputs": {}}  # fields.parse_create's, absent from older rows


class Store:
    """The jobs table of the SQLite file at `path` (created with its folder when missing).
    Rows come back as dicts with `request` and `outputs` decoded from JSON."""

    def __init__(self, path: Path | str):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock, self._read_lock = threading.Lock(), threading.Lock()
        self._db = self._connect(path)
        try:
            problems = [row[0] for row in self._db.execute("PRAGMA integrity_check(5)")]
        except sqlite3.DatabaseError as error:  # not a database at all, or a header past repair
            problems = [str(error)]
        if problems != ["ok"]:
            self._db.close()
            raise RuntimeError(
                f"the jobs database {path} failed its integrity check: {'; '.join(problems).replace(chr(10), '; ')}. "
                "Stop, move it aside (with its -wal and -shm files) and restore a copy, or start empty"
            )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(SCHEMA)
        self._db.execute(GONE_SCHEMA)
        if "owner" not in {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}:
            self._db.execute("ALTER TABLE jobs ADD COLUMN owner TEXT")  # a store from before owners
        self._reader = self._connect(path)

    @staticmethod
    def _connect(path: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        db.row_factory = sqlite3.Row
        return db

    def _fetch(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._read_lock:
            return self._reader.execute(sql, args).fetchall()

    def _change(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    @staticmethod
    def _row(row: sqlite3.Row) -> dict:
        job = dict(row)
        # a request stored before conditioned inputs: no task (implied), the server's fit, no files
        job["request"] = {**REQUEST_BEFORE_INPUTS, **json.loads(job["request"])}
        job["outputs"] = json.loads(job["outputs"]) if job["outputs"] else None
        return job

    def add(self, job_id: str, created_at: int, request: dict, owner: str | None) -> None:
        """Insert a queued job of `owner` (auth.owner_of a key, None without keys)."""
        self._change(
            "INSERT INTO jobs (id, created_at, status, request, owner) VALUES (?, ?, 'queued', ?, ?)",
            (job_id, created_at, json.dumps(request), owner),
        )

    def get(self, job_id: str) -> dict | None:
        """The job with this id, or None."""
        rows = self._fetch("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return self._row(rows[0]) if rows else None

    def page(self, after: str | None, limit: int, descending: bool, owner: str | None) -> tuple[list[dict], bool]:
        """Up to `limit` jobs of `owner` (None: every job) in creation order (newest first when
        descending) after the job with id `after` (None: from the start; a job removed since:
        from its place), and whether more follow. Raises KeyError for an `after` that is not one
        of those jobs, nor one removed within the retention (forget)."""
        mine, mine_args = ("owner = ?", (owner,)) if owner is not None else ("1", ())
        with self._read_lock:
            where, args = mine, mine_args
            if after is not None:  # a job, or one removed since (its place in `gone`)
                sql = f"SELECT seq FROM jobs WHERE id = ? AND {mine} UNION ALL "
                sql += f"SELECT seq FROM gone WHERE id = ? AND {mine}"
                row = self._reader.execute(sql, (after, *mine_args, after, *mine_args)).fetchone()
                if row is None:
                    raise KeyError(after)
                where, args = f"{mine} AND seq {'<' if descending else '>'} ?", (*mine_args, row["seq"])
            rows = self._reader.execute(
                f"SELECT * FROM jobs WHERE {where} ORDER BY seq {'DESC' if descending else 'ASC'} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return [self._row(row) for row in rows[:limit]], len(rows) > limit

    def active(self) -> list[dict]:
        """Every queued or in_progress job, oldest first."""
        rows = self._fetch(f"SELECT * FROM jobs WHERE {_ACTIVE_SQL} ORDER BY seq")
        return [self._row(row) for row in rows]

    def submitted(self, job_id: str, triton_request_id: str) -> None:
        """Record a new submission of an active job under `triton_request_id`: one more attempt,
        queued again, no steps, no preview."""
        self._change(
            "UPDATE jobs SET status = 'queued', attempts = attempts + 1, triton_request_id = ?, step = 0, "
            f"total_steps = NULL, queue_position = 0, preview_step = NULL WHERE id = ? AND {_ACTIVE_SQL}",
            (triton_request_id, job_id),
        )

    def progress(self, job_id: str, **fields) -> bool:
        """Set columns (status, step, total_steps, queue_position, preview_step) of an active job;
        False when it is no longer active."""
        names = ", ".join(f"{name} = ?" for name in fields)
        return self._change(f"UPDATE jobs SET {names} WHERE id = ? AND {_ACTIVE_SQL}", (*fields.values(), job_id)) == 1

    def end(
        self,
        job_id: str,
        status: str,
        now: int,
        expires_at: int,
        outputs: list[dict] | None = None,
        error: tuple[str, str] | None = None,
    ) -> bool:
        """Move an active job to `status` (one of ENDED) at unix time `now`, kept until
        `expires_at`, with its outputs' INFO (completed) or (code, message) (failed); False when
        it was no longer active (another transition won). Raises ValueError for another status."""
        if status not in ENDED:
            raise ValueError(f"status must be one of {ENDED}, got {status!r}")
        code, message = error or (None, None)
        changed = self._change(
            "UPDATE jobs SET status = ?, outputs = ?, error_code = ?, error_message = ?, completed_at = ?, "
            f"expires_at = ? WHERE id = ? AND {_ACTIVE_SQL}",
            (status, json.dumps(outputs) if outputs is not None else None, code, message, now, expires_at, job_id),
        )
        return changed == 1

    def delete(self, job_id: str, now: int) -> dict | None:
        """Remove the job at unix time `now`, keeping its place for list cursors (`gone`); returns
        it as it was, or None when there was none."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute("DELETE FROM jobs WHERE id = ? RETURNING *", (job_id,)).fetchall()
            if rows:
                self._db.execute(
                    "INSERT OR REPLACE INTO gone (id, seq, owner, removed_at) VALUES (?, ?, ?, ?)",
                    (job_id, rows[0]["seq"], rows[0]["owner"], now),
                )
        return self._row(rows[0]) if rows else None

    def forget(self, before: int) -> int:
        """Drop the places of jobs removed before unix time `before`; returns how many."""
        return self._change("DELETE FROM gone WHERE removed_at < ?", (before,))

    def expired(self, now: int) -> list[str]:
        """The ids of the ended jobs whose expires_at is at or before unix time `now`."""
        return [row["id"] for row in self._fetch("SELECT id FROM jobs WHERE expires_at <= ?", (now,))]

    def ids(self) -> set[str]:
        """The ids of every job."""
        return {row["id"] for row in self._fetch("SELECT id FROM jobs")}

    def close(self) -> None:
        """Close the database connections."""
        with self._lock, self._read_lock:
            self._db.close()
            self._reader.close()
