"""Group commit of the HTTP API's appends: concurrent requests share one statement.

A producer's ``POST /v1/events`` without an ``Idempotency-Key`` is one
statement (``bothy.append_event`` over the batch, :func:`~bothy_notify.store.
events.append_direct`), so it commits on its own (no ``BEGIN``/``COMMIT``
round trips), run on the Trio thread's own connection (:meth:`Database.query_direct
<bothy_notify.store.db.Database.query_direct>`: no worker thread). While one such
statement runs, the requests that arrive queue; when it returns, the first of
them runs the next statement for all of them: one statement and one
transaction for every request that waited, as PostgreSQL's own group commit
writes one WAL flush for many transactions. A request alone (nothing running)
goes at once, so no request waits for company.

Waking the round. ``bothy.append_event`` ends with ``NOTIFY bothy_events``,
which PostgreSQL signals to every backend of the database that listens on any
channel (the round's, the runner's, the gateway's). When the round is held in
this very process (:class:`LocalRound`), the statement leaves the ``NOTIFY``
out and the appender wakes the round itself once the statement returned, so
the round reads the committed events. Should the round move away between the
two (its connection lost, another node took it), its next holder reads the
events in its first round (catch-up), or at its poll interval: later, never
lost.

Each request keeps its own answer. The shared statement is all or nothing, so
when the database refuses one of its events (:class:`~bothy_notify.store.
events.EventRejected`: Python's validation ran first, so this is rare), no
event of the group was kept and each request's batch runs again on its own,
which gives every request its own seqs or its own refusal. Any other error
(the database unavailable) reaches every request of the group.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import trio

from bothy_notify.store import events as eventlog
from bothy_notify.store.db import Database
from bothy_notify.store.events import EventRejected

Batch = Sequence[tuple[str, Mapping[str, Any]]]


class LocalRound(Protocol):
    """The consumer round of this process, as the appender sees it."""

    def holds(self) -> bool:
        """Whether this process holds the round now and listens for its wake-ups."""
        ...

    def wake(self) -> None:
        """Run a round soon: events were committed (never blocks, any thread)."""
        ...


class _Waiting:
    """One request in the queue: its batch, then its answer."""

    __slots__ = ("batch", "done", "error", "seqs", "wake")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.seqs: list[int] | None = None
        self.error: BaseException | None = None
        self.done = False
        self.wake = trio.Event()
        """Set when the answer is there (``done``), or else when it is this one's turn
        to run the next statement."""


class GroupAppender:
    """Appends batches through ``db``, grouping those that arrive while one runs.

    Args:
        db: the API's pool.
        limit: the most events one statement carries (``server.max_batch_events``
            or more: one request's batch always fits alone).
        local_round: the round when this process may hold it (role ``all``);
            while it does, it is woken here instead of by ``NOTIFY``.
    """

    def __init__(
        self, db: Database, *, limit: int = 5000, local_round: LocalRound | None = None
    ) -> None:
        self._db = db
        self._limit = limit
        self._local_round = local_round
        self._queue: list[_Waiting] = []
        self._running = False
        self.statements = 0
        self.batches = 0
        """Statements run and request batches they carried (statistics, tests)."""

    def __repr__(self) -> str:
        return f"GroupAppender(queued={len(self._queue)})"

    async def append(self, batch: Batch) -> list[int]:
        """Append ``batch`` (all or nothing); returns its seqs in order.

        Raises what :func:`~bothy_notify.store.events.append` raises for this
        batch (:class:`EventRejected`), or the database's error. Cancelled while
        it waits, the batch leaves the queue unwritten; once its statement runs
        it is not abandoned (like :meth:`Database.run`).
        """
        me = _Waiting(batch)
        self._queue.append(me)
        try:
            if not self._running:
                await self._lead()
            while not me.done:
                await me.wake.wait()  # the answer, or the turn to run the next statement
                if not me.done:
                    await self._lead()
        finally:
            if not me.done:  # cancelled while waiting: nothing of it was written
                self._queue.remove(me)
                if me.wake.is_set():  # its turn had come: the next one's now
                    self._hand_on()
        if me.error is not None:
            raise me.error
        assert me.seqs is not None
        return me.seqs

    async def _lead(self) -> None:
        """Run one statement for the head of the queue, then hand the lead on."""
        self._running = True
        group: list[_Waiting] = []
        size = 0
        while self._queue and (not group or size + len(self._queue[0].batch) <= self._limit):
            group.append(self._queue.pop(0))
            size += len(group[-1].batch)
        try:
            with trio.CancelScope(shield=True):  # the others' batches ride on it
                await self._append_group(group)
        except Exception as exc:
            for w in group:
                if w.seqs is None and w.error is None:
                    # Each request raises its own instance (a traceback is per raise).
                    w.error = exc if w is group[0] else copy.copy(exc)
        finally:
            self.statements += 1
            self.batches += len(group)
            for w in group:
                w.done = True
                w.wake.set()
            self._hand_on()

    def _hand_on(self) -> None:
        if self._queue:
            self._queue[0].wake.set()
        else:
            self._running = False

    async def _append_group(self, group: list[_Waiting]) -> None:
        """One statement for every batch of ``group``; when the database refuses an
        event, each batch on its own. Sets each one's ``seqs`` or ``error``."""
        db, local = self._db, self._local_round
        wake = local is not None and local.holds()
        try:
            if len(group) > 1:
                try:
                    seqs = await eventlog.append_direct(
                        db, [e for w in group for e in w.batch], notify=not wake
                    )
                except EventRejected:
                    pass  # nothing was kept: each batch alone tells whose it was
                else:
                    at = 0
                    for w in group:
                        w.seqs, at = seqs[at : at + len(w.batch)], at + len(w.batch)
                    return
            for w in group:
                try:
                    w.seqs = await eventlog.append_direct(db, w.batch, notify=not wake)
                except EventRejected as exc:
                    w.error = exc
        finally:
            if wake and local is not None and any(w.seqs for w in group):
                local.wake()
