"""The kind catalogue from outside, on real processes of a cluster: an ``api`` node that
serves ``GET /v1/catalogue`` and sends the desktop hint, and a ``worker`` that
decides and sends the delayed push, both following one ``notify.kinds_dir``
while they run (issue 12).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.cluster.live import DELAY, WORLD, Cluster, hints, live, message, node_config, until
from tests.faults.conftest import DaemonFactory
from tests.harness import device_token
from tests.procs import DaemonProcess

pytestmark = pytest.mark.slow

APP = """["friend_request"]
category = "social"
template = "{count} new friend requests"

["message"]
category = "social"
template = "{count} not the built-in"
"""


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def catalogue(
    http: httpx.AsyncClient, node: DaemonProcess, etag: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {device_token('alex', 'alex-phone')}"}
    if etag is not None:
        headers["if-none-match"] = etag
    return await http.get(f"{node.api_url}/v1/catalogue", headers=headers)


def put(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


async def test_a_cluster_follows_the_kinds_directory_and_keeps_one_version_per_notification(
    daemons: DaemonFactory,
    fault_db: str,
    tmp_path: Path,
    http: httpx.AsyncClient,
    nursery: trio.Nursery,
) -> None:
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    notify: dict[str, Any] = {"categories": ["social"], "kinds_dir": str(kinds)}
    a = await daemons("a", **node_config("api", notify=notify))
    w = await daemons("w", **node_config("worker", notify=notify))
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    await c.append(a, *WORLD)
    await c.register(a, "alex", "alex-phone", "alex-phone-token")
    await c.settled()

    empty = await catalogue(http, a)
    assert empty.status_code == 200
    first = empty.json()["version"]
    assert empty.headers["etag"] == f'"{first}"'

    # A desktop hint from A decided by the worker with the first version; the kinds
    # change before the delayed push leaves: the push still carries the first one.
    desktop = await live(nursery, a, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    await c.append(a, message(1))
    await until(lambda: _has(desktop, "m1"), "the desktop's hint")
    (hint,) = hints(desktop, "m1")
    assert hint["mv"] == first

    path = put(kinds, "acme/chat/kinds.toml", APP)
    installed = await catalogue(http, a, empty.headers["etag"])
    assert installed.status_code == 200
    second = installed.json()["version"]
    assert second != first and installed.headers["etag"] == f'"{second}"'
    served = installed.json()["kinds"]
    assert served["acme/chat:friend_request"]["template"] == "{count} new friend requests"
    # A key naming a built-in gets the app's namespace; the built-in is untouched.
    assert served["acme/chat:message"]["template"] == "{count} not the built-in"
    assert served["message"] == empty.json()["kinds"]["message"]
    assert (await catalogue(http, a, installed.headers["etag"])).status_code == 304

    await until(lambda: _pushed(c, "m1"), "the delayed push", DELAY + 20)
    (push,) = c.pushes("alex-phone-token")
    assert push["nid"] == hint["nid"] and push["mv"] == first

    # Decided after the change: every copy carries the second version.
    await c.append(a, message(2))
    await until(lambda: _has(desktop, "m2"), "the desktop's second hint")
    await until(lambda: _pushed(c, "m2"), "the second delayed push", DELAY + 20)
    assert hints(desktop, "m2")[0]["mv"] == second
    assert [p["mv"] for p in c.pushes("alex-phone-token")] == [first, second]

    # Removed again: the first version, and a device holding it gets 304.
    path.unlink()
    back = await catalogue(http, a, empty.headers["etag"])
    assert back.status_code == 304 and back.headers["etag"] == empty.headers["etag"]

    # A file at the wrong depth: reported by both nodes, though nobody asks either of
    # them, and by check-config; the catalogue in use stays as it was.
    put(kinds, "kinds.toml", APP)
    for node in (a, w):
        await until(partial(_invalid, c, node, 1), "the misplaced file to be counted")
    assert (await catalogue(http, a)).json()["version"] == first
    with trio.fail_after(60):
        checked = await trio.run_process(
            [
                sys.executable,
                "-m",
                "bothy_notify.cli",
                "check-config",
                "--config",
                str(w.config_file),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert checked.returncode == 2
    assert b"notify.kinds_dir: kinds.toml: in the wrong place" in checked.stderr
    for node in (a, w):
        assert "kinds file refused; the last good kinds stay in use" in node.log_text()


async def _has(client: Any, message_id: str) -> bool:
    return bool(hints(client, message_id))


async def _pushed(c: Cluster, message_id: str) -> bool:
    return any(p.get("message_id") == message_id for p in c.pushes("alex-phone-token"))


async def _invalid(c: Cluster, node: DaemonProcess, count: int) -> bool:
    return await c.metric(node, "bothy_catalogue_invalid_files") == count
