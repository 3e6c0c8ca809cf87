"""The decision for one hint and one recipient (SPEC section 6).

The rules, in the order they apply:

1. Not a human, inactive, or no read access: skip ``no_access``.
   The kind's category is switched off, or the follow level says no:
   skip ``preference``. (``security`` cannot be switched off; ``none``
   silences a thread even for mentions; ``mentions`` lets only mentions
   through; a ``mention_only`` hint, an edit's newly mentioned people, is a
   mention or nothing.) The read position is at or past the message: skip
   ``read``.
2. Coalescing: a message hint for a (recipient, thread) whose window is open
   folds into it and routes nothing now; the window's flush decides later.
3. Active in the thread: some live connection focuses the thread and is not
   idle: skip ``active_in_thread``; no device hears about it.
4. Every device with a live connection gets a ``gateway`` route.
5. Every other device with active push registrations gets a ``push`` route,
   ``push_delayed`` by the mobile delay while a ``macos`` or ``windows``
   device is live and not idle; only hints that point at a message wait.
6. No route at all: skip ``no_registration``.
7. A message hint that was routed opens a coalescing window (unless the
   window length is zero or it is itself a flush).

The author (actor) is never a recipient: :func:`decide` refuses to route to
them with ``no_access``, and candidate selection leaves them out before.

:func:`decide` is :class:`HintRules` made for the hint, then asked about the
recipient. A caller deciding one hint for many recipients (the consumer round)
makes the :class:`HintRules` once and asks it per recipient: what depends on
the hint alone (whether it may coalesce or wait, the window it would open,
the device it is about) is then worked out once, not per recipient.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.kernel.results import SkipReason
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify.domain.model import (
    DESKTOP_PLATFORMS,
    Decision,
    Delivery,
    Fold,
    Hint,
    Kind,
    Policy,
    RecipientFacts,
    Route,
    Skip,
    Via,
    Window,
)
from bothy_notify.notify.domain.window import fold_into, open_window
from bothy_notify.vocabulary import Level

_MESSAGE_KINDS = frozenset({Kind.MESSAGE.value, Kind.MENTION.value})
_ZERO = timedelta(0)
# Plain strings: the decision runs once per recipient, and enum lookups show in profiles.
_MESSAGE, _MENTION, _SECURITY = Kind.MESSAGE.value, Kind.MENTION.value, Kind.SECURITY.value


def effective_kind(hint: Hint, facts: RecipientFacts) -> tuple[str, str] | None:
    """The (kind, category) this recipient hears ``hint`` as, or ``None`` if they opted out.

    A message hint becomes ``mention`` for a mentioned recipient whose level is
    not ``none`` and whose ``mentions`` category is on; otherwise ``message``
    when the level is ``all`` and ``messages`` is on, unless the hint is
    ``mention_only`` (an edit's: it never becomes a message).
    """
    off = facts.categories_off
    if hint.kind in _MESSAGE_KINDS:
        if facts.level is Level.NONE:
            return None
        mentioned = hint.kind == _MENTION or facts.user_id in hint.mentions
        if mentioned and "mentions" not in off:
            return _MENTION, "mentions"
        if hint.mention_only:
            return None
        if facts.level is Level.ALL and "messages" not in off:
            return _MESSAGE, "messages"
        return None
    if hint.kind == _SECURITY:
        return hint.kind, hint.category
    if hint.category in off:
        return None
    return hint.kind, hint.category


def release_delayed(release_seq: int, read_position: int) -> bool:
    """Whether a delayed push may still go out: the person has not read that far."""
    return release_seq <= 0 or read_position < release_seq


def decide(
    hint: Hint,
    facts: RecipientFacts,
    policy: Policy,
    *,
    window: Window | None = None,
    now: datetime,
) -> Decision:
    """Decide how ``facts.user_id`` hears about ``hint``.

    Args:
        hint: the hint.
        facts: the recipient's facts at this point of the log.
        policy: the configured delay and coalescing window.
        window: the recipient's coalescing window for the hint's thread, if any.
        now: the round's time (windows open and close relative to it).

    Returns:
        :class:`Skip` with a reason, :class:`Fold` into an open window, or
        :class:`Delivery` with at least one route.
    """
    return HintRules.of(hint, policy, now).decide(facts, window)


@fast_init
@dataclass(frozen=True, slots=True)
class HintRules:
    """The rules above for one hint, with what depends on the hint alone worked out.

    Build with :meth:`of`; :meth:`decide` per recipient.

    Attributes:
        hint: the hint.
        now: the round's time.
        coalescing: the hint may fold into, or open, a coalescing window.
        opens: the window a routed delivery opens (``None`` without coalescing).
        delay: the mobile delay this hint waits while a desktop is active (zero:
            it never waits).
        excluded: the device no route may go to (a security hint's target).
    """

    hint: Hint
    now: datetime
    coalescing: bool
    opens: Window | None
    delay: timedelta
    excluded: str | None

    @classmethod
    def of(cls, hint: Hint, policy: Policy, now: datetime) -> HintRules:
        coalescing = (
            not hint.is_flush
            and hint.thread_id is not None
            and hint.message_id is not None
            and hint.message_seq > 0
            and policy.coalesce_window > _ZERO
        )
        opens = (
            open_window(now, policy.coalesce_window, hint.message_seq, hint.message_id or "")
            if coalescing
            else None
        )
        delay = (
            policy.mobile_delay if hint.message_seq > 0 and policy.mobile_delay > _ZERO else _ZERO
        )
        excluded = hint.target_id if hint.kind == _SECURITY else None
        return cls(hint, now, coalescing, opens, delay, excluded)

    def decide(self, facts: RecipientFacts, window: Window | None = None) -> Decision:
        """How ``facts.user_id`` hears about the hint (see :func:`decide`)."""
        hint = self.hint
        user = facts.user_id
        if user == hint.actor_id or not (facts.human and facts.active and facts.has_access):
            return Skip(user, SkipReason.NO_ACCESS)
        chosen = effective_kind(hint, facts)
        if chosen is None:
            return Skip(user, SkipReason.PREFERENCE)
        kind, category = chosen
        if hint.message_seq > 0 and facts.read_position >= hint.message_seq:
            return Skip(user, SkipReason.READ)

        if self.coalescing and window is not None and window.is_open(self.now):
            return Fold(
                user,
                fold_into(
                    window, hint.message_seq, hint.message_id or "", mentioned=kind == _MENTION
                ),
            )

        excluded = self.excluded
        presence = facts.presence
        routes: list[Route] = []
        if not presence:  # nobody connected: every device with a registration, at once
            for device in facts.devices:
                if device.registrations and device.device_id != excluded:
                    routes.append(Route(Via.PUSH, device.device_id, device.registrations))
        else:
            if hint.thread_id is not None and any(
                hint.thread_id in entry.focus and not entry.idle for entry in presence
            ):
                return Skip(user, SkipReason.ACTIVE_IN_THREAD)
            live: set[str] = set()
            for entry in presence:
                if entry.device_id in live or entry.device_id == excluded:
                    continue
                live.add(entry.device_id)
                routes.append(Route(Via.GATEWAY, entry.device_id))
            desktop_active = any(
                entry.platform in DESKTOP_PLATFORMS and not entry.idle for entry in presence
            )
            delay = self.delay if desktop_active else _ZERO
            for device in facts.devices:
                if (
                    device.device_id in live
                    or device.device_id == excluded
                    or not device.registrations
                ):
                    continue
                if delay:
                    routes.append(
                        Route(Via.PUSH_DELAYED, device.device_id, device.registrations, delay)
                    )
                else:
                    routes.append(Route(Via.PUSH, device.device_id, device.registrations))

        if not routes:
            return Skip(user, SkipReason.NO_REGISTRATION)

        if hint.count is not None:
            count = hint.count
        elif hint.message_seq > 0:
            count = max(1, hint.message_seq - facts.read_position)
        else:
            count = 1
        quiet = hint.quiet and kind != _MENTION if not hint.is_flush else hint.quiet
        return Delivery(user, kind, category, count, quiet, tuple(routes), self.opens, facts.quiet)
