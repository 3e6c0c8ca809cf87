"""First attempts a notify request waits for, reported by this process's job runner.

The gateway answers a homeserver once the first attempts of its pushes are known
(at most ``matrix_gateway.answer_within``). A push job of the gateway runs in the
job runner like every push; :class:`AnsweringHandler` wraps the kind's handler
and tells :class:`FirstAttempts` each result the moment it is reported, before
the runner records it, so an answer never waits for a database round trip it
does not need. A result of a job nobody waits for (a retry, a job of a request
already answered) is passed on and forgotten.

A job another node's runner claims is answered from the database instead
(:func:`bothy_notify.store.matrix.first_attempts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import trio

from bothy_notify.runner import JobHandler, JobResult, Report
from bothy_notify.store.jobs import Job


class Expected:
    """The jobs one request waits for and the results reported so far."""

    def __init__(self, owner: FirstAttempts, job_ids: Iterable[int]) -> None:
        self._owner = owner
        self.job_ids = frozenset(job_ids)
        self.results: dict[int, JobResult] = {}
        self.changed = trio.Event()

    def __repr__(self) -> str:
        return f"Expected(jobs={len(self.job_ids)}, answered={len(self.results)})"

    def answered(self, job_id: int, result: JobResult) -> None:
        self.results.setdefault(job_id, result)
        self.changed.set()

    async def wait_changed(self) -> None:
        """Until a result arrives after the previous call (or none was taken yet)."""
        await self.changed.wait()
        self.changed = trio.Event()

    def close(self) -> None:
        """Stop waiting: later results are not kept."""
        self._owner.forget(self)


class FirstAttempts:
    """Who waits for which job's first result (in this process's Trio thread)."""

    def __init__(self) -> None:
        self._waiting: dict[int, Expected] = {}

    def __repr__(self) -> str:
        return f"FirstAttempts(waiting={len(self._waiting)})"

    def expect(self, job_ids: Iterable[int]) -> Expected:
        """Wait for the first results of ``job_ids`` (call :meth:`Expected.close` when done)."""
        expected = Expected(self, job_ids)
        for job_id in expected.job_ids:
            self._waiting[job_id] = expected
        return expected

    def forget(self, expected: Expected) -> None:
        for job_id in expected.job_ids:
            if self._waiting.get(job_id) is expected:
                del self._waiting[job_id]

    def reported(self, job: Job, result: JobResult) -> None:
        """The runner reports ``result`` of ``job`` (its first, or a later attempt's)."""
        expected = self._waiting.pop(job.id, None)
        if expected is not None:
            expected.answered(job.id, result)


class AnsweringHandler:
    """A job handler that tells :class:`FirstAttempts` every result of the handler it
    wraps, then reports it to the runner as usual."""

    def __init__(self, inner: JobHandler, first: FirstAttempts) -> None:
        self.kind = inner.kind
        self._inner = inner
        self._first = first

    def __repr__(self) -> str:
        return f"AnsweringHandler({self._inner!r})"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        first = self._first

        async def reporting(job: Job, result: JobResult) -> None:
            first.reported(job, result)
            await report(job, result)

        await self._inner.run_batch(jobs, reporting)
