"""The embedded server of one data directory, shared by several processes (nodes of a
cluster on one machine): it stops with the last process that uses it, and each
process's log says which of the two happened."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bothy_notify.store.embedded import EmbeddedPostgres

ATTACH = """
import sys
from bothy_notify.store.embedded import EmbeddedPostgres
server = EmbeddedPostgres(sys.argv[1])
server.start()
print("attached", flush=True)
sys.stdin.readline()
server.stop()
"""


@pytest.fixture
def home() -> Iterator[Path]:
    """A private temporary directory (pytest's basetemp is not readable by the
    ``pgserver`` user the server runs as when the tests run as root)."""
    path = Path(tempfile.mkdtemp(prefix="bothy-test-embedded-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_node_leaving_a_shared_embedded_server_leaves_it_running_and_says_so(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = home / "pg"
    mine = EmbeddedPostgres(data)
    url = mine.start()
    other = subprocess.Popen(
        [sys.executable, "-c", ATTACH, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "attached\n"
        with caplog.at_level(logging.INFO, logger="bothy.store.embedded"):
            mine.stop()
        assert caplog.messages[-1] == (
            "embedded PostgreSQL server left running for the other processes using it"
        )
        with psycopg.connect(url) as conn:  # the other process still has its database
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        assert other.stdin is not None
        other.stdin.write("\n")
        other.stdin.close()
        assert other.wait(60) == 0
        assert other.stdout is not None
        other.stdout.close()
    assert not (data / "postmaster.pid").exists()  # the last one stopped it


@pytest.mark.slow
def test_the_last_process_using_the_embedded_server_stops_it(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedPostgres(home / "pg")
    server.start()
    with caplog.at_level(logging.INFO, logger="bothy.store.embedded"):
        server.stop()
    assert caplog.messages[-1] == "embedded PostgreSQL server stopped"
    assert not (home / "pg" / "postmaster.pid").exists()
