"""The full-text store: an SQLite FTS5 index of document text by URI (BM25 ranking, snippets), in memory or in a
file that `--workers N` share. Blocking: every method is called from a worker thread."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["QUERY_SECONDS", "FullTextIndex", "QueryTimeout", "fts_expression"]

QUERY_SECONDS = 5.0
"""Longest a full-text query may run before it is interrupted (a clean error, never a stuck thread)."""
SNIPPET_TOKENS = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, uri TEXT UNIQUE NOT NULL, version TEXT NOT NULL,
                                 bytes INTEGER NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(body, tokenize = 'unicode61 remove_diacritics 2');
"""


class QueryTimeout(Exception):
    """A full-text query ran past its time and was interrupted."""


def fts_expression(terms: Sequence[tuple[str, bool]]) -> str:
    """An FTS5 MATCH expression requiring every term: each one quoted, so no input is read as FTS5 syntax."""
    return " ".join('"' + word.replace('"', '""') + '"' + ("*" if prefix else "") for word, prefix in terms)


class FullTextIndex:
    """An SQLite FTS5 index of document text by URI, in memory or in a file. Blocking: call it from a worker
    thread. One connection, used by one thread at a time (a lock), so queries and writes never interleave."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False,
                                     isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            if path is not None:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.execute("PRAGMA busy_timeout=5000")  # --workers N share the file
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def known(self) -> dict[str, tuple[str, int]]:
        """Every indexed URI with the version and byte count it was indexed at."""
        with self._lock:
            return {uri: (version, size) for uri, version, size in
                    self._conn.execute("SELECT uri, version, bytes FROM docs")}

    def put(self, docs: Sequence[tuple[str, str, str, int]]) -> None:
        """Index (uri, version, text, bytes) documents, replacing what those URIs had, in one transaction."""
        with self._lock, _transaction(self._conn) as conn:
            for uri, version, text, size in docs:
                row = conn.execute("SELECT id FROM docs WHERE uri = ?", (uri,)).fetchone()
                if row is not None:
                    conn.execute("DELETE FROM fts WHERE rowid = ?", row)
                    conn.execute("UPDATE docs SET version = ?, bytes = ? WHERE id = ?", (version, size, row[0]))
                    rowid = row[0]
                else:
                    rowid = conn.execute("INSERT INTO docs (uri, version, bytes) VALUES (?, ?, ?)",
                                         (uri, version, size)).lastrowid
                conn.execute("INSERT INTO fts (rowid, body) VALUES (?, ?)", (rowid, text))

    def delete(self, uris: Sequence[str]) -> None:
        with self._lock, _transaction(self._conn) as conn:
            for uri in uris:
                row = conn.execute("SELECT id FROM docs WHERE uri = ?", (uri,)).fetchone()
                if row is not None:
                    conn.execute("DELETE FROM fts WHERE rowid = ?", row)
                    conn.execute("DELETE FROM docs WHERE id = ?", row)

    def query(self, match: str, limit: int, visible: Callable[[str], bool] | None, prefix: str = "",
              seconds: float = QUERY_SECONDS) -> list[tuple[str, str]]:
        """(uri, snippet) of the best documents matching `match` (BM25) under `prefix`: `limit` of them that
        `visible` accepts, or without `visible`, `limit` of them (the caller filters; a test per row costs a
        Python call for every match). QueryTimeout past `seconds`. Snippets are made only for the ones returned."""
        deadline = time.monotonic() + seconds
        where, args = "fts MATCH ?", [match]
        if prefix:
            where += " AND docs.uri >= ? AND docs.uri < ?"
            args += [prefix, prefix + "\U0010ffff"]
        if visible is not None:
            where += " AND visible(docs.uri)"
        with self._lock:
            conn = self._conn
            if visible is not None:
                conn.create_function("visible", 1, lambda uri: bool(visible(uri)), deterministic=False)
            conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
            try:
                top = conn.execute(
                    f"SELECT fts.rowid, docs.uri FROM fts JOIN docs ON docs.id = fts.rowid WHERE {where} "
                    "ORDER BY bm25(fts) LIMIT ?", (*args, limit)).fetchall()
                if not top:
                    return []
                marks = ",".join("?" * len(top))
                snippets = dict(conn.execute(
                    f"SELECT rowid, snippet(fts, 0, '«', '»', '…', {SNIPPET_TOKENS}) FROM fts "
                    f"WHERE fts MATCH ? AND rowid IN ({marks})", (match, *(rowid for rowid, _ in top))).fetchall())
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise QueryTimeout() from None
                raise
            finally:
                conn.set_progress_handler(None, 0)
        return [(uri, snippets.get(rowid, "")) for rowid, uri in top]

    def stats(self) -> tuple[int, int]:
        """(documents, bytes of text) indexed."""
        with self._lock:
            docs, size = self._conn.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM docs").fetchone()
        return docs, size


class _transaction:
    """One write transaction: committed when the block ends, rolled back if it raises."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        # IMMEDIATE takes the write lock first, so another process writing the same index file (--workers N) makes
        # this one wait (busy_timeout) rather than fail when it upgrades from reading to writing.
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, *rest: object) -> None:
        self.conn.execute("ROLLBACK" if kind is not None else "COMMIT")
