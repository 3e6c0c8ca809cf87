"""Serving one notify request of the Matrix Push Gateway API (SPEC section 14c).

``MatrixGateway.notify`` takes a parsed :class:`~.notification.Notification`:

1. Each device's app id names its route (``[matrix_gateway] apps``); an unknown
   app id is rejected like a dead pushkey. Its provider reads the pushkey (and
   a Web Push pusher's ``data``) as a registration would
   (:attr:`~bothy_notify.push.providers.ProviderEntry.pushkey`): a pushkey that
   can never be valid for it is rejected; one its provider refuses to contact
   (a Web Push endpoint outside ``allowed_endpoints``) is not sent and not
   rejected (a configuration matter, as Sygnal has it).
2. In one transaction: each pushkey's registration (made on first notify,
   :mod:`bothy_notify.store.matrix`), and one ``matrix.push_send`` job per
   (event, registration) that is not gone, unique on the pair: a homeserver
   that sends the same event again (it retries after a timeout) within the
   job's life (``jobs.retention``, at least ``push.max_age``) inserts nothing
   and nothing is sent twice. A badge update (no event) is a job of its own
   each time. Jobs this node's runner has room for are inserted already
   claimed and handed to it after the commit (no claim round trip).
3. The answer waits for the first attempt of each new job, at most
   ``matrix_gateway.answer_within`` from the request's start: the runner of
   this process tells each result as it is reported
   (:class:`~.answers.FirstAttempts`); a job claimed elsewhere is read from the
   database, polled.
4. ``rejected`` lists every pushkey its provider declared gone, by this first
   attempt (a dead outcome: Unregistered, 410, UNREGISTERED) or before (the
   registration is invalidated). Never a misconfiguration (a mismatch, a
   rejection: the registration is kept) and never a transient failure (the
   runner retries it; the homeserver gets 200).

Every device is counted once in ``bothy_matrix_notifications_total{app,
outcome}`` (:class:`MatrixOutcome`), ``app`` being its configured Matrix app id
(``unknown`` for any other).
"""

from __future__ import annotations

import copy
import enum
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from bothy_notify.config import MatrixGatewayConfig, PushConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.matrix.answers import Expected, FirstAttempts
from bothy_notify.matrix.apps import AppRoute
from bothy_notify.matrix.limits import SourceLimits
from bothy_notify.matrix.notification import Device, Notification
from bothy_notify.matrix.push import KIND
from bothy_notify.push.port import Refusal
from bothy_notify.push.providers import PROVIDERS
from bothy_notify.runner import Done, JobResult
from bothy_notify.store import matrix as store
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import ClaimHere, Job, JobSpec, JobWriter

log = logging.getLogger("bothy.matrix")

RENEW_AFTER = timedelta(days=1)
"""A pushkey in use renews its registration at most this often (``push.registration_ttl``
is at least a minute; its default 30 days)."""
POLL_FIRST = 0.02
POLL_CAP = 0.25
"""Seconds between two reads of jobs claimed by another node: from the first, doubling
up to the cap (an answer waits at most ``answer_within``)."""
LATEST_TS = 253_402_300_799
"""The last second a datetime holds (9999-12-31): a later ``pushkey_ts`` is read as it."""
UNKNOWN_APP = "unknown"
"""The ``app`` label of a device whose app id is not configured."""
GROUP_DEVICES = 1000
"""The most devices one grouped transaction stores (a request's own always fit)."""


class MatrixOutcome(enum.StrEnum):
    """What a notify request did for one device: ``bothy_matrix_notifications_total{outcome}``."""

    DELIVERED = "delivered"
    """Its first attempt delivered within ``answer_within``."""
    REJECTED = "rejected"
    """Listed in ``rejected``: gone now or before, an unknown app id, a pushkey that can
    never be valid."""
    REFUSED = "refused"
    """Its provider refused it and keeps the pushkey (a mismatch, a rejection, an
    endpoint not allowed): not listed."""
    PENDING = "pending"
    """No first result within ``answer_within``, or a transient one: the runner retries."""
    DUPLICATE = "duplicate"
    """The same (event, pushkey) again within the job's life: nothing sent."""


_FIRST_RESULT: Mapping[Result, MatrixOutcome] = {
    Result.DELIVERED: MatrixOutcome.DELIVERED,
    Result.DEAD: MatrixOutcome.REJECTED,
    Result.MISMATCH: MatrixOutcome.REFUSED,
    Result.REJECTED: MatrixOutcome.REFUSED,
    Result.SKIPPED_NO_REGISTRATION: MatrixOutcome.REJECTED,
}
"""The outcome of a job's first result (a ``Done``'s); any other is ``pending``."""


RegistrationCheck = Callable[..., Awaitable[tuple[str, str] | None]]
"""``(provider, app_id, token, secret) -> (field, problem) | None`` (``push.providers``)."""


@dataclass(slots=True, eq=False)  # identity: a queue holds each once
class _Request:
    """One notify request while its registrations and jobs are stored (grouped with
    others): ``wake`` is set when it is stored (``done``) or when it is its turn to
    lead the next transaction."""

    notification: Notification
    devices: list[_Device]
    claimed: set[int] = field(default_factory=set)
    """Its jobs inserted claimed by this node's runner and handed to it."""
    expected: Expected | None = None
    """Where this process's runner reports the first results of its jobs."""
    done: bool = False
    error: BaseException | None = None
    wake: trio.Event = field(default_factory=trio.Event)


@dataclass(slots=True)
class _Device:
    """One device of the request while it is served."""

    device: Device
    app: str
    outcome: MatrixOutcome | None = None
    pushkey: store.Pushkey | None = None
    registration_id: str | None = None
    job_id: int | None = None


class MatrixGateway:
    """Serves notify requests (see the module docstring).

    Args:
        db: the pool its transactions run on (the HTTP API's).
        clock: the injected clock (registrations' and jobs' times).
        config: ``[matrix_gateway]``.
        push: ``[push]`` (``max_attempts``).
        routes: the checked routes of ``[matrix_gateway] apps``.
        check: the providers' registration checks (``push.providers.registration_check``).
        metrics: ``bothy_matrix_notifications_total``.
        first: where this process's runner reports first results (``None``: no runner).
        claim: which jobs to insert claimed by this node's runner, given its room now
            (``None``: this node runs no gateway jobs).
        run_claimed: hands jobs inserted claimed to the runner; false when it took none.
        monotonic: seconds on a monotonic clock, for the rate limit per address.
    """

    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        config: MatrixGatewayConfig,
        push: PushConfig,
        routes: Mapping[str, AppRoute],
        check: RegistrationCheck | None,
        metrics: Metrics,
        first: FirstAttempts | None = None,
        claim: Callable[[], ClaimHere | None] | None = None,
        run_claimed: Callable[[Sequence[Job]], bool] | None = None,
        monotonic: Callable[[], float] = trio.current_time,
    ) -> None:
        self._db = db
        self._clock = clock
        self.config = config
        self._max_attempts = push.max_attempts
        self._routes = routes
        self._check = check
        self._count = metrics.matrix_notifications
        self._first = first
        self._claim = claim
        self._run_claimed = run_claimed
        self._queue: list[_Request] = []
        self._running = False
        self.limits = SourceLimits(
            per_second=config.requests_per_second, burst=config.requests_burst, now=monotonic
        )
        for app in (*routes, UNKNOWN_APP):
            for outcome in MatrixOutcome:
                self._count.labels(app, outcome.value)

    def __repr__(self) -> str:
        return f"MatrixGateway(apps={len(self._routes)})"

    @property
    def apps(self) -> tuple[str, ...]:
        """The configured Matrix app ids."""
        return tuple(self._routes)

    async def notify(self, notification: Notification) -> list[str]:
        """Serve one notify request; returns the pushkeys to list in ``rejected``.

        Raises :class:`~bothy_notify.store.db.StoreUnavailable` (the homeserver
        retries). Cancellation: the transaction that made the jobs has committed
        or rolled back as a whole; jobs handed to the runner run regardless.
        """
        deadline = trio.current_time() + self.config.answer_within.total_seconds()
        devices = [await self._read(d) for d in notification.devices]
        to_store = [d for d in devices if d.outcome is None]
        if to_store:
            request = _Request(notification, to_store)
            try:
                await self._store(request)
                await self._wait(to_store, request.claimed, request.expected, deadline)
            finally:
                if request.expected is not None:
                    request.expected.close()
        rejected: list[str] = []
        for d in devices:
            outcome = d.outcome or MatrixOutcome.PENDING
            self._count.labels(d.app, outcome.value).inc()
            if outcome is MatrixOutcome.REJECTED:
                rejected.append(d.device.pushkey)
        return rejected

    async def _read(self, device: Device) -> _Device:
        """The device with its route and what its provider reads of its pushkey."""
        route = self._routes.get(device.app_id)
        if route is None:
            return _Device(device, UNKNOWN_APP, MatrixOutcome.REJECTED)
        served = _Device(device, route.matrix_app)
        entry = PROVIDERS[route.provider]
        assert entry.pushkey is not None  # routes are checked at start
        found = entry.pushkey(device.pushkey, device.data, route.environment)
        if isinstance(found, Refusal):
            served.outcome = MatrixOutcome.REJECTED
            return served
        if self._check is not None:
            problem = await self._check(route.provider, route.app_id, found.token, found.secret)
            if problem is not None:
                served.outcome = MatrixOutcome.REFUSED
                return served
        set_at = (
            datetime.fromtimestamp(min(device.pushkey_ts, LATEST_TS), UTC)
            if device.pushkey_ts > 0
            else None
        )
        served.pushkey = store.Pushkey(
            owner=route.owner,
            device_id=route.matrix_app,
            provider=route.provider,
            token=found.token,
            app_id=route.app_id,
            environment=found.environment,
            secret=found.secret,
            expires_at=found.expires_at,
            pushkey_ts=set_at,
        )
        return served

    async def _store(self, request: _Request) -> None:
        """Store ``request``'s registrations and jobs, in one transaction with the requests
        that arrive while another such transaction runs (as :class:`~bothy_notify.store.
        appender.GroupAppender` groups appends): when it returns, the request's devices
        have their jobs (or outcomes) and ``request.claimed`` the jobs handed to the
        runner. Cancelled while it waits, the request leaves the queue unwritten; once
        its transaction runs it is not abandoned."""
        self._queue.append(request)
        try:
            if not self._running:
                await self._lead()
            while not request.done:
                await request.wake.wait()  # stored, or the turn to run the next transaction
                if not request.done:
                    await self._lead()
        finally:
            if not request.done and request in self._queue:
                # Cancelled while queued (not while its group's transaction runs: that
                # one finishes and marks it done regardless).
                self._queue.remove(request)
                if request.wake.is_set():  # its turn had come: the next one's now
                    self._hand_on()
        if request.error is not None:
            raise request.error

    def _hand_on(self) -> None:
        if self._queue:
            self._queue[0].wake.set()
        else:
            self._running = False

    async def _lead(self) -> None:
        """One transaction for the head of the queue (up to :data:`GROUP_DEVICES`
        devices), then the lead passes on."""
        self._running = True
        group: list[_Request] = []
        size = 0
        while self._queue and (not group or size + len(self._queue[0].devices) <= GROUP_DEVICES):
            group.append(self._queue.pop(0))
            size += len(group[-1].devices)
        try:
            with trio.CancelScope(shield=True):  # the others' devices ride on it
                await self._store_group(group)
        except Exception as exc:
            for r in group:
                # Each request raises its own instance (a traceback is per raise).
                r.error = exc if r is group[0] else copy.copy(exc)
        finally:
            for r in group:
                r.done = True
                r.wake.set()
            self._hand_on()

    async def _store_group(self, group: list[_Request]) -> None:
        """Registrations and jobs of ``group`` in one transaction; the jobs inserted
        claimed are handed to the runner in one batch (planned together)."""
        now = self._clock.now()
        claim = self._claim() if self._claim is not None else None
        max_attempts = self._max_attempts
        flat = [
            (d, _args(r.notification), _event_key(r.notification)) for r in group for d in r.devices
        ]

        def transaction(conn: Conn) -> tuple[list[store.Known], list[str | None], JobWriter]:
            found = [d.pushkey for d, _shared, _event in flat if d.pushkey is not None]
            known = store.pushkeys(conn, found, now, renew_after=RENEW_AFTER)
            writer = JobWriter(conn, now)
            writer.claim_here(claim)
            keys: list[str | None] = []
            taken: set[str] = set()
            for (_device, args, event_key), k in zip(flat, known, strict=True):
                key = f"mx:{event_key}:{k.registration_id}" if event_key else f"mxb:{new_id()}"
                if k.gone or key in taken:  # gone, or the same push twice in this group
                    keys.append(None)
                    continue
                keys.append(key)
                taken.add(key)
                writer.add(
                    JobSpec(
                        kind=KIND,
                        args={"registration_id": k.registration_id, **args},
                        scheduled_at=now,
                        max_attempts=max_attempts,
                        unique_key=key,
                    )
                )
            writer.finish()
            return known, keys, writer

        known, keys, writer = await self._db.run(transaction)
        for (d, _shared, _event), k, key in zip(flat, known, keys, strict=True):
            d.registration_id = k.registration_id
            d.job_id = writer.inserted.get(key) if key is not None else None
            if k.gone:
                d.outcome = MatrixOutcome.REJECTED
            elif d.job_id is None:
                d.outcome = MatrixOutcome.DUPLICATE
        if self._first is not None:
            # Before the runner has them: no first result can come before it is awaited.
            for r in group:
                r.expected = self._first.expect(
                    d.job_id for d in r.devices if d.job_id is not None and d.outcome is None
                )
        claimed = writer.claimed
        if claimed and (self._run_claimed is None or not self._run_claimed(claimed)):
            # The runner stopped meanwhile: their lease ends and a runner takes them.
            log.info("gateway jobs inserted claimed were not taken", extra={"jobs": len(claimed)})
            claimed = []
        here = {job.id for job in claimed}
        for r in group:
            r.claimed = {d.job_id for d in r.devices if d.job_id in here}

    async def _wait(
        self,
        devices: list[_Device],
        here: set[int],
        expected: Expected | None,
        deadline: float,
    ) -> None:
        """Wait for the first results of the devices' new jobs, until ``deadline``: this
        process's runner reports them to ``expected`` (registered before the runner
        had them); the jobs it did not claim at their insert (another node's runner
        may) are also read from the database."""
        waiting = {d.job_id: d for d in devices if d.job_id is not None and d.outcome is None}
        if not waiting:
            return
        elsewhere = [job_id for job_id in waiting if job_id not in here]
        if expected is not None and not elsewhere:
            # All with this process's runner (the usual case): this task waits itself.
            with trio.move_on_at(deadline):
                while not _take(expected, waiting):
                    await expected.wait_changed()
            return
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                def settled() -> None:
                    if all(d.outcome is not None for d in waiting.values()):
                        nursery.cancel_scope.cancel()

                if elsewhere:
                    nursery.start_soon(self._poll, elsewhere, waiting, settled)
                if expected is not None:
                    nursery.start_soon(self._take_results, expected, waiting, settled)

    @staticmethod
    async def _take_results(
        expected: Expected, waiting: dict[int, _Device], settled: Callable[[], None]
    ) -> None:
        """Take this process's results as they are reported."""
        while True:
            _take(expected, waiting)
            settled()
            await expected.wait_changed()

    async def _poll(
        self, job_ids: list[int], waiting: dict[int, _Device], settled: Callable[[], None]
    ) -> None:
        """Read the first attempts of jobs another runner may have claimed, until known."""
        delay = POLL_FIRST
        left = list(job_ids)
        while left:
            await trio.sleep(delay)
            delay = min(POLL_CAP, delay * 2)
            found = await self._db.run(
                functools.partial(store.first_attempts, job_ids=list(left)), transaction=False
            )
            for job_id, attempt in found.items():
                d = waiting[job_id]
                if d.outcome is None:
                    d.outcome = _attempt_outcome(attempt)
            settled()
            left = [job_id for job_id in left if waiting[job_id].outcome is None]


def _take(expected: Expected, waiting: dict[int, _Device]) -> bool:
    """Give the devices the results reported so far; whether every one has its outcome."""
    for job_id, result in expected.results.items():
        d = waiting[job_id]
        if d.outcome is None:
            d.outcome = _outcome(result)
    return all(d.outcome is not None for d in waiting.values())


def _attempt_outcome(attempt: store.FirstAttempt) -> MatrixOutcome:
    """The outcome of a first attempt another runner recorded."""
    if attempt.gone:
        return MatrixOutcome.REJECTED
    if attempt.delivered:
        return MatrixOutcome.DELIVERED
    return MatrixOutcome.PENDING if attempt.retrying else MatrixOutcome.REFUSED


def _outcome(result: JobResult) -> MatrixOutcome:
    if isinstance(result, Done):
        return _FIRST_RESULT.get(result.result, MatrixOutcome.PENDING)
    return MatrixOutcome.PENDING


def _event_key(notification: Notification) -> str | None:
    """The event's part of its jobs' unique keys: a digest (a Matrix event ID may be 255
    characters; the key is an index entry). ``None`` for a badge update."""
    if notification.event_id is None:
        return None
    return hashlib.sha256(notification.event_id.encode()).hexdigest()[:32]


def _args(notification: Notification) -> dict[str, Any]:
    """The job args every device of ``notification`` shares: IDs and integers only."""
    out: dict[str, Any] = {"urgency": notification.urgency}
    if notification.event_id is not None:
        out["event_id"] = notification.event_id
    if notification.room_id is not None:
        out["room_id"] = notification.room_id
    if notification.unread is not None:
        out["unread"] = notification.unread
    if notification.missed_calls is not None:
        out["missed_calls"] = notification.missed_calls
    return out
