"""The last moments of a drain start no provider request (``Providers.stop_sending_at``)."""

from __future__ import annotations

import trio
import trio.testing

from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.port import Message, Outcome, PushMessage, Target
from bothy_notify.push.registry import Providers

TARGET = Target(registration_id="r1", user_id="alex", provider="fake", token="tok", platform="ios")
MESSAGE = PushMessage(nid="n1", kind="message", count=1, quiet=False)


class HeldProvider:
    """Holds each send until ``release`` is set."""

    name = "fake"

    def __init__(self) -> None:
        self.release = trio.Event()
        self.sent = 0

    async def send(self, target: Target, message: Message) -> Outcome:
        self.sent += 1
        await self.release.wait()
        return Outcome.delivered()

    async def aclose(self) -> None:
        return None


async def test_a_send_before_the_moment_goes_out() -> None:
    fake = FakeProvider()
    providers = Providers({"fake": fake}, max_in_flight=4)
    providers.stop_sending_at(trio.current_time() + 3600)
    outcome = await providers.try_send(TARGET, MESSAGE, permit_wait=1.0)
    assert outcome is not None and outcome.kind.value == "delivered"
    assert len(fake.sends) == 1


async def test_from_the_moment_on_no_request_starts() -> None:
    fake = FakeProvider()
    providers = Providers({"fake": fake}, max_in_flight=4)
    providers.stop_sending_at(trio.current_time())
    assert await providers.try_send(TARGET, MESSAGE, permit_wait=1.0) is None
    assert fake.sends == []
    # The one-off send of `push test` is not a job: it still goes out.
    assert (await providers.send(TARGET, MESSAGE)).kind.value == "delivered"


async def test_a_send_that_waited_for_a_permit_past_the_moment_does_not_start() -> None:
    held = HeldProvider()
    providers = Providers({"fake": held}, max_in_flight=1)
    outcomes: list[Outcome | None] = []

    async def send() -> None:
        outcomes.append(await providers.try_send(TARGET, MESSAGE, permit_wait=60.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()  # the first holds the only permit
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()  # the second waits for it
        providers.stop_sending_at(trio.current_time())
        held.release.set()
    assert held.sent == 1
    assert [o is None for o in outcomes] == [False, True]
    assert providers.statistics() == {"fake": 0}  # the permit was given back
