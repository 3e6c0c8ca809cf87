"""The Matrix gateway's registrations: made on first notify, renewed sparingly, gone once
declared gone, restored when the pusher was set again; never a person's."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Database
from bothy_notify.store.matrix import Known, Pushkey, gone, pushkeys

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
OWNER = "matrix-gateway/im.example.ios"
TOKEN = "ab" * 32
APNS = Pushkey(OWNER, "im.example.ios", "apns", TOKEN, environment="production")
DAY = timedelta(days=1)


async def read(db: Database, query: str, *params: object) -> list[tuple[Any, ...]]:
    return await db.run(lambda c: c.execute(query, params).fetchall())


async def notify(db: Database, *found: Pushkey, at: datetime = NOW) -> list[Known]:
    return await db.run(lambda c: pushkeys(c, list(found), at, renew_after=DAY))


async def test_a_new_pushkey_gets_a_registration_of_its_apps_principal(db: Database) -> None:
    (known,) = await notify(db, APNS)
    assert not known.gone
    assert await read(
        db, "SELECT user_id, device_id, provider, token, environment FROM bothy.push_registrations"
    ) == [(OWNER, "im.example.ios", "apns", TOKEN, "production")]
    assert await notify(db, APNS) == [known]


async def test_a_known_pushkey_is_renewed_at_most_once_per_interval(db: Database) -> None:
    await notify(db, APNS)
    await notify(db, APNS, at=NOW + timedelta(hours=1))
    assert await read(db, "SELECT renewed_at FROM bothy.push_registrations") == [(NOW,)]
    later = NOW + 2 * DAY
    await notify(db, APNS, at=later)
    assert await read(db, "SELECT renewed_at FROM bothy.push_registrations") == [(later,)]


async def test_a_pushkey_declared_gone_stays_gone_until_its_pusher_is_set_again(
    db: Database,
) -> None:
    (known,) = await notify(db, APNS)
    dead_at = NOW + timedelta(minutes=1)
    await db.run(lambda c: regs.mark_dead(c, known.registration_id, "Unregistered", dead_at))
    assert await db.run(lambda c: gone(c, [known.registration_id])) == {known.registration_id}

    same_pusher = dataclasses.replace(APNS, pushkey_ts=NOW - DAY)
    later = NOW + timedelta(minutes=2)
    assert await notify(db, same_pusher, at=later) == [Known(known.registration_id, gone=True)]
    assert await notify(db, APNS, at=later) == [Known(known.registration_id, gone=True)]

    set_again = dataclasses.replace(APNS, pushkey_ts=NOW + timedelta(minutes=5))
    assert await notify(db, set_again, at=NOW + timedelta(minutes=6)) == [
        Known(known.registration_id, gone=False)
    ]
    assert await read(
        db, "SELECT invalidated_at, last_error, failure_count FROM bothy.push_registrations"
    ) == [(None, None, 0)]


async def test_a_pushkey_swept_for_want_of_renewal_is_restored_by_its_next_notify(
    db: Database,
) -> None:
    (known,) = await notify(db, APNS)
    await db.run(lambda c: regs.sweep_unrenewed(c, NOW + 40 * DAY, timedelta(days=30)))
    assert await notify(db, APNS, at=NOW + 41 * DAY) == [Known(known.registration_id, gone=False)]
    assert await read(db, "SELECT invalidated_at FROM bothy.push_registrations") == [(None,)]


async def test_a_web_push_pushers_new_keys_replace_the_stored_ones(db: Database) -> None:
    first = Pushkey(
        "matrix-gateway/im.example.web", "im.example.web", "webpush", "https://p/1", secret="k1"
    )
    await notify(db, first)
    await notify(db, dataclasses.replace(first, secret="k2"), at=NOW + timedelta(minutes=1))
    assert await read(db, "SELECT signing_key FROM bothy.push_registrations") == [("k2",)]


async def test_the_same_token_of_a_person_and_of_the_gateway_are_two_registrations(
    db: Database,
) -> None:
    person = await db.run(
        lambda c: regs.upsert(
            c,
            user_id="alex",
            device_id="alex-phone",
            provider="apns",
            token=TOKEN,
            environment="production",
            app_id=None,
            signing_key=None,
            now=NOW,
        )
    )
    (known,) = await notify(db, APNS)
    assert known.registration_id != person.registration.id
    moved = await db.run(
        lambda c: regs.upsert(
            c,
            user_id="sam",
            device_id="sam-phone",
            provider="apns",
            token=TOKEN,
            environment="production",
            app_id=None,
            signing_key=None,
            now=NOW,
        )
    )
    assert moved.registration.id == person.registration.id  # a person's token moves...
    rows = await read(db, "SELECT user_id FROM bothy.push_registrations ORDER BY user_id")
    assert rows == [(OWNER,), ("sam",)]  # ...but never the gateway's
    assert regs.owner_scope("apns", OWNER) == OWNER


@pytest.mark.parametrize("count", [1, 3])
async def test_many_pushkeys_of_one_request_keep_their_order(db: Database, count: int) -> None:
    found = [dataclasses.replace(APNS, token=f"{i:02x}" * 32) for i in range(count)]
    known = await notify(db, *found)
    tokens = dict(await read(db, "SELECT id, token FROM bothy.push_registrations"))
    assert [tokens[k.registration_id] for k in known] == [p.token for p in found]
