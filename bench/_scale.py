"""The data set of ``bench/decide.py --scale`` and the capture behind ``--explain``.

Seeding: the projection tables are written with ``COPY`` (the events that would
have made them are not what is measured, and a million ``thread.followed``
through the round would take longer than the benchmark): people with a phone
each, spaces, threads, follows with a skewed number of followers per thread,
read states, a node with desktops live on it (the cluster's shared presence)
and closed coalescing windows. Then ``VACUUM (ANALYZE)``, as autovacuum would
have left tables of that age.

Capture: :func:`recording` gives a connection whose cursors note every
statement and its parameters; a round run on it shows exactly what the round
sends, and :func:`explain` runs each statement again under ``EXPLAIN (ANALYZE,
BUFFERS)``: with its parameters bound (the plan of the first executions of a
statement) and as a prepared statement forced to its generic plan (the plan
psycopg's automatic preparing leads to after a few executions).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer


@dataclass(frozen=True)
class Scale:
    """The shape of the data set (every figure a command-line default of ``--scale``).

    People ``i`` are members of space ``i % spaces``; thread ``j`` lies in space
    ``j % spaces`` and channel ``j % (10 * spaces)``. The ``popular`` first
    threads are followed by every member of their space; the others share the
    remaining follows evenly, followers drawn from their space. A follow is
    ``all`` with ``all_share``, ``none`` with ``none_share``, else ``mentions``;
    a follow that is not ``none`` has a read state with ``read_share``.
    """

    people: int = 100_000
    follows: int = 1_000_000
    threads: int = 10_000
    spaces: int = 20
    popular: int = 100
    all_share: float = 0.10
    none_share: float = 0.05
    read_share: float = 0.5
    desktops: int = 20_000
    windows: int = 50_000
    seed: int = 19

    @property
    def per_space(self) -> int:
        return self.people // self.spaces


@dataclass
class Seeded:
    """What the seed wrote, for the message events that follow it."""

    scale: Scale
    node_id: str
    threads_by_followers: list[str] = field(default_factory=list)
    """Thread ids, most followed first."""


def _copy(
    conn: psycopg.Connection[Any], table: str, columns: str, lines: Iterable[str], what: str
) -> int:
    started = time.perf_counter()
    rows = 0
    chunk: list[str] = []
    with conn.cursor() as cur, cur.copy(f"COPY bothy.{table} ({columns}) FROM STDIN") as copy:
        for line in lines:
            chunk.append(line)
            if len(chunk) >= 20_000:
                copy.write("".join(chunk))
                rows += len(chunk)
                chunk.clear()
        copy.write("".join(chunk))
        rows += len(chunk)
    print(f"  {what}: {rows:,} rows in {time.perf_counter() - started:.1f}s", flush=True)
    return rows


def seed_scale(url: str, scale: Scale) -> Seeded:
    """Write the projection tables of ``scale`` with COPY (see the module's docstring)."""
    rng = random.Random(scale.seed)
    now = datetime.now(UTC)
    stamp = now.isoformat()
    node_id = "01900000-0000-7000-8000-00000000001a"
    people = [f"user{i}" for i in range(scale.people)]
    members = [people[s :: scale.spaces] for s in range(scale.spaces)]
    ordinary = scale.threads - scale.popular
    rest = scale.follows - scale.popular * scale.per_space
    base, extra = divmod(max(0, rest), max(1, ordinary))
    follows: list[tuple[str, str, str]] = []
    counts: list[tuple[int, str]] = []
    for j in range(scale.threads):
        thread = f"t{j}"
        pool = members[j % scale.spaces]
        if j < scale.popular:
            followers = pool
        else:
            k = base + (1 if j - scale.popular < extra else 0)
            followers = rng.sample(pool, min(k, len(pool)))
        counts.append((len(followers), thread))
        for user in followers:
            draw = rng.random()
            level = (
                "all"
                if draw < scale.all_share
                else "none"
                if draw < scale.all_share + scale.none_share
                else "mentions"
            )
            follows.append((thread, user, level))
    reads = [
        (u, t) for t, u, level in follows if level != "none" and rng.random() < scale.read_share
    ]
    windows = rng.sample(reads, min(scale.windows, len(reads)))
    closed = (now - timedelta(hours=1)).isoformat()
    print(
        f"seeding {scale.people:,} people, {len(follows):,} follows, {scale.threads:,} threads"
        f" with COPY",
        flush=True,
    )
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        _copy(
            conn, "users", "user_id, kind, active", (f"{u}\thuman\tt\n" for u in people), "people"
        )
        _copy(
            conn,
            "devices",
            "user_id, device_id, platform, state",
            (f"{u}\tphone-{u}\tios\tactive\n" for u in people),
            "devices",
        )
        _copy(
            conn,
            "push_registrations",
            "id, user_id, device_id, provider, token, created_at, renewed_at",
            (f"reg-{u}\t{u}\tphone-{u}\tfake\ttoken-{u}\t{stamp}\t{stamp}\n" for u in people),
            "push registrations",
        )
        _copy(
            conn,
            "preferences",
            "user_id, categories",
            (f'{u}\t{{"mentions": false}}\n' for u in people[::10]),
            "preferences",
        )
        _copy(
            conn,
            "members",
            "scope_id, user_id",
            (f"s{s}\t{u}\n" for s, pool in enumerate(members) for u in pool),
            "memberships",
        )
        _copy(
            conn,
            "threads",
            "thread_id, space_id, channel_id",
            (
                f"t{j}\ts{j % scale.spaces}\tc{j % (10 * scale.spaces)}\n"
                for j in range(scale.threads)
            ),
            "threads",
        )
        _copy(conn, "follows", "thread_id, user_id, level", _tabbed(follows), "follows")
        _copy(
            conn,
            "read_states",
            "user_id, thread_id, last_read_seq",
            (f"{u}\t{t}\t0\n" for u, t in reads),
            "read states",
        )
        _copy(
            conn,
            "hint_windows",
            "user_id, thread_id, opened_at, closes_at, count, first_seq, newest_seq,"
            " newest_message_id",
            (f"{u}\t{t}\t{closed}\t{closed}\t1\t0\t0\tm\n" for u, t in windows),
            "closed coalescing windows",
        )
        live_until = (now + timedelta(days=1)).isoformat()
        conn.execute(
            "INSERT INTO bothy.nodes (node_id, role, host, pid, started_at, seen_at)"
            " VALUES (%s, 'all', 'bench', 1, %s, %s)",
            (node_id, now, live_until),
        )
        _copy(
            conn,
            "presence",
            "user_id, device_id, node_id, platform, focus, idle, updated_at, conn_serial, live_seq",
            (
                f"{u}\tdesk-{u}\t{node_id}\tmacos\t{{}}\tf\t{stamp}\t{i}\t{i}\n"
                for i, u in enumerate(rng.sample(people, min(scale.desktops, len(people))))
            ),
            "desktops live on one node (shared presence)",
        )
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        vacuumed = time.perf_counter()
        conn.execute("VACUUM (ANALYZE)")
        print(f"  VACUUM (ANALYZE): {time.perf_counter() - vacuumed:.1f}s", flush=True)
    print(f"seeded in {time.perf_counter() - started:.1f}s", flush=True)
    counts.sort(key=lambda c: (-c[0], int(c[1][1:])))
    return Seeded(scale, node_id, [t for _n, t in counts])


def _tabbed(rows: Iterable[tuple[str, ...]]) -> Iterator[str]:
    for row in rows:
        yield "\t".join(row) + "\n"


@dataclass(frozen=True)
class Statement:
    """One statement a connection sent: its SQL and parameters (``many``: each set of
    parameters of an ``executemany``)."""

    query: str
    params: Any
    many: bool = False

    @property
    def keys(self) -> list[int]:
        """The key counts of its parameters that are lists or JSON arrays."""
        if self.many or not isinstance(self.params, (list, tuple)):
            return []
        return [n for n in (key_count(p) for p in self.params) if n is not None]

    @property
    def explainable(self) -> bool:
        head = self.query.lstrip()[:6].upper()
        return head in ("SELECT", "WITH C", "WITH K", "WITH I", "UPDATE", "INSERT", "DELETE") and (
            "pg_try_advisory_lock" not in self.query
        )


def recording(url: str, into: list[Statement]) -> psycopg.Connection[Any]:
    """A dedicated connection (as the round opens) whose cursors append every
    statement they execute to ``into``."""
    from bothy_notify.store.db import connect_dedicated

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            into.append(Statement(str(query), params))
            return super().execute(query, params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            params_seq = list(params_seq)
            into.append(Statement(str(query), params_seq, many=True))
            return super().executemany(query, params_seq, **kwargs)

    conn = connect_dedicated(url)
    conn.cursor_factory = Recording
    return conn


def key_count(value: Any) -> int | None:
    """How many keys a parameter carries: the length of a list or a JSON array."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str) and value.startswith("["):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        return len(parsed) if isinstance(parsed, list) else None
    return None


def _constants() -> dict[str, str]:
    """SQL held in module constants, by text: the name a plan is printed under."""
    from bothy_notify.notify import facts
    from bothy_notify.store import access, events, jobs, registrations

    out: dict[str, str] = {}
    for module in (facts, access, events, jobs, registrations):
        short = module.__name__.rsplit(".", 1)[-1]
        for name, value in vars(module).items():
            if name.lstrip("_").isupper() and isinstance(value, str) and " " in value:
                out[value] = f"{short}.{name}"
    return out


def label(statement: Statement) -> str:
    """A name for a statement: its constant's, else its verb and the tables it names."""
    named = _constants().get(statement.query)
    if named:
        return named
    verb = statement.query.lstrip().split(None, 1)[0].upper()
    tables = list(dict.fromkeys(re.findall(r"bothy\.(\w+)", statement.query)))
    return f"{verb} {'+'.join(tables)}"


TINY_TABLES = frozenset({"consumer_cursor", "nodes", "provider_deliveries"})
"""Tables with a row per cluster node, per provider or a single row: a scan of them is
as cheap as a probe, whatever the load."""


def seq_scans(plan: list[str]) -> list[str]:
    """The tables a plan scans whole, but the tiny ones."""
    found = re.findall(r"Seq Scan on (\w+)", "\n".join(plan))
    return sorted({t for t in found if t not in TINY_TABLES})


def shape(plan: list[str]) -> list[str]:
    """A plan's nodes without costs, times or parameter numbers (to compare plans)."""
    return [
        re.sub(r"\(cost=.*|\$\d+", "", line).strip()
        for i, line in enumerate(plan)
        if i == 0 or "->" in line
    ]


@dataclass
class Explained:
    """One statement's plans: as first executed and as prepared (its generic plan)."""

    label: str
    keys: list[int]
    plan: list[str]
    ms: float
    generic_plan: list[str] | None
    generic_ms: float | None

    @property
    def same_generic(self) -> bool:
        return self.generic_plan is None or shape(self.plan) == shape(self.generic_plan)

    def figures(self) -> dict[str, Any]:
        return {
            "read": self.label,
            "keys": self.keys,
            "ms": round(self.ms, 2),
            "seq_scans": seq_scans(self.plan) + seq_scans(self.generic_plan or []),
            "generic_same": self.same_generic,
        }


def explain_all(url: str, statements: Iterable[Statement]) -> list[Explained]:
    """EXPLAIN (ANALYZE, BUFFERS) of every read and write of ``statements`` (the
    bound plan, and the generic one a prepared statement comes to)."""
    out: list[Explained] = []
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for statement in statements:
            if not statement.explainable:
                continue
            plan, ms = explain(conn, statement, generic=False)
            generic: tuple[list[str], float] | None = None
            if not statement.many:
                generic = explain(conn, statement, generic=True)
            out.append(
                Explained(
                    label(statement),
                    statement.keys,
                    plan,
                    ms,
                    generic[0] if generic else None,
                    generic[1] if generic else None,
                )
            )
    return out


def print_explained(title: str, explained: list[Explained]) -> None:
    print(f"== EXPLAIN (ANALYZE, BUFFERS): {title}")
    for e in explained:
        keys = ", ".join(f"{n:,}" for n in e.keys) or "-"
        print(f"-- {e.label}  (keys: {keys}; {e.ms:.2f} ms)")
        for line in e.plan:
            print(f"   {line}")
        if not e.same_generic and e.generic_plan is not None:
            print(f"   generic plan (prepared statement), {e.generic_ms:.2f} ms:")
            for line in e.generic_plan:
                print(f"   {line}")
        else:
            print("   generic plan (prepared statement): the same")
    print(f"== summary: {title}")
    print(f"   {'statement':44s} {'keys':>15s} {'ms':>9s}  whole-table scans")
    for e in explained:
        keys = "/".join(f"{n}" for n in e.keys) or "-"
        scans = ", ".join(seq_scans(e.plan) + seq_scans(e.generic_plan or [])) or "none"
        print(f"   {e.label:44s} {keys:>15s} {e.ms:9.2f}  {scans}")


def most_followed(url: str, n: int) -> list[str]:
    """The ``n`` threads with the most followers at level ``all``."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT thread_id FROM bothy.follows WHERE level = 'all' GROUP BY thread_id"
            " ORDER BY count(*) DESC, thread_id LIMIT %s",
            (n,),
        ).fetchall()
    return [r[0] for r in rows]


def explain(
    conn: psycopg.Connection[Any], statement: Statement, *, generic: bool
) -> tuple[list[str], float]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``statement`` in a transaction rolled back
    afterwards; with ``generic``, of the statement prepared and forced to its
    generic plan. Returns the plan's lines and its execution time (ms)."""
    params = statement.params[0] if statement.many else statement.params
    try:
        with conn.transaction(force_rollback=True):
            if generic:
                rows = _explain_generic(conn, statement.query, params)
            else:
                rows = conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS) " + statement.query,
                    params,
                ).fetchall()
    finally:
        # A prepared statement outlives the transaction that prepared it.
        if conn.execute(
            "SELECT 1 FROM pg_prepared_statements WHERE name = 'bench_generic'"
        ).fetchone():
            conn.execute("DEALLOCATE bench_generic")
    lines = [r[0] for r in rows]
    ms = 0.0
    for line in lines:
        if line.startswith("Execution Time:"):
            ms = float(line.split()[2])
    return lines, ms


def _explain_generic(conn: psycopg.Connection[Any], query: str, params: Any) -> list[tuple[str]]:
    """PREPARE ``query``, force its generic plan and EXPLAIN ANALYZE its EXECUTE with
    ``params`` (each cast to the type the server inferred for it)."""
    pq = PostgresQuery(Transformer(conn))
    pq.convert(query, params)
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.execute(b"PREPARE bench_generic AS " + pq.query)
    row = conn.execute(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'bench_generic'"
    ).fetchone()
    types = row[0] if row else []
    # EXPLAIN EXECUTE takes no parameters of the protocol: its arguments are literals,
    # each cast to the type PREPARE inferred for it.
    if isinstance(params, dict):
        values = [params[name] for name in pq._order or ()]
    else:
        values = list(params or ())
    args = sql.SQL(", ").join(
        sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
        for v, t in zip(values, types, strict=True)
    )
    explained = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_generic({})").format(args)
    return conn.execute(explained).fetchall()


def burst_messages(threads: list[str], count: int, first_seq: int) -> list[tuple[str, Any]]:
    """``count`` messages spread over ``threads`` in turn (a burst to popular threads)."""
    return [
        (
            "message.created",
            {
                "thread_id": threads[i % len(threads)],
                "message_id": f"burst{first_seq}-{i}",
                "thread_seq": first_seq + i // len(threads),
                "author_id": "author",
                "mentions": [],
            },
        )
        for i in range(count)
    ]


def capture_round(url: str, config: Any, node_timeout: timedelta, limit: int) -> list[Statement]:
    """The statements of one round of up to ``limit`` events as a node of a cluster
    decides them (shared presence read with the group, gateway jobs targeted at the
    node holding the connections, coalescing windows as configured). It commits."""
    from bothy_notify.config import LiveConfig
    from bothy_notify.kernel.clock import SystemClock
    from bothy_notify.kernel.metrics import Metrics
    from bothy_notify.notify.facts import SharedPresence
    from bothy_notify.notify.round import ConsumerRound
    from bothy_notify.notify.routes import JobLiveRoutes

    consumer = ConsumerRound(
        database_url=url,
        config=LiveConfig(config),
        clock=SystemClock(),
        presence=SharedPresence(node_timeout),
        live=JobLiveRoutes(push_max_attempts=config.push.max_attempts),
        metrics=Metrics(),
    )
    statements: list[Statement] = []
    conn = recording(url, statements)
    try:
        consumer._round_once(conn, limit)
    finally:
        conn.close()
    return statements


def capture_jobs(url: str, config: Any, node_id: str) -> list[Statement]:
    """The statements the runner and the job handlers send for the jobs the round left:
    a claim of ``jobs.claim_batch`` due pushes, their check (registrations, reach) and
    completion; the claim and check of as many of the node's gateway hints as a
    runner's room holds; one flush at its window's end. Each in a transaction rolled
    back afterwards."""
    from bothy_notify.config import LiveConfig
    from bothy_notify.kernel.clock import SystemClock, from_unix_micros
    from bothy_notify.kernel.metrics import Metrics
    from bothy_notify.notify import facts
    from bothy_notify.notify.facts import SharedPresence
    from bothy_notify.notify.jobs.args import (
        FLUSH,
        GATEWAY_SEND,
        PUSH_SEND,
        FlushArgs,
        PushSendArgs,
    )
    from bothy_notify.notify.jobs.flush import FlushHandler
    from bothy_notify.notify.jobs.gateway_send import GatewaySendHandler
    from bothy_notify.notify.routes import JobLiveRoutes
    from bothy_notify.runner import CLAIMED_ROOM
    from bothy_notify.store import jobs as queue
    from bothy_notify.store import registrations

    clock = SystemClock()
    now = clock.now()
    lease = config.jobs.lease
    with psycopg.connect(url) as plain:
        row = plain.execute(
            "SELECT args::text FROM bothy.jobs WHERE kind = %s ORDER BY id LIMIT 1", (FLUSH,)
        ).fetchone()
    flush_args = FlushArgs.from_args(orjson.loads(row[0])) if row else None
    statements: list[Statement] = []
    conn = recording(url, statements)
    try:
        with conn.transaction(force_rollback=True):
            claimed = queue.claim(conn, now, config.jobs.claim_batch, lease, [PUSH_SEND])
            parsed = [PushSendArgs.from_args(j.args) for j in claimed]
            registrations.load(conn, {a.registration_id for a in parsed})
            facts.reach_now(conn, {(a.user_id, a.thread_id) for a in parsed})
            queue.complete(conn, [j.fence for j in claimed], now)
        with conn.transaction(force_rollback=True):
            room = CLAIMED_ROOM * config.jobs.concurrency
            hints = queue.claim(conn, now, room, lease, [GATEWAY_SEND], node_id)
            handler = GatewaySendHandler(
                db=None,  # type: ignore[arg-type]
                clock=clock,
                config=config.push,
                metrics=Metrics(),
                publisher=None,
            )
            handler.check(conn, hints, now)
        if flush_args is not None:
            # At the end of its window (the claim is the one above, so not repeated).
            ends = from_unix_micros(flush_args.opened_at) + config.notify.coalesce_window
            flush = FlushHandler(
                db=None,  # type: ignore[arg-type]
                clock=clock,
                config=LiveConfig(config),
                presence=SharedPresence(config.cluster.node_timeout),
                live=JobLiveRoutes(push_max_attempts=config.push.max_attempts),
                metrics=Metrics(),
            )
            with conn.transaction(force_rollback=True):
                flush._flush(conn, args=flush_args, now=ends, mv=None)
    finally:
        conn.close()
    # The statements as the handlers sent them; explained afresh (each rolls back).
    return statements
