"""Stage timestamps along the path of a desktop hint, for ``bench/gateway.py --stages``.

Benchmark instrumentation only: :func:`install` wraps a few functions of the
daemon (in this process, before the daemon starts) so that each message's
hint leaves a ``time.monotonic()`` mark at every stage it passes. The marks
cost a few microseconds each and are off unless ``--stages`` is given.

Stages, in path order (a stage a path does not pass is left out):

- ``append``: ``bothy.append_event`` returned (the producer process);
- ``wake``: the round's ``LISTEN`` wait returned with a notification (thread);
- ``round_start``: the round's first statement is sent (thread);
- ``commit``: the round's transaction committed (thread);
- ``round_back``: the round's result is back in the Trio thread;
- ``claim``: the job runner's claim returned the job (thread; not passed by a
  gateway hint the round claimed itself);
- ``dispatch``: the runner handed the job to its handler (Trio);
- ``check``: the job's check statement returned (thread: the runner's pool, or
  the round's connection right after its commit);
- ``publish``: the publisher queued the frame (Trio);
- ``written``: the frame was written to the client's socket (Trio);
- ``read``: the client read it (the client process).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

STAGES = (
    "append",
    "wake",
    "round_start",
    "commit",
    "round_back",
    "claim",
    "dispatch",
    "check",
    "publish",
    "written",
    "read",
)

_MESSAGE_ID = re.compile(r'"message_id":"([^"]+)"')


class Trace:
    """First mark per (stage, message id)."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {s: {} for s in STAGES}
        self._wake: float | None = None
        self._round: list[str] = []
        self._committed: list[str] = []
        self.blocked_waits = 0
        """Times the round found committed events behind a running transaction and
        slept (``notify.round``'s blocked wait)."""
        self.rounds = 0

    def reset(self) -> None:
        """Forget the marks (a new phase)."""
        self.marks = {s: {} for s in STAGES}
        self.blocked_waits = self.rounds = 0

    def mark(self, stage: str, ids: list[str], at: float | None = None) -> None:
        when = time.monotonic() if at is None else at
        marks = self.marks[stage]
        for m in ids:
            marks.setdefault(m, when)

    def summary(self, appended: dict[str, float], arrivals: dict[str, float]) -> list[str]:
        """One line per stage, in the order the median message passes them: the time
        from the stage the message passed just before (p50, p99, ms) and from the
        append."""
        self.marks["append"] = dict(appended)
        self.marks["read"] = dict(arrivals)
        rows = []
        for stage in STAGES[1:]:
            step: list[float] = []
            total: list[float] = []
            for m, t in self.marks[stage].items():
                if m not in appended:
                    continue
                before = max(
                    (
                        self.marks[s][m]
                        for s in STAGES
                        if s != stage and self.marks[s].get(m, t) < t
                    ),
                    default=appended[m],
                )
                step.append((t - before) * 1000)
                total.append((t - appended[m]) * 1000)
            if step:
                rows.append((_pct(total, 0.5), stage, step, total))
        lines = [f"    rounds {self.rounds}, blocked waits {self.blocked_waits}"]
        for _, stage, step, total in sorted(rows):
            lines.append(
                f"    {stage:<12} +{_pct(step, 0.5):7.2f} ms p50  +{_pct(step, 0.99):7.2f} ms p99"
                f"   (from append: p50 {_pct(total, 0.5):7.2f}, p99 {_pct(total, 0.99):7.2f})"
                f"  n={len(step)}"
            )
        return lines


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _message_ids_of_jobs(jobs: Any) -> list[str]:
    return [str(j.args["message_id"]) for j in jobs if "message_id" in j.args]


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def install(trace: Trace) -> None:
    """Wrap the daemon's functions so that they leave marks in ``trace``. Call before
    the daemon is built (bound methods are taken when its parts are made)."""
    from bothy_notify import runner as runner_module
    from bothy_notify.notify import round as round_module
    from bothy_notify.notify.jobs import gateway_send
    from bothy_notify.store import events as eventlog
    from bothy_notify.store import jobs as queue
    from bothy_notify.store import listen as listen_module
    from gateway import publisher, transport

    def wait_notify(fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            got = fn(*args)
            # The store's listener serves the runner and the gateway too: the round's
            # waits are those of its own thread.
            if got and threading.current_thread().name == "listener round":
                trace._wake = time.monotonic()
            return got

        return wrapped

    _wrap(listen_module, "_wait_for_notifications", wait_notify)

    def lock_and_read(fn: Any) -> Any:
        def wrapped(conn: Any, limit: int) -> Any:
            started = time.monotonic()
            cursor, batch = fn(conn, limit)
            ids = [str(e.payload["message_id"]) for e in batch if "message_id" in e.payload]
            trace._round = ids
            if trace._wake is not None:
                trace.mark("wake", ids, trace._wake)
                trace._wake = None
            trace.mark("round_start", ids, started)
            return cursor, batch

        return wrapped

    _wrap(eventlog, "lock_and_read", lock_and_read)

    def round_once(fn: Any) -> Any:
        def wrapped(self: Any, conn: Any, limit: int | None = None) -> Any:
            trace._round = []
            out = fn(self, conn, limit)
            trace.rounds += 1
            trace.mark("commit", trace._round)
            trace._committed = trace._round
            return out

        return wrapped

    _wrap(round_module.ConsumerRound, "_round_once", round_once)

    def set_blocked(fn: Any) -> Any:
        def wrapped(self: Any, wait: float | None) -> None:
            if wait is not None:
                trace.blocked_waits += 1
            fn(self, wait)

        return wrapped

    _wrap(round_module.ConsumerRound, "_set_blocked", set_blocked)

    def nudge(fn: Any) -> Any:
        def wrapped(self: Any) -> None:
            trace.mark("round_back", trace._committed)
            fn(self)

        return wrapped

    _wrap(runner_module.JobRunner, "nudge", nudge)

    def hand_over(fn: Any) -> Any:
        async def wrapped(self: Any) -> None:
            trace.mark("round_back", trace._committed)
            await fn(self)

        return wrapped

    if hasattr(round_module.ConsumerRound, "_hand_over"):
        _wrap(round_module.ConsumerRound, "_hand_over", hand_over)

    def run_claimed(fn: Any) -> Any:
        def wrapped(self: Any, jobs: Any, handler: Any = None) -> bool:
            trace.mark("dispatch", _message_ids_of_jobs(jobs))
            taken: bool = fn(self, jobs, handler)
            return taken

        return wrapped

    if hasattr(runner_module.JobRunner, "run_claimed"):
        _wrap(runner_module.JobRunner, "run_claimed", run_claimed)

    def claim_and_peek(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            jobs, due = fn(*args, **kwargs)
            trace.mark("claim", _message_ids_of_jobs(jobs))
            return jobs, due

        return wrapped

    _wrap(queue, "claim_and_peek", claim_and_peek)

    def dispatch(fn: Any) -> Any:
        def wrapped(self: Any, work: Any, jobs: Any) -> None:
            trace.mark("dispatch", _message_ids_of_jobs(jobs))
            fn(self, work, jobs)

        return wrapped

    _wrap(runner_module.JobRunner, "_dispatch", dispatch)

    def check(fn: Any) -> Any:
        def wrapped(self: Any, conn: Any, parsed: Any, now: Any) -> Any:
            out = fn(self, conn, parsed, now)
            trace.mark("check", [a.message_id for a in parsed.values() if a.message_id])
            return out

        return wrapped

    _wrap(gateway_send.GatewaySendHandler, "_check", check)

    def publish(fn: Any) -> Any:
        async def wrapped(self: Any, event: Any, **kwargs: Any) -> int:
            queued: int = await fn(self, event, **kwargs)
            if "message_id" in event.payload:
                trace.mark("publish", [str(event.payload["message_id"])])
            return queued

        return wrapped

    _wrap(publisher.HubPublisher, "publish", publish)

    def send(fn: Any) -> Any:
        async def wrapped(self: Any, text: str) -> None:
            await fn(self, text)
            if text.startswith('{"type":"notification.created"'):
                found = _MESSAGE_ID.search(text)
                if found:
                    trace.mark("written", [found.group(1)])

        return wrapped

    _wrap(transport.WebSocketTransport, "send", send)
