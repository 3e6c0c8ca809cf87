"""The presence view over the hub (SPEC section 6, "Presence facts"), without network.

Connections are driven through the hub's own API, exactly as sessions drive
them: open, identify, go live, focus, close.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from bothy_notify.auth import DeviceClaims
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceEntry
from gateway.closes import REPLACED
from gateway.connection import Connection, Outbound
from gateway.hub import Hub
from gateway.presence import HubPresence
from gateway.protocol import Phase


def make_hub(queue_max: int = 4) -> tuple[Hub, HubPresence]:
    hub = Hub(metrics=Metrics(), outbound_queue_max=queue_max)
    return hub, HubPresence(hub)


def connect(
    hub: Hub,
    user: str,
    device: str,
    platform: str = "macos",
    *,
    kind: str = "user",
    live: bool = True,
) -> Connection:
    conn = hub.open()
    hub.identify(conn, DeviceClaims(user, device, platform, kind))
    if live:
        assert hub.go_live(conn)
    return conn


def test_a_live_human_connection_counts_with_its_device_and_platform() -> None:
    hub, presence = make_hub()
    connect(hub, "alex", "alex-desktop", "macos")

    assert presence.entries(["alex"]) == {
        "alex": (PresenceEntry("alex-desktop", "macos", frozenset(), False),)
    }


def test_catching_up_closing_agent_and_app_connections_do_not_count() -> None:
    hub, presence = make_hub()
    connect(hub, "alex", "alex-desktop", live=False)  # catching up
    closing = connect(hub, "alex", "alex-laptop", "windows")
    hub.close(closing, REPLACED)
    connect(hub, "alex", "alex-bot", "linux", kind="agent")
    connect(hub, "alex", "alex-app", "web", kind="app")
    connecting = hub.open()  # never identified

    assert presence.entries(["alex"]) == {}
    assert connecting.phase is Phase.CONNECTING


def test_a_person_without_a_counted_connection_is_absent() -> None:
    hub, presence = make_hub()
    connect(hub, "alex", "alex-desktop")

    entries = presence.entries(["alex", "sam", "robin"])

    assert set(entries) == {"alex"}


def test_a_connection_that_never_sent_focus_has_empty_focus_and_is_not_idle() -> None:
    hub, presence = make_hub()
    connect(hub, "alex", "alex-desktop")

    (entry,) = presence.entries(["alex"])["alex"]

    assert entry.focus == frozenset() and entry.idle is False


def test_focus_and_idle_are_copies_that_later_focus_ops_do_not_change() -> None:
    hub, presence = make_hub()
    conn = connect(hub, "alex", "alex-desktop")
    hub.set_focus(conn, frozenset({"t1", "t2"}), True)
    (before,) = presence.entries(["alex"])["alex"]

    hub.set_focus(conn, frozenset({"t3"}), False)
    (after,) = presence.entries(["alex"])["alex"]

    assert before.focus == frozenset({"t1", "t2"}) and before.idle is True
    assert after.focus == frozenset({"t3"}) and after.idle is False


def test_one_entry_per_device_while_a_newer_connection_replaces_an_older_one() -> None:
    hub, presence = make_hub()
    older = connect(hub, "alex", "alex-desktop")
    hub.set_focus(older, frozenset({"t1"}), False)
    newer = connect(hub, "alex", "alex-desktop", live=False)

    (during,) = presence.entries(["alex"])["alex"]  # the newer one still catches up
    assert during.focus == frozenset({"t1"})

    assert hub.go_live(newer)
    (after,) = presence.entries(["alex"])["alex"]

    assert after.focus == frozenset()
    assert older.close == REPLACED and older.phase is Phase.CLOSING
    assert newer.phase is Phase.LIVE


def test_an_older_connection_finishing_catch_up_after_a_newer_one_closes_itself() -> None:
    hub, presence = make_hub()
    older = connect(hub, "alex", "alex-desktop", live=False)
    newer = connect(hub, "alex", "alex-desktop")

    assert not hub.go_live(older)

    assert older.close == REPLACED
    assert presence.entries(["alex"])["alex"] == (
        PresenceEntry("alex-desktop", "macos", frozenset(), False),
    )
    assert newer.phase is Phase.LIVE


class _StuckWriter:
    """A writer whose transport never accepts a byte."""

    def __init__(self) -> None:
        self.started = trio.Event()

    def write_now(self, conn: Connection, frames: Sequence[Outbound]) -> bool:
        return False  # the socket takes nothing: the frame waits for drain

    async def drain(self, conn: Connection) -> None:
        self.started.set()
        await trio.sleep_forever()


async def test_the_presence_read_returns_at_once_with_a_blocked_writer_and_a_full_queue(
    nursery: trio.Nursery,
) -> None:
    hub, presence = make_hub(queue_max=2)
    conn = connect(hub, "alex", "alex-desktop")
    writer = _StuckWriter()
    conn.attach(transport=None, nursery=nursery, writer=writer)  # type: ignore[arg-type]
    while conn.offer("{}", None):
        pass
    await writer.started.wait()
    assert conn.queued() == 2

    with trio.fail_after(1):
        entries = await trio.to_thread.run_sync(presence.entries, ["alex"])

    assert [e.device_id for e in entries["alex"]] == ["alex-desktop"]


def test_presence_reprs_carry_no_ids() -> None:
    hub, presence = make_hub()
    conn = connect(hub, "alex", "alex-desktop")

    for text in (repr(hub), repr(presence), repr(conn)):
        assert "alex" not in text
