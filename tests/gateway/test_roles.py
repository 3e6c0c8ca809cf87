"""Role wiring with a gateway: ``api`` beside ``worker`` on one database (SPEC section 3)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from gateway.service import build_gateway
from tests.gateway.client import connect_live
from tests.gateway.world import GATEWAY_SEND, message, pushes, world
from tests.harness import Launch, make_config

WORKER_LINE = "no presence on this node: hints go by push only"


@contextmanager
def captured(logger: str) -> Iterator[list[logging.LogRecord]]:
    """Records of ``logger`` at INFO and above, whatever else configured logging."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    target = logging.getLogger(logger)
    handler, level = Keep(logging.INFO), target.level
    target.addHandler(handler)
    target.setLevel(logging.INFO)
    try:
        yield records
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


async def test_a_worker_beside_an_api_node_pushes_at_once_and_says_so_once(
    launch: Launch, nursery: trio.Nursery
) -> None:
    with captured("bothy.wiring") as records:
        api = await launch(
            gateway_factory=build_gateway, config=make_config(server={"role": "api"})
        )
        worker = await launch(config=make_config(server={"role": "worker"}))
    await world(api)
    desktop = await connect_live(nursery, api, "alex", "alex-desktop", "macos")
    await desktop.focus(["t1"])

    await api.append(message(1))
    await worker.settle()

    assert len(pushes(worker)) == 1
    assert await worker.jobs(GATEWAY_SEND) == []
    assert desktop.notifications() == []
    assert [r.getMessage() for r in records].count(WORKER_LINE) == 1
    assert api.daemon.round is None and api.daemon.runner is None
    assert worker.addresses.gateway is None


async def test_role_all_runs_the_gateway_round_and_runner_in_one_process(
    launch: Launch, nursery: trio.Nursery
) -> None:
    with captured("bothy.wiring") as records:
        node = await launch(gateway_factory=build_gateway)
    await world(node)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")

    await node.append(message(1))
    await node.settle()

    await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert len(await node.jobs(GATEWAY_SEND)) == 1
    assert node.daemon.round is not None and node.daemon.runner is not None
    assert WORKER_LINE not in [r.getMessage() for r in records]


def test_the_gateway_never_imports_notify() -> None:
    probe = (
        "import sys, gateway.service;"
        "print(sorted(m for m in sys.modules if m.startswith('bothy_notify.notify')"
        " or m == 'bothy_notify.wiring'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )

    assert result.stdout.strip() == "[]"
