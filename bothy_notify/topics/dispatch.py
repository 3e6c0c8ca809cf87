"""Topic mode in the consumer round: a batch's envelopes become push jobs.

:class:`~bothy_notify.notify.planner.RoundPlanner` hands the seqs of the
batch's ``envelope.published`` events to :func:`dispatch`, inside the round's
transaction, so the jobs commit together with the cursor (and a crash before
the commit leaves nothing: the next holder dispatches the same envelopes
again).

One statement (:func:`bothy_notify.store.topics.dispatch_page`) joins the
envelopes with the subscriptions of their topic and runs in keyset pages of
:data:`PAGE_SIZE` deliveries in (seq, recipient) order, so a topic with any
number of subscribers is decided in bounded memory, on both sides. It applies,
in SQL:

- push eligibility (a welcome always, an application message only with
  ``should_push``, a commit or proposal always) and ``include_commits``
  (commits and proposals reach only subscriptions that opted in);
- start positions: an envelope whose transaction id is below the
  subscription's ``since_xid`` (settled before the subscription was stored) is
  never pushed to it, however late the round gets to it;
- sender suppression: when the subscription's key window covers the envelope's
  epoch (append time / 30 days) and HMAC-SHA256(key, data) equals
  ``sender_hmac``, no job; every other case sends (fail open);
- one ``topics.push_send`` job per remaining (envelope, subscription): no
  coalescing in this mode.

An envelope with no subscriber never leaves the database (its payload is not
even read into the round), and neither does any envelope's data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store import topics as store
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import JOBS_CHANNEL
from bothy_notify.topics.model import EPOCH_SECONDS

ENVELOPE_PUBLISHED = "envelope.published"
"""The event type of an envelope (schemas/events/envelope.published.json)."""

PAGE_SIZE = 1000
"""Deliveries decided per statement: bounds what one page holds, in PostgreSQL and here."""


@dataclass
class TopicsOutcome:
    """What the round's dispatch did, for metrics after the commit."""

    envelopes: int = 0
    deliveries: int = 0
    jobs: int = 0
    pages: int = 0
    largest_page: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)

    def record(self, metrics: Metrics) -> None:
        """Count the suppressed deliveries (sent ones count when their send answers)."""
        for channel, n in self.suppressed.items():
            metrics.topic_deliveries.labels(channel, "suppressed").inc(n)


def dispatch(
    conn: Conn,
    envelope_seqs: Sequence[int],
    *,
    now: datetime,
    max_attempts: int,
    outcome: TopicsOutcome,
    page_size: int = PAGE_SIZE,
) -> int:
    """Insert the push jobs of ``envelope_seqs`` in the caller's transaction.

    Returns the number of jobs inserted (and wakes job runners at commit when
    there are any). Blocking; runs in the round's worker thread.
    """
    if not envelope_seqs:
        return 0
    seqs = sorted(envelope_seqs)
    outcome.envelopes += len(seqs)
    after = store.Keyset(seqs[0])
    jobs = 0
    while True:
        page = store.dispatch_page(
            conn,
            seqs,
            after,
            page_size=page_size,
            epoch_seconds=EPOCH_SECONDS,
            now=now,
            max_attempts=max_attempts,
        )
        outcome.pages += 1
        outcome.deliveries += page.deliveries
        outcome.largest_page = max(outcome.largest_page, page.deliveries)
        outcome.suppressed.update(page.suppressed)
        jobs += page.jobs
        if page.deliveries < page_size or page.last is None:
            break
        after = page.last
    outcome.jobs += jobs
    if jobs:
        conn.execute(f"NOTIFY {JOBS_CHANNEL}")
    return jobs
