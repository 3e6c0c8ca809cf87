"""``GET``/``PUT /v1/quiet-hours`` over HTTP: the default, a round trip, and a 422
naming the field for every rule of the body (nothing stored)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import Launch, Node, device_token, make_config

SOCIAL = make_config(notify={"categories": ["social"]})
PHONE = device_token("alex", "alex-phone")
DEFAULT: dict[str, Any] = {
    "time_zone": "UTC",
    "schedule": [],
    "snooze_until": None,
    "breakthrough": [],
}
WEEKNIGHTS = {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "22:00", "end": "07:00"}
"""Not quiet at the fake clock's start, Monday 2026-01-05 09:00 UTC."""


async def put(node: Node, body: Any, token: str = PHONE) -> Any:
    return await node.request("PUT", "/v1/quiet-hours", json=body, token=token)


async def get(node: Node, token: str = PHONE) -> dict[str, Any]:
    response = await node.request("GET", "/v1/quiet-hours", token=token)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_person_who_never_set_quiet_hours_has_the_default(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    assert await get(node) == DEFAULT


async def test_put_answers_and_stores_the_settings_for_every_device(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    body = {
        "time_zone": "Europe/Berlin",
        "schedule": [WEEKNIGHTS, {"days": ["sat"], "start": "13:00", "end": "15:30"}],
        "snooze_until": "2026-01-05T12:00:00+01:00",
        "breakthrough": ["social", "mentions"],
    }
    answer = await put(node, body)
    assert answer.status_code == 200, answer.text
    stored = {
        **body,
        "snooze_until": "2026-01-05T11:00:00Z",
        "breakthrough": ["mentions", "social"],
    }
    assert answer.json() == stored
    assert await get(node, device_token("alex", "alex-laptop", "macos")) == stored
    assert await get(node, device_token("sam", "sam-phone")) == DEFAULT


async def test_a_snooze_that_has_ended_reads_as_null(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    assert (await put(node, {"snooze_until": "2026-01-05T09:30:00Z"})).status_code == 200
    node.clock.advance(1800)
    assert (await get(node))["snooze_until"] is None


async def test_an_empty_body_clears_the_settings(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    assert (await put(node, {"schedule": [WEEKNIGHTS]})).status_code == 200
    answer = await put(node, {})
    assert answer.status_code == 200 and answer.json() == DEFAULT
    assert await get(node) == DEFAULT


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        ({"time_zone": "Europe/Berlin "}, "time_zone"),
        ({"time_zone": 1}, "time_zone"),
        ({"schedule": {"days": ["mon"]}}, "schedule"),
        ({"schedule": [WEEKNIGHTS] * 15}, "schedule"),
        ({"schedule": [{**WEEKNIGHTS, "note": "x"}]}, "schedule"),
        ({"schedule": [{**WEEKNIGHTS, "days": ["monday"]}]}, "schedule.days"),
        ({"schedule": [{**WEEKNIGHTS, "days": ["mon", "mon"]}]}, "schedule.days"),
        ({"schedule": [{**WEEKNIGHTS, "days": []}]}, "schedule.days"),
        ({"schedule": [{**WEEKNIGHTS, "start": "7:00"}]}, "schedule.start"),
        ({"schedule": [{**WEEKNIGHTS, "start": "24:00"}]}, "schedule.start"),
        ({"schedule": [{**WEEKNIGHTS, "start": "\uff12\uff12:00"}]}, "schedule.start"),
        ({"schedule": [{**WEEKNIGHTS, "end": "07:60"}]}, "schedule.end"),
        ({"snooze_until": "2026-01-05T12:00:00"}, "snooze_until"),
        ({"snooze_until": "2026-01-05T12:00Z"}, "snooze_until"),
        ({"snooze_until": "2026-02-30T09:00:00Z"}, "snooze_until"),
        ({"snooze_until": "0000-12-31T09:00:00Z"}, "snooze_until"),
        ({"snooze_until": "2026-01-05T12:00:00+24:00"}, "snooze_until"),
        ({"snooze_until": 1767603600}, "snooze_until"),
        ({"breakthrough": ["billing"]}, "breakthrough"),
        ({"breakthrough": ["social", "social"]}, "breakthrough"),
        ({"breakthrough": "social"}, "breakthrough"),
        ({"quiet": True}, "(body)"),
        ([], "(body)"),
    ],
)
async def test_a_wrong_field_is_422_naming_it_and_nothing_is_stored(
    launch: Launch, body: Any, field: str
) -> None:
    node = await launch(config=SOCIAL)
    assert (await put(node, {"schedule": [WEEKNIGHTS]})).status_code == 200

    answer = await put(node, body)

    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"].startswith(f"{field}: ")
    assert (await get(node))["schedule"] == [WEEKNIGHTS]


async def test_a_snooze_exactly_30_days_ahead_is_accepted(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    answer = await put(node, {"snooze_until": "2026-02-04T09:00:00Z"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["snooze_until"] == "2026-02-04T09:00:00Z"


@pytest.mark.parametrize(
    "value", ["2026-02-04T09:00:01Z", "2027-01-01T00:00:00+05:00", "9999-12-31T23:59:59-23:59"]
)
async def test_a_snooze_beyond_30_days_is_capped_and_reads_capped(
    launch: Launch, value: str
) -> None:
    node = await launch(config=SOCIAL)
    answer = await put(node, {"snooze_until": value})
    assert answer.status_code == 200, answer.text
    assert answer.json()["snooze_until"] == "2026-02-04T09:00:00Z"
    assert (await get(node))["snooze_until"] == "2026-02-04T09:00:00Z"


async def test_a_snooze_before_the_year_1_in_utc_is_past_not_an_error(launch: Launch) -> None:
    """The case the issue found: ``astimezone`` overflowed and the answer was 500."""
    node = await launch(config=SOCIAL)
    answer = await put(node, {"snooze_until": "0001-01-01T00:00:00+01:00"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["snooze_until"] is None
    assert (await get(node))["snooze_until"] is None


async def test_an_entry_whose_end_equals_its_start_is_stored_as_given(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    whole_saturday = {"days": ["sat"], "start": "00:00", "end": "00:00"}
    answer = await put(node, {"schedule": [whole_saturday]})
    assert answer.status_code == 200, answer.text
    assert (await get(node))["schedule"] == [whole_saturday]


async def test_quiet_hours_need_a_device_token(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    assert (await node.request("GET", "/v1/quiet-hours")).status_code == 401
    assert (await node.request("PUT", "/v1/quiet-hours", json={})).status_code == 401
