"""A job runner process for the crash test: it claims ``test.block`` jobs, says so on
stdout, and then blocks until it is killed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import timedelta

import trio

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.runner import JobRunner, Report
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import Job


class Blocker:
    kind = "test.block"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            print(f"started {job.id}", flush=True)
        await trio.sleep_forever()


async def main(url: str) -> None:
    db = Database(url, pool_size=2)
    await db.open()
    runner = JobRunner(
        db=db,
        database_url=url,
        clock=SystemClock(),
        handlers=[Blocker()],
        config=JobsConfig(lease=timedelta(seconds=60)),
        poll_interval=timedelta(milliseconds=50),
        metrics=Metrics(),
    )
    await runner.run()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
