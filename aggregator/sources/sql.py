"""A SQL database as a source (SQLAlchemy): its tables and views as schema documents, and parameterised queries.

Paths are table or view names; reading one gives its schema (columns, types, nullability, keys, optional sample
rows) as JSON. Query templates run the manifest's SQL with values bound as parameters, never formatted into
the text, in read-only transactions where the database offers them, under a statement timeout and a row cap.
SQLite files are opened read-only (`mode=ro`): a missing file is an error, never created.
Errors name no SQL and no connection string: those stay in the server log, and credentials not even there.
"""

from __future__ import annotations

import builtins  # `builtins.list` in annotations below the class's own `list` method
import csv
import hashlib
import io
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread

from aggregator.content import QUERY_FORMATS
from aggregator.globs import compile_glob, path_filter
from aggregator.sources.base import Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge

__all__ = ["SqlSource", "render_rows"]


def _redact(url: str) -> str:
    return re.sub(r"//([^:/@]*)(:[^@/]*)?@", r"//\1@", url)


def _reason(exc: BaseException, secrets: Sequence[str] = ()) -> str:
    """What the database said, for the operator ("no such table: customers", "database "x" does not exist"):
    the driver's exception class and first line, bounded, with URL credentials and `secrets` blanked out."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    text = _redact(lines[0] if lines else "")[:300]
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return f"{type(orig).__name__}: {text}" if text else type(orig).__name__


class SqlSource(Source):
    """One database; `tables` (names or globs) limits what is listed and readable."""


    def __init__(self, id: str, url: str, *, tables: Sequence[str] = (), sample_rows: int = 0, row_limit: int = 1000,
                 timeout: float = 30.0, max_concurrency: int = 8, checksum: str | None = None) -> None:
        try:
            import sqlalchemy
        except ImportError:
            raise SourceError("SQL sources need SQLAlchemy: pip install 'mcp-aggregator[sql]' "
                              "(in a checkout: pip install -e '.[sql]')") from None
        self.id = id
        self._label = f"database {_redact(url)}"
        self._secrets = _url_secrets(url)
        self._tables = [compile_glob(t).fullmatch for t in tables] if tables else None
        self._sample_rows = sample_rows
        self.row_limit = row_limit
        self._timeout = timeout
        self._checksum = checksum
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        try:
            target = _sqlite_read_only(sqlalchemy.engine.make_url(url))
            self._engine = sqlalchemy.create_engine(target, pool_pre_ping=True, **_engine_options(url, timeout))
        except SourceError:
            raise
        except Exception as exc:  # a bad URL or a missing driver: never echo the URL (credentials)
            raise SourceError(f"cannot open {self._label}: {_reason(exc, self._secrets)}") from None
        _make_read_only(sqlalchemy, self._engine, timeout)

    def describe(self) -> str:
        return self._label

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._engine.dispose)

    async def _call(self, func: Any, *args: Any) -> Any:
        async with self._limiter:
            try:
                # The database's own statement timeout fires first and says more; this bounds what it cannot
                # (a server that stopped answering), within twice the timeout at most.
                with anyio.fail_after(self._timeout + min(self._timeout, 5.0)):
                    return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True)
            except TimeoutError:
                raise SourceError(f"{self._label}: no answer within {self._timeout:g}s") from None

    def _allowed(self, name: str) -> bool:
        return self._tables is None or any(match(name) for match in self._tables)

    def _names(self) -> list[str]:
        import sqlalchemy

        try:
            inspector = sqlalchemy.inspect(self._engine)
            return sorted(n for n in inspector.get_table_names() + inspector.get_view_names() if self._allowed(n))
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise SourceError(f"listing tables failed: {_reason(exc, self._secrets)}") from None

    async def probe(self) -> None:
        """Connect once and list the tables; SourceError saying why not."""
        await self._call(self._names)

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        wanted = path_filter(pattern, exclude, hidden)
        names = await self._call(self._names)
        version = await self._version()
        return [FileInfo(n, None, None, version, "application/json") for n in names if wanted(n)]

    async def stat(self, path: str) -> FileInfo:
        if path not in await self._call(self._names):
            raise SourceNotFound("no such table")
        return FileInfo(path, None, None, await self._version(path))

    async def version(self, path: str | None) -> str | None:
        """For query templates (None) the `checksum:` query's result; for a table its stat's version."""
        if path is None:
            return await self._version()
        return await super().version(path)

    async def _version(self, table: str | None = None) -> str | None:
        """For one table a digest of its schema document (what a read gives: columns, keys, sample rows); for the
        data queries read, the `checksum:` query's result (None without one). What polling compares."""
        if table is not None:
            return _digest(await self._call(self._document, table))
        if self._checksum is not None:
            rows = await self._call(self._run, self._checksum, {}, 10)
            return json.dumps(rows[1], default=str)
        return None

    async def read(self, path: str, max_bytes: int) -> Blob:
        names = await self._call(self._names)
        if path not in names:  # only names the database itself reported, so quoting below is safe
            raise SourceNotFound("no such table")
        data = await self._call(self._document, path)
        if len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        return Blob(data, "application/json", _digest(data))

    def _document(self, name: str) -> bytes:
        """Table `name`'s schema document as served."""
        return json.dumps(self._schema(name), indent=2, default=_plain).encode()

    def _schema(self, name: str) -> dict[str, Any]:
        """Table `name`'s schema document; SourceNotFound if it went meanwhile, SourceError if the database fails."""
        import sqlalchemy

        try:
            return self._describe_table(sqlalchemy, name)
        except sqlalchemy.exc.NoSuchTableError:
            raise SourceNotFound("no such table") from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise SourceError(f"reading a table's schema failed: {_reason(exc, self._secrets)}") from None

    def _describe_table(self, sqlalchemy: Any, name: str) -> dict[str, Any]:
        inspector = sqlalchemy.inspect(self._engine)
        columns = [{"name": c["name"], "type": str(c["type"]), "nullable": bool(c.get("nullable", True)),
                    **({"default": str(c["default"])} if c.get("default") is not None else {})}
                   for c in inspector.get_columns(name)]
        doc: dict[str, Any] = {"name": name, "kind": "view" if name in inspector.get_view_names() else "table",
                               "columns": columns}
        pk = inspector.get_pk_constraint(name) or {}
        if pk.get("constrained_columns"):
            doc["primaryKey"] = pk["constrained_columns"]
        fks = [{"columns": fk["constrained_columns"], "references": fk["referred_table"],
                "referencedColumns": fk["referred_columns"]} for fk in inspector.get_foreign_keys(name)]
        if fks:
            doc["foreignKeys"] = fks
        if self._sample_rows:
            table = sqlalchemy.Table(name, sqlalchemy.MetaData(), autoload_with=self._engine)
            with self._engine.connect() as conn:
                rows = conn.execute(sqlalchemy.select(table).limit(self._sample_rows)).mappings().all()
            doc["sampleRows"] = [dict(r) for r in rows]
        return doc

    async def query(self, sql: str, params: Mapping[str, str | None], fmt: str, max_bytes: int) -> Blob:
        """Run `sql` with `params` bound; the result rendered as `fmt` (json, csv or markdown)."""
        columns, rows, truncated = await self._call(self._run, sql, dict(params), self.row_limit)
        text = render_rows(columns, rows, fmt, truncated)
        data = text.encode()
        if len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        return Blob(data, QUERY_FORMATS[fmt], None)

    def _run(self, sql: str, params: dict[str, Any], limit: int
             ) -> tuple[builtins.list[str], builtins.list[tuple[Any, ...]], bool]:
        import sqlalchemy

        try:
            with self._engine.connect() as conn:
                result = conn.execute(sqlalchemy.text(sql), params)
                if not result.returns_rows:
                    conn.rollback()
                    return [], [], False
                columns = list(result.keys())
                rows = [tuple(r) for r in result.fetchmany(limit + 1)]
                conn.rollback()  # read-only: nothing a query did is ever kept
        except sqlalchemy.exc.SQLAlchemyError as exc:
            # The database's own words (they may quote a value; this goes to the operator only, never a client),
            # not SQLAlchemy's, which append the statement and its parameters.
            raise SourceError(f"query failed: {_reason(exc, self._secrets)}") from None
        return columns, rows[:limit], len(rows) > limit


def _digest(document: bytes) -> str:
    return "sha256:" + hashlib.sha256(document).hexdigest()[:32]


def _url_secrets(url: str) -> tuple[str, ...]:
    """The password in a database URL, as written and decoded (what must never reach a log line)."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return ()
    return tuple({password, unquote(password)}) if password else ()


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def render_rows(columns: list[str], rows: list[tuple[Any, ...]], fmt: str, truncated: bool = False) -> str:
    """Rows as JSON (`{"columns", "rows": [{...}], "truncated"}`), CSV or a Markdown table."""
    if fmt == "json":
        return json.dumps({"columns": columns, "rows": [dict(zip(columns, r, strict=True)) for r in rows],
                           "truncated": truncated}, indent=2, default=_plain)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([[_cell(v) for v in r] for r in rows])
        return out.getvalue()
    header = "| " + " | ".join(_md(c) for c in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_md(_cell(v)) for v in r) + " |" for r in rows]
    note = [f"\n_Showing the first {len(rows)} rows._"] if truncated else []
    return "\n".join([header, rule, *body, *note]) + "\n"


def _cell(value: Any) -> str:
    return "" if value is None else (_plain(value) if not isinstance(value, (str, int, float)) else str(value))


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _sqlite_read_only(url: Any) -> Any:
    """An SQLite file URL as a read-only URI filename (`file:...?mode=ro`); SourceError naming the file if absent.

    Without it sqlite3 creates a missing file on first connect, and `PRAGMA query_only` is a setting any query
    can lift. In-memory databases, and URLs that are already URI filenames, are left as written but for `mode`.
    Other databases pass through untouched.
    """
    if url.get_backend_name() != "sqlite":
        return url
    database, query = url.database or "", dict(url.query)
    if database in ("", ":memory:") or query.get("mode") == "memory":
        return url
    if str(query.get("uri", "")).lower() in ("true", "1"):
        return url.set(query={**query, "mode": "ro"})
    path = os.path.abspath(database)
    if not os.path.isfile(path):
        raise SourceError(f"no SQLite database file at {path} (a SQLite source is opened read-only, never created)")
    return url.set(database="file:" + quote(path, safe="/"), query={**query, "uri": "true", "mode": "ro"})


def _engine_options(url: str, timeout: float) -> dict[str, Any]:
    millis = int(timeout * 1000)
    if url.startswith("postgresql"):
        # connect_timeout: a connect to a silent server ends (libpq counts whole seconds, at least 2), rather than
        # holding its abandoned thread for good.
        return {"connect_args": {"options": f"-c statement_timeout={millis} -c default_transaction_read_only=on",
                                 "connect_timeout": max(2, math.ceil(timeout))}}
    if url.startswith(("mysql", "mariadb")):
        return {"connect_args": {"read_timeout": max(1, int(timeout)), "connect_timeout": 10}}
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": timeout}}
    return {}


def _make_read_only(sqlalchemy: Any, engine: Any, timeout: float) -> None:
    """Per connection: read-only and a statement timeout, in each database's own words."""
    dialect = engine.dialect.name
    deadlines: dict[int, list[float]] = {}  # sqlite3 connections take no attributes: keyed by id()

    @sqlalchemy.event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if dialect == "sqlite":
                cursor.execute("PRAGMA query_only = ON")
                deadline_box: list[float] = []

                def progress() -> int:
                    # Abort statements that run past the timeout (SQLite has no statement_timeout).
                    return 1 if deadline_box and time.monotonic() > deadline_box[0] else 0

                dbapi_connection.set_progress_handler(progress, 10_000)
                deadlines[id(dbapi_connection)] = deadline_box
            elif dialect in ("mysql", "mariadb"):
                cursor.execute("SET SESSION TRANSACTION READ ONLY")
                try:
                    cursor.execute(f"SET SESSION max_statement_time = {timeout:g}")  # MariaDB
                except Exception:
                    cursor.execute(f"SET SESSION max_execution_time = {int(timeout * 1000)}")  # MySQL
        finally:
            cursor.close()

    if dialect == "sqlite":
        @sqlalchemy.event.listens_for(engine, "before_cursor_execute")
        def arm(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, executemany: Any) -> None:
            box = deadlines.get(id(conn.connection.dbapi_connection))
            if box is not None:
                box[:] = [time.monotonic() + timeout]
