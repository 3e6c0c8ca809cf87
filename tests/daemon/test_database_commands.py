"""Which database the commands use: ``database.url = ""`` starts the embedded
PostgreSQL for every one-shot command, in the data directory named relative to the
configuration file (``run`` is covered by the install check,
``tests/install/smoke.py``; ``demo`` always uses a throwaway embedded server); an
unreachable database is one line and exit status 1, never a traceback."""

from __future__ import annotations

import io
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bothy_notify import commands
from bothy_notify.cli import main
from bothy_notify.config import load_config

CONFIG = """
[server]
dev = true

[database]
url = ""
data_dir = "state/postgres"

[push.fake]
"""


@pytest.mark.slow  # starts and stops a real embedded PostgreSQL three times
def test_an_empty_database_url_runs_every_command_on_the_embedded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "bothy.toml").write_text(CONFIG)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # the working directory must not matter
    config = load_config("../etc/bothy.toml", env={})
    data_dir = tmp_path / "etc" / "state" / "postgres"

    out = io.StringIO()
    assert commands.migrate_command(config, out) == 0
    assert f"starting the embedded PostgreSQL in {data_dir}" in out.getvalue()
    assert "migrations: " in out.getvalue()
    assert (data_dir / "PG_VERSION").is_file()

    out = io.StringIO()
    assert commands.secret_set_command(config, "a-name", io.StringIO("value-0123456789"), out) == 0
    assert "stored secret a-name: 16 characters" in out.getvalue()

    out = io.StringIO()
    assert commands.push_test_command(config, "alex", out) == 1
    assert "no device registered for this person" in out.getvalue()
    assert list((tmp_path / "cwd").iterdir()) == []


@pytest.fixture
def restore_bothy_logging() -> Iterator[None]:
    """``main`` sets up the ``bothy`` logger for the process; put it back for later tests."""
    logger = logging.getLogger("bothy")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        yield
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.usefixtures("restore_bothy_logging")
@pytest.mark.parametrize("command", ["migrate", "run"])
def test_an_unreachable_database_is_reported_in_one_line_with_exit_status_1(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bothy.toml"
    config.write_text(
        '[server]\napi_listen = "127.0.0.1:0"\ngateway_listen = "127.0.0.1:0"\n'
        f'[database]\nurl = "postgresql://bothy@127.0.0.1:{closed_port()}/bothy"\n'
        '[log]\nlevel = "error"\n'
    )
    assert main([command, "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "bothy-notify: the database cannot be reached" in err
    assert "Traceback" not in err and "127.0.0.1" not in err
