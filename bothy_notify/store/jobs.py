"""The job queue on PostgreSQL.

A job is ``(kind, args, scheduled_at)`` plus bookkeeping. Runners claim due
jobs in batches with ``FOR UPDATE SKIP LOCKED`` and hold a lease; a job whose
lease ran out (its runner crashed) becomes available again. Jobs with a
``unique_key`` are inserted at most once. Every time comes from the injected
clock, never from the database's ``now()``, so tests move time by hand.

States: ``available`` -> ``running`` -> ``completed`` | ``failed``, or back to
``available`` for a retry (or after a lost lease).

Fencing: every claim takes the job's next ``claim`` number (it never goes
down, unlike ``attempt``, which a deferral gives back), and every write about a
claimed job (complete, fail, retry, defer, renew, release) matches
``(id, claim)`` with state ``running``. A runner whose lease ran out, after
another runner claimed the job again, matches nothing: each of these functions
returns the fences that held, so the caller applies effects for those only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from psycopg import Copy

from bothy_notify.kernel.values import fast_init
from bothy_notify.store.db import Conn, Database

JobArgs = Mapping[str, int | str]
JOBS_CHANNEL = "bothy_jobs"
"""``NOTIFY`` channel that wakes runners when jobs were inserted."""


@fast_init
@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to insert.

    Attributes:
        kind: the handler, e.g. ``notify.push_send``.
        args: IDs and integers only (never text).
        scheduled_at: not run before this time.
        max_attempts: attempts before the job fails.
        unique_key: when set, a second job with the same key is not inserted.
        node_id: when set, only that node runs the job (``cluster.mode =
            "multi"``: a gateway hint goes to the node holding the connections).
    """

    kind: str
    args: JobArgs
    scheduled_at: datetime
    max_attempts: int
    unique_key: str | None = None
    node_id: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job.

    ``claim`` is this run's claim number: results carry it (``fence``) so they
    apply only while this claim still holds the job.
    """

    id: int
    kind: str
    args: Mapping[str, int | str]
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    created_at: datetime
    claim: int = 0

    @property
    def fence(self) -> Fence:
        """``(id, claim)``: what every write about this run of the job must match."""
        return (self.id, self.claim)

    def __repr__(self) -> str:
        # args hold IDs; keep them out of reprs that may reach logs.
        return f"Job(id={self.id}, kind={self.kind!r}, attempt={self.attempt})"


Fence = tuple[int, int]
"""``(job id, claim number)`` of one claimed run of a job."""


_COPY_CHUNK_ROWS = 256
"""Rows sent to COPY at once: large enough to amortise a round trip, small enough to
keep the database busy while the caller decides."""

_COPY_CHUNK_PARTS = 4 * _COPY_CHUNK_ROWS

RowShape = tuple[bytes, bytes]
"""A binary ``COPY`` row of the jobs table but its args: the fields before them (the
field count and ``kind``) and the fields after them (``scheduled_at``,
``max_attempts``, ``created_at``)."""

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
"""The binary ``COPY`` header: signature, flags, no header extension."""
_TRAILER = struct.pack("!h", -1)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_JSONB_VERSION = b"\x01"
"""jsonb's binary form: a version byte, then the JSON text."""
_jsonb_head = struct.Struct("!ic").pack
"""A jsonb field's length and version byte, before its JSON text."""


def _timestamptz(when: datetime) -> bytes:
    """``when`` as a binary ``timestamptz`` field (length, then microseconds since
    2000-01-01 UTC); ``when`` must be aware."""
    return struct.pack("!iq", 8, (when - _PG_EPOCH) // _MICROSECOND)


class JobWriter:
    """Inserts jobs in the caller's transaction, as fast as the database takes them.

    Jobs without a unique key go in with ``COPY``. Inside :meth:`stream`, once
    enough jobs have gathered, a ``COPY`` opens and jobs are sent in chunks as
    they are added, so the database ingests on its own core while the caller
    is still deciding; small amounts wait for :meth:`finish` and go in one
    ``COPY`` there. Jobs with a unique key are inserted at :meth:`finish` with
    ``ON CONFLICT DO NOTHING``. No other statement may run on the connection
    inside a stream.

    Args are JSON objects of IDs and integers, encoded with orjson. ``COPY`` runs
    in its binary format: the server then parses no times or integers, only the
    args' JSON (less of its CPU per row than the text format: ``bench/decide.py``).

    :meth:`claim_here` makes the writer insert some keyed jobs already claimed
    by this node (see :class:`ClaimHere`); after :meth:`finish` they are in
    :attr:`claimed`, and the caller runs them itself once the transaction has
    committed.
    """

    _COPY = (
        "COPY bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)"
        " FROM STDIN (FORMAT BINARY)"
    )

    def __init__(self, conn: Conn, now: datetime) -> None:
        self._conn = conn
        self._now_field = _timestamptz(now)
        self._now = now
        self._shapes: dict[tuple[str, datetime, int], RowShape] = {}
        self._lines: list[bytes] = []
        """Four parts per row: the fields before the args, the args' length and version,
        the args, the fields after."""
        self._keyed: list[JobSpec] = []
        self._streaming = False
        self._open: ExitStack | None = None
        self._copy: Copy | None = None
        self._claim: ClaimHere | None = None
        self.added = 0
        self.claimed: list[Job] = []
        """The jobs :meth:`finish` inserted already claimed (:meth:`claim_here`)."""
        self.inserted: dict[str, int] = {}
        """The id of each job with a unique key that :meth:`finish` inserted, by its key
        (a key already taken is absent)."""

    def __repr__(self) -> str:
        return f"JobWriter(added={self.added}, claimed={len(self.claimed)})"

    def claim_here(self, claim: ClaimHere | None) -> None:
        """Insert the keyed jobs that ``claim`` selects already claimed by this node.

        Call before adding jobs. ``None`` (the default) claims nothing.
        """
        self._claim = claim

    @contextmanager
    def stream(self) -> Iterator[None]:
        """While open, full chunks of jobs are sent to ``COPY`` as they are added."""
        self._streaming = True
        try:
            yield
        except BaseException as exc:
            if self._open is not None:
                self._open.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            self._close_copy()
        finally:
            self._streaming = False
            self._open = self._copy = None

    def add(self, spec: JobSpec) -> None:
        if spec.unique_key is not None or spec.node_id is not None:
            self.added += 1
            self._keyed.append(spec)
            return
        # (A job without a key goes through COPY, which returns no ids: never claimed here.)
        shape = self.row_shape(spec.kind, spec.scheduled_at, spec.max_attempts)
        self.add_json(shape, orjson.dumps(spec.args))

    def row_shape(self, kind: str, scheduled_at: datetime, max_attempts: int) -> RowShape:
        """What the ``COPY`` rows of jobs of ``kind`` due at ``scheduled_at`` share (for
        :meth:`add_json`)."""
        key = (kind, scheduled_at, max_attempts)
        shape = self._shapes.get(key)
        if shape is None:
            name = kind.encode()
            shape = self._shapes[key] = (
                struct.pack("!hi", 5, len(name)) + name,
                _timestamptz(scheduled_at) + struct.pack("!ii", 4, max_attempts) + self._now_field,
            )
        return shape

    def add_json(self, shape: RowShape, args: bytes) -> None:
        """Add a job without a unique key or node whose ``args`` are already encoded: a
        JSON object of IDs and integers, as ``orjson.dumps`` writes it (the round's
        immediate pushes, encoded once per hint: ``notify.routes.HintJobs``)."""
        self.added += 1
        lines = self._lines
        lines += (shape[0], _jsonb_head(len(args) + 1, _JSONB_VERSION), args, shape[1])
        if self._streaming and len(lines) >= _COPY_CHUNK_PARTS:
            self._send_lines()

    def extend(self, specs: Iterable[JobSpec]) -> None:
        for spec in specs:
            self.add(spec)

    def _send_lines(self) -> None:
        if self._copy is None:
            stack = ExitStack()
            cursor = stack.enter_context(self._conn.cursor())
            self._copy = stack.enter_context(cursor.copy(self._COPY))
            self._open = stack
            self._lines.insert(0, _SIGNATURE)
        self._copy.write(b"".join(self._lines))
        self._lines.clear()

    def _close_copy(self) -> None:
        if self._open is not None:
            self._lines.append(_TRAILER)
            self._send_lines()
            stack, self._open, self._copy = self._open, None, None
            stack.close()

    def flush_copy(self) -> None:
        """Send every buffered job without a unique key through ``COPY`` now."""
        if self._lines:
            self._send_lines()
            self._close_copy()

    def finish(self) -> int:
        """Insert what is still buffered and the keyed jobs; wake runners at commit.

        Returns how many jobs are new (keyed duplicates are not). Jobs selected
        by :meth:`claim_here` are inserted ``running`` (attempt 1, the next claim
        number, a lease) and listed in :attr:`claimed`; runners are woken only
        for the others.
        """
        self.flush_copy()
        inserted = self.added - len(self._keyed)
        to_claim = 0
        if self._keyed:
            keyed, self._keyed = self._keyed, []
            claim = self._claim
            here = [False] * len(keyed)
            if claim is not None:
                room = claim.room
                for i, spec in enumerate(keyed):
                    if room <= 0:
                        break
                    if claim.selects(spec, self._now):
                        here[i] = True
                        room -= 1
                to_claim = sum(here)
            lease_until = self._now + claim.lease if claim is not None else None
            # One JSON parameter for all rows: orjson encodes it in C, where nine
            # arrays would be dumped element by element in Python.
            rows = orjson.dumps(
                [
                    (s.kind, s.args, s.scheduled_at, s.max_attempts, s.unique_key, s.node_id, h)
                    for s, h in zip(keyed, here, strict=True)
                ]
            )
            row = self._conn.execute(
                "WITH ins AS (INSERT INTO bothy.jobs"
                " (kind, args, scheduled_at, max_attempts, created_at, unique_key, node_id,"
                "  state, attempt, claim, lease_until)"
                " SELECT r->>0, r->1, (r->>2)::timestamptz, (r->>3)::int, %s, r->>4,"
                "  (r->>5)::uuid, CASE WHEN (r->>6)::bool THEN 'running' ELSE 'available' END,"
                "  CASE WHEN (r->>6)::bool THEN 1 ELSE 0 END,"
                "  CASE WHEN (r->>6)::bool THEN 1 ELSE 0 END,"
                "  CASE WHEN (r->>6)::bool THEN %s::timestamptz END"
                " FROM jsonb_array_elements(%s::text::jsonb) AS r"
                " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
                " RETURNING id, unique_key, state)"
                " SELECT count(*), array_agg(id) FILTER (WHERE state = 'running'),"
                "  array_agg(unique_key) FILTER (WHERE state = 'running'),"
                "  array_agg(id), array_agg(unique_key) FROM ins",
                (self._now, lease_until, rows.decode()),
            ).fetchone()
            inserted += int(row[0]) if row else 0
            if row and row[3]:
                self.inserted.update(zip(row[4], (int(i) for i in row[3]), strict=True))
            if row and row[1]:
                specs = {s.unique_key: s for s, h in zip(keyed, here, strict=True) if h}
                for job_id, key in zip(row[1], row[2], strict=True):
                    spec = specs[key]
                    self.claimed.append(
                        Job(
                            id=int(job_id),
                            kind=spec.kind,
                            args=spec.args,
                            attempt=1,
                            max_attempts=spec.max_attempts,
                            scheduled_at=spec.scheduled_at,
                            created_at=self._now,
                            claim=1,
                        )
                    )
                self.claimed.sort(key=lambda j: j.id)
        if self.added > to_claim:
            self._conn.execute(f"NOTIFY {JOBS_CHANNEL}")
        return inserted


@dataclass(frozen=True, slots=True)
class ClaimHere:
    """Which jobs a :class:`JobWriter` inserts already claimed by this node.

    A job is claimed at its insert when its kind is one of ``kinds``, it has a
    unique key, it is due (``scheduled_at`` at or before the writer's now) and
    it is for no particular node or for ``node_id``; at most ``room`` of them
    (the room this node's runner has). The lease is ``lease`` from the writer's
    now, as a claim by the runner would give; if the node dies before it runs
    them, the lease runs out and the housekeeper makes them available again.

    Attributes:
        kinds: the job kinds this node runs at once after the commit.
        node_id: this node's id in a cluster, ``None`` on a single node.
        lease: ``jobs.lease``.
        room: the most jobs to claim.
    """

    kinds: frozenset[str]
    node_id: str | None
    lease: timedelta
    room: int

    def selects(self, spec: JobSpec, now: datetime) -> bool:
        return (
            spec.kind in self.kinds
            and spec.unique_key is not None
            and spec.scheduled_at <= now
            and (spec.node_id is None or spec.node_id == self.node_id)
        )


def insert(conn: Conn, specs: Sequence[JobSpec], now: datetime) -> int:
    """Insert ``specs`` in the caller's transaction; return how many rows were new."""
    writer = JobWriter(conn, now)
    writer.extend(specs)
    return writer.finish()


_FOR_NODE = " AND (node_id IS NULL OR node_id = %s)"
"""The claim filter of a node of a cluster: jobs for any node, and its own."""


def claim(
    conn: Conn,
    now: datetime,
    limit: int,
    lease: timedelta,
    kinds: Sequence[str],
    node_id: str | None = None,
) -> list[Job]:
    """Claim up to ``limit`` due jobs of ``kinds``: state running, attempt + 1, the next
    claim number, a lease.

    With ``node_id`` (``cluster.mode = "multi"``) jobs targeted at other nodes
    are left alone; without it (a single node) every job is this node's.
    """
    mine = _FOR_NODE if node_id is not None else ""
    params: tuple[object, ...] = (now + lease, now, list(kinds))
    if node_id is not None:
        params += (node_id,)
    rows = conn.execute(
        "UPDATE bothy.jobs j SET state = 'running', attempt = j.attempt + 1,"
        " claim = j.claim + 1, lease_until = %s"
        # The claimed ids as an array, so each job is updated through its key: joined
        # to them as a table, the planner hashed a few hundred ids against a scan of
        # the whole table (finished jobs included) once it planned the statement for
        # its generic parameters (docs/performance.md, "decide at scale").
        " WHERE j.id = ANY(ARRAY(SELECT id FROM bothy.jobs"
        "  WHERE state = 'available' AND scheduled_at <= %s"
        f"  AND kind = ANY(%s){mine} ORDER BY scheduled_at, id LIMIT %s"
        "  FOR UPDATE SKIP LOCKED))"
        # The args as text, decoded by orjson in C (psycopg's jsonb loader is the json
        # module's Python decoder: it showed in bench/push.py's profile).
        " RETURNING j.id, j.kind, j.args::text, j.attempt, j.max_attempts, j.scheduled_at,"
        " j.created_at, j.claim",
        (*params, limit),
    ).fetchall()
    loads = orjson.loads
    jobs = [Job(r[0], r[1], loads(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]
    jobs.sort(key=lambda j: (j.scheduled_at, j.id))
    return jobs


def claim_and_peek(
    conn: Conn,
    now: datetime,
    limit: int,
    lease: timedelta,
    kinds: Sequence[str],
    node_id: str | None = None,
) -> tuple[list[Job], datetime | None]:
    """:func:`claim`, and when it found fewer than ``limit`` jobs, :func:`next_due` too
    (one worker-thread hop instead of two)."""
    jobs = claim(conn, now=now, limit=limit, lease=lease, kinds=kinds, node_id=node_id)
    return jobs, next_due(conn, kinds, node_id) if len(jobs) < limit else None


def next_due(conn: Conn, kinds: Sequence[str], node_id: str | None = None) -> datetime | None:
    """When the next available job of ``kinds`` this node may claim is scheduled, if any."""
    mine = _FOR_NODE if node_id is not None else ""
    params: tuple[object, ...] = (list(kinds),)
    if node_id is not None:
        params += (node_id,)
    row = conn.execute(
        "SELECT min(scheduled_at) FROM bothy.jobs WHERE state = 'available'"
        f" AND kind = ANY(%s){mine}",
        params,
    ).fetchone()
    return row[0] if row else None


_FENCED = "j.id = f.i AND j.claim = f.c AND j.state = 'running'"
"""The fence of every write about a claimed job (``f`` is the unnested input)."""


def _held(rows: list[tuple[Any, ...]]) -> set[Fence]:
    return {(int(r[0]), int(r[1])) for r in rows}


_COMPLETE = (
    "UPDATE bothy.jobs j SET state = 'completed', finished_at = {now}, lease_until = NULL"
    " FROM unnest({ids}::bigint[], {claims}::bigint[]) AS f(i, c)"
    f" WHERE {_FENCED} RETURNING j.id, j.claim"
)


def complete(conn: Conn, fences: Iterable[Fence], now: datetime) -> set[Fence]:
    """Mark claimed jobs completed; return the fences that held."""
    fences = list(fences)
    if not fences:
        return set()
    return _held(
        conn.execute(
            _COMPLETE.format(now="%s", ids="%s", claims="%s"),
            (now, [f[0] for f in fences], [f[1] for f in fences]),
        ).fetchall()
    )


async def complete_direct(db: Database, fences: Sequence[Fence], now: datetime) -> set[Fence]:
    """:func:`complete` as a statement of its own on the Trio thread's connection
    (:meth:`Database.query_direct`: no worker thread)."""
    if not fences:
        return set()
    rows = await db.query_direct(
        b"bothy_complete_jobs",
        _COMPLETE.format(now="$1::timestamptz", ids="$2", claims="$3").encode(),
        [
            now.isoformat().encode(),
            ("{" + ",".join(str(f[0]) for f in fences) + "}").encode(),
            ("{" + ",".join(str(f[1]) for f in fences) + "}").encode(),
        ],
    )
    return _held([(r[0], r[1]) for r in rows])


def finished_at(conn: Conn, fences: Sequence[Fence], at: datetime) -> set[Fence]:
    """Of ``fences``, the jobs that this claim finished (completed or failed) at
    ``at``: a recording whose connection broke may have committed before it did,
    and its retry, with the same ``at``, tells its own commit from another's (a
    rescue at a lease's end finishes at the housekeeper's time, a new claim has
    another number)."""
    if not fences:
        return set()
    return _held(
        conn.execute(
            "SELECT j.id, j.claim FROM bothy.jobs j"
            " JOIN unnest(%s::bigint[], %s::bigint[]) AS f(i, c) ON j.id = f.i AND j.claim = f.c"
            " WHERE j.state IN ('completed', 'failed') AND j.finished_at = %s",
            ([f[0] for f in fences], [f[1] for f in fences], at),
        ).fetchall()
    )


def fail(conn: Conn, failures: Sequence[tuple[Fence, str]], now: datetime) -> set[Fence]:
    """Give claimed jobs up with their error; return the fences that held."""
    if not failures:
        return set()
    return _held(
        conn.execute(
            "UPDATE bothy.jobs j SET state = 'failed', finished_at = %s, lease_until = NULL,"
            " last_error = f.e FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS f(i, c, e)"
            f" WHERE {_FENCED} RETURNING j.id, j.claim",
            (
                now,
                [f[0][0] for f in failures],
                [f[0][1] for f in failures],
                [f[1] for f in failures],
            ),
        ).fetchall()
    )


def retry(conn: Conn, retries: Sequence[tuple[Fence, datetime, str]]) -> set[Fence]:
    """Make claimed jobs available again at their retry time; return the fences
    that held."""
    if not retries:
        return set()
    return _held(
        conn.execute(
            "UPDATE bothy.jobs j SET state = 'available', scheduled_at = f.s, lease_until = NULL,"
            " last_error = f.e"
            " FROM unnest(%s::bigint[], %s::bigint[], %s::timestamptz[], %s::text[])"
            f" AS f(i, c, s, e) WHERE {_FENCED} RETURNING j.id, j.claim",
            (
                [r[0][0] for r in retries],
                [r[0][1] for r in retries],
                [r[1] for r in retries],
                [r[2] for r in retries],
            ),
        ).fetchall()
    )


def renew(conn: Conn, fences: Sequence[Fence], until: datetime) -> set[Fence]:
    """Extend the lease of jobs this runner still holds; return the fences that held
    (the others were lost: their lease ran out and another runner took them)."""
    if not fences:
        return set()
    return _held(
        conn.execute(
            "UPDATE bothy.jobs j SET lease_until = %s"
            f" FROM unnest(%s::bigint[], %s::bigint[]) AS f(i, c) WHERE {_FENCED}"
            " RETURNING j.id, j.claim",
            (until, [f[0] for f in fences], [f[1] for f in fences]),
        ).fetchall()
    )


def defer(conn: Conn, deferred: Sequence[tuple[Fence, datetime]]) -> set[Fence]:
    """Put claimed jobs back for later without counting their attempt; return the
    fences that held."""
    if not deferred:
        return set()
    return _held(
        conn.execute(
            "UPDATE bothy.jobs j SET state = 'available', scheduled_at = f.s, lease_until = NULL,"
            " attempt = greatest(j.attempt - 1, 0)"
            " FROM unnest(%s::bigint[], %s::bigint[], %s::timestamptz[]) AS f(i, c, s)"
            f" WHERE {_FENCED} RETURNING j.id, j.claim",
            ([d[0][0] for d in deferred], [d[0][1] for d in deferred], [d[1] for d in deferred]),
        ).fetchall()
    )


def release(conn: Conn, fences: Iterable[Fence]) -> set[Fence]:
    """Give back claimed jobs that did not run to the end (shutdown); the attempt is
    not counted. Returns the fences that held."""
    fences = list(fences)
    if not fences:
        return set()
    return _held(
        conn.execute(
            "UPDATE bothy.jobs j SET state = 'available', lease_until = NULL,"
            " attempt = greatest(j.attempt - 1, 0)"
            f" FROM unnest(%s::bigint[], %s::bigint[]) AS f(i, c) WHERE {_FENCED}"
            " RETURNING j.id, j.claim",
            ([f[0] for f in fences], [f[1] for f in fences]),
        ).fetchall()
    )


def rescue_expired(conn: Conn, now: datetime) -> tuple[int, int]:
    """Jobs whose lease ran out run again (or fail when out of attempts).

    Returns (made available, failed).
    """
    again = conn.execute(
        "UPDATE bothy.jobs SET state = 'available', lease_until = NULL,"
        " last_error = 'lease expired' WHERE state = 'running' AND lease_until < %s"
        " AND attempt < max_attempts",
        (now,),
    ).rowcount
    failed = conn.execute(
        "UPDATE bothy.jobs SET state = 'failed', lease_until = NULL, finished_at = %s,"
        " last_error = 'lease expired' WHERE state = 'running' AND lease_until < %s",
        (now, now),
    ).rowcount
    return again, failed


def prune(conn: Conn, older_than: datetime) -> int:
    """Delete finished jobs that finished before ``older_than``."""
    return conn.execute(
        "DELETE FROM bothy.jobs WHERE state IN ('completed', 'failed') AND finished_at < %s",
        (older_than,),
    ).rowcount


def depth(conn: Conn, now: datetime) -> tuple[dict[tuple[str, str], int], float]:
    """Unfinished jobs by (kind, state), and how long the oldest due job has waited (s)."""
    counts = {
        (r[0], r[1]): int(r[2])
        for r in conn.execute(
            "SELECT kind, state, count(*) FROM bothy.jobs"
            " WHERE state IN ('available', 'running') GROUP BY kind, state"
        )
    }
    row = conn.execute(
        "SELECT min(scheduled_at) FROM bothy.jobs WHERE state = 'available' AND scheduled_at <= %s",
        (now,),
    ).fetchone()
    oldest = row[0] if row else None
    lag = max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
    return counts, lag
