"""The control channel between the parent of ``server.processes`` and a node process:
the spec, and the child's reading of ``drain``, ``stop`` and the channel's end (over a
real Unix socket pair)."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

import pytest
import trio

from bothy_notify.config import ClusterMode, Role
from bothy_notify.processes.control import ChildSpec, ControlError, ParentChannel
from tests.harness import make_config

URL = "postgresql://bothy:pw@/db?host=/tmp/x"


def spec(**changes: Any) -> ChildSpec:
    return replace(ChildSpec(2, 3, Role.WORKER, "127.0.0.1:8700", "127.0.0.1:8701", URL), **changes)


def test_a_spec_survives_its_line() -> None:
    assert ChildSpec.from_line(spec().to_line()) == spec()
    assert ChildSpec.from_line(spec(database_url=None).to_line()) == spec(database_url=None)


def test_a_spec_never_shows_the_database_url() -> None:
    assert "pw" not in repr(spec()) and "tmp" not in repr(spec())


def test_a_line_that_is_no_spec_is_refused() -> None:
    with pytest.raises(ControlError):
        ChildSpec.from_line(b'{"ordinal": 1}\n')
    with pytest.raises(ControlError):
        ChildSpec.from_line(b"ready\n")


def test_the_spec_makes_the_child_a_cluster_node_of_one_process_on_the_shared_ports() -> None:
    config = spec().apply(make_config(server={"processes": 3}))
    assert config.server.role is Role.WORKER
    assert config.server.processes == 1
    assert config.cluster.mode is ClusterMode.MULTI
    assert (config.server.api_listen, config.server.gateway_listen) == (
        "127.0.0.1:8700",
        "127.0.0.1:8701",
    )


async def watched(lines: bytes, *, close: bool) -> list[str]:
    parent, child = socket.socketpair()
    channel = ParentChannel(child, spec())
    seen: list[str] = []
    parent.sendall(lines)
    if close:
        parent.close()
    try:
        await channel.watch(drain=lambda: seen.append("drain"), stop=lambda: seen.append("stop"))
    finally:
        channel.close()
        if not close:
            parent.close()
    return seen


async def test_drain_twice_then_stop_ends_the_watch_at_stop() -> None:
    assert await watched(b"drain\ndrain\nstop\n", close=False) == ["drain", "drain", "stop"]


async def test_the_end_of_the_channel_is_a_drain() -> None:
    assert await watched(b"", close=True) == ["drain"]


async def test_an_unknown_line_is_an_error() -> None:
    with pytest.raises(ControlError):
        await watched(b"reboot\n", close=False)


async def test_ready_reaches_the_parent() -> None:
    parent, child = socket.socketpair()
    channel = ParentChannel(child, spec())
    try:
        await channel.ready()
        parent.setblocking(False)
        await trio.lowlevel.wait_readable(parent)
        assert parent.recv(64) == b"ready\n"
    finally:
        channel.close()
        parent.close()
