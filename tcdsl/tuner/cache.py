"""Tuning cache: the autotuner's persistent store, ``TuneKey -> TuneEntry`` in one SQLite file.

Input: a ``TuneKey`` (canonical def text, shapes, dtypes, strides, target and toolchain) and the mapping
options found for it; output: the fastest ``TuneEntry`` per key, its search history and a resumable checkpoint.

Several processes may tune into the same file at once: the database runs in WAL mode with a busy timeout,
every write is one ``BEGIN IMMEDIATE`` transaction (the best is compared and stored inside it, so a slower
result never overwrites a faster one), and every call opens and closes its own connection, so one
``TuningCache`` object may be shared by threads.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tcdsl.codegen.diskcache import mkdir_private
from tcdsl.core import knobs
from tcdsl.core.errors import TcError

SCHEMA_VERSION = 1
"""Stored in ``PRAGMA user_version``; a file written by a newer schema is refused, not rewritten."""

_SCHEMA = """
CREATE TABLE keys (
    digest TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    tc TEXT NOT NULL,
    entry TEXT NOT NULL,
    backend TEXT NOT NULL
);
CREATE INDEX keys_def ON keys (tc, entry, backend);
CREATE TABLE best (
    digest TEXT PRIMARY KEY REFERENCES keys (digest),
    options TEXT NOT NULL,
    time_s REAL NOT NULL,
    created REAL NOT NULL,
    evaluations INTEGER NOT NULL
);
CREATE TABLE history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    digest TEXT NOT NULL REFERENCES keys (digest),
    record TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX history_digest ON history (digest, id);
CREATE TABLE checkpoints (
    digest TEXT PRIMARY KEY REFERENCES keys (digest),
    state TEXT NOT NULL,
    created REAL NOT NULL
);
"""

_TABLES = {"keys", "best", "history", "checkpoints", "sqlite_sequence"}


class TuningCacheError(TcError):
    """The tuning cache file cannot be used: not a SQLite database, corrupt, unreadable, or a newer schema."""


@dataclass(frozen=True)
class TuneKey:
    """Everything a tuned result depends on; two keys with equal fields share a digest in every process."""

    tc: str
    entry: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    strides: tuple[tuple[int, ...], ...]
    backend: str
    device: str
    arch: str
    compiler: str
    version: str

    def __post_init__(self) -> None:
        # accept lists (e.g. from JSON) and normalise them, so equality, hashing and the digest agree
        object.__setattr__(self, "shapes", _int_tuples(self.shapes))
        object.__setattr__(self, "strides", _int_tuples(self.strides))
        object.__setattr__(self, "dtypes", tuple(str(d) for d in self.dtypes))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, tuples as lists, no whitespace."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> TuneKey:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a TuneKey is a JSON object, got {type(data).__name__}")
        return cls(**data)

    def digest(self) -> str:
        """sha256 hex of the canonical JSON."""
        return hashlib.sha256(self.to_json().encode("ascii")).hexdigest()


@dataclass(frozen=True)
class TuneEntry:
    """The best mapping options known for a key and how long they took."""

    key: TuneKey
    options: str
    time_s: float
    created: float
    evaluations: int


def _int_tuples(rows: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in row) for row in rows)


def _check_time(time_s: float) -> float:
    t = float(time_s)
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"a tuning time must be a finite, non-negative number of seconds, got {time_s!r}")
    return t


class TuningCache:
    """The tuning cache at ``path`` (default ``knobs.tuning_db()``); the schema is created if missing."""

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout_s: float = 30.0) -> None:
        self.path: Path = Path(path) if path is not None else knobs.tuning_db()
        self.timeout_s = float(timeout_s)
        try:
            mkdir_private(self.path.parent)  # 0700, like the kernel cache beside it
        except OSError as e:
            raise TuningCacheError(f"cannot create the directory of the tuning cache {self.path}: {e}") from e
        self._init_schema()

    def __repr__(self) -> str:
        return f"TuningCache({str(self.path)!r})"

    # -- connections -----------------------------------------------------------------------------------------

    def _error(self, e: BaseException) -> TuningCacheError:
        return TuningCacheError(f"tuning cache {self.path} is unusable: {e} (the file was left in place)")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A fresh autocommit connection, closed on exit; SQLite errors become ``TuningCacheError``."""
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise self._error(e) from e
        try:
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across crashes of the process in WAL mode
            yield conn
        except sqlite3.Error as e:
            raise self._error(e) from e
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any exception."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._connect() as conn:
            self._enable_wal(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._create_tables(conn)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (persistent); retried while another process holds the lock it needs."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() == "wal":
                    return
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
                return
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _create_tables(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise TuningCacheError(
                f"tuning cache {self.path} has schema version {version}, newer than this tcdsl's "
                f"{SCHEMA_VERSION}; use a newer tcdsl or another TCDSL_TUNING_DB"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables - _TABLES:
            raise TuningCacheError(
                f"{self.path} is a SQLite database but not a tcdsl tuning cache (tables: {', '.join(sorted(tables))})"
            )
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _put_key(conn: sqlite3.Connection, key: TuneKey) -> str:
        digest = key.digest()
        conn.execute(
            "INSERT OR IGNORE INTO keys (digest, key, tc, entry, backend) VALUES (?, ?, ?, ?, ?)",
            (digest, key.to_json(), key.tc, key.entry, key.backend),
        )
        return digest

    # -- best entries ----------------------------------------------------------------------------------------

    def best(self, key: TuneKey) -> TuneEntry | None:
        """The fastest entry recorded for ``key``, or None."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT options, time_s, created, evaluations FROM best WHERE digest = ?", (key.digest(),)
            ).fetchone()
        if row is None:
            return None
        return TuneEntry(key, row[0], float(row[1]), float(row[2]), int(row[3]))

    def record(
        self,
        key: TuneKey,
        options: str,
        time_s: float,
        evaluations: int = 0,
        history: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Store ``options`` if ``key`` has no entry yet or ``time_s`` beats the stored best (True when it
        became the best); append every dict of ``history`` to the key's history either way."""
        t = _check_time(time_s)
        if evaluations < 0:
            raise ValueError(f"evaluations must be non-negative, got {evaluations}")
        records = [json.dumps(h) for h in history or []]  # serialise before the transaction: errors early
        now = time.time()
        with self._write() as conn:
            digest = self._put_key(conn, key)
            row = conn.execute("SELECT time_s FROM best WHERE digest = ?", (digest,)).fetchone()
            improved = row is None or t < float(row[0])
            if improved:
                conn.execute(
                    "INSERT OR REPLACE INTO best (digest, options, time_s, created, evaluations) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (digest, options, t, now, int(evaluations)),
                )
            conn.executemany(
                "INSERT INTO history (digest, record, created) VALUES (?, ?, ?)", [(digest, r, now) for r in records]
            )
        return improved

    def entries(self) -> list[TuneEntry]:
        """Every best entry, oldest record first."""
        return self._select_entries("", ())

    def related(self, tc: str, entry: str, backend: str) -> list[TuneEntry]:
        """Best entries of the same def (text and entry name) on the same backend, for any shapes, dtypes,
        strides, device or toolchain (the exact key included if present), fastest first: seeds for a search."""
        return self._select_entries("WHERE k.tc = ? AND k.entry = ? AND k.backend = ?", (tc, entry, backend))

    def _select_entries(self, where: str, args: tuple[str, ...]) -> list[TuneEntry]:
        order = "b.time_s, b.created" if where else "b.created, b.digest"
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT k.key, b.options, b.time_s, b.created, b.evaluations "
                f"FROM best AS b JOIN keys AS k ON k.digest = b.digest {where} ORDER BY {order}",
                args,
            ).fetchall()
        return [TuneEntry(TuneKey.from_json(r[0]), r[1], float(r[2]), float(r[3]), int(r[4])) for r in rows]

    # -- history and checkpoints -----------------------------------------------------------------------------

    def history(self, key: TuneKey) -> list[dict[str, Any]]:
        """All history records of ``key``, in the order they were committed."""
        with self._connect() as conn:
            rows = conn.execute("SELECT record FROM history WHERE digest = ? ORDER BY id", (key.digest(),)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def save_checkpoint(self, key: TuneKey, state: dict[str, Any]) -> None:
        """Store the search state of ``key``, replacing any previous one."""
        text = json.dumps(state)
        with self._write() as conn:
            digest = self._put_key(conn, key)
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (digest, state, created) VALUES (?, ?, ?)",
                (digest, text, time.time()),
            )

    def load_checkpoint(self, key: TuneKey) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute("SELECT state FROM checkpoints WHERE digest = ?", (key.digest(),)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def clear_checkpoint(self, key: TuneKey) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM checkpoints WHERE digest = ?", (key.digest(),))

    def forget(self, key: TuneKey) -> None:
        """Delete the best entry, the history and the checkpoint of ``key``."""
        digest = key.digest()
        with self._write() as conn:
            for table in ("best", "history", "checkpoints", "keys"):
                conn.execute(f"DELETE FROM {table} WHERE digest = ?", (digest,))
