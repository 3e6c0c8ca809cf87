"""The soak's history checker: every decided push delivered exactly once, or skipped.

Pure: it takes what the soak collected and returns its findings, so a unit test
can feed it a history. Its inputs:

- the messages the producer got appended (``accepted``: message id -> thread id;
  with an ``Idempotency-Key`` each, a retry never appends twice) and who follows
  which thread;
- the ``notify.push_send`` jobs of ``bothy.jobs`` (:class:`PushJob`);
- every node's ``push.fake.record_file``, one :class:`Send` per line, with the
  node that wrote it;
- the stops the soak made (:class:`Stop`: SIGTERM, a graceful stop, or SIGKILL);
- the skips the nodes counted (``bothy_push_skipped_total`` for the reasons a push
  job can end with, summed over every life of every node; the reason of one job is
  not kept anywhere, so skips are checked in aggregate).

What it checks:

1. every (accepted message, follower) has exactly one push job (``lost``: none;
   ``decided_twice``: more than one);
2. every push job is finished (``unfinished``: still available or running);
3. every push job is sent exactly once to its registration, or completed with
   no send: a skip, which the nodes' skip counts must account for
   (``unexplained_skips``);
4. a second send of a job is a duplicate, put down to the stop between the two
   sends: after a SIGKILL it is explained when the job was claimed again
   (``claim`` > 1: its lease ran out and another claim ran it); after a SIGTERM
   it is a failure, as is one with no stop between (``duplicates_graceful``,
   ``duplicates_unexplained``);
5. a send that matches no push job (``sent_undecided``).

``ok`` is true when nothing failed. Only the ``message`` hint pushes are checked
(a clearing push or a summary answers something else).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SAMPLES = 5
"""Examples kept per finding (job ids, never tokens)."""


@dataclass(frozen=True, slots=True)
class PushJob:
    """One ``notify.push_send`` row."""

    id: int
    message_id: str
    user_id: str
    registration_id: str
    nid: str
    state: str
    attempt: int
    claim: int


@dataclass(frozen=True, slots=True)
class Send:
    """One line of a node's fake-provider record."""

    node: str
    at: datetime
    registration_id: str
    nid: str
    kind: str


@dataclass(frozen=True, slots=True)
class Stop:
    """A node the soak stopped (and started again) at ``at``: ``SIGTERM`` or ``SIGKILL``."""

    node: str
    signal: str
    at: datetime


@dataclass
class Findings:
    """What the checker found; the counts first, then up to :data:`SAMPLES` job ids."""

    messages: int = 0
    expected_pushes: int = 0
    push_jobs: int = 0
    sent_once: int = 0
    skipped: int = 0
    skips_counted: int = 0
    lost: int = 0
    decided_twice: int = 0
    unfinished: int = 0
    unexplained_skips: int = 0
    duplicates_after_kill: int = 0
    duplicates_graceful: int = 0
    duplicates_unexplained: int = 0
    sent_undecided: int = 0
    samples: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.decided_twice
            or self.unfinished
            or self.unexplained_skips
            or self.duplicates_graceful
            or self.duplicates_unexplained
            or self.sent_undecided
        )

    def note(self, finding: str, example: Any) -> None:
        kept = self.samples.setdefault(finding, [])
        if len(kept) < SAMPLES:
            kept.append(example)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "samples"}
        return {**out, "ok": self.ok, "samples": self.samples}


def check(
    *,
    accepted: Mapping[str, str],
    followers: Mapping[str, Sequence[str]],
    jobs: Iterable[PushJob],
    sends: Iterable[Send],
    stops: Sequence[Stop],
    skips_counted: int,
) -> Findings:
    """The findings for one soak's history (see the module docstring).

    Args:
        accepted: message id -> thread id, for every append the producer got a 2xx for.
        followers: thread id -> the people who follow it (each with one phone).
        jobs: the ``notify.push_send`` jobs.
        sends: every node's fake-provider sends.
        stops: the soak's stops, in time order.
        skips_counted: pushes the nodes counted as skipped, all lives summed.
    """
    found = Findings(messages=len(accepted), skips_counted=skips_counted)
    by_pair: dict[tuple[str, str], list[PushJob]] = defaultdict(list)
    by_target: dict[tuple[str, str], PushJob] = {}
    for job in jobs:
        found.push_jobs += 1
        by_pair[(job.message_id, job.user_id)].append(job)
        by_target[(job.nid, job.registration_id)] = job
        if job.state not in ("completed", "failed"):
            found.unfinished += 1
            found.note("unfinished", job.id)

    for message_id, thread_id in accepted.items():
        for user_id in followers.get(thread_id, ()):
            found.expected_pushes += 1
            decided = by_pair.get((message_id, user_id), [])
            if not decided:
                found.lost += 1
                found.note("lost", message_id)
            elif len(decided) > 1:
                found.decided_twice += 1
                found.note("decided_twice", [job.id for job in decided])

    sent: dict[tuple[str, str], list[Send]] = defaultdict(list)
    for send in sends:
        if send.kind != "message":
            continue
        key = (send.nid, send.registration_id)
        if key not in by_target:
            found.sent_undecided += 1
            found.note("sent_undecided", send.nid)
            continue
        sent[key].append(send)

    for key, job in by_target.items():
        copies = sorted(sent.get(key, []), key=lambda s: s.at)
        if not copies:
            if job.state == "completed":
                found.skipped += 1
            continue
        found.sent_once += 1
        for earlier, later in itertools.pairwise(copies):
            cause = _stop_between(stops, earlier, later)
            if cause is not None and cause.signal == "SIGKILL" and job.claim > 1:
                found.duplicates_after_kill += 1
                found.note("duplicates_after_kill", job.id)
            elif cause is not None and cause.signal == "SIGTERM":
                found.duplicates_graceful += 1
                found.note("duplicates_graceful", job.id)
            else:
                found.duplicates_unexplained += 1
                found.note("duplicates_unexplained", job.id)

    if found.skipped > skips_counted:
        found.unexplained_skips = found.skipped - skips_counted
    return found


def _stop_between(stops: Sequence[Stop], earlier: Send, later: Send) -> Stop | None:
    """The stop of the node that sent ``earlier`` that came between the two sends, a
    SIGKILL first (a kill's duplicate is the expected kind)."""
    between = [
        stop for stop in stops if stop.node == earlier.node and earlier.at <= stop.at <= later.at
    ]
    if not between:
        return None
    kills = [stop for stop in between if stop.signal == "SIGKILL"]
    return (kills or between)[0]


def followers_of(people: int, threads: int) -> dict[str, list[str]]:
    """The soak's world: person ``u{i}`` follows thread ``t{i % threads}``."""
    out: dict[str, list[str]] = defaultdict(list)
    for i in range(people):
        out[f"t{i % threads}"].append(f"u{i}")
    return dict(out)
