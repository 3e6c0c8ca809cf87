"""Stage timestamps along the path of a desktop hint, for ``bench/gateway.py --stages``.

:class:`Trace` is an instrument the daemon offers a hook for
(:class:`bothy_notify.kernel.instrument.Instrument`, given as
``Daemon(instrument=...)``, in the benchmark's process): each message's hint
leaves a ``time.monotonic()`` mark at every stage it passes. Nothing of the
daemon is patched; without ``--stages`` no instrument is given and the path
pays nothing.

Stages, in path order (a stage a path does not pass is left out):

- ``append``: ``bothy.append_event`` returned (the producer process);
- ``wake``: the round's ``LISTEN`` wait returned with a notification (thread);
- ``round_start``: the round's first statement is sent (thread);
- ``commit``: the round's transaction committed (thread);
- ``round_back``: the round's result is back in the Trio thread;
- ``claim``: the job runner's claim returned the job (thread; not passed by a
  gateway hint the round claimed itself);
- ``dispatch``: the runner handed the job to its handler (Trio);
- ``check``: the job's check statement returned (thread: the round's
  connection right after its commit, or the runner's at its claim);
- ``publish``: the publisher queued the frame (Trio);
- ``written``: the frame went to the client's socket (Trio);
- ``read``: the client read it (the client process).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bothy_notify.kernel.instrument import Instrument

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


class Trace(Instrument):
    """First mark per (stage, message id)."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {s: {} for s in STAGES}
        self._woken: float | None = None
        self._started = 0.0
        self._round: list[str] = []
        self._committed: list[str] = []
        self.blocked_waits = 0
        """Times the round found committed events behind a running transaction and
        waited (``notify.round``'s blocked wait)."""
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

    # -- the daemon's hooks (bothy_notify.kernel.instrument) ------------------------------

    def round_woken(self) -> None:
        self._woken = time.monotonic()

    def round_started(self) -> None:
        self._started = time.monotonic()

    def round_read(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        ids = [str(p["message_id"]) for p in payloads if "message_id" in p]
        self._round = ids
        if self._woken is not None:
            self.mark("wake", ids, self._woken)
            self._woken = None
        self.mark("round_start", ids, self._started)

    def round_blocked(self, wait: float) -> None:
        self.blocked_waits += 1

    def round_committed(self) -> None:
        self.rounds += 1
        self.mark("commit", self._round)
        self._committed = self._round

    def jobs_checked(self, args: Sequence[Mapping[str, Any]]) -> None:
        self.mark("check", _message_ids(args))

    def round_handed_over(self) -> None:
        self.mark("round_back", self._committed)

    def jobs_claimed(self, args: Sequence[Mapping[str, Any]]) -> None:
        self.mark("claim", _message_ids(args))

    def jobs_dispatched(self, args: Sequence[Mapping[str, Any]]) -> None:
        self.mark("dispatch", _message_ids(args))

    def frame_published(self, payload: Mapping[str, Any]) -> None:
        if "message_id" in payload:
            self.mark("publish", [str(payload["message_id"])])

    def frame_written(self, text: str) -> None:
        if text.startswith('{"type":"notification.created"'):
            found = _MESSAGE_ID.search(text)
            if found:
                self.mark("written", [found.group(1)])

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


def _message_ids(args: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(a["message_id"]) for a in args if "message_id" in a]
