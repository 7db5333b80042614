"""The source contract for SQL databases (SQLite; PostgreSQL on 127.0.0.1:5432): each "file" is a table.

A table `name` holds the file's bytes in a `body` column, one row; reading it gives the table's JSON schema document
with that row as its sample (`sampleRows: 1`), so `assert_content` checks the document, not the bytes. Writing a
file replaces the row (or creates the table), removing it drops the table. A hang is a lock another connection
holds (SQLite: an exclusive transaction; PostgreSQL: an ACCESS EXCLUSIVE table lock).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregator.sources import Blob, Source
from tests.isolation import own_database
from tests.source_contract import Opener, SourceContract, open_kind, silent_server

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is not installed")

# The contract runs in a database of each worker's own (own_database), not in `test`: a listing shows every table.
POSTGRES_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"
PASSWORD = "pw-contract-7e6d"


def sql_source(url: str, **settings: object) -> Source:
    """The database at `url` as a source, each table's first row sampled in its document."""
    return open_kind(url, sample_rows=1, **settings)


def fill(engine: Any, files: dict[str, bytes], blob_type: str) -> None:
    """One table per file, named by its path, holding its bytes in one row."""
    with engine.begin() as conn:
        for name, data in files.items():
            table = engine.dialect.identifier_preparer.quote(name)
            conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(sqlalchemy.text(f"CREATE TABLE {table} (body {blob_type})"))
            conn.execute(sqlalchemy.text(f"INSERT INTO {table} (body) VALUES (:body)"), {"body": data})


class SqlContract(SourceContract):
    """What both databases share: tables as files."""

    nested = False
    exact_bytes = False
    hangs = True
    queries = True
    blob_type = "BLOB"

    def database_url(self, tmp_path: Path) -> str:
        """The URL of an empty database of the suite's own (tables are the files)."""
        raise NotImplementedError

    @pytest.fixture
    def make_source(self, tmp_path: Path) -> Opener:
        self.url = self.database_url(tmp_path)

        def open(files: dict[str, bytes], **settings: object) -> Source:
            engine = self.engine()
            fill(engine, files, self.blob_type)
            engine.dispose()
            return sql_source(self.url, **settings)

        return open

    def engine(self) -> Any:
        return sqlalchemy.create_engine(self.url)

    def held(self, source: Source) -> int:
        pool = source._engine.pool  # type: ignore[attr-defined]
        return pool.checkedin() + pool.checkedout()

    def assert_content(self, path: str, data: bytes, blob: Blob) -> None:
        doc = json.loads(blob.data)
        assert blob.mime_type == "application/json"
        assert doc["name"] == path and [c["name"] for c in doc["columns"]] == ["body"]
        assert doc["sampleRows"] == [{"body": data.hex()}], path

    def write(self, source: Source, path: str, data: bytes) -> None:
        engine = self.engine()
        fill(engine, {path: data}, self.blob_type)
        engine.dispose()

    def remove(self, source: Source, path: str) -> None:
        engine = self.engine()
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP TABLE {engine.dialect.identifier_preparer.quote(path)}"))
        engine.dispose()

    def test_a_schema_change_changes_the_version(self, make_source: Opener) -> None:
        """The document lists the columns: a new column is new bytes, though not a single row changed."""
        async def body(source: Source) -> None:
            before = await source.version("a.md")
            engine = self.engine()
            with engine.begin() as conn:
                table = engine.dialect.identifier_preparer.quote("a.md")
                conn.execute(sqlalchemy.text(f"ALTER TABLE {table} ADD COLUMN note VARCHAR(10)"))
            engine.dispose()
            after = await source.version("a.md")
            assert after != before and (await source.read("a.md", 1 << 20)).version == after

        self.run(make_source, body)


class TestSqliteContract(SqlContract):
    def database_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'contract.db'}"

    @pytest.fixture
    def hanging(self, tmp_path: Path) -> Iterator[Callable[[float], tuple[Source, str]]]:
        path = tmp_path / "locked.db"
        engine = sqlalchemy.create_engine(f"sqlite:///{path}")
        fill(engine, {"a.md": b"# A\n"}, self.blob_type)
        engine.dispose()
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # every other connection waits for it
        yield lambda timeout: (sql_source(f"sqlite:///{path}", timeout=timeout), "a.md")
        holder.execute("ROLLBACK")
        holder.close()


def postgres_url(password: str | None = None) -> str:
    """This worker's own PostgreSQL database for the contract (created once), emptied."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    url = own_database(POSTGRES_ADMIN, "contract")
    if password:
        url = url.replace("postgres@", f"postgres:{password}@", 1)
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("DROP SCHEMA public CASCADE"))
        conn.execute(sqlalchemy.text("CREATE SCHEMA public"))
    engine.dispose()
    return url


class TestPostgresContract(SqlContract):
    blob_type = "BYTEA"
    credentials = True

    def database_url(self, tmp_path: Path) -> str:
        return postgres_url()

    @pytest.fixture(params=["lock", "silent server"])
    def hanging(self, request: pytest.FixtureRequest) -> Iterator[Callable[[float], tuple[Source, str]]]:
        if request.param == "silent server":
            with silent_server() as port:
                yield lambda timeout: (sql_source(f"postgresql+psycopg://postgres@127.0.0.1:{port}/x",
                                                  timeout=timeout), "a.md")
            return
        url = postgres_url()
        engine = sqlalchemy.create_engine(url)
        fill(engine, {"a.md": b"# A\n"}, self.blob_type)
        holder = engine.connect()
        holder.execute(sqlalchemy.text('LOCK TABLE "a.md" IN ACCESS EXCLUSIVE MODE'))  # held until rollback
        yield lambda timeout: (sql_source(url, timeout=timeout), "a.md")
        holder.rollback()
        holder.close()
        engine.dispose()

    @pytest.fixture
    def with_credentials(self) -> tuple[Source, list[str]]:
        url = postgres_url(PASSWORD)  # trust authentication: any password is accepted, and must never be shown
        engine = sqlalchemy.create_engine(url)
        fill(engine, {"a.md": b"# A\n"}, self.blob_type)
        engine.dispose()
        return sql_source(url), [PASSWORD]


def mariadb_url() -> str:
    """This worker's own MariaDB database for the contract (created once), emptied."""
    pytest.importorskip("pymysql", reason="PyMySQL is not installed")
    url = own_database(MARIADB_ADMIN, "contract")
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        tables = conn.execute(sqlalchemy.text("SELECT table_name FROM information_schema.tables "
                                              "WHERE table_schema = DATABASE()")).scalars().all()
        if tables:
            conn.execute(sqlalchemy.text("DROP TABLE " + ", ".join(f"`{t}`" for t in tables)))
    engine.dispose()
    return url


class TestMariadbContract(SqlContract):
    blob_type = "LONGBLOB"

    def database_url(self, tmp_path: Path) -> str:
        return mariadb_url()

    @pytest.fixture(params=["lock", "silent server"])
    def hanging(self, request: pytest.FixtureRequest) -> Iterator[Callable[[float], tuple[Source, str]]]:
        if request.param == "silent server":
            with silent_server() as port:
                yield lambda timeout: (sql_source(f"mysql+pymysql://root@127.0.0.1:{port}/x", timeout=timeout),
                                       "a.md")
            return
        url = mariadb_url()
        engine = sqlalchemy.create_engine(url)
        fill(engine, {"a.md": b"# A\n"}, self.blob_type)
        holder = engine.connect()
        holder.execute(sqlalchemy.text("LOCK TABLES `a.md` WRITE"))  # held until UNLOCK TABLES
        yield lambda timeout: (sql_source(url, timeout=timeout), "a.md")
        holder.execute(sqlalchemy.text("UNLOCK TABLES"))
        holder.close()
        engine.dispose()
