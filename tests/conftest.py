"""Shared fixtures: one embedded PostgreSQL per test session, a fresh database per
test (cloned from a migrated template), a fake clock, and an absolute deadline
around every async test (fixtures included)."""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.store.db import Database
from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.migrate import migrate

TEST_DEADLINE = float(os.environ.get("BOTHY_TEST_DEADLINE", "60"))
"""Seconds an async test (with its fixtures) may take before it fails; a test marked
``deadline(seconds)`` gets its own (never less)."""

TEMPLATE = "bothy_template"


def _run_with_deadline(
    async_fn: Callable[..., Any], *args: Any, deadline: float = TEST_DEADLINE, **kwargs: Any
) -> Any:
    async def bounded() -> Any:
        with trio.fail_after(deadline):
            return await async_fn(*args)

    return trio.run(bounded, **kwargs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fn = getattr(item, "obj", None)
        if fn is not None and inspect.iscoroutinefunction(fn):
            marker = item.get_closest_marker("deadline")
            deadline = TEST_DEADLINE if marker is None else max(TEST_DEADLINE, marker.args[0])
            item.add_marker(pytest.mark.trio(run=partial(_run_with_deadline, deadline=deadline)))


@pytest.fixture(autouse=True)
def _logging_levels() -> Iterator[None]:
    """Give every test the log levels it started with: a daemon's reload
    (``logs.set_level``) and ``setup_logging`` set the root's and ``bothy``'s level
    for the whole process, and a later test in the same worker would then miss the
    records it checks for (seen: a warning under a level left at ``error``)."""
    loggers = [logging.getLogger(), logging.getLogger("bothy")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The session's embedded server, with a migrated template database.

    Its data directory is a private temporary directory (not pytest's rotating
    basetemp, which a concurrent pytest run may prune), removed at the end.
    """
    home = Path(tempfile.mkdtemp(prefix="bothy-test-pg-"))
    server = EmbeddedPostgres(home / "data")
    url = server.start()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    with psycopg.connect(make_conninfo(url, dbname=TEMPLATE)) as conn:
        migrate(conn)
    try:
        yield url
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def database_url(pg_url: str) -> Iterator[str]:
    """A fresh database for this test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield make_conninfo(pg_url, dbname=name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, pool_size=4)
    await database.open()
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def launch(nursery: trio.Nursery, database_url: str) -> AsyncIterator[Any]:
    """Start daemons on this test's database: ``node = await launch(config=...)``.

    Nodes stop when the test ends; their HTTP clients are closed.
    """
    from tests.harness import Node, start_node

    nodes: list[Node] = []

    async def starter(**kwargs: Any) -> Node:
        node = await start_node(nursery, database_url, **kwargs)
        nodes.append(node)
        return node

    try:
        yield starter
    finally:
        for node in nodes:
            await node.http.aclose()
