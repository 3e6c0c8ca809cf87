"""Shared benchmark helpers: an embedded PostgreSQL in a temporary directory, a
migrated database, and machine facts for the report."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.migrate import migrate


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """A fresh, migrated database: ``$BOTHY_BENCH_DATABASE_URL``'s server or an embedded one."""
    base = os.environ.get("BOTHY_BENCH_DATABASE_URL")
    embedded: EmbeddedPostgres | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if not base:
        tmp = tempfile.TemporaryDirectory(prefix="bothy-bench-")
        embedded = EmbeddedPostgres(Path(tmp.name) / "pg")
        base = embedded.start()
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(base, dbname=name)
    with psycopg.connect(url) as conn:
        migrate(conn)
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if embedded is not None:
            embedded.stop()
        if tmp is not None:
            tmp.cleanup()


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def report(name: str, **figures: Any) -> None:
    """Print the closing JSON line every benchmark ends with."""
    print(json.dumps({"bench": name, **figures}))
