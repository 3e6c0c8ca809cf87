"""``bothy-notify run --ready-file PATH``: the bound addresses as JSON once the daemon
serves (the process form of ``task_status.started``), gone once it exits
(docs/operations.md, "Readiness for supervisors and scripts")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from bothy_notify import __version__
from testkit.daemon import DaemonProcess, cli_command
from tests.procs import write_config

UNREACHABLE = "postgresql://nobody@127.0.0.1:9/nothing"
"""A database nobody answers for (the discard port): ``run`` fails after its start."""


def names_with(part: str, directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if part in p.name)


def daemon(database_url: str, tmp_path: Path, *args: str) -> DaemonProcess:
    return DaemonProcess(
        config_file=write_config(tmp_path / "node.toml", database_url),
        log_file=tmp_path / "node.log",
        args=args,
    )


def one_shot(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``bothy-notify run ARGS`` to its end (it fails before serving), bounded."""
    return subprocess.run(
        [*cli_command(), "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )


async def test_the_ready_file_gives_the_bound_addresses_and_is_removed_at_exit(
    database_url: str, tmp_path: Path
) -> None:
    node = await daemon(database_url, tmp_path).start(timeout=60)
    try:
        assert node.ready_file is not None
        document = json.loads(node.ready_file.read_text(encoding="utf-8"))
        assert document == {
            "api": node.api,
            "gateway": node.gateway,
            "role": "all",
            "processes": 1,
            "pid": node.pid,
            "version": __version__,
        }
        assert not node.api.endswith(":0") and node.gateway is not None
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"http://{node.api}/healthz")).status_code == 200
        host, _, port = node.gateway.rpartition(":")
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(host, int(port))
        await stream.aclose()
        # Written whole, by rename: no temporary file is left beside it.
        assert names_with("ready", tmp_path) == [node.ready_file.name]
    finally:
        code = await node.stop()
    assert code == 0
    assert not node.ready_file.exists()
    assert "bothy-notify running (role all)" in node.log_text()  # the line for people stays


async def test_with_node_processes_the_parent_writes_it_for_all_of_them(
    database_url: str, tmp_path: Path
) -> None:
    node = await daemon(database_url, tmp_path, "--processes", "2").start(timeout=120)
    try:
        assert node.ready["processes"] == 2
        assert node.ready["pid"] == node.pid  # the parent: the process to signal
        assert node.ready["role"] == "all"
        async with httpx.AsyncClient(timeout=10) as http:
            metrics = (await http.get(f"http://{node.api}/metrics")).text
        # Every node process is up by then: each shows its round's holder gauge.
        holders = [
            line for line in metrics.splitlines() if line.startswith("bothy_consumer_holder{")
        ]
        assert len({line.split('pid="')[1].split('"')[0] for line in holders}) == 2, holders
    finally:
        code = await node.stop(timeout=60)
    assert code == 0
    assert node.ready_file is not None and not node.ready_file.exists()


def test_a_stale_ready_file_is_removed_at_the_start_and_none_is_written_on_failure(
    tmp_path: Path,
) -> None:
    stale = tmp_path / "ready.json"
    stale.write_text('{"api": "127.0.0.1:1", "gateway": null}', encoding="utf-8")
    config = write_config(tmp_path / "node.toml", UNREACHABLE)

    done = one_shot(tmp_path, "--config", str(config), "--ready-file", str(stale))

    assert done.returncode == 1, done.stderr
    assert "the database cannot be reached" in done.stderr
    assert not stale.exists()


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_ready_file_in_a_missing_directory_is_refused_before_anything_starts(
    tmp_path: Path, processes: str
) -> None:
    config = write_config(tmp_path / "node.toml", UNREACHABLE)
    missing = tmp_path / "no-such-directory" / "ready.json"

    done = one_shot(
        tmp_path,
        *("--config", str(config), "--processes", processes, "--ready-file", str(missing)),
    )

    assert done.returncode == 2
    assert f"--ready-file: no such directory: {missing.parent}" in done.stderr
    assert "database" not in done.stderr  # refused before the database was tried
