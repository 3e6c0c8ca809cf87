"""Topic mode in PostgreSQL: recipients, subscriptions, and the dispatch statement.

Recipients (``bothy.topic_recipients``) and subscriptions
(``bothy.topic_subscriptions``) are written by the HTTP API; envelopes are
``envelope.published`` events in ``bothy.events``. The consumer round turns a
batch's envelopes into ``topics.push_send`` jobs with :func:`dispatch_page`,
one page of deliveries per call, inside the round's transaction; the job
handler reads recipients with :func:`load_recipients` and applies a terminal
answer with :func:`delete_if_unchanged`.

Nothing here knows the HTTP API or the round; values in and out are bytes,
integers and the small frozen dataclasses below.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.kernel.clock import to_unix_micros
from bothy_notify.store.db import Conn
from bothy_notify.store.migrate import load_event_schemas

TOPIC_PUSH_SEND = "topics.push_send"
"""The job kind of one content-free push to one recipient."""


@dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """How to reach a recipient. The repr shows the channel only (no token, URL or key)."""

    channel: str
    delivery: str
    environment: str | None = None
    signing_key: bytes | None = None

    def __repr__(self) -> str:
        return f"DeliveryConfig(channel={self.channel!r})"


@dataclass(frozen=True, slots=True)
class RecipientState:
    """What a mutating request answers: read from the recipient row alone."""

    topic_count: int
    channel: str
    renewed_at: datetime


@dataclass(frozen=True, slots=True)
class Recipient:
    """A recipient as a send needs it. The repr shows no id, token, URL or key."""

    recipient_id: bytes
    config: DeliveryConfig

    def __repr__(self) -> str:
        return f"Recipient(channel={self.config.channel!r})"


@dataclass(frozen=True, slots=True)
class SubscriptionAdd:
    """One topic to add or replace: its key window (pads per slot) and commit flag."""

    topic: bytes
    include_commits: bool
    hmac_epoch_base: int | None = None
    hmac_pads: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None)

    def __repr__(self) -> str:
        return f"SubscriptionAdd(include_commits={self.include_commits})"


class Refusal(enum.Enum):
    """Why a recipient mutation changed nothing (checked in this order)."""

    NOT_FOUND = "not_found"
    WRONG_SECRET = "wrong_secret"  # noqa: S105 - a refusal name
    MALFORMED = "malformed"
    TOPIC_LIMIT = "topic_limit"


@dataclass(frozen=True, slots=True)
class Registered:
    state: RecipientState
    created: bool


@dataclass(frozen=True, slots=True)
class Updated:
    state: RecipientState
    added: int
    removed: int


def _secret_matches(stored: bytes, presented_hash: bytes) -> bool:
    # Constant time: the comparison must not tell how much of a hash matched.
    return hmac.compare_digest(bytes(stored), presented_hash)


def _lock(conn: Conn, recipient_id: bytes) -> tuple[bytes, int, str] | None:
    row = conn.execute(
        "SELECT secret_hash, topic_count, channel FROM bothy.topic_recipients"
        " WHERE recipient_id = %s FOR UPDATE",
        (recipient_id,),
    ).fetchone()
    return None if row is None else (bytes(row[0]), int(row[1]), str(row[2]))


def secret_check(conn: Conn, recipient_id: bytes, secret_hash: bytes) -> Refusal | None:
    """Checks 3 and 4 without a lock: unknown (``NOT_FOUND``) or a wrong secret.

    ``None`` when the recipient exists and the secret is right. Register calls
    this before its slower checks (the webhook host's resolution) and checks
    again under a lock when it writes.
    """
    row = conn.execute(
        "SELECT secret_hash FROM bothy.topic_recipients WHERE recipient_id = %s",
        (recipient_id,),
    ).fetchone()
    if row is None:
        return Refusal.NOT_FOUND
    return None if _secret_matches(row[0], secret_hash) else Refusal.WRONG_SECRET


def register(
    conn: Conn,
    recipient_id: bytes,
    secret_hash: bytes,
    config: DeliveryConfig,
    now: datetime,
) -> Registered | Refusal:
    """Create the recipient, or replace a known one's delivery config (its
    subscriptions kept) when the secret matches; renews it either way.

    Returns ``WRONG_SECRET`` and changes nothing when the id is known with
    another secret. Call in a transaction.
    """
    for _ in range(2):
        found = _lock(conn, recipient_id)
        if found is not None:
            if not _secret_matches(found[0], secret_hash):
                return Refusal.WRONG_SECRET
            row = conn.execute(
                "UPDATE bothy.topic_recipients SET channel = %s, delivery = %s,"
                " environment = %s, signing_key = %s, renewed_at = %s"
                " WHERE recipient_id = %s RETURNING topic_count, channel, renewed_at",
                (
                    config.channel,
                    config.delivery,
                    config.environment,
                    config.signing_key,
                    now,
                    recipient_id,
                ),
            ).fetchone()
            assert row is not None
            return Registered(RecipientState(int(row[0]), row[1], row[2]), created=False)
        row = conn.execute(
            "INSERT INTO bothy.topic_recipients (recipient_id, secret_hash, channel, delivery,"
            " environment, signing_key, topic_count, created_at, renewed_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s) ON CONFLICT (recipient_id) DO NOTHING"
            " RETURNING topic_count, channel, renewed_at",
            (
                recipient_id,
                secret_hash,
                config.channel,
                config.delivery,
                config.environment,
                config.signing_key,
                now,
                now,
            ),
        ).fetchone()
        if row is not None:
            return Registered(RecipientState(int(row[0]), row[1], row[2]), created=True)
        # A concurrent register created it first: check the secret against that row.
    raise AssertionError("a recipient row appeared and vanished under a lock")


def unregister(conn: Conn, recipient_id: bytes, secret_hash: bytes) -> Refusal | int:
    """Delete the recipient and (by cascade) its subscriptions; returns how many
    subscriptions went with it. Call in a transaction."""
    found = _lock(conn, recipient_id)
    if found is None:
        return Refusal.NOT_FOUND
    if not _secret_matches(found[0], secret_hash):
        return Refusal.WRONG_SECRET
    conn.execute("DELETE FROM bothy.topic_recipients WHERE recipient_id = %s", (recipient_id,))
    return found[1]


def update_subscriptions(
    conn: Conn,
    recipient_id: bytes,
    secret_hash: bytes,
    *,
    adds: Sequence[SubscriptionAdd],
    removes: Sequence[bytes],
    malformed: bool,
    max_topics: int,
    now: datetime,
) -> Updated | Refusal:
    """Apply adds and removes in the caller's transaction, in the order of checks.

    Unknown recipient, wrong secret, then ``malformed`` (the caller's
    structural verdict, reported only once the recipient is proven), then the
    topic limit: the adds may not raise ``topic_count`` above ``max_topics``.
    A refusal changes nothing. A new topic's start position is the event log's
    settled position of this transaction (``pg_snapshot_xmin``); an existing
    topic keeps its start position and gets the new key window and flag; a
    remove of an absent topic does nothing. ``topic_count`` moves with the rows
    and the recipient is renewed.
    """
    found = _lock(conn, recipient_id)
    if found is None:
        return Refusal.NOT_FOUND
    if not _secret_matches(found[0], secret_hash):
        return Refusal.WRONG_SECRET
    if malformed:
        return Refusal.MALFORMED
    count = found[1]
    add_topics = [a.topic for a in adds]
    existing = {
        bytes(r[0])
        for r in conn.execute(
            "SELECT topic FROM bothy.topic_subscriptions"
            " WHERE recipient_id = %s AND topic = ANY(%s)",
            (recipient_id, add_topics + list(removes)),
        )
    }
    new = sum(1 for t in add_topics if t not in existing)
    gone = sum(1 for t in removes if t in existing)
    final = count + new - gone
    if new and final > max_topics:
        return Refusal.TOPIC_LIMIT
    if gone:
        conn.execute(
            "DELETE FROM bothy.topic_subscriptions WHERE recipient_id = %s AND topic = ANY(%s)",
            (recipient_id, list(removes)),
        )
    if adds:
        conn.execute(
            "INSERT INTO bothy.topic_subscriptions (recipient_id, topic, since_xid,"
            " include_commits, hmac_epoch_base, hmac_pads_0, hmac_pads_1, hmac_pads_2)"
            " SELECT %s, t, pg_snapshot_xmin(pg_current_snapshot()), c, b, p0, p1, p2"
            " FROM unnest(%s::bytea[], %s::boolean[], %s::bigint[],"
            "             %s::bytea[], %s::bytea[], %s::bytea[]) AS a(t, c, b, p0, p1, p2)"
            " ON CONFLICT (recipient_id, topic) DO UPDATE SET"
            " include_commits = EXCLUDED.include_commits,"
            " hmac_epoch_base = EXCLUDED.hmac_epoch_base, hmac_pads_0 = EXCLUDED.hmac_pads_0,"
            " hmac_pads_1 = EXCLUDED.hmac_pads_1, hmac_pads_2 = EXCLUDED.hmac_pads_2",
            (
                recipient_id,
                add_topics,
                [a.include_commits for a in adds],
                [a.hmac_epoch_base for a in adds],
                [a.hmac_pads[0] for a in adds],
                [a.hmac_pads[1] for a in adds],
                [a.hmac_pads[2] for a in adds],
            ),
        )
    row = conn.execute(
        "UPDATE bothy.topic_recipients SET topic_count = %s, renewed_at = %s"
        " WHERE recipient_id = %s RETURNING topic_count, channel, renewed_at",
        (final, now, recipient_id),
    ).fetchone()
    assert row is not None
    return Updated(RecipientState(int(row[0]), row[1], row[2]), added=new, removed=gone)


def load_recipients(conn: Conn, recipient_ids: Collection[bytes]) -> dict[bytes, Recipient]:
    """The recipients that still exist among ``recipient_ids``, by id."""
    rows = conn.execute(
        "SELECT recipient_id, channel, delivery, environment, signing_key"
        " FROM bothy.topic_recipients WHERE recipient_id = ANY(%s)",
        (list(recipient_ids),),
    ).fetchall()
    return {
        bytes(r[0]): Recipient(
            bytes(r[0]),
            DeliveryConfig(r[1], r[2], r[3], None if r[4] is None else bytes(r[4])),
        )
        for r in rows
    }


def delete_if_unchanged(conn: Conn, recipient_id: bytes, config: DeliveryConfig) -> bool:
    """Delete a recipient after a terminal answer, but only while its stored delivery
    config still equals the one the send used (a register in between keeps it)."""
    deleted = conn.execute(
        "DELETE FROM bothy.topic_recipients WHERE recipient_id = %s AND channel = %s"
        " AND delivery = %s AND environment IS NOT DISTINCT FROM %s"
        " AND signing_key IS NOT DISTINCT FROM %s",
        (recipient_id, config.channel, config.delivery, config.environment, config.signing_key),
    ).rowcount
    return deleted > 0


def sweep_expired(conn: Conn, renewed_before: datetime) -> int:
    """Delete recipients (and their subscriptions) not renewed since ``renewed_before``."""
    return conn.execute(
        "DELETE FROM bothy.topic_recipients WHERE renewed_at < %s", (renewed_before,)
    ).rowcount


def previous_errors(conn: Conn, job_ids: Collection[int]) -> dict[int, str | None]:
    """The error the previous attempt of each job recorded (``None`` on a first attempt)."""
    rows = conn.execute(
        "SELECT id, last_error FROM bothy.jobs WHERE id = ANY(%s)", (list(job_ids),)
    ).fetchall()
    return {int(r[0]): r[1] for r in rows}


# ---------------------------------------------------------------- dispatch


@dataclass(frozen=True, slots=True)
class Keyset:
    """Where a page starts: after (``seq``, ``recipient_id``) in delivery order."""

    seq: int
    recipient_id: bytes = b""


@dataclass(frozen=True, slots=True)
class Page:
    """What one page of deliveries did (nothing per delivery leaves the database).

    Attributes:
        deliveries: (envelope, subscription) pairs decided, at most the page size.
        jobs: ``topics.push_send`` jobs inserted (the deliveries not suppressed).
        suppressed: suppressed deliveries by channel.
        last: the keyset of the page's last delivery (``None`` when it had none).
    """

    deliveries: int
    jobs: int
    suppressed: dict[str, int]
    last: Keyset | None


_FORMS = {
    name: str(prop["pattern"])
    for name, prop in load_event_schemas()["envelope.published"]["properties"].items()
    if "pattern" in prop
}
"""The envelope schema's base64 forms. ``bothy.append_event`` already refuses other
payloads, but a producer may INSERT into ``bothy.events`` directly: the statement
checks again, so a malformed row is skipped (and its data never suppresses)
instead of failing the round."""

# One statement per page; the same statement for every page of a batch (keyset
# paging in (seq, recipient_id) order). Rows:
#   d        the page's deliveries: eligible envelopes of the batch joined with the
#            subscriptions of their topic, above each subscription's start position,
#            commits and proposals only where include_commits; with the key the
#            subscription holds for the envelope's epoch (its pads), if any. The
#            envelope's fields (m) sit behind OFFSET 0: without the fence the planner
#            flattens m and evaluates its regular expressions and base64 decoding
#            once per delivery instead of once per envelope (a large share of the
#            statement's CPU: bench/topics.py).
#   x        the data of the page's envelopes that need the sender check, decoded once.
#   decided  each delivery and whether it is the sender's own (HMAC over the pads).
#   ins      one job per delivery that is not suppressed.
_PAGE = """
WITH d AS (
  SELECT e.seq, e.occurred_at, m.topic, s.recipient_id, m.sender_hmac,
         CASE WHEN m.sender_hmac IS NULL OR s.hmac_epoch_base IS NULL THEN NULL
              WHEN m.epoch = s.hmac_epoch_base THEN s.hmac_pads_0
              WHEN m.epoch = s.hmac_epoch_base + 1 THEN s.hmac_pads_1
              WHEN m.epoch = s.hmac_epoch_base + 2 THEN s.hmac_pads_2 END AS pads
  FROM bothy.events e
  CROSS JOIN LATERAL (
    SELECT CASE WHEN p.topic ~ %(topic_form)s THEN decode(p.topic, 'base64') END AS topic,
           p.kind, p.should_push = 'true' AS should_push,
           CASE WHEN p.sender_hmac ~ %(hmac_form)s
                THEN decode(p.sender_hmac, 'base64') END AS sender_hmac,
           floor(extract(epoch FROM e.occurred_at) / %(epoch_seconds)s)::bigint AS epoch
    FROM jsonb_to_record(e.payload - 'data')
         AS p(topic text, kind text, should_push text, sender_hmac text)
    OFFSET 0  -- a fence: decoded once per envelope, not once per delivery
  ) m
  CROSS JOIN LATERAL (
    SELECT s.recipient_id, s.hmac_epoch_base, s.hmac_pads_0, s.hmac_pads_1, s.hmac_pads_2
    FROM bothy.topic_subscriptions s
    WHERE m.topic IS NOT NULL AND s.topic = m.topic
      AND s.recipient_id > CASE WHEN e.seq = %(seq)s THEN %(rid)s::bytea ELSE '\\x'::bytea END
      AND s.since_xid <= e.xid
      AND (m.kind IN ('welcome', 'application') OR s.include_commits)
    ORDER BY s.recipient_id
    LIMIT %(page)s
  ) s
  WHERE e.seq >= %(seq)s AND e.seq <= %(last)s AND e.seq = ANY(%(seqs)s)
    AND e.type = 'envelope.published' AND jsonb_typeof(e.payload) = 'object'
    AND m.kind IN ('welcome', 'application', 'commit', 'proposal')
    AND (m.kind <> 'application' OR m.should_push)
  ORDER BY e.seq, s.recipient_id
  LIMIT %(page)s
),
x AS MATERIALIZED (
  SELECT e.seq, CASE WHEN e.payload ->> 'data' ~ %(data_form)s
                     THEN decode(e.payload ->> 'data', 'base64') END AS data
  FROM bothy.events e
  WHERE e.seq = ANY(ARRAY(SELECT DISTINCT seq FROM d WHERE pads IS NOT NULL))
),
decided AS (
  SELECT d.seq, d.topic, d.recipient_id, d.occurred_at,
         coalesce(d.pads IS NOT NULL AND sha256(substr(d.pads, 65, 64)
                  || sha256(substr(d.pads, 1, 64) || x.data)) = d.sender_hmac,
                  false) AS suppressed
  FROM d LEFT JOIN x USING (seq)
),
ins AS (
  INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)
  SELECT %(kind)s,
         jsonb_build_object('seq', seq, 'recipient_id', encode(recipient_id, 'hex'),
                            'topic', encode(topic, 'hex'),
                            'appended_at',
                            floor(extract(epoch FROM occurred_at) * 1000000)::bigint,
                            'due_at', %(now_micros)s::bigint),
         %(now)s, %(max_attempts)s, %(now)s
  FROM decided WHERE NOT suppressed
  RETURNING 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM ins), l.seq, l.recipient_id,
       (SELECT coalesce(jsonb_object_agg(c.channel, c.n), '{}'::jsonb) FROM (
          SELECT r.channel, count(*) AS n FROM decided
          JOIN bothy.topic_recipients r USING (recipient_id)
          WHERE decided.suppressed GROUP BY r.channel) c)
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
  SELECT seq, recipient_id FROM d ORDER BY seq DESC, recipient_id DESC LIMIT 1
) l ON true
"""


def dispatch_page(
    conn: Conn,
    envelope_seqs: Sequence[int],
    after: Keyset,
    *,
    page_size: int,
    epoch_seconds: int,
    now: datetime,
    max_attempts: int,
) -> Page:
    """Decide one page of deliveries of ``envelope_seqs`` (sorted) after ``after``
    and insert their jobs, in the caller's transaction.

    Only the counts and the page's last keyset come back: an envelope with no
    subscriber, its data, and every suppressed delivery stay in the database.
    A page shorter than ``page_size`` is the last one.
    """
    params: dict[str, Any] = {
        "seqs": list(envelope_seqs),
        "seq": after.seq,
        "rid": after.recipient_id,
        "last": envelope_seqs[-1],
        "page": page_size,
        "epoch_seconds": epoch_seconds,
        "topic_form": _FORMS["topic"],
        "hmac_form": _FORMS["sender_hmac"],
        "data_form": _FORMS["data"],
        "kind": TOPIC_PUSH_SEND,
        "now": now,
        "now_micros": to_unix_micros(now),
        "max_attempts": max_attempts,
    }
    row = conn.execute(_PAGE, params).fetchone()
    assert row is not None
    deliveries, jobs, last_seq, last_rid, suppressed = row
    last = None if last_seq is None else Keyset(int(last_seq), bytes(last_rid))
    return Page(int(deliveries), int(jobs), {str(k): int(v) for k, v in suppressed.items()}, last)
