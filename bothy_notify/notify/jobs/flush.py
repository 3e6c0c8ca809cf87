"""``notify.flush``: the end of a coalescing window (SPEC section 6, point 6).

In one transaction: take the window (it may have been replaced by a newer one,
then nothing happens); when messages were folded in and the thread is still
unread, decide one hint with count = the unread count, with the presence of
this moment, and insert its jobs. Nothing when it was read, and nothing (skip
``deleted``) when every message it would tell of, the folded ones past the read
position, was deleted since the window opened (:func:`~bothy_notify.notify.domain.
only_deleted`); when only its newest was, the hint tells of the thread up to its
last message.

The flush's hint is a notification of its own (a new ``nid``) decided at the
window's end, so it carries the catalogue version of that moment (refreshed
once per batch of flush jobs), and all its copies carry that one value. The
hint that opened the window kept the version of its own decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial

import trio

from bothy_notify.config import LiveConfig
from bothy_notify.kernel.clock import Clock, from_unix_micros
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.notify import facts
from bothy_notify.notify.catalogue import CatalogueSource
from bothy_notify.notify.domain import SkipReason, Window, flush_hint, only_deleted
from bothy_notify.notify.facts import PresenceSource
from bothy_notify.notify.jobs.args import FLUSH, FlushArgs
from bothy_notify.notify.planner import Decider, RoundOutcome
from bothy_notify.notify.routes import LiveRoutes
from bothy_notify.runner import Done, Report
from bothy_notify.store import access, deletions
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job, JobWriter


class FlushHandler:
    """Runs ``notify.flush`` jobs.

    ``config`` is the node's live configuration, read at each flush (a reload's
    ``notify.categories`` reach the next one). ``catalogue`` gives the version
    fixed on the flush hints (none given: the send jobs fall back to the version
    in use when they run).
    """

    kind = FLUSH

    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        config: LiveConfig,
        presence: PresenceSource,
        live: LiveRoutes,
        metrics: Metrics,
        catalogue: CatalogueSource | None = None,
    ) -> None:
        self._db = db
        self._catalogue = catalogue
        self._clock = clock
        self._config = config
        self._presence = presence
        self._live = live
        self._metrics = metrics

    def __repr__(self) -> str:
        return "FlushHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        mv: str | None = None
        if self._catalogue is not None:
            mv = (await trio.to_thread.run_sync(self._catalogue.refresh)).version
        for job in jobs:
            args = FlushArgs.from_args(job.args)
            now = self._clock.now()
            outcome, result = await self._db.run(partial(self._flush, args=args, now=now, mv=mv))
            for reason, n in outcome.skips.items():
                self._metrics.skip(reason, n)
            for kind, n in outcome.hints.items():
                self._metrics.hints.labels(kind).inc(n)
            await report(job, Done(result))

    def _flush(
        self, conn: Conn, *, args: FlushArgs, now: datetime, mv: str | None
    ) -> tuple[RoundOutcome, Result]:
        outcome = RoundOutcome()
        row = conn.execute(
            "DELETE FROM bothy.hint_windows WHERE user_id = %s AND thread_id = %s"
            " AND opened_at = %s RETURNING opened_at, closes_at, count, first_seq, newest_seq,"
            " newest_message_id, mention",
            (args.user_id, args.thread_id, from_unix_micros(args.opened_at)),
        ).fetchone()
        if row is None:
            return outcome, Result.REPLACED
        window = Window(*row)
        info = facts.threads(conn, [args.thread_id]).get(args.thread_id)
        position = access.read_position(conn, args.user_id, args.thread_id)
        deleted = deletions.deleted_seqs(
            conn, args.thread_id, window.first_seq, window.newest_seq, since=window.opened_at
        )
        if only_deleted(window, position, deleted):
            outcome.skips[SkipReason.DELETED] += 1
            return outcome, SkipReason.DELETED.result
        hint = flush_hint(
            window,
            nid=new_id(),
            thread_id=args.thread_id,
            read_position=position,
            last_message_seq=info.last_message_seq if info else 0,
            deleted=deleted,
        )
        if hint is None:
            return outcome, Result.NOTHING_UNREAD
        writer = JobWriter(conn, now)
        decider = Decider(
            conn,
            now=now,
            config=self._config.current,
            presence=self._presence,
            live=self._live,
            outcome=outcome,
            writer=writer,
            mv=mv,
        )
        decider.decide_group([(hint, [args.user_id], now)], windows_on=False)
        writer.finish()
        return outcome, Result.FLUSHED if outcome.jobs else Result.SKIPPED
