"""Fixtures of the real-process tests: a PostgreSQL of the module's own that tests
may stop, and daemons started as child processes on a fresh database of it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.procs import DaemonProcess, PgCluster, write_config


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PgCluster]:
    """An embedded PostgreSQL for this module (tests may stop and start it)."""
    home = Path(tempfile.mkdtemp(prefix="bothy-faults-pg-"))
    cluster = PgCluster(home)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def fault_db(pg_cluster: PgCluster) -> str:
    """A fresh database on the module's server."""
    return pg_cluster.new_database()


DaemonFactory = Callable[..., Awaitable[DaemonProcess]]


@pytest.fixture
async def daemons(fault_db: str, tmp_path: Path) -> AsyncIterator[DaemonFactory]:
    """Start daemon processes on this test's database:
    ``node = await daemons("a", env={...}, notify={...})``; all are killed at the end."""
    started: list[DaemonProcess] = []

    async def start(
        name: str = "node", *, env: dict[str, str] | None = None, **sections: Any
    ) -> DaemonProcess:
        config = write_config(
            tmp_path / f"{name}.toml",
            fault_db,
            record_file=tmp_path / "pushes.jsonl",
            **sections,
        )
        node = DaemonProcess(config_file=config, log_file=tmp_path / f"{name}.log", env=env or {})
        started.append(node)
        return await node.start()

    try:
        yield start
    finally:
        with trio.CancelScope(shield=True):
            for node in started:
                if node.alive():
                    node.kill()
                    await node.wait_exit(10)
