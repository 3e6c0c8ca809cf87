"""The token lifecycle: what a provider's outcome does to a registration (SPEC section 10).

One module for every sender: ``notify.push_send`` hands the effect to the job
runner (it commits together with the job's result), and ``bothy-notify push
test`` applies it in its own transaction. The rules, all of them here:

==========  ================  ==================================================
outcome     attempt           the registration
==========  ================  ==================================================
delivered   any               ``last_seen_at`` set, strikes reset; the provider's
                              latest delivery moves forward (shared by all nodes)
dead        any               invalidated, kept as evidence (registering again
                              restores it)
mismatch    any               kept, error recorded, no strike (logged by the
                              provider with the environment and topic)
rejected    any               kept, error recorded, no strike; logged once per
                              (provider, reason) per minute with what to check
transient   not the last      error recorded; the send is retried
transient   the last          the send failed: :func:`judge_failed_send`
==========  ================  ==================================================

A strike is one *send* whose every attempt failed transiently (a send ends at
its first non-transient outcome, so "the last attempt was transient" means
every attempt was). :func:`judge_failed_send`, in order:

1. the registration is gone or invalidated: nothing to count;
2. the last outcome is ``ours`` (no answer about this token arrived: our
   connection, DNS, TLS or token fetch failed): no strike;
3. a strike counted within ``push.strike_interval``: no strike (at most one
   per interval);
4. the same provider delivered to no *other* registration within the
   interval (its latest delivery is older, or not newer than this
   registration's own): the provider or our path to it is down for everyone,
   no strike;
5. otherwise a strike; ``push.max_strikes`` in a row invalidate.

A delivery resets the count. No strike is ever counted for a mismatch or a
rejection, so a configuration or payload bug never deletes registrations.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.config import PushConfig
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.push.port import Outcome, OutcomeKind
from bothy_notify.push.providers import entry
from bothy_notify.push.transport import LogThrottle
from bothy_notify.runner import BatchedEffect, Effect
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn

log = logging.getLogger("bothy.notify.lifecycle")

REJECTION_LOG_PERIOD = 60.0
"""Seconds between two log lines for the same (provider, reason) rejection."""


class Verdict(enum.StrEnum):
    """What a failed send does to its registration (:func:`judge_failed_send`)."""

    NOT_ACTIVE = "not_active"
    OURS = "ours"
    RECENT_STRIKE = "recent_strike"
    PROVIDER_QUIET = "provider_quiet"
    STRIKE = "strike"
    INVALIDATE = "invalidate"

    @property
    def counts(self) -> bool:
        """Whether the verdict counts a strike."""
        return self in (Verdict.STRIKE, Verdict.INVALIDATE)


@dataclass(frozen=True, slots=True)
class StrikeRules:
    """``push.max_strikes`` and ``push.strike_interval``."""

    max_strikes: int
    interval: timedelta

    @classmethod
    def of(cls, config: PushConfig) -> StrikeRules:
        return cls(config.max_strikes, config.strike_interval)


def judge_failed_send(
    outcome: Outcome, state: regs.StrikeState | None, rules: StrikeRules, now: datetime
) -> Verdict:
    """Whether a send whose every attempt failed transiently counts a strike; pure.

    ``outcome`` is the last attempt's; ``state`` the registration's as it is now
    (``None`` when it is gone). The rules are in the module docstring.
    """
    if state is None or not state.active:
        return Verdict.NOT_ACTIVE
    if outcome.ours:
        return Verdict.OURS
    since = now - rules.interval
    if state.last_strike_at is not None and state.last_strike_at > since:
        return Verdict.RECENT_STRIKE
    others = state.provider_delivered_at
    if (
        others is None
        or others <= since
        or (state.last_seen_at is not None and others <= state.last_seen_at)
    ):
        return Verdict.PROVIDER_QUIET
    if state.strikes + 1 >= rules.max_strikes:
        return Verdict.INVALIDATE
    return Verdict.STRIKE


def send_outcome(outcome: Outcome, *, last_attempt: bool) -> str:
    """The ``outcome`` label of ``bothy_push_sends_total`` for one attempt: the
    outcome's kind, or ``failed`` for a transient last attempt (the send gave up)."""
    if outcome.kind is OutcomeKind.TRANSIENT and last_attempt:
        return "failed"
    return outcome.kind.value


# ---------------------------------------------------------------- what to check

GENERIC_REJECTION = "the provider refused this message; the registration is kept"
"""Said for a rejection without a hint of its own."""


def what_to_check(provider: str, outcome: Outcome) -> str | None:
    """A constant hint on what to check for an outcome's reason (never a token or ID);
    ``None`` when there is nothing to say."""
    if outcome.reason == "provider_not_configured":
        return "this node has no block for the registration's provider"
    if outcome.reason == "unknown_app":
        return "the registration's app_id is not one of its provider's configured apps"
    spec = entry(provider)
    hint = spec.hints.get(outcome.reason)
    if hint is None and outcome.kind is OutcomeKind.REJECTED:
        hint = spec.rejection_hint or None
    return hint


# ---------------------------------------------------------------- effects


class TokenLifecycle:
    """Turns an outcome into its registration effect and explains rejections.

    Args:
        config: ``push.*`` (``max_strikes``, ``strike_interval``).
        metrics: counts invalidations (``bothy_registrations_total{action}``).
        log_period: seconds between log lines of one (provider, reason) rejection.
    """

    def __init__(
        self, *, config: PushConfig, metrics: Metrics, log_period: float = REJECTION_LOG_PERIOD
    ) -> None:
        self._rules = StrikeRules.of(config)
        self._metrics = metrics
        self._throttle = LogThrottle(log_period)

    def __repr__(self) -> str:
        return f"TokenLifecycle(max_strikes={self._rules.max_strikes})"

    def effect(
        self, registration_id: str, provider: str, outcome: Outcome, *, last_attempt: bool
    ) -> Effect | BatchedEffect:
        """The write ``outcome`` makes on the registration (see the module docstring).

        ``last_attempt``: no attempt of this send follows (a transient outcome means
        the send failed). The effect runs in the transaction that records the
        job's result, with the clock's now.
        """
        reason = outcome.reason or outcome.kind.value
        if outcome.kind is OutcomeKind.DELIVERED:
            return BatchedEffect(regs.mark_delivered_many, (registration_id, provider))
        if outcome.kind is OutcomeKind.DEAD:
            return lambda conn, now: self._dead(conn, registration_id, reason, now)
        if outcome.kind is OutcomeKind.TRANSIENT and last_attempt:
            return lambda conn, now: self._failed(conn, registration_id, outcome, now)
        return BatchedEffect(regs.mark_errors_many, (registration_id, reason))

    def _dead(self, conn: Conn, registration_id: str, reason: str, now: datetime) -> None:
        if regs.mark_dead(conn, registration_id, reason, now):
            self._metrics.registration("invalidated", cause="dead")

    def _failed(self, conn: Conn, registration_id: str, outcome: Outcome, now: datetime) -> None:
        reason = outcome.reason or outcome.kind.value
        verdict = judge_failed_send(
            outcome, regs.strike_state(conn, registration_id), self._rules, now
        )
        if verdict.counts:
            invalidate = verdict is Verdict.INVALIDATE
            regs.add_strike(conn, registration_id, reason, now, invalidate=invalidate)
            if invalidate:
                self._metrics.registration("invalidated", cause="strikes")
        elif verdict is not Verdict.NOT_ACTIVE:
            regs.mark_error(conn, registration_id, reason, now)

    def explain(self, provider: str, outcome: Outcome) -> None:
        """Log a rejection with what to check, once per (provider, reason) per
        :data:`REJECTION_LOG_PERIOD` (a payload bug rejects every send alike).
        Reasons the provider logs itself (naming its keys) are left to it."""
        if outcome.kind is not OutcomeKind.REJECTED:
            return
        if outcome.reason in entry(provider).explained:
            return
        if not self._throttle.allow(f"{provider}:{outcome.reason}"):
            return
        log.warning(
            "%s rejected a push (%s): %s",
            provider,
            outcome.reason or "no reason",
            what_to_check(provider, outcome) or GENERIC_REJECTION,
            extra={"provider": provider, "reason": outcome.reason},
        )


def apply_now(conn: Conn, effect: Effect | BatchedEffect, now: datetime) -> None:
    """Apply one effect at once (``push test``, which has no job runner)."""
    if isinstance(effect, BatchedEffect):
        effect.apply(conn, [effect.item], now)
    else:
        effect(conn, now)
