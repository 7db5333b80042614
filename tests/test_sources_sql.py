"""SQL sources: SQLite always; PostgreSQL and MariaDB on their standard local ports (skipped with a reason when
absent, which CI turns into a failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound, ResourceUnavailable
from tests.conftest import MODES, connect, reads_are_unavailable, write_manifest
from tests.isolation import own_database
from tests.test_validate import closed_port

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is not installed")

ROOT = Path(__file__).resolve().parents[1]
SETUP = [
    "DROP VIEW IF EXISTS customer_totals", "DROP TABLE IF EXISTS orders", "DROP TABLE IF EXISTS customers",
    "DROP TABLE IF EXISTS internal_audit",
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR(100) NOT NULL, country VARCHAR(2) NOT NULL)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
    "total_cents INTEGER NOT NULL)",
    "CREATE TABLE internal_audit (id INTEGER PRIMARY KEY, note VARCHAR(100))",
    "CREATE VIEW customer_totals AS SELECT c.id, c.name, count(o.id) AS orders FROM customers c "
    "LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id, c.name",
    "INSERT INTO customers VALUES (1, 'Ada', 'GB'), (2, 'Grace', 'US'), (3, 'Katherine', 'US')",
    "INSERT INTO orders VALUES (1, 1, 1999), (2, 1, 4500), (3, 2, 1250)",
]


def database(url: str) -> str:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in SETUP:
                conn.execute(sqlalchemy.text(statement))
    except sqlalchemy.exc.OperationalError as exc:
        pytest.skip(f"database at {url.split('@')[-1]} is not reachable: {type(exc.orig).__name__}")
    finally:
        engine.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database(f"sqlite:///{tmp_path / 'crm.db'}")
    if request.param == "postgresql":
        pytest.importorskip("psycopg", reason="psycopg is not installed")
        return database(own_database("postgresql+psycopg://postgres@127.0.0.1:5432/test", "sql"))
    pytest.importorskip("pymysql", reason="PyMySQL is not installed")
    return database(own_database("mysql+pymysql://root@127.0.0.1:3306/test", "sql"))


def manifest(folder: Path, url: str, extra: str = "") -> Path:
    return write_manifest(folder, f"""
        version: 1
        server: {{name: sql-test}}
        sources:
          crm: {{url: "{url}", tables: ["customers", "orders", "customer_*"], rowLimit: 2, timeout: 2s, sampleRows: 1}}
        collections:
          - {{source: crm, glob: "*", uri: "db://crm/{{path}}/schema"}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: customer, source: crm,
             query: "SELECT id, name FROM customers WHERE id = :id"}}
          - {{uriTemplate: "db://crm/by-name/{{name}}", name: by-name, source: crm,
             query: "SELECT id, name FROM customers WHERE name = :name"}}
          - {{uriTemplate: "db://crm/all.csv", name: all-csv, source: crm, format: csv,
             query: "SELECT id, name FROM customers ORDER BY id"}}
          - {{uriTemplate: "db://crm/all.md", name: all-md, source: crm, format: markdown,
             query: "SELECT id, name FROM customers ORDER BY id"}}
          - {{uriTemplate: "db://crm/delete/{{id}}", name: delete, source: crm,
             query: "DELETE FROM customers WHERE id = :id"}}
          - {{uriTemplate: "db://crm/slow", name: slow, source: crm, query: "{{slow}}"}}
        {extra}
        """)


SLOW = {
    "sqlite": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
    "postgresql": "SELECT pg_sleep(10)",
    "mysql": "SELECT SLEEP(10)",
}


def test_schemas_queries_formats_injection_and_read_only(db_url: str, tmp_path: Path) -> None:
    dialect = db_url.split(":")[0].split("+")[0]
    path = manifest(tmp_path, db_url)
    path.write_text(path.read_text().replace("{slow}", SLOW[dialect]))

    async def main() -> None:
        agg = await ResourceService.open(path)
        uris = [e.uri for e in agg.catalog.entries]
        assert uris == ["db://crm/customer_totals/schema", "db://crm/customers/schema", "db://crm/orders/schema"]
        assert agg.catalog.get("db://crm/orders/schema").mime_type == "application/json"
        schema = json.loads((await agg.read("db://crm/orders/schema")).content.text)
        assert [c["name"] for c in schema["columns"]] == ["id", "customer_id", "total_cents"]
        assert schema["primaryKey"] == ["id"] and schema["foreignKeys"][0]["references"] == "customers"
        assert len(schema["sampleRows"]) == 1
        assert json.loads((await agg.read("db://crm/customer_totals/schema")).content.text)["kind"] == "view"
        with pytest.raises(ResourceNotFound):
            await agg.read("db://crm/internal_audit/schema")  # not in `tables`

        one = json.loads((await agg.read("db://crm/customers/2")).content.text)
        assert one["rows"] == [{"id": 2, "name": "Grace"}] and one["truncated"] is False
        async def rows(uri: str) -> list | str:
            try:
                return json.loads((await agg.read(uri)).content.text)["rows"]
            except ResourceUnavailable as exc:  # PostgreSQL refuses text where an integer goes
                assert "SELECT" not in exc.message and "InvalidText" not in exc.message
                return "refused"

        # Bound, never spliced: at most the row a lenient database's own cast of the value names
        # (MariaDB reads '1; DROP ...' as 1), never every row, and no statement after the value runs.
        for hostile in ["1%3B%20DROP%20TABLE%20customers", "1%20OR%201%3D1"]:
            assert await rows(f"db://crm/customers/{hostile}") in ([], [{"id": 1, "name": "Ada"}], "refused")
        assert await rows("db://crm/customers/%27%20OR%201%3D1%20--") in ([], "refused")
        assert await rows("db://crm/by-name/%27%20OR%20%27%27%3D%27") == []

        csv_text = (await agg.read("db://crm/all.csv")).content.text
        assert csv_text.splitlines() == ["id,name", "1,Ada", "2,Grace"]  # rowLimit 2
        md = (await agg.read("db://crm/all.md")).content.text
        assert md.startswith("| id | name |\n|---|---|\n| 1 | Ada |") and "first 2 rows" in md

        with pytest.raises(ResourceUnavailable) as err:
            await agg.read("db://crm/delete/1")
        assert "DELETE" not in err.value.message and "customers" not in err.value.message
        with pytest.raises(ResourceUnavailable):
            await agg.read("db://crm/slow")
        # Nothing changed: the injection attempts and the DELETE left every row in place.
        assert json.loads((await agg.read("db://crm/customers/1")).content.text)["rows"] == [{"id": 1, "name": "Ada"}]
        await agg.aclose()

    anyio.run(main)
    engine = sqlalchemy.create_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT count(*) FROM customers")).scalar() == 3
    engine.dispose()


def test_errors_hide_sql_and_credentials(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: sql-bad}
        sources:
          crm: {url: "postgresql+psycopg://app:hunter2@127.0.0.1:1/none", timeout: 2s}
        templates:
          - {uriTemplate: "db://x/{id}", name: x, source: crm, query: "SELECT secret_column FROM t WHERE id = :id"}
        """)

    async def main() -> None:
        agg = await ResourceService.open(path)
        with pytest.raises(ResourceUnavailable) as err:
            await agg.read("db://x/1")
        assert "hunter2" not in err.value.message and "secret_column" not in err.value.message
        assert "hunter2" not in agg.sources["crm"].describe()
        await agg.aclose()

    anyio.run(main)
    assert "hunter2" not in caplog.text and "secret_column" not in caplog.text


def test_the_sample_database_script_can_run_while_another_run_or_a_reader_uses_the_file(tmp_path: Path) -> None:
    """Tests on several workers (and users with a server running) rebuild the sample at once: no run may fail and a
    reader never finds the file missing or half built."""
    import sqlite3

    script, db = ROOT / "sample-configs" / "sql" / "make_db.py", tmp_path / "crm.db"
    for _ in range(4):
        runs = [subprocess.Popen([sys.executable, str(script), str(db)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE) for _ in range(4)]
        while any(run.poll() is None for run in runs):
            if db.exists():
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as reader:
                    assert reader.execute("SELECT count(*) FROM customers").fetchone() == (4,)
        assert [(run.wait(), run.stderr.read()) for run in runs if run.stderr] == [(0, b"")] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crm.db"]


@pytest.mark.parametrize("mode", MODES)
def test_sample_manifest_over_stdio(mode: str, tmp_path: Path) -> None:
    """The bundled sample, its database built by its script, read through the official client."""
    subprocess.run([sys.executable, str(ROOT / "sample-configs" / "sql" / "make_db.py")], check=True,
                   capture_output=True)

    async def main() -> None:
        async with connect(ROOT / "sample-configs" / "sql.yaml", mode) as client:
            listed = [r.uri for r in (await client.list_resources()).resources]
            assert "db://crm/customers/schema" in listed and not any("internal_audit" in u for u in listed)
            one = (await client.read_resource("db://crm/customers/4")).contents[0]
            assert one.mime_type == "application/json" and json.loads(one.text)["rows"][0]["name"] == "Hedy Lamarr"
            table = (await client.read_resource("db://crm/totals.md")).contents[0]
            assert table.mime_type == "text/markdown" and "| Hedy Lamarr | 1 | 99900 |" in table.text

    anyio.run(main)


def test_checksum_poll_sends_updated_and_new_tables_change_the_listing(tmp_path: Path) -> None:
    from mcp import Client
    from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

    from aggregator.supervisor import Supervisor
    from aggregator.notify import Notifier
    from aggregator.server import build_server

    url = database(f"sqlite:///{tmp_path / 'live.db'}")
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: sql-live}}
        sources:
          crm: {{url: "{url}", poll: 200ms, checksum: "SELECT count(*), max(id) FROM customers"}}
        collections:
          - {{source: crm, glob: "*", uri: "db://crm/{{path}}/schema"}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: c, source: crm, query: "SELECT * FROM customers WHERE id = :id"}}
        """)

    async def main() -> None:
        agg = await ResourceService.open(path)
        notifier = Notifier()
        live = Supervisor(agg, notifier)
        async with anyio.create_task_group() as tg:
            tg.start_soon(live.run)
            async with Client(build_server(agg, notifier), mode="auto", cache=None) as client:
                async with client.listen(resources_list_changed=True,
                                         resource_subscriptions=["db://crm/customers/4"]) as sub:
                    await anyio.sleep(0.5)  # the first poll records the checksum
                    engine = sqlalchemy.create_engine(url)
                    with engine.begin() as conn:
                        conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (4, 'Hedy', 'AT')"))
                        conn.execute(sqlalchemy.text("CREATE TABLE notes (id INTEGER PRIMARY KEY)"))
                    engine.dispose()
                    seen = []
                    with anyio.fail_after(5):
                        async for event in sub:
                            seen.append(event)
                            if len(seen) == 2:
                                break
                    assert ResourceUpdated(uri="db://crm/customers/4") in seen and ResourcesListChanged() in seen
                assert json.loads((await client.read_resource("db://crm/customers/4")).contents[0].text)["rows"]
                assert "db://crm/notes/schema" in [r.uri for r in (await client.list_resources()).resources]
            live.stop()
            tg.cancel_scope.cancel()
        await agg.aclose()

    anyio.run(main)


def missing_db_manifest(folder: Path) -> Path:
    (folder / "data").mkdir(exist_ok=True)
    return write_manifest(folder, """
        version: 1
        server: {name: sql-missing}
        sources:
          crm:
            url: "sqlite:///data/crm.db"
            tables: [customers]
        collections:
          - {source: crm, glob: "*", uri: "db://crm/{path}/schema"}
        templates:
          - {uriTemplate: "db://crm/customers/{id}", name: c, source: crm,
             query: "SELECT * FROM customers WHERE id = :id"}
        """)


def aggregator_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_missing_sqlite_file_is_a_located_error_and_is_never_created(tmp_path: Path) -> None:
    from aggregator.service import open_sources
    from aggregator.manifest import ManifestError, load_manifest

    path = missing_db_manifest(tmp_path)
    db = tmp_path / "data" / "crm.db"

    validated = aggregator_cli("validate", str(path))
    assert validated.returncode == 1, validated
    output = validated.stdout + validated.stderr
    assert f"{path}:4:3: sources.crm.url: " in output and str(db) in output and "no SQLite database" in output
    assert not db.exists()

    with pytest.raises(ManifestError) as err:
        open_sources(load_manifest(path))
    [issue] = err.value.issues
    assert (issue.line, issue.col, issue.key) == (4, 3, "sources.crm.url") and str(db) in issue.message
    assert not db.exists()

    served = aggregator_cli("serve", str(path))
    assert served.returncode != 0 and f"{path}:4:3: sources.crm.url: " in served.stderr, served
    assert not db.exists()
    assert not any(tmp_path.joinpath("data").iterdir())  # no journal, -wal or -shm file either


def test_the_sample_validated_before_its_database_is_built_creates_nothing(tmp_path: Path) -> None:
    """sample-configs/sql.yaml names sql/crm.db beside itself: copied to a folder without one, nothing appears."""
    (tmp_path / "sql").mkdir()
    sample = tmp_path / "sql.yaml"
    sample.write_text((ROOT / "sample-configs" / "sql.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    result = aggregator_cli("validate", str(sample))
    assert result.returncode == 1 and str(tmp_path / "sql" / "crm.db") in result.stdout + result.stderr, result
    assert not (tmp_path / "sql" / "crm.db").exists()


def test_sqlite_cannot_be_written_even_with_query_only_turned_off(tmp_path: Path) -> None:
    """The file is opened read-only (mode=ro): a manifest query that lifts `PRAGMA query_only` still cannot write."""
    url = database(f"sqlite:///{tmp_path / 'crm.db'}")
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: sql-ro}}
        sources:
          crm: {{url: "{url}", maxConcurrency: 1, ttl: 0s}}
        templates:
          - {{uriTemplate: "db://crm/unlock", name: unlock, source: crm, query: "PRAGMA query_only = OFF"}}
          - {{uriTemplate: "db://crm/create", name: create, source: crm, query: "CREATE TABLE pwned (x INTEGER)"}}
          - {{uriTemplate: "db://crm/insert", name: insert, source: crm,
             query: "INSERT INTO customers VALUES (9, 'Eve', 'XX')"}}
          - {{uriTemplate: "db://crm/customers/{{id}}", name: c, source: crm,
             query: "SELECT name FROM customers WHERE id = :id"}}
        """, name="ro.yaml")

    async def main() -> None:
        agg = await ResourceService.open(path)
        for uri in ["db://crm/unlock", "db://crm/create", "db://crm/unlock", "db://crm/insert"]:
            try:
                await agg.read(uri)
            except ResourceUnavailable:
                pass
        assert json.loads((await agg.read("db://crm/customers/1")).content.text)["rows"] == [{"name": "Ada"}]
        await agg.aclose()

    anyio.run(main)
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT count(*) FROM customers")).scalar() == 3
        assert conn.execute(sqlalchemy.text("SELECT count(*) FROM sqlite_master WHERE name = 'pwned'")).scalar() == 0
    engine.dispose()


@pytest.mark.parametrize("mode", MODES)
def test_sqlite_file_with_awkward_characters_in_its_path_reads(tmp_path: Path, mode: str) -> None:
    """The read-only URI percent-encodes the path: '?', '#', '%' and spaces in folder names still open the file."""
    from urllib.parse import quote

    folder = tmp_path / "a ?#% b"
    folder.mkdir()
    url = database(f"sqlite:///{quote(str(folder / 'crm.db'), safe='/ #')}")  # SQLAlchemy decodes %3F and %25
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: sql-path}}
        sources:
          crm: {{url: "{url}", tables: [customers]}}
        collections:
          - {{source: crm, glob: "*", uri: "db://crm/{{path}}/schema"}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: c, source: crm,
             query: "SELECT name FROM customers WHERE id = :id"}}
        """)

    async def main() -> None:
        async with connect(path, mode) as client:
            assert [r.uri for r in (await client.list_resources()).resources] == ["db://crm/customers/schema"]
            one = (await client.read_resource("db://crm/customers/2")).contents[0]
            assert json.loads(one.text)["rows"] == [{"name": "Grace"}]

    anyio.run(main)
    assert sorted(p.name for p in folder.iterdir()) == ["crm.db"]


def test_in_memory_sqlite_still_opens(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: sql-memory}
        sources:
          mem: {url: "sqlite:///:memory:"}
        templates:
          - {uriTemplate: "db://mem/{n}", name: n, source: mem, query: "SELECT :n + 1 AS next"}
        """)

    async def main() -> None:
        agg = await ResourceService.open(path)
        assert json.loads((await agg.read("db://mem/41")).content.text)["rows"] == [{"next": 42}]
        await agg.aclose()

    anyio.run(main)


def test_failures_tell_the_operator_why_and_the_client_nothing(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The log says what the database said (`no such table: customers`, `database ... does not exist`); the
    client's message names only the URI; the password in the URL appears nowhere."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    lite = tmp_path / "empty.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{lite}")
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE other (id INTEGER)"))
    engine.dispose()
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: sql-why}}
        sources:
          lite: {{url: "sqlite:///{lite}"}}
          pg: {{url: "postgresql+psycopg://postgres:pw-0c8e1d@127.0.0.1:5432/no_such_db_15", timeout: 5s}}
        templates:
          - {{uriTemplate: "lite://{{id}}", name: lite, source: lite, query: "SELECT * FROM customers WHERE id = :id"}}
          - {{uriTemplate: "pg://{{id}}", name: pg, source: pg, query: "SELECT :id AS id"}}
        """)

    reads_are_unavailable(path, ["lite://1", "pg://1"])
    assert "query failed: OperationalError: no such table: customers" in caplog.text
    assert 'database "no_such_db_15" does not exist' in caplog.text
    assert "pw-0c8e1d" not in caplog.text and "SELECT" not in caplog.text


# --- optional: true ---------------------------------------------------------------------------------------------

PG_PASSWORD = "pw-7b21e4"


def optional_manifest(folder: Path, closed: int, flag: str = ", optional: true") -> Path:
    """A folder that serves, beside SQL sources that cannot be used: a SQLite file that is not there, PostgreSQL on
    a closed port, and a database name PostgreSQL does not have."""
    (folder / "docs").mkdir(exist_ok=True)
    (folder / "docs" / "a.md").write_text("# A\n")
    (folder / "data").mkdir(exist_ok=True)
    return write_manifest(folder, f"""
        version: 1
        server: {{name: sql-optional}}
        sources:
          docs: {{url: ./docs}}
          lite: {{url: "sqlite:///data/crm.db", tables: [customers]{flag}}}
          down: {{url: "postgresql+psycopg://postgres:{PG_PASSWORD}@127.0.0.1:{closed}/test", timeout: 3s{flag}}}
          nodb: {{url: "postgresql+psycopg://postgres:{PG_PASSWORD}@127.0.0.1:5432/no_such_db_24", timeout: 3s{flag}}}
        collections:
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
          - {{source: lite, glob: "*", uri: "lite://{{path}}/schema"}}
          - {{source: down, glob: "*", uri: "down://{{path}}/schema"}}
          - {{source: nodb, glob: "*", uri: "nodb://{{path}}/schema"}}
        templates:
          - {{uriTemplate: "lite://customers/{{id}}", name: customer, source: lite,
             query: "SELECT id, name FROM customers WHERE id = :id"}}
          - {{uriTemplate: "down://customers/{{id}}", name: down customer, source: down, query: "SELECT :id AS id"}}
        """)


def test_optional_sql_sources_that_cannot_open_are_skipped_by_validate(tmp_path: Path) -> None:
    """validate: each optional SQL source that cannot be opened or listed is one located warning saying it is
    skipped (exit 0; --strict fails); nothing is created, no password shown, nothing said twice."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    closed = closed_port()
    path = optional_manifest(tmp_path, closed)
    done = aggregator_cli("validate", str(path))
    assert done.returncode == 0, done
    err = done.stderr
    db = tmp_path / "data" / "crm.db"
    assert f"{path}:5:3: sources.lite: warning: cannot open source 'lite': no SQLite database file at {db} " in err, err
    assert f"{path}:6:3: sources.down: warning: cannot reach database postgresql+psycopg://postgres@127.0.0.1:" \
           f"{closed}/test: listing tables failed: OperationalError: connection failed: " in err, err
    assert f"{path}:7:3: sources.nodb: warning: cannot reach database " in err and \
           'database "no_such_db_24" does not exist' in err, err
    for sid in ("lite", "down", "nodb"):
        line = next(line for line in err.splitlines() if f"sources.{sid}: warning" in line)
        assert line.endswith("; skipped (optional: true): the other sources serve without it"), line
    assert "matches no file" not in err  # said by the source's own warning
    assert "WARNING" not in err  # each problem once, located; not again as a log line
    assert PG_PASSWORD not in err + done.stdout
    assert "valid, 3 warning(s)" in done.stdout
    assert aggregator_cli("validate", "--strict", str(path)).returncode == 1
    assert not db.exists() and not any((tmp_path / "data").iterdir())


def test_sql_sources_that_cannot_be_listed_are_located_errors_unless_optional(tmp_path: Path) -> None:
    """Without `optional`, PostgreSQL on a closed port or without the database is refused, at the collection that
    lists it, saying why (a missing SQLite file: test_a_missing_sqlite_file_is_a_located_error_...)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    closed = closed_port()
    path = optional_manifest(tmp_path, closed, flag="")
    path.write_text(path.read_text().replace('  lite: {url: "sqlite:///data/crm.db", tables: [customers]}\n', "")
                    .replace('  - {source: lite, glob: "*", uri: "lite://{path}/schema"}\n', "")
                    .replace('  - {uriTemplate: "lite://customers/{id}", name: customer, source: lite,\n'
                             '     query: "SELECT id, name FROM customers WHERE id = :id"}\n', ""))
    for command in ("validate", "serve"):
        done = aggregator_cli(command, str(path))
        assert done.returncode == 1, done
        assert f"{path}:9:5: collections[1]: cannot list source 'down': listing tables failed: OperationalError: " \
               f"connection failed: connection to server at \"127.0.0.1\", port {closed} failed: Connection refused" \
               in done.stderr, done.stderr
        assert f"{path}:10:5: collections[2]: cannot list source 'nodb': listing tables failed: " in done.stderr
        assert 'database "no_such_db_24" does not exist' in done.stderr
        assert PG_PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize("mode", MODES)
def test_optional_sql_sources_that_cannot_open_leave_the_rest_serving(tmp_path: Path, mode: str) -> None:
    """serve: the folder serves, the SQL sources list nothing and their templates are unavailable (naming only the
    URI); once the SQLite file exists, saving the manifest opens it."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    path = optional_manifest(tmp_path, closed_port())
    db = tmp_path / "data" / "crm.db"

    async def main() -> None:
        from mcp.shared.exceptions import MCPError

        async with connect(path, mode) as client:
            assert [r.uri for r in (await client.list_resources()).resources] == ["docs://a.md"]
            assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"
            for uri in ("lite://customers/1", "down://customers/1"):
                with pytest.raises(MCPError) as failed:
                    await client.read_resource(uri)
                assert failed.value.error.message == f"Resource {uri} could not be read right now"
            assert not db.exists()

            database(f"sqlite:///{db}")
            path.write_text(path.read_text() + "\n")  # a save: the reload opens what could not be opened
            with anyio.fail_after(20):
                while "lite://customers/schema" not in [r.uri for r in (await client.list_resources()).resources]:
                    await anyio.sleep(0.1)
            row = json.loads((await client.read_resource("lite://customers/1")).contents[0].text)  # type: ignore[union-attr]
            assert row["rows"] == [{"id": 1, "name": "Ada"}]

    anyio.run(main)
