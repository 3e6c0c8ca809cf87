"""Identifies served in batches: many connections' device rows and unread snapshots in
one transaction.

Each identify reads and writes the same few rows for its own device
(:func:`gateway.queries.identify`). One at a time, a reconnect storm pays a
worker-thread hop, a pooled connection and five round trips per connection;
here a session hands its verified claims to :class:`IdentifyBatches` and
waits, and one task runs whatever has gathered meanwhile, up to
:data:`MAX_BATCH`, as one call of :func:`gateway.queries.identify_many` (four
statements), which answers what identifying them one by one would. So the
batches grow with the load and a lone identify waits for nothing.

A batch the database refuses for a reason other than being unreachable is
run again one identify at a time, so one connection's trouble never fails
another's. A session cancelled while it waits is left out of any batch not
yet started.
"""

from __future__ import annotations

from functools import partial

import trio

from bothy_notify.auth import DeviceClaims
from bothy_notify.store.db import Database, StoreError, StoreUnavailable
from gateway import queries

MAX_BATCH = 500
"""Identifies in one transaction at most."""


class _Waiter:
    __slots__ = ("claims", "done", "failed", "gone", "result")

    def __init__(self, claims: DeviceClaims) -> None:
        self.claims = claims
        self.done = trio.Event()
        self.result: queries.Identified | None = None
        self.failed: StoreError | None = None
        self.gone = False


class IdentifyBatches:
    """The gateway's identifies, in batches (see the module docstring).

    Args:
        db: the gateway's pool.
        max_batch: identifies in one transaction at most.
    """

    def __init__(self, db: Database, *, max_batch: int = MAX_BATCH) -> None:
        self._db = db
        self._max = max_batch
        self._waiting: list[_Waiter] = []
        self._wake = trio.Event()
        self.batches = 0
        """Transactions run so far (statistics, tests)."""

    def __repr__(self) -> str:
        return f"IdentifyBatches(waiting={len(self._waiting)}, batches={self.batches})"

    async def identify(self, claims: DeviceClaims) -> queries.Identified:
        """:func:`gateway.queries.identify` of ``claims``, in the next batch.

        Raises:
            StoreError: the database could not serve it.
        """
        waiter = _Waiter(claims)
        self._waiting.append(waiter)
        self._wake.set()
        try:
            await waiter.done.wait()
        except BaseException:
            waiter.gone = True
            raise
        if waiter.failed is not None:
            raise waiter.failed
        assert waiter.result is not None
        return waiter.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the identifies as they come, until cancelled."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._waiting:
                taken, self._waiting = self._waiting[: self._max], self._waiting[self._max :]
                batch = [w for w in taken if not w.gone]
                if batch:
                    await self._serve(batch)

    async def _serve(self, batch: list[_Waiter]) -> None:
        try:
            self.batches += 1
            results = await self._db.run(
                partial(queries.identify_many, claims=[w.claims for w in batch])
            )
        except StoreUnavailable:
            for w in batch:
                w.failed = StoreUnavailable("the database cannot be reached")
        except StoreError:
            if len(batch) == 1:
                batch[0].failed = StoreError("the database refused the identify")
            else:
                for w in batch:
                    await self._serve([w])
        else:
            for w, result in zip(batch, results, strict=True):
                w.result = result
        finally:
            for w in batch:
                if w.result is not None or w.failed is not None:
                    w.done.set()
