"""The reference client of topic mode: keeps a recipient's subscriptions on the
daemon in step with the app's conversations, consent, overrides and keys.

Usable as is by a bot or a backend service (Trio), and the model for mobile
SDKs. Its state lives in one SQLite file (:mod:`.local`); the app tells it
about conversations through a :class:`~.model.ConversationSource`.

Surface:

- :meth:`NotificationClient.enable` stores the delivery config and rules,
  makes the recipient identity on first use, and registers inline;
- :meth:`NotificationClient.disable` clears config and uploaded set (the
  identity and the overrides stay) and unregisters;
- :meth:`NotificationClient.state` reads the local state, never the daemon;
- :meth:`NotificationClient.set_conversation` / :meth:`conversation_enabled`:
  per-conversation overrides;
- :meth:`NotificationClient.wake` after a consent, membership, override or key
  change; :meth:`NotificationClient.run` is the task runner (Trio service);
  :meth:`NotificationClient.sync_once` is one run of it.

A run makes at most one request. In order: nothing unless enabled (and past a
retry backoff); a Register when one is owed (first enable failed, the daemon
said NOT_FOUND) or the renewal deadline passed (now + (expires_at - now) / 4
after every success, an hour at the least); otherwise the next :func:`~.diff.plan` (at most 1000
subscriptions). Every answer's ``topic_count`` is compared with the uploaded
set: a difference starts a repair pass that marks every uploaded row stale;
while it runs, counts are not compared and each run re-sends at most 1000
stale rows, clearing marks as the answer confirms them; it ends when none is
left. A count still higher after a completed pass (topics the daemon has and
this client never recorded) is logged once and left alone. Errors: terminal
ones set the state to failed and stop; NOT_FOUND clears the uploaded set,
starts a pass and registers again; a topic limit drops the run's adds until
the desired set changes (other topics' adds go on); everything else backs
off (60 s, doubling up to an hour).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import trio

from bothy_notify.client import diff
from bothy_notify.client.api import Identity, RecipientApi
from bothy_notify.client.errors import (
    NotificationError,
    RecipientNotFound,
    RunnerDisabled,
    TerminalError,
    TopicLimitReached,
)
from bothy_notify.client.local import LocalStore, Settings
from bothy_notify.client.model import (
    Conversation,
    ConversationSource,
    Delivery,
    NotificationState,
    Override,
    RecipientState,
    Rules,
    Status,
)
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.topics.model import epoch_of

log = logging.getLogger("bothy.client")

FIRST_RETRY = timedelta(seconds=60)
"""Backoff after the first failed notification call."""
LONGEST_RETRY = timedelta(hours=1)
"""Backoff stops doubling here (the hourly sync would run anyway)."""
RENEWAL_FLOOR = timedelta(hours=1)
"""The next renewal is never sooner than this: with a clock far off the daemon's, an
expiry that looks past would otherwise make every run a Register."""
SYNC_PERIOD = timedelta(hours=1)
"""The sync task runs at least this often while enabled, so a lost wake costs an hour."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run did: ``call`` names the request made (``None``: none), ``more``
    says whether work is left that the next run should do at once."""

    call: str | None
    more: bool


class NotificationClient:
    """One installation's notifications.

    Args:
        store: the local SQLite state.
        api: the daemon.
        source: the app's conversations and keys.
        clock: the injected clock (renewal and retry deadlines, HMAC epochs).
        runner_enabled: whether this client's task runner will run; without it
            subscriptions could not be kept current, so :meth:`enable` refuses.
    """

    def __init__(
        self,
        *,
        store: LocalStore,
        api: RecipientApi,
        source: ConversationSource,
        clock: Clock | None = None,
        runner_enabled: bool = True,
    ) -> None:
        self._store = store
        self._api = api
        self._source = source
        self._clock = clock or SystemClock()
        self._runner_enabled = runner_enabled
        self._wake = trio.Event()
        self._running = trio.Lock()
        self.repair_passes = 0

    def __repr__(self) -> str:
        return f"NotificationClient(status={self.state().status.value!r})"

    # ------------------------------------------------------------ public surface

    def state(self) -> NotificationState:
        """The local state: disabled, enabled, or failed with its error (no call)."""
        return self._store.settings().state()

    def identity(self) -> Identity | None:
        """The recipient identity, once made (kept across disable and enable)."""
        return self._store.identity()

    async def enable(self, delivery: Delivery, rules: Rules | None = None) -> NotificationState:
        """Enable notifications and register inline.

        A terminal error sets the state to failed and is returned as that state;
        any other error leaves it enabled with the registration retried by the
        task runner. Calling it again with a new token, URL or rule keeps the
        uploaded set; the next run sends what the new rules change.

        Raises:
            RunnerDisabled: this client has no task runner (nothing is stored).
        """
        if not self._runner_enabled:
            raise RunnerDisabled("notifications need the client's task runner")
        with self._store.transaction():
            self._store.identity(create=True)
            self._store.update(
                status=Status.ENABLED,
                error_code=None,
                error_message=None,
                delivery=delivery,
                rules=rules or Rules(),
                need_register=True,
                retry_at=None,
                retry_backoff=None,
            )
        async with self._running:
            await self._register()
        self.wake()
        return self.state()

    async def disable(self) -> None:
        """Disable notifications: the config and the uploaded set go, the identity and
        the overrides stay; then unregister (NOT_FOUND is success; any other failure
        leaves it to the daemon's expiry)."""
        with self._store.transaction():
            self._store.update(
                status=Status.DISABLED,
                error_code=None,
                error_message=None,
                delivery=None,
                need_register=False,
                renewal_deadline=None,
                sync_deadline=None,
                retry_at=None,
                retry_backoff=None,
                repairing=False,
                pass_completed=False,
                high_warned=False,
                topic_count=None,
                channel=None,
                expires_at=None,
            )
            self._store.clear_uploaded()
            self._store.clear_held_back()
        identity = self._store.identity()
        if identity is None:
            return
        async with self._running:
            try:
                await self._api.unregister(identity)
            except RecipientNotFound:
                pass
            except NotificationError as exc:
                log.warning(
                    "unregister failed; the daemon deletes the recipient at its expiry",
                    extra={"code": exc.code},
                )

    def set_conversation(self, topic: bytes, value: Override) -> None:
        """Set a conversation's override (``NONE`` returns it to the rules); wakes the
        task runner after the local commit."""
        with self._store.transaction():
            self._store.set_override(topic, value)
        self.wake()

    def conversation_enabled(self, conversation: Conversation) -> bool:
        """The effective value for a conversation: its override, else the rules."""
        settings = self._store.settings()
        override = self._store.overrides().get(conversation.topic, Override.NONE)
        return diff.effective(conversation, override, settings.rules)

    def wake(self) -> None:
        """Tell the task runner that something changed (call after your own commit)."""
        with self._store.transaction():
            self._store.update(sync_deadline=None)
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The task runner: a run at start, after every wake, when a deadline passes,
        and at least hourly; runs again at once while work remains.

        The run at start happens whatever the deadlines say, so a change whose wake
        was lost (the process ended between the app's commit and :meth:`wake`) is
        sent now rather than at the hourly run; with nothing to send it makes no
        call (the diff is local).

        Cancellation: a request in flight is abandoned (its effect is learnt on the
        next run; nothing local is half-written).
        """
        task_status.started()
        more = True  # the run at start
        while True:
            wake = self._wake
            if wake.is_set():
                self._wake = wake = trio.Event()
            if more or self._due():
                more = (await self.sync_once()).more
                if more:
                    await trio.lowlevel.checkpoint()
                    continue
            await self._wait(wake)

    async def sync_once(self) -> RunResult:
        """One run of the task: at most one request (see the module docstring)."""
        async with self._running:
            settings = self._store.settings()
            now = self._clock.now()
            if settings.status is not Status.ENABLED or settings.delivery is None:
                return RunResult(None, False)
            if settings.retry_at is not None and now < settings.retry_at:
                return RunResult(None, False)
            if settings.need_register or (
                settings.renewal_deadline is not None and now >= settings.renewal_deadline
            ):
                ok = await self._register()
                return RunResult("register", ok and not self._plan().empty)
            return await self._update()

    # ------------------------------------------------------------ the runs

    def _plan(self) -> diff.Plan:
        settings = self._store.settings()
        desired = self._desired(settings)
        return diff.plan(
            desired,
            self._store.uploaded(),
            rules=settings.rules,
            keys=self._source.hmac_key,
            epoch=epoch_of(self._clock.now()),
            fingerprint=self._source.root_key_fingerprint(),
            held_back=self._store.held_back(diff.digest(desired)),
        )

    def _desired(self, settings: Settings) -> dict[bytes, diff.Desired]:
        return diff.desired_set(
            self._source.conversations(),
            self._source.welcome_topic(),
            self._store.overrides(),
            settings.rules,
        )

    async def _register(self) -> bool:
        settings = self._store.settings()
        identity = self._store.identity()
        if settings.delivery is None or identity is None:
            return False
        try:
            state = await self._api.register(identity, settings.delivery)
        except NotificationError as exc:
            self._failed_call(exc, settings)
            return False
        with self._store.transaction():
            if self._store.settings().status is not Status.ENABLED:
                return False  # disabled meanwhile: nothing more to record
            self._store.update(need_register=False)
            self._succeeded(state)
        return True

    async def _update(self) -> RunResult:
        settings = self._store.settings()
        identity = self._store.identity()
        assert identity is not None
        plan = self._plan()
        if plan.empty:
            with self._store.transaction():
                self._store.update(sync_deadline=self._clock.now() + SYNC_PERIOD)
            return RunResult(None, False)
        fingerprint = self._source.root_key_fingerprint()
        try:
            state = await self._api.update_subscriptions(identity, plan.adds, plan.removes)
        except TopicLimitReached as exc:
            # The run's adds wait until the desired set changes; other topics' adds
            # (key refreshes, a repair pass's re-uploads) and the removes go on.
            desired = self._desired(settings)
            log.warning(
                "the daemon's topic limit is reached; this run's adds wait for a change",
                extra={"code": exc.code, "dropped": len(plan.adds)},
            )
            with self._store.transaction():
                self._store.hold_back([a.topic for a in plan.adds], diff.digest(desired))
            return RunResult("subscriptions", not self._plan().empty)
        except NotificationError as exc:
            self._failed_call(exc, settings)
            return RunResult("subscriptions", False)
        with self._store.transaction():
            if self._store.settings().status is not Status.ENABLED:
                return RunResult("subscriptions", False)
            self._store.confirm(plan.adds, plan.removes, fingerprint)
            self._succeeded(state)
        return RunResult("subscriptions", not self._plan().empty)

    def _succeeded(self, state: RecipientState) -> None:
        """After any successful answer, inside the caller's local transaction."""
        now = self._clock.now()
        settings = self._store.settings()
        self._store.record_state(state)
        self._store.update(
            renewal_deadline=now + max((state.expires_at - now) / 4, RENEWAL_FLOOR),
            sync_deadline=now + SYNC_PERIOD,
            retry_at=None,
            retry_backoff=None,
        )
        if settings.delivery is not None and state.channel != settings.delivery.channel:
            log.warning(
                "the daemon reports another channel than this client registered",
                extra={"channel": state.channel},
            )
        if settings.repairing:
            if self._store.stale_count() == 0:
                self._store.update(repairing=False, pass_completed=True, high_warned=False)
                log.info("repair pass complete")
            return
        uploaded = self._store.uploaded_count()
        if state.topic_count == uploaded:
            return
        if state.topic_count > uploaded and settings.pass_completed:
            if not settings.high_warned:
                log.warning(
                    "the daemon holds topics this client has no record of; left alone",
                    extra={"daemon": state.topic_count, "uploaded": uploaded},
                )
                self._store.update(high_warned=True)
            return
        log.warning(
            "the daemon's topic count differs from the uploaded set; repairing",
            extra={"daemon": state.topic_count, "uploaded": uploaded},
        )
        self._store.mark_all_stale()
        self._store.update(repairing=True, pass_completed=False, high_warned=False)
        self.repair_passes += 1

    def _failed_call(self, exc: NotificationError, settings: Settings) -> None:
        with self._store.transaction():
            if self._store.settings().status is not Status.ENABLED:
                return
            if isinstance(exc, TerminalError):
                log.warning("notifications failed; tasks stop", extra={"code": exc.code})
                self._store.update(
                    status=Status.FAILED, error_code=exc.code, error_message=exc.message
                )
            elif isinstance(exc, RecipientNotFound):
                log.warning("the daemon does not know this recipient; registering again")
                self._store.clear_uploaded()
                self._store.update(
                    need_register=True, repairing=True, pass_completed=False, high_warned=False
                )
                self.repair_passes += 1
            else:
                backoff = timedelta(seconds=settings.retry_backoff or 0) * 2 or FIRST_RETRY
                backoff = min(max(backoff, FIRST_RETRY), LONGEST_RETRY)
                log.warning(
                    "a notification call failed; retrying later",
                    extra={"code": exc.code, "retry_seconds": backoff.total_seconds()},
                )
                self._store.update(
                    retry_at=self._clock.now() + backoff,
                    retry_backoff=backoff.total_seconds(),
                )

    # ------------------------------------------------------------ scheduling

    def _next_due(self) -> datetime | None:
        settings = self._store.settings()
        if settings.status is not Status.ENABLED:
            return None
        if settings.retry_at is not None:
            return settings.retry_at
        candidates = [d for d in (settings.renewal_deadline, settings.sync_deadline) if d]
        if settings.need_register or settings.sync_deadline is None:
            return self._clock.now()
        return min(candidates) if candidates else self._clock.now()

    def _due(self) -> bool:
        due = self._next_due()
        return due is not None and due <= self._clock.now()

    async def _wait(self, wake: trio.Event) -> None:
        due = self._next_due()
        async with trio.open_nursery() as race:

            async def until_woken() -> None:
                await wake.wait()
                race.cancel_scope.cancel()

            async def until_due(when: datetime) -> None:
                await self._clock.sleep_until(when)
                race.cancel_scope.cancel()

            race.start_soon(until_woken)
            if due is not None:
                race.start_soon(until_due, due)
