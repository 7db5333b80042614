"""Build sample-configs/sql/crm.db, the small SQLite database sample-configs/sql.yaml serves.

    python sample-configs/sql/make_db.py
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT UNIQUE,
    country TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    total_cents INTEGER NOT NULL,
    placed_at TEXT NOT NULL
);
CREATE TABLE internal_audit (id INTEGER PRIMARY KEY, note TEXT);
CREATE VIEW customer_totals AS
    SELECT c.id, c.name, count(o.id) AS orders, coalesce(sum(o.total_cents), 0) AS total_cents
    FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id;
"""
CUSTOMERS = [(1, "Ada Lovelace", "ada@example.com", "GB"), (2, "Grace Hopper", "grace@example.com", "US"),
             (3, "Katherine Johnson", "katherine@example.com", "US"), (4, "Hedy Lamarr", "hedy@example.com", "AT")]
ORDERS = [(1, 1, 1999, "2026-01-03"), (2, 1, 4500, "2026-02-11"), (3, 2, 1250, "2026-02-12"), (4, 4, 99900, "2026-03-01")]


def build(path: Path) -> Path:
    """Write the database beside `path` and move it into place in one step, so that a server reading `path`, or
    another run of this script, never sees a half-built or missing file."""
    fresh = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fresh.unlink(missing_ok=True)
    try:
        db = sqlite3.connect(fresh)
        try:
            with db:
                db.executescript(SCHEMA)
                db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, '2026-03-01T00:00:00Z')", CUSTOMERS)
                db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", ORDERS)
                db.execute("INSERT INTO internal_audit VALUES (1, 'not for assistants')")
        finally:
            db.close()
        os.replace(fresh, path)
    finally:
        fresh.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("crm.db")))
