"""One notification, one catalogue version: every copy of a hint (gateway,
immediate push, delayed push) carries the ``mv`` fixed when the hint was
decided, even when the kinds directory changes before a copy is sent; a flush
hint is decided again at the window's end and carries the version of then.

End to end: real daemon (role ``all``), real gateway on 127.0.0.1:0, real
PostgreSQL, a fake clock for the delays, the fake provider.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from bothy_notify.notify.planner import RoundOutcome
from gateway.service import build_gateway
from tests.gateway.client import connect_live
from tests.gateway.world import DELAY, PUSH_SEND, jobs_for, message, pushes, start, world
from tests.harness import Launch, Node, device_token, make_config

INVITE = '["invite"]\ncategory = "social"\ntemplate = "{count} invitations"\n'


def kinds_notify(root: Path, **extra: Any) -> dict[str, Any]:
    return {"categories": ["social"], "kinds_dir": str(root), **extra}


def install(root: Path, text: str = INVITE) -> None:
    app = root / "acme" / "chat"
    app.mkdir(parents=True, exist_ok=True)
    (app / "kinds.toml").write_text(text, encoding="utf-8")


async def served_version(node: Node) -> str:
    response = await node.request("GET", "/v1/catalogue", token=device_token("alex", "alex-phone"))
    assert response.status_code == 200
    version: str = response.json()["version"]
    return version


def is_hint(frame: dict[str, Any]) -> bool:
    return frame.get("type") == "notification.created"


async def test_a_change_between_the_desktop_hint_and_the_delayed_push_keeps_the_first_mv(
    launch: Launch, nursery: trio.Nursery, tmp_path: Path
) -> None:
    node = await start(launch, notify=kinds_notify(tmp_path))
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    first = await served_version(node)

    await node.append(message(1))
    await node.settle()
    hint = await desktop.wait_for(is_hint)
    assert hint["payload"]["mv"] == first

    install(tmp_path)
    second = await served_version(node)  # the daemon has taken the change in
    assert second != first
    await node.advance(DELAY)
    (push,) = pushes(node)
    assert push["nid"] == hint["payload"]["nid"]
    assert push["mv"] == first

    # A notification decided after the change carries the new version on every copy.
    await node.append(message(2))
    await node.settle()
    later = await desktop.wait_for(lambda f: is_hint(f) and f["payload"]["message_id"] == "m2")
    await node.advance(DELAY)
    assert later["payload"]["mv"] == second
    assert [(p["message_id"], p["mv"]) for p in pushes(node)] == [("m1", first), ("m2", second)]


async def test_a_change_right_after_the_decision_leaves_both_immediate_copies_with_its_mv(
    launch: Launch, nursery: trio.Nursery, tmp_path: Path
) -> None:
    armed = False

    def change_the_catalogue(outcome: RoundOutcome) -> None:
        # Inside the round's transaction, after the decision and before the jobs run.
        nonlocal armed
        if armed and outcome.jobs:
            armed = False
            install(tmp_path)
            node.daemon.live_catalogue.refresh()

    node = await launch(
        gateway_factory=build_gateway,
        config=make_config(notify=kinds_notify(tmp_path)),
        before_commit=change_the_catalogue,
    )
    await world(node)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t1"], idle=True)  # idle: the phone is pushed at once
    decided = await served_version(node)

    armed = True
    await node.append(message(1))
    await node.settle()
    hint = await desktop.wait_for(is_hint)

    assert node.daemon.catalogue.version != decided
    (push,) = pushes(node)
    assert push["nid"] == hint["payload"]["nid"]
    assert push["mv"] == hint["payload"]["mv"] == decided


async def test_the_flush_hint_carries_the_version_of_the_windows_end_on_every_copy(
    launch: Launch, nursery: trio.Nursery, tmp_path: Path
) -> None:
    node = await start(launch, notify=kinds_notify(tmp_path, coalesce_window="30s"))
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    first = await served_version(node)

    await node.append(message(1))
    await node.settle()
    opening = await desktop.wait_for(is_hint)
    await node.append(message(2))  # folded into the window
    await node.settle()
    install(tmp_path)  # nothing reads the catalogue until the window ends

    await node.advance(30)
    flush = await desktop.wait_for(lambda f: is_hint(f) and f["payload"]["count"] == 2)
    second = node.daemon.catalogue.version
    assert second != first
    assert opening["payload"]["mv"] == first and flush["payload"]["mv"] == second

    await node.advance(DELAY)
    by_nid = {p["nid"]: p["mv"] for p in pushes(node)}
    assert by_nid == {opening["payload"]["nid"]: first, flush["payload"]["nid"]: second}


async def test_a_push_queued_without_mv_is_sent_with_the_version_in_use(
    launch: Launch, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Jobs queued by a release that did not fix the version at decision.
    node = await start(launch, notify=kinds_notify(tmp_path))
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    await node.append(message(1))
    await node.settle()
    (job,) = await jobs_for(node, PUSH_SEND)
    assert "mv" in job["args"]
    await node.sql("UPDATE bothy.jobs SET args = args - 'mv' WHERE id = %s", (job["id"],))

    install(tmp_path)
    now = await served_version(node)
    await node.advance(DELAY)
    (push,) = pushes(node)
    assert push["mv"] == now
