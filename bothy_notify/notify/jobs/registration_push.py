"""What every push to a registration shares: its check, its badge, its lifecycle.

The push kinds that go to a person's registration (``notify.push_send``,
``notify.push_clear``, ``notify.push_summary``) are
:class:`~bothy_notify.push.jobs.PushKind` definitions run by the one
:class:`~bothy_notify.push.jobs.PushJobHandler`; this module is what they have
in common beyond that handler:

- the registration check of SPEC section 7 (:func:`still_active`): it exists,
  is active and still belongs to the job's person; else the job is skipped
  ``no_registration``; and the :class:`~bothy_notify.push.port.Target` of a
  registration (:func:`target_of`);
- the badge a push carries (:func:`badges`: ``push.badge = "unread_threads"``,
  one statement for every person a batch sends to, read when the job runs);
- :class:`RegistrationLifecycle`: each answer counted
  (``bothy_push_sends_total{provider,outcome,app}``), a rejection explained, and
  its effect on the registration from the token lifecycle
  (:mod:`bothy_notify.notify.lifecycle`: strikes, invalidation).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from bothy_notify.config import BadgeMode, NotifyConfig, PushConfig
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.notify.lifecycle import TokenLifecycle, send_outcome
from bothy_notify.push.jobs import Planned
from bothy_notify.push.port import Outcome, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import BatchedEffect, Effect
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job
from bothy_notify.store.unread import badges_of

DEFAULT_NOTIFY = NotifyConfig()
"""Where a kind built without ``urgency_of`` reads each kind's default urgency."""


def still_active(
    found: tuple[regs.Registration, str] | None, user_id: str
) -> tuple[regs.Registration, str] | None:
    """A loaded registration (and its platform) if it may still be sent to: it exists,
    is active and still belongs to the job's person; else ``None`` (the send is
    skipped ``no_registration``)."""
    if found is None or found[0].invalidated_at is not None or found[0].user_id != user_id:
        return None
    return found


def target_of(reg: regs.Registration, platform: str, job: Job) -> Target:
    """Where a push to ``reg`` goes, on ``job``'s attempt."""
    return Target(
        registration_id=reg.id,
        user_id=reg.user_id,
        provider=reg.provider,
        token=reg.token,
        platform=platform,
        environment=reg.environment,
        app_id=reg.app_id,
        signing_key=reg.signing_key,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        last_error=reg.error_since_delivery,
        failure_count=reg.failure_count,
        expires_at=reg.expires_at,
    )


def badges(conn: Conn, config: PushConfig, user_ids: Collection[str]) -> Mapping[str, int] | None:
    """The badge of each person in ``user_ids`` for pushes planned now: their unread
    threads (one statement for all) with ``push.badge = "unread_threads"``; ``None``
    when pushes carry no badge."""
    if config.badge is not BadgeMode.UNREAD_THREADS:
        return None
    return badges_of(conn, user_ids)


def badge_of(found: Mapping[str, int] | None, user_id: str) -> int | None:
    """One person's badge from :func:`badges` (0 for a person with nothing unread)."""
    return None if found is None else found.get(user_id, 0)


class RegistrationLifecycle:
    """The :class:`~bothy_notify.push.jobs.Lifecycle` of pushes to registrations,
    one for all their kinds: every answer counted in ``bothy_push_sends_total``
    (a transient last attempt as ``failed``), a rejection logged with what to
    check (throttled), and the token lifecycle's effect on the registration."""

    def __init__(self, *, providers: Providers, config: PushConfig, metrics: Metrics) -> None:
        self._providers = providers
        self._sends = Children(metrics.push_sends)
        self.tokens = TokenLifecycle(config=config, metrics=metrics)

    def __repr__(self) -> str:
        return "RegistrationLifecycle()"

    def answered(
        self, plan: Planned, outcome: Outcome, *, last_attempt: bool
    ) -> Effect | BatchedEffect:
        target = plan.target
        self._sends(
            target.provider,
            send_outcome(outcome, last_attempt=last_attempt),
            self._providers.app_label(target),
        ).inc()
        self.tokens.explain(target.provider, outcome)
        return self.tokens.effect(
            target.registration_id, target.provider, outcome, last_attempt=last_attempt
        )
