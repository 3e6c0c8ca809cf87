"""A database that stalls writes to one job's row, as a busy primary or a checkpoint
can: the test's own transaction holds the row (``FOR UPDATE``) until it lets go."""

from __future__ import annotations

from typing import Any

import psycopg
import trio


class RowLock:
    """One connection of the test's own holding job rows locked until :meth:`release`
    (at the latest when its ``async with`` block ends, however the test ends)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None

    async def __aenter__(self) -> RowLock:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    async def take(self, job_id: int) -> None:
        """Lock ``job_id``'s row in ``bothy.jobs``: every write to it waits from now on."""

        def take() -> None:
            if self._conn is None:
                self._conn = psycopg.connect(self._url)
            self._conn.execute("SELECT 1 FROM bothy.jobs WHERE id = %s FOR UPDATE", (job_id,))

        await trio.to_thread.run_sync(take)

    async def take_table(self) -> None:
        """Lock ``bothy.jobs`` against writes: every claim and recording waits from now
        on (reads do not)."""

        def take() -> None:
            if self._conn is None:
                self._conn = psycopg.connect(self._url)
            self._conn.execute("LOCK TABLE bothy.jobs IN EXCLUSIVE MODE")

        await trio.to_thread.run_sync(take)

    async def release(self) -> None:
        """End the transaction and close the connection (shielded: a test calls it while
        being cancelled); again, nothing."""

        def release() -> None:
            if self._conn is not None:
                self._conn.rollback()
                self._conn.close()
                self._conn = None

        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(release)


async def a_write_waits(url: str) -> bool:
    """Whether some statement on ``url``'s database waits for a lock."""

    def ask() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
        return bool(row and row[0])

    return await trio.to_thread.run_sync(ask)
