"""The token lifecycle's rules as a table, without a database or an event loop where
none is needed (``bothy_notify.notify.lifecycle``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import trio.testing

from bothy_notify.config import PushConfig
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify.lifecycle import (
    GENERIC_REJECTION,
    StrikeRules,
    TokenLifecycle,
    Verdict,
    judge_failed_send,
    send_outcome,
    what_to_check,
)
from bothy_notify.push.port import Outcome
from bothy_notify.runner import BatchedEffect
from bothy_notify.store.registrations import StrikeState

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RULES = StrikeRules(max_strikes=3, interval=timedelta(hours=1))
FAILED = Outcome.transient("http_503")
OTHERS_DELIVERED = NOW - timedelta(minutes=5)


def state(
    *,
    active: bool = True,
    strikes: int = 0,
    last_strike_at: datetime | None = None,
    last_seen_at: datetime | None = None,
    provider_delivered_at: datetime | None = OTHERS_DELIVERED,
) -> StrikeState:
    return StrikeState(active, strikes, last_strike_at, last_seen_at, provider_delivered_at)


@pytest.mark.parametrize(
    ("outcome", "facts", "verdict"),
    [
        pytest.param(FAILED, state(), Verdict.STRIKE, id="others-delivered-strikes"),
        pytest.param(FAILED, state(strikes=2), Verdict.INVALIDATE, id="third-in-a-row"),
        pytest.param(FAILED, state(strikes=7), Verdict.INVALIDATE, id="past-the-limit"),
        pytest.param(FAILED, None, Verdict.NOT_ACTIVE, id="gone"),
        pytest.param(FAILED, state(active=False), Verdict.NOT_ACTIVE, id="invalidated"),
        pytest.param(
            Outcome.transient("connect_error", ours=True), state(), Verdict.OURS, id="ours"
        ),
        pytest.param(
            Outcome.transient("token_unavailable", ours=True),
            state(strikes=2),
            Verdict.OURS,
            id="ours-even-at-the-limit",
        ),
        pytest.param(
            FAILED,
            state(last_strike_at=NOW - timedelta(minutes=59)),
            Verdict.RECENT_STRIKE,
            id="strike-within-interval",
        ),
        pytest.param(
            FAILED,
            state(strikes=1, last_strike_at=NOW - timedelta(hours=1)),
            Verdict.STRIKE,
            id="strike-an-interval-ago",
        ),
        pytest.param(
            FAILED, state(provider_delivered_at=None), Verdict.PROVIDER_QUIET, id="never-delivered"
        ),
        pytest.param(
            FAILED,
            state(provider_delivered_at=NOW - timedelta(hours=1)),
            Verdict.PROVIDER_QUIET,
            id="provider-silent-for-the-interval",
        ),
        pytest.param(
            FAILED,
            state(last_seen_at=OTHERS_DELIVERED),
            Verdict.PROVIDER_QUIET,
            id="the-latest-delivery-was-its-own",
        ),
        pytest.param(
            FAILED,
            state(last_seen_at=OTHERS_DELIVERED - timedelta(seconds=1)),
            Verdict.STRIKE,
            id="others-delivered-after-it",
        ),
    ],
)
def test_a_failed_send_is_judged_by_the_strike_rules(
    outcome: Outcome, facts: StrikeState | None, verdict: Verdict
) -> None:
    assert judge_failed_send(outcome, facts, RULES, NOW) is verdict


def test_only_strike_and_invalidate_count() -> None:
    assert {v for v in Verdict if v.counts} == {Verdict.STRIKE, Verdict.INVALIDATE}


@pytest.mark.parametrize(
    ("outcome", "last_attempt", "label"),
    [
        (Outcome.transient("http_503"), False, "transient"),
        (Outcome.transient("http_503"), True, "failed"),
        (Outcome.delivered(), True, "delivered"),
        (Outcome.rejected("PayloadTooLarge"), True, "rejected"),
        (Outcome.dead("Unregistered"), False, "dead"),
    ],
)
def test_the_last_transient_attempt_is_counted_as_failed(
    outcome: Outcome, last_attempt: bool, label: str
) -> None:
    assert send_outcome(outcome, last_attempt=last_attempt) == label


def lifecycle(log_period: float = 60.0) -> TokenLifecycle:
    return TokenLifecycle(config=PushConfig(), metrics=Metrics(), log_period=log_period)


def test_deliveries_and_recorded_errors_are_batched_effects() -> None:
    tokens = lifecycle()
    delivered = tokens.effect("r1", "apns", Outcome.delivered(), last_attempt=False)
    retried = tokens.effect("r1", "apns", FAILED, last_attempt=False)
    rejected = tokens.effect("r1", "apns", Outcome.rejected("BadPriority"), last_attempt=True)
    assert isinstance(delivered, BatchedEffect) and delivered.item == ("r1", "apns")
    assert isinstance(retried, BatchedEffect) and retried.item == ("r1", "http_503")
    assert isinstance(rejected, BatchedEffect) and rejected.item == ("r1", "BadPriority")
    # A failed send and a dead token read and write one registration each.
    assert not isinstance(tokens.effect("r1", "apns", FAILED, last_attempt=True), BatchedEffect)
    dead = tokens.effect("r1", "apns", Outcome.dead("Unregistered"), last_attempt=False)
    assert not isinstance(dead, BatchedEffect)


@pytest.mark.parametrize(
    ("provider", "reason", "says"),
    [
        ("fcm", "INVALID_ARGUMENT", "data value a string"),
        ("apns", "PayloadTooLarge", "4 KB"),
        ("apns", "InvalidProviderToken", "push.apns.key"),
        ("fcm", "token_refused", "push.fcm.service_account"),
        ("webhook", "private_address", "allow_private_addresses"),
        ("apns", "SomethingNew", "Apple's table"),
        ("webhook", "http_422", "accepts the payload"),
    ],
)
def test_every_rejection_says_what_to_check(provider: str, reason: str, says: str) -> None:
    hint = what_to_check(provider, Outcome.rejected(reason))
    assert hint is not None and says in hint


def test_a_transient_reason_without_a_hint_says_nothing() -> None:
    assert what_to_check("apns", Outcome.transient("http_503")) is None


async def test_a_rejection_is_logged_once_per_provider_and_reason_per_period(
    caplog: pytest.LogCaptureFixture, mock_clock: trio.testing.MockClock
) -> None:
    tokens = lifecycle(log_period=5.0)
    caplog.set_level(logging.WARNING, logger="bothy.notify.lifecycle")
    too_large = Outcome.rejected("PayloadTooLarge")
    for _ in range(3):
        tokens.explain("apns", too_large)
    tokens.explain("fcm", Outcome.rejected("INVALID_ARGUMENT"))
    tokens.explain("apns", Outcome.transient("http_503"))  # not a rejection: not logged
    assert len(caplog.records) == 2
    mock_clock.jump(6)
    tokens.explain("apns", too_large)
    assert len(caplog.records) == 3
    first = caplog.records[0].getMessage()
    assert first.startswith("apns rejected a push (PayloadTooLarge): ")
    assert "4 KB" in first


async def test_a_rejection_without_a_hint_of_its_provider_gets_the_generic_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bothy.notify.lifecycle")
    lifecycle().explain("fake", Outcome.rejected("fake_rejected"))
    (record,) = caplog.records
    assert record.getMessage().endswith(GENERIC_REJECTION)
