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

_HINTS: dict[tuple[str, str], str] = {
    ("apns", "PayloadTooLarge"): (
        "the push is larger than APNs accepts (4 KB): check the lengths of the IDs in"
        " hints (thread, message, target) and of push.apns.alert_title"
    ),
    ("apns", "BadTopic"): "check push.apns.bundle_id against the app's bundle id",
    ("apns", "MissingTopic"): "check push.apns.bundle_id",
    ("apns", "BadPriority"): "check push.apns.style (background pushes use priority 5)",
    ("apns", "InvalidPushType"): "check push.apns.style",
    ("apns", "InvalidProviderToken"): "check push.apns.key, push.apns.key_id and team_id",
    ("apns", "MissingProviderToken"): "check push.apns.key, push.apns.key_id and team_id",
    ("apns", "ExpiredProviderToken"): (
        "APNs refused two fresh provider tokens in a row: check push.apns.key_id,"
        " push.apns.team_id and this host's clock"
    ),
    ("apns", "Forbidden"): "check that the key in push.apns.key may send APNs pushes",
    ("apns", "malformed_token"): (
        "a stored APNs token is not a hex device token: the app registered something else"
    ),
    ("apns", "unknown_environment"): "a registration names an environment without an APNs host",
    ("fcm", "INVALID_ARGUMENT"): (
        "FCM refused the message as malformed: check the payload (every data value a"
        " string, no reserved key such as from or gcm.*), its size (4 KB) and that the"
        " token is an FCM registration token"
    ),
    ("fcm", "THIRD_PARTY_AUTH_ERROR"): (
        "the APNs key or certificate in the Firebase project is missing or invalid:"
        " check the project's Cloud Messaging settings for Apple apps"
    ),
    ("fcm", "PERMISSION_DENIED"): (
        "the service account may not send for this project: check its role and that"
        " the FCM API is enabled"
    ),
    ("fcm", "UNAUTHENTICATED"): ("FCM refused the access token: check push.fcm.service_account"),
    ("fcm", "token_refused"): (
        "the token endpoint refused the service account: check push.fcm.service_account"
        " (the key may be disabled or deleted)"
    ),
    ("fcm", "token_unavailable"): "the token endpoint could not be reached",
    ("fcm", "token_timeout"): "the token endpoint did not answer in time",
    ("webhook", "private_address"): (
        "the webhook host resolves to a private or local address, refused unless"
        " push.webhook.allow_private_addresses"
    ),
    ("webhook", "redirect"): (
        "the receiver answered with a redirect, which is never followed: register the final URL"
    ),
    ("webhook", "bad_signing_key"): "a stored signing key is not base64 of 16 to 64 bytes",
    ("webhook", "http_404"): "the receiver answered 404: check the webhook URL",
    ("webhook", "http_410"): "the receiver answered 410: check the webhook URL",
    ("webhook", "http_401"): (
        "the receiver refused the webhook: check that it verifies the signature with the"
        " registered signing key"
    ),
    ("webhook", "http_403"): (
        "the receiver refused the webhook: check that it verifies the signature with the"
        " registered signing key"
    ),
}
_PROVIDER_HINTS: dict[str, str] = {
    "apns": "APNs refused the message: look the reason up in Apple's table of APNs reasons",
    "fcm": "FCM refused the message: look the reason up in FCM's error codes",
    "webhook": "the receiver refused the webhook: check that it accepts the payload",
}


def what_to_check(provider: str, outcome: Outcome) -> str | None:
    """A constant hint on what to check for an outcome's reason (never a token or ID);
    ``None`` when there is nothing to say."""
    if outcome.reason == "provider_not_configured":
        return "this node has no block for the registration's provider"
    hint = _HINTS.get((provider, outcome.reason))
    if hint is None and outcome.kind is OutcomeKind.REJECTED:
        hint = _PROVIDER_HINTS.get(provider)
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
        :data:`REJECTION_LOG_PERIOD` (a payload bug rejects every send alike)."""
        if outcome.kind is not OutcomeKind.REJECTED:
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
