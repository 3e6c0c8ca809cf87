"""Every date field of the API takes any value of its type without a 5xx (issue 30).

The API's request bodies hold two dates (``schemas/openapi.yaml``): a quiet-hours
``snooze_until`` (``format: date-time``, RFC 3339) and a Web Push subscription's
``expirationTime`` (milliseconds since the epoch). Hypothesis sends RFC 3339
values of the years 1-9999 with offsets up to +-23:59 (leap seconds, long
fractions, either case), and milliseconds from before the epoch to past the
year 9999: each answer is a 2xx, or a 422 naming the field; never a 5xx. A
date that exists is always accepted, and reads back as the instant it names,
capped at 30 days ahead (a snooze), or as ``null`` once past.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webpush import WebPushProvider
from testkit.fakes.webpush import HOST, Browser
from tests.harness import Launch, Node, device_token, make_config

PHONE = device_token("alex", "alex-phone")
BROWSER = device_token("alex", "alex-laptop", "web")
EXAMPLES = 100
"""Hypothesis examples per field: each is one or two requests to a running daemon."""
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


@st.composite
def rfc3339(draw: st.DrawFn) -> tuple[str, datetime | None]:
    """An RFC 3339 date-time and the instant it names (``None``: no such date, as
    February 30; an instant beyond what a ``datetime`` holds is saturated)."""
    year = draw(st.one_of(st.sampled_from([1, 2, 1970, 2026, 9998, 9999]), st.integers(1, 9999)))
    month, day = draw(st.integers(1, 12)), draw(st.integers(1, 31))
    hour, minute, second = (
        draw(st.integers(0, 23)),
        draw(st.integers(0, 59)),
        draw(st.integers(0, 60)),
    )
    digits = draw(st.text("0123456789", min_size=1, max_size=12))
    fraction = draw(st.sampled_from(["", f".{digits}"]))
    sign, off_h, off_m = (
        draw(st.sampled_from("+-")),
        draw(st.integers(0, 23)),
        draw(st.integers(0, 59)),
    )
    offset = draw(st.sampled_from(["Z", "z", f"{sign}{off_h:02d}:{off_m:02d}"]))
    t = draw(st.sampled_from("Tt"))
    text = (
        f"{year:04d}-{month:02d}-{day:02d}{t}{hour:02d}:{minute:02d}:{second:02d}{fraction}{offset}"
    )
    try:
        local = date(year, month, day)
    except ValueError:
        return text, None
    delta = timedelta(hours=off_h, minutes=off_m) * (1 if sign == "+" else -1)
    if offset in ("Z", "z"):
        delta = timedelta(0)
    micros = int((digits + "000000")[:6]) if fraction else 0
    # The instant as UTC arithmetic on ordinals: no datetime overflows on the way.
    seconds = ((local.toordinal() - 1) * 86_400 + hour * 3600 + minute * 60 + second) - int(
        delta.total_seconds()
    )
    low = 0
    high = (LATEST - EARLIEST) // timedelta(seconds=1)
    if seconds < low:
        return text, EARLIEST
    if seconds > high or (seconds == high and micros > LATEST.microsecond):
        return text, LATEST
    return text, EARLIEST + timedelta(seconds=seconds, microseconds=micros)


async def put_snooze(node: Node, value: str) -> tuple[int, str, Any]:
    answer = await node.request("PUT", "/v1/quiet-hours", json={"snooze_until": value}, token=PHONE)
    again = await node.request("GET", "/v1/quiet-hours", token=PHONE)
    assert again.status_code == 200, again.text
    return answer.status_code, answer.text, again.json()["snooze_until"]


async def test_every_rfc3339_snooze_is_accepted_or_422_naming_the_field(launch: Launch) -> None:
    node = await launch()
    now = node.clock.now()
    cap = now + timedelta(days=30)
    seen = {"accepted": 0, "refused": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=rfc3339())
    @example(case=("0001-01-01T00:00:00+01:00", EARLIEST))
    @example(case=("0001-01-01T00:00:00+23:59", EARLIEST))
    @example(case=("9999-12-31T23:59:59-23:59", LATEST))
    @example(case=("9999-12-31T23:59:60Z", LATEST))
    @example(case=("2026-01-05T09:00:00.1234567891+00:00", now + timedelta(microseconds=123456)))
    @example(case=("2026-02-30T09:00:00Z", None))
    def snooze(case: tuple[str, datetime | None]) -> None:
        value, instant = case
        status, text, stored = trio.from_thread.run(put_snooze, node, value)
        assert status in (200, 422), f"{value}: {status} {text}"
        if instant is None:
            assert status == 422 and '"snooze_until: ' in text, f"{value}: {text}"
            seen["refused"] += 1
            return
        assert status == 200, f"{value}: {text}"
        expected = min(instant, cap)
        if expected <= now:
            assert stored is None, value
        else:
            assert datetime.fromisoformat(stored) == expected, value
        seen["accepted"] += 1

    await trio.to_thread.run_sync(snooze)
    assert seen["accepted"] > 0 and seen["refused"] > 0, seen


async def test_every_expiration_time_is_accepted_or_422_naming_the_field(launch: Launch) -> None:
    now_clock = FakeClock()
    sender = WebPushProvider(
        key=ec.generate_private_key(ec.SECP256R1()),
        subject="mailto:ops@bothy.test",
        allowed_endpoints=(HOST,),
        clock=now_clock,
        resolver=FakeResolver({HOST: ["127.0.0.1"]}),
    )
    node = await launch(config=make_config(), providers={"webpush": sender}, clock=now_clock)
    browser = Browser(
        "s1", f"https://{HOST}/push/s1", ec.generate_private_key(ec.SECP256R1()), os.urandom(16)
    )
    now_ms = now_clock.now().timestamp() * 1000

    async def register(value: float) -> tuple[int, str]:
        answer = await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "webpush", "subscription": browser.subscription(value)},
            token=BROWSER,
        )
        return answer.status_code, answer.text

    seen = {"accepted": 0, "refused": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        value=st.one_of(
            st.integers(-(10**18), 10**18),
            st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20),
            st.sampled_from([0, 1, 253_402_300_799_999, 253_402_300_800_000, now_ms + 1]),
            st.integers(int(now_ms), 253_402_300_799_999),
        )
    )
    def expiration(value: float) -> None:
        status, text = trio.from_thread.run(register, value)
        assert status in (200, 201, 422), f"{value}: {status} {text}"
        if status == 422:
            assert '"subscription.expirationTime: ' in text, f"{value}: {text}"
            assert not (now_ms < value < 253_402_300_800_000), value
            seen["refused"] += 1
        else:
            seen["accepted"] += 1

    await trio.to_thread.run_sync(expiration)
    await sender.aclose()
    assert seen["accepted"] > 0 and seen["refused"] > 0, seen
