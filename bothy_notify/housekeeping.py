"""Housekeeping on nodes that run jobs.

- every tick: jobs whose lease ran out (a crashed runner) become available
  again; queue depth and lag metrics;
- hourly (and once at start): prune finished jobs after ``jobs.retention``,
  invalidate registrations not renewed within ``push.registration_ttl``, delete
  invalidated registrations after ``push.invalidated_retention``, delete the
  idempotency records of app hints older than ``notify.idempotency_window``,
  delete topic-mode recipients (and their subscriptions) not renewed within
  ``push.recipient_ttl``, delete the ``Idempotency-Key`` records of appends older than
  ``server.idempotency_window``, and forget deleted messages once no job of theirs
  can be pending (``max(push.max_age, notify.coalesce_window)`` after the deletion).

The housekeeper runs under a supervisor (``wiring``): an unexpected error
restarts it with backoff; a database error only skips that tick.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

import trio

from bothy_notify.config import Config
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store import append_keys, deletions, idempotency, topics
from bothy_notify.store import jobs as queue
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database, StoreError

log = logging.getLogger("bothy.housekeeping")

SWEEP_EVERY = 3600.0
"""Seconds between sweeps: apps register on every launch, so an hourly sweep is plenty."""
TICK_MAX = 5.0
"""Longest pause between lease rescues and metric samples, in seconds."""


@dataclass(frozen=True, slots=True)
class SweepResult:
    jobs_pruned: int
    registrations_expired: int
    registrations_deleted: int
    idempotency_pruned: int = 0
    recipients_expired: int = 0
    append_keys_pruned: int = 0
    deletions_pruned: int = 0


def sweep(conn: Conn, now: datetime, config: Config) -> SweepResult:
    """The hourly work, in one transaction."""
    return SweepResult(
        jobs_pruned=queue.prune(conn, now - config.jobs.retention),
        registrations_expired=regs.sweep_unrenewed(conn, now, config.push.registration_ttl),
        registrations_deleted=regs.delete_invalidated(
            conn, now - config.push.invalidated_retention
        ),
        idempotency_pruned=idempotency.prune(conn, now - config.notify.idempotency_window),
        recipients_expired=topics.sweep_expired(conn, now - config.push.recipient_ttl),
        append_keys_pruned=append_keys.prune(conn, now - config.server.idempotency_window),
        deletions_pruned=deletions.prune(
            conn, now - max(config.push.max_age, config.notify.coalesce_window)
        ),
    )


class Housekeeper:
    """The housekeeping service."""

    def __init__(self, *, db: Database, clock: Clock, config: Config, metrics: Metrics) -> None:
        self._db = db
        self._clock = clock
        self._config = config
        self._metrics = metrics

    def __repr__(self) -> str:
        return "Housekeeper()"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        tick = min(TICK_MAX, max(0.05, self._config.jobs.lease.total_seconds() / 2))
        last_sweep = -SWEEP_EVERY
        task_status.started()
        while True:
            try:
                await self.tick()
                if time.monotonic() - last_sweep >= SWEEP_EVERY:
                    last_sweep = time.monotonic()
                    await self.sweep_now()
            except StoreError:
                log.warning("housekeeping could not reach the database")
            await trio.sleep(tick)

    async def tick(self) -> None:
        now = self._clock.now()

        def work(conn: Conn) -> tuple[tuple[int, int], dict[tuple[str, str], int], float]:
            rescued = queue.rescue_expired(conn, now)
            counts, lag = queue.depth(conn, now)
            return rescued, counts, lag

        (again, failed), counts, lag = await self._db.run(work)
        self._metrics.jobs_rescued.labels("again").inc(again)
        self._metrics.jobs_rescued.labels("failed").inc(failed)
        if again or failed:
            log.warning(
                "jobs whose lease ran out were rescued",
                extra={"rescued": again, "failed": failed},
            )
        self._metrics.set_jobs_depth(counts)
        self._metrics.jobs_lag_seconds.set(lag)

    async def sweep_now(self) -> SweepResult:
        now = self._clock.now()
        # Bulk: a prune of an hour's rows may take longer than a request's bounds.
        result = await self._db.run(lambda c: sweep(c, now, self._config), bulk=True)
        self._metrics.registration("expired", result.registrations_expired, cause="not_renewed")
        self._metrics.registration("deleted", result.registrations_deleted)
        if result.recipients_expired:
            self._metrics.topic_recipients.labels("expired").inc(result.recipients_expired)
        log.info(
            "housekeeping sweep",
            extra={
                "jobs_pruned": result.jobs_pruned,
                "registrations_expired": result.registrations_expired,
                "registrations_deleted": result.registrations_deleted,
                "idempotency_pruned": result.idempotency_pruned,
                "recipients_expired": result.recipients_expired,
                "append_keys_pruned": result.append_keys_pruned,
                "deletions_pruned": result.deletions_pruned,
            },
        )
        return result
