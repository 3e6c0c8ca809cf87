"""Supervision: a long-running service that fails is restarted, never the daemon.

:class:`Supervised` wraps one service (an ``async def run(*, task_status)``)
and runs it in a nursery of its own. When the service raises, the failure is
logged by type (never its message, which may quote a value), counted in
``bothy_service_restarts_total{service}``, and the service is started again
after an exponential backoff (:data:`FIRST_DELAY` doubling up to
:data:`MAX_DELAY`; a service that then stays up for :data:`MAX_DELAY` starts
from the first delay again on its next failure: :mod:`bothy_notify.kernel.backoff`).
:attr:`Supervised.up` is false from the failure until the restart has started,
which is what ``/readyz`` reports.

Only cancellation ends a supervised service from outside; a service that
returns on its own (for example the job runner after a graceful stop) ends
its supervisor too. A lost database is a failure like any other here: the
services retry their own connections, and if one gives up by raising, this
restarts it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from pathlib import PurePath
from typing import Any

import trio

from bothy_notify.kernel.backoff import RESTART_FIRST, RESTART_MAX, restart_backoff
from bothy_notify.kernel.metrics import Metrics

log = logging.getLogger("bothy.supervise")

FIRST_DELAY = RESTART_FIRST
"""Seconds before the first restart (:data:`~bothy_notify.kernel.backoff.RESTART_FIRST`)."""
MAX_DELAY = RESTART_MAX
"""Longest wait between restarts, and how long a service must stay up for its backoff
to start again from :data:`FIRST_DELAY` (:data:`~bothy_notify.kernel.backoff.RESTART_MAX`)."""

Service = Callable[..., Awaitable[Any]]
"""``async def run(*, task_status)`` of a long-running service."""


def error_type(exc: BaseException) -> str:
    """The type name of the first leaf of ``exc`` (exception groups unwrapped), and of
    its cause when it has one: ``StoreError(UndefinedTable)``. Never a message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    name = type(exc).__name__
    cause = exc.__cause__
    return f"{name}({type(cause).__name__})" if cause is not None else name


_OUR_PACKAGES = ("bothy_notify", "gateway")


def error_where(exc: BaseException) -> str:
    """Where ``exc`` arose in this project's code, as ``package/module.py:line in function``.

    The root cause's innermost frame in ``bothy_notify`` or ``gateway`` (a
    database error points at the statement's caller, not at psycopg), else its
    innermost frame; ``""`` without a traceback. Only code locations: no value.
    """
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    frames = traceback.extract_tb(root.__traceback__) or traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    ours = [f for f in frames if any(p in PurePath(f.filename).parts for p in _OUR_PACKAGES)]
    frame = (ours or frames)[-1]
    parts = PurePath(frame.filename).parts
    for package in _OUR_PACKAGES:
        if package in parts:
            parts = parts[len(parts) - 1 - parts[::-1].index(package) :]
            break
    else:
        parts = parts[-1:]
    return f"{'/'.join(parts)}:{frame.lineno} in {frame.name}"


class Supervised:
    """Runs ``service`` and restarts it with backoff whenever it fails.

    Args:
        name: the service's name in logs, metrics and ``/readyz`` (a constant).
        service: its ``run(*, task_status)``.
        metrics: the registry (``bothy_service_restarts_total{service}``).
        first_delay, max_delay: the backoff (tests shorten it).
    """

    def __init__(
        self,
        name: str,
        service: Service,
        *,
        metrics: Metrics | None = None,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self.name = name
        self._service = service
        self._metrics = metrics
        self.backoff = restart_backoff(first_delay, max_delay)
        self.up = False
        self.restarts = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"Supervised({self.name!r}, up={self.up}, restarts={self.restarts})"

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the service until cancelled (or until it returns on its own).

        ``task_status.started`` gets what the service's first successful start gave;
        a service that fails before its first start is retried like any other
        failure, and ``started`` waits for it. Cancellation cancels the service.
        """
        retries = self.backoff.retries()
        first = True
        while True:
            began = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    value = await nursery.start(self._service)
                    self.up = True
                    if first:
                        first = False
                        task_status.started(value)
            except Exception as exc:  # an ExceptionGroup too; Cancelled is not an Exception
                self.up = False
                self.restarts += 1
                self.last_error = error_type(exc)
                delay = retries.failed(up_for=trio.current_time() - began)
                log.error(
                    "service failed; restarting it",
                    extra={
                        "service": self.name,
                        "error_type": self.last_error,
                        "restart_in_seconds": delay,
                    },
                )
                if self._metrics is not None:
                    self._metrics.service_restarts.labels(self.name).inc()
                await trio.sleep(delay)
                continue
            finally:
                self.up = False
            return
