"""systemd: the readiness protocol (``$NOTIFY_SOCKET``) spoken by a real daemon, the
reload on SIGHUP, and the unit file in ``contrib/systemd``.

The daemon tests give ``bothy-notify run`` an abstract datagram socket of their
own as ``$NOTIFY_SOCKET`` (with ``SO_PASSCRED``, so each message carries its
sender's pid, which is how systemd tells the main process from the others) and
read what it says: ``READY=1`` once ``/readyz`` answers 200, ``WATCHDOG=1``,
``RELOADING=1`` and ``READY=1`` around a SIGHUP, ``STOPPING=1`` at the drain.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trio

from bothy_notify.config import LogConfig, NotifyConfig, load_config_text
from bothy_notify.kernel.sdnotify import Notifier
from tests.harness import device_token
from tests.procs import DaemonProcess, write_config
from tests.support.repo import ROOT
from tests.support.tools import ensure_tool

UNIT = ROOT / "contrib" / "systemd" / "bothy-notify.service"
INSTALLED_BINARY = "/opt/bothy-notify/bin/bothy-notify"
"""Where the unit expects the command (the virtualenv of its install notes)."""


# ---------------------------------------------------------------- the protocol, alone


@dataclass
class Message:
    pid: int
    fields: dict[str, str]


def _parse(data: bytes, ancillary: list[tuple[int, int, bytes]]) -> Message:
    pid = -1
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:12])[0]
    fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
    return Message(pid, fields)


def _listener(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(address)
    return sock


def _receive(sock: socket.socket) -> Message:
    sock.settimeout(5)
    data, ancillary, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    return _parse(data, ancillary)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A socket path must fit in 108 bytes; pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="sd-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_ready_goes_to_a_socket_path(short_dir: Path) -> None:
    with _listener(str(short_dir / "notify")) as sock:
        notifier = Notifier(str(short_dir / "notify"))
        assert notifier.ready("serving (role all)")
        notifier.close()
        message = _receive(sock)
    assert message.fields == {"READY": "1", "STATUS": "serving (role all)"}
    assert message.pid == os.getpid()


def test_an_abstract_address_starts_with_at() -> None:
    name = f"bothy-test-{uuid.uuid4().hex}"
    with _listener(b"\0" + name.encode()) as sock:
        notifier = Notifier("@" + name)
        assert notifier.stopping() and notifier.reloading()
        notifier.close()
        assert _receive(sock).fields == {"STOPPING": "1"}
        reloading = _receive(sock).fields
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0


def test_the_environment_is_read_and_removed() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier.from_environment(env)
    assert notifier.enabled and notifier.watchdog_interval == 15.0
    assert env == {}  # nothing the daemon starts speaks for the service


def test_a_watchdog_meant_for_another_process_is_not_kept() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
    assert Notifier.from_environment(env).watchdog_interval is None
    assert not Notifier.from_environment({}).enabled


FAILING = "cannot notify the service manager; trying again with the next message"
AGAIN = "notifying the service manager again"


def _count(caplog: pytest.LogCaptureFixture, message: str) -> int:
    return [r.getMessage() for r in caplog.records].count(message)


def test_a_socket_that_is_gone_is_reported_throttled_and_never_raises(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [0.0]
    notifier = Notifier(str(short_dir / "nobody-listens"), monotonic=lambda: clock[0])
    assert not notifier.ready()
    assert not notifier.watchdog()
    clock[0] += 59
    assert not notifier.watchdog()
    assert (_count(caplog, FAILING), notifier.failed_sends) == (1, 3)
    clock[0] += 1  # a minute after the first warning: the next failure warns again
    assert not notifier.watchdog()
    assert _count(caplog, FAILING) == 2
    (last,) = [r for r in caplog.records if r.getMessage() == FAILING][1:]
    assert last.__dict__["failed_sends"] == 3  # the three since the first warning
    notifier.close()


def test_an_address_that_can_never_work_is_reported_once_and_not_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relative = Notifier("relative/path")
    assert not relative.ready()
    assert not relative.watchdog()
    relative.close()
    message = "NOTIFY_SOCKET is neither a path nor an abstract address; not notifying"
    assert _count(caplog, message) == 1
    assert relative.failed_sends == 0


def test_a_send_that_failed_is_tried_again_when_the_socket_is_back(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As at ``systemctl daemon-reexec``: the manager's socket is removed and created
    again at the same path; the next message reaches the new one."""
    caplog.set_level(logging.INFO, logger="bothy.systemd")
    path = str(short_dir / "notify")
    notifier = Notifier(path, watchdog_usec=2_000_000, monotonic=lambda: 0.0)
    with _listener(path) as sock:
        assert notifier.watchdog()
        assert _receive(sock).fields == {"WATCHDOG": "1"}
    os.unlink(path)  # the manager went away (its socket closed and removed)

    assert not notifier.watchdog()
    assert not notifier.watchdog()

    with _listener(path) as again:  # ... and came back
        assert notifier.watchdog()
        assert _receive(again).fields == {"WATCHDOG": "1"}
        assert notifier.ready("serving")
        assert _receive(again).fields == {"READY": "1", "STATUS": "serving"}
    notifier.close()
    assert (_count(caplog, FAILING), _count(caplog, AGAIN), notifier.failed_sends) == (1, 1, 2)


def test_the_watchdog_keeps_pinging_through_a_manager_that_was_gone(short_dir: Path) -> None:
    path = str(short_dir / "notify")
    notifier = Notifier(path, watchdog_usec=2_000_000)  # a ping every second
    received: list[bytes] = []

    def drain(sock: socket.socket) -> None:
        sock.setblocking(False)
        while True:
            try:
                received.append(sock.recv(64))
            except BlockingIOError:
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            first = _listener(path)
            nursery.start_soon(notifier.keep_watchdog)
            await trio.sleep(0.5)  # the ping at 0 s
            drain(first)
            first.close()
            os.unlink(path)
            await trio.sleep(2.0)  # the pings at 1 and 2 s fail
            second = _listener(path)
            await trio.sleep(2.0)  # those at 3 and 4 s reach the new socket
            drain(second)
            second.close()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    notifier.close()
    assert received == [b"WATCHDOG=1"] * 3
    assert notifier.failed_sends == 2


def test_the_watchdog_pings_every_half_timeout() -> None:
    name = f"bothy-test-{uuid.uuid4().hex}"
    with _listener(b"\0" + name.encode()) as sock:
        notifier = Notifier("@" + name, watchdog_usec=2_000_000)

        async def main() -> None:
            with trio.move_on_after(3.5):  # pings at 0, 1, 2 and 3 s of the mock clock
                await notifier.keep_watchdog()

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        notifier.close()
        sock.setblocking(False)
        pings = 0
        while True:
            try:
                data = sock.recv(64)
            except BlockingIOError:
                break
            assert data == b"WATCHDOG=1"
            pings += 1
    assert pings == 4


# ---------------------------------------------------------------- a real daemon


@dataclass
class NotifySocket:
    """An abstract datagram socket a daemon is told about in ``$NOTIFY_SOCKET``."""

    name: str = field(default_factory=lambda: f"bothy-test-{uuid.uuid4().hex}")
    messages: list[Message] = field(default_factory=list)
    seen: int = 0
    sock: trio.socket.SocketType | None = None

    @property
    def address(self) -> str:
        return "@" + self.name

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        await sock.bind(b"\0" + self.name.encode())
        self.sock = sock
        task_status.started()
        with sock:
            while True:
                data, ancillary, _flags, _addr = await sock.recvmsg(4096, socket.CMSG_SPACE(12))
                self.messages.append(_parse(data, ancillary))

    async def next(self, key: str, *, timeout: float = 60.0) -> Message:
        """The next message (after those already taken) that sets ``key``; the
        watchdog's pings in between are skipped."""
        with trio.fail_after(timeout):
            while True:
                while self.seen < len(self.messages):
                    message = self.messages[self.seen]
                    self.seen += 1
                    if key in message.fields:
                        return message
                await trio.sleep(0.01)

    def count(self, key: str) -> int:
        return sum(key in m.fields for m in self.messages)


def _free_port() -> int:
    # The test must know the API's address before the daemon says READY=1.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def notify_socket(nursery: trio.Nursery) -> AsyncIterator[NotifySocket]:
    listener = NotifySocket()
    await nursery.start(listener.run)
    yield listener


KIND = '[notify.kinds."social:poke"]\ncategory = "messages"\ntemplate = "{count} pokes"\n'


async def _ready_then_readyz(
    daemon: DaemonProcess, listener: NotifySocket, api: str, http: httpx.AsyncClient
) -> Message:
    """Start ``daemon`` and wait for READY=1; /readyz must answer 200 at that moment."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon.start)
        ready = await listener.next("READY")
        answer = await http.get(f"http://{api}/readyz")
        assert answer.status_code == 200, answer.text
    return ready


@pytest.mark.slow
async def test_a_daemon_says_ready_once_it_serves_reloads_on_sighup_and_says_stopping(
    database_url: str, tmp_path: Path, notify_socket: NotifySocket
) -> None:
    port = _free_port()
    config = write_config(
        tmp_path / "bothy.toml",
        database_url,
        server={"api_listen": f"127.0.0.1:{port}"},
        notify={"categories": ["social"]},
    )
    config.write_text(config.read_text() + KIND)
    daemon = DaemonProcess(
        config_file=config,
        log_file=tmp_path / "daemon.log",
        env={"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "200000"},
    )
    token = device_token("alex", "alex-desktop", "macos")
    catalogue_url = f"http://127.0.0.1:{port}/v1/catalogue"
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            ready = await _ready_then_readyz(daemon, notify_socket, f"127.0.0.1:{port}", http)
            assert ready.pid == daemon.pid
            assert ready.fields["STATUS"] == "serving (role all)"
            await notify_socket.next("WATCHDOG")

            async def poke_template() -> str:
                answer = await http.get(catalogue_url, headers={"authorization": f"Bearer {token}"})
                return str(answer.json()["kinds"]["social:poke"]["template"])

            assert await poke_template() == "{count} pokes"

            # A reload takes the new catalogue in: RELOADING=1, then READY=1 again.
            config.write_text(config.read_text().replace("{count} pokes", "{count} nudges"))
            daemon.kill(signal.SIGHUP)
            reloading = await notify_socket.next("RELOADING")
            assert int(reloading.fields["MONOTONIC_USEC"]) > 0
            await notify_socket.next("READY")
            assert await poke_template() == "{count} nudges"

            # A configuration that does not load changes nothing; the node serves on.
            config.write_text(config.read_text() + "\n[bogus]\nx = 1\n")
            daemon.kill(signal.SIGHUP)
            await notify_socket.next("RELOADING")
            await notify_socket.next("READY")
            assert await poke_template() == "{count} nudges"
            assert "reload refused, nothing changed" in daemon.log_text()
            assert "bogus: unknown key" in daemon.log_text()

            daemon.kill(signal.SIGTERM)
            stopping = await notify_socket.next("STOPPING")
            assert await daemon.wait_exit(60) == 0
    finally:
        if daemon.alive():
            daemon.kill()
    assert stopping.pid == daemon.pid
    assert {m.pid for m in notify_socket.messages} == {daemon.pid}
    assert notify_socket.count("READY") == 3  # the start and each reload


@pytest.mark.slow
async def test_with_several_processes_the_parent_says_ready_once_all_serve(
    database_url: str, tmp_path: Path, notify_socket: NotifySocket
) -> None:
    port = _free_port()
    config = write_config(
        tmp_path / "bothy.toml", database_url, server={"api_listen": f"127.0.0.1:{port}"}
    )
    daemon = DaemonProcess(
        config_file=config,
        log_file=tmp_path / "daemon.log",
        args=("--processes", "2"),
        env={"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "500000"},
    )
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            ready = await _ready_then_readyz(daemon, notify_socket, f"127.0.0.1:{port}", http)
            # Both node processes had started serving before the parent said so.
            started = {
                line.get("process")
                for line in map(json.loads, _json_lines(daemon.log_text()))
                if line.get("msg") == "node started"
            }
            assert started == {1, 2}
            assert ready.fields["STATUS"] == "serving (role all, 2 processes)"
            await notify_socket.next("WATCHDOG")
            daemon.kill(signal.SIGTERM)
            await notify_socket.next("STOPPING")
            assert await daemon.wait_exit(60) == 0
    finally:
        if daemon.alive():
            daemon.kill()
    # Only the parent speaks for the service (systemd's NotifyAccess=main).
    assert {m.pid for m in notify_socket.messages} == {daemon.pid}
    assert notify_socket.count("READY") == 1


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------- the unit file


def _unit() -> dict[str, list[tuple[str, str]]]:
    """The unit's sections, each a list of (key, value): keys repeat (Environment=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def _service(key: str) -> list[str]:
    return [v for k, v in _unit()["Service"] if k == key]


def test_the_unit_is_a_notify_service_that_checks_its_configuration_first() -> None:
    assert _service("Type") == ["notify"]
    assert _service("NotifyAccess") == ["main"]
    assert _service("ExecStartPre") == [f"{INSTALLED_BINARY} check-config"]
    assert _service("ExecStart") == [f"{INSTALLED_BINARY} run"]
    assert _service("ExecReload") == ["/bin/kill -HUP $MAINPID"]
    assert _service("KillMode") == ["mixed"]
    assert _service("WatchdogSec") and int(_service("WatchdogSec")[0]) > 0


def test_the_unit_is_hardened() -> None:
    assert _service("LimitNOFILE") == ["65536"]
    assert _service("NoNewPrivileges") == ["yes"]
    assert _service("ProtectSystem") == ["strict"]
    assert _service("StateDirectory") == ["bothy-notify"]
    assert _service("User") and _service("User") != ["root"]


def test_the_units_environment_names_real_keys_and_loads() -> None:
    env = dict(item.split("=", 1) for item in _service("Environment"))
    overrides = {k: v for k, v in env.items() if k.startswith("BOTHY_NOTIFY__")}
    assert overrides
    config = load_config_text("", env=overrides)
    state = f"/var/lib/{_service('StateDirectory')[0]}/"
    assert config.database.data_dir.startswith(state)
    assert env["BOTHY_NOTIFY_CONFIG"].startswith(f"/etc/{_service('ConfigurationDirectory')[0]}/")


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = ensure_tool("systemd-analyze", "systemd")
    # The unit as installed, with the command where this test's virtualenv has it.
    binary = Path(sys.executable).parent / "bothy-notify"
    unit = tmp_path / "bothy-notify.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED_BINARY, str(binary)))
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120, check=False
    )
    # verify exits 0 on some problems too (an unknown value is "ignored"): any output fails.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


def test_the_unit_documents_what_a_reload_rereads() -> None:
    text = UNIT.read_text()
    assert "SIGHUP" in text
    for section, cls in (("log", LogConfig), ("notify", NotifyConfig)):
        named = set(re.findall(rf"(?<![\w-]){section}\.([a-z_]+)", text))
        assert named and named <= {f.name for f in dataclasses.fields(cls)}, named
