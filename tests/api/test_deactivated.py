"""A person the app deactivated (``user.upserted`` with ``active: false``) is refused
on every device endpoint with 403 ``deactivated``, and nothing changes."""

from __future__ import annotations

from tests.api.test_auth import DEVICE_ENDPOINTS
from tests.harness import Launch, device_token, ev


async def test_every_device_endpoint_refuses_a_deactivated_person(launch: Launch) -> None:
    node = await launch()
    await node.append(ev("user.upserted", user_id="alex", kind="human", active=False))
    await node.settle()
    token = device_token("alex", "alex-new-phone")

    for method, path, body in DEVICE_ENDPOINTS:
        response = await node.request(method, path, json=body, token=token)
        assert response.status_code == 403, (method, path)
        assert response.json() == {
            "error": {"code": "deactivated", "message": "this person has been deactivated"}
        }
    assert await node.sql("SELECT count(*) FROM bothy.devices") == [(0,)]
    assert await node.sql("SELECT count(*) FROM bothy.push_registrations") == [(0,)]


async def test_a_person_activated_again_is_served_again(launch: Launch) -> None:
    node = await launch()
    await node.append(ev("user.upserted", user_id="alex", kind="human", active=False))
    await node.settle()
    token = device_token("alex", "alex-phone")
    assert (await node.request("GET", "/v1/preferences", token=token)).status_code == 403

    await node.append(ev("user.upserted", user_id="alex", kind="human", active=True))
    await node.settle()

    assert (await node.request("GET", "/v1/preferences", token=token)).status_code == 200


async def test_a_person_the_app_never_named_is_served(launch: Launch) -> None:
    node = await launch()

    response = await node.request("GET", "/v1/preferences", token=device_token("new", "new-1"))

    assert response.status_code == 200
    assert await node.sql("SELECT kind, active FROM bothy.users") == [("human", True)]
