"""``Daemon(instrument=...)``: an instrument is told of every stage of a desktop hint's
path, in path order, with what the stage handled (``bothy_notify.kernel.instrument``;
``bench/gateway.py --stages`` times the path with one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio

from bothy_notify.kernel.instrument import Instrument
from gateway.service import build_gateway
from tests.gateway.client import connect_live
from tests.gateway.world import message, world
from tests.harness import Launch, make_config


class Stages(Instrument):
    """The stages each message passed, in the order they were passed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.round: list[str] = []

    def _passed(self, stage: str, ids: Sequence[str]) -> None:
        self.seen += [(stage, m) for m in ids]

    def round_read(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        self.round = [str(p["message_id"]) for p in payloads if "message_id" in p]
        self._passed("read", self.round)

    def round_committed(self) -> None:
        self._passed("committed", self.round)

    def jobs_checked(self, args: Sequence[Mapping[str, Any]]) -> None:
        self._passed("checked", [a["message_id"] for a in args if "message_id" in a])

    def round_handed_over(self) -> None:
        self._passed("handed over", self.round)
        self.round = []

    def jobs_dispatched(self, args: Sequence[Mapping[str, Any]]) -> None:
        self._passed("dispatched", [a["message_id"] for a in args if "message_id" in a])

    def frame_published(self, payload: Mapping[str, Any]) -> None:
        self._passed("published", [payload["message_id"]] if "message_id" in payload else [])

    def frame_written(self, text: str) -> None:
        if '"notification.created"' in text:
            self._passed("written", ["m1"] if '"message_id":"m1"' in text else ["other"])

    def stages_of(self, message_id: str) -> list[str]:
        return [stage for stage, m in self.seen if m == message_id]


async def test_an_instrument_sees_a_desktop_hint_pass_every_stage_in_order(
    launch: Launch, nursery: trio.Nursery
) -> None:
    stages = Stages()
    node = await launch(gateway_factory=build_gateway, config=make_config(), instrument=stages)
    await world(node)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")

    await node.append(message(1))
    await node.settle()
    hint = await desktop.wait_for(lambda f: f.get("type") == "notification.created")

    assert hint["payload"]["message_id"] == "m1"
    # The round decides it, its own gateway hint is checked on its connection and
    # handed over, the runner runs it, the publisher queues it, the writer writes it.
    assert stages.stages_of("m1") == [
        "read",
        "committed",
        "checked",
        "handed over",
        "dispatched",
        "published",
        "written",
    ]
