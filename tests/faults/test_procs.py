"""The real-process harness itself: a daemon serves, dies, comes back on its ports,
and survives its database going away and coming back."""

from __future__ import annotations

import httpx
import pytest

from testkit.daemon import DaemonFailed
from tests.faults.conftest import DaemonFactory
from tests.harness import ev, producer_token

pytestmark = pytest.mark.slow


async def append(client: httpx.AsyncClient, api: str, *events: dict[str, object]) -> list[int]:
    response = await client.post(
        f"http://{api}/v1/events",
        json={"events": list(events)},
        headers={"authorization": f"Bearer {producer_token()}"},
    )
    assert response.status_code == 200, response.text
    seqs: list[int] = response.json()["seqs"]
    return seqs


async def test_a_killed_daemon_restarts_on_its_ports(daemons: DaemonFactory) -> None:
    node = await daemons("a")
    async with httpx.AsyncClient(timeout=10) as client:
        first = await append(
            client, node.api, ev("user.upserted", user_id="u1", kind="human", active=True)
        )
        api = node.api
        node.pin_ports()
        await node.crash()
        await node.start()
        assert node.api == api
        second = await append(
            client, node.api, ev("user.upserted", user_id="u2", kind="human", active=True)
        )
    assert second[0] > first[0]
    assert await node.stop() == 0


@pytest.mark.parametrize("key", ["api_listen", "gateway_listen"])
async def test_an_address_in_use_stops_the_daemon_with_one_line_naming_the_key(
    daemons: DaemonFactory, key: str
) -> None:
    node = await daemons("a")
    taken = node.api if key == "api_listen" else node.gateway
    with pytest.raises(DaemonFailed, match="exited with 2"):
        await daemons("b", server={key: taken})
    text = (node.log_file.parent / "b.log").read_text()
    assert f"bothy-notify: server.{key}: cannot listen on {taken} (" in text, text
    assert "bothy.crash" not in text and "Traceback" not in text, text
    assert node.alive()
