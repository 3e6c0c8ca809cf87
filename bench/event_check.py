"""Benchmark: what checking one event's payload costs, in Python and in SQL.

Python: ``EventValidator.check`` per event over one valid payload of every type
(plus a ``message.created`` with 20 mentions and a ``hint.requested`` with 100
recipients), and over refused payloads (one bad field each, the 422 path), in
CPU microseconds per event. The floor is a loop that only looks the type up.

SQL: ``bothy.checked_event`` over a batch of events in one statement (the cost
``bothy.append_event`` adds to an insert), in CPU microseconds of the server
process per event; the floor is the same statement without the check.

``--against REV`` also measures the checkers of git revision REV (before the
generated checks: ``store/fastcheck.py`` + ``jsonschema`` in Python,
``bothy.validate_json`` reading ``bothy.event_types`` in SQL), loaded from git
into a temporary directory and a schema of their own, alternated with the
current ones round by round; the ratios are REV's time over the current one.

Usage: .venv/bin/python bench/event_check.py [--rounds N] [--against REV]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, machine_busy, process_cpu, report
from bothy_notify.resources import event_schemas
from bothy_notify.store.db import StoreError
from bothy_notify.store.events import EventValidator
from testkit.events import VALID_PAYLOADS

ROOT = Path(__file__).resolve().parent.parent

BENCH_TYPES = (
    "user.upserted",
    "device.upserted",
    "thread.upserted",
    "member.added",
    "member.removed",
    "thread.followed",
    "thread.read",
    "message.created",
    "access.expiring",
    "hint.requested",
    "envelope.published",
)
"""The types measured: the eleven every revision since 452b655 knows, so that
``--against`` compares like with like (the results in ``bench/results/`` are of these)."""
VALID: dict[str, dict[str, Any]] = {t: VALID_PAYLOADS[t] for t in BENCH_TYPES}

Events = list[tuple[str, dict[str, Any]]]


def valid_events() -> Events:
    events = list(VALID.items())
    created = {**VALID["message.created"], "mentions": [f"user-{i}" for i in range(20)]}
    hint = {**VALID["hint.requested"], "recipients": [f"user-{i}" for i in range(100)]}
    return [*events, ("message.created", created), ("hint.requested", hint)]


def refused_events() -> Events:
    created = VALID["message.created"]
    return [
        ("thread.read", {**VALID["thread.read"], "seq": -1}),
        ("message.created", {**created, "mentions": ["alex", "not ok"]}),
        ("user.upserted", {"user_id": "alex", "kind": "human"}),
        ("member.added", {**VALID["member.added"], "extra": 1}),
        ("device.upserted", {**VALID["device.upserted"], "platform": "beos"}),
    ]


# ---------------------------------------------------------------- Python


def python_us(check: Callable[[str, dict[str, Any]], object], events: Events, repeat: int) -> float:
    """CPU microseconds per event of ``check`` over ``events``, ``repeat`` times (CPU
    time: the machine is shared, and a wall clock counts the others' turns)."""
    start = time.process_time()
    for _ in range(repeat):
        for event_type, payload in events:
            with contextlib.suppress(StoreError):  # EventRejected, REV's too
                check(event_type, payload)
    return (time.process_time() - start) / (repeat * len(events)) * 1e6


def old_modules(rev: str, tmp: Path) -> ModuleType:
    """REV's ``store/events.py`` with its ``fastcheck``, imported from ``tmp``."""
    for name in ("fastcheck", "events"):
        text = git_show(rev, f"bothy_notify/store/{name}.py")
        text = text.replace("from bothy_notify.store.fastcheck import", "from old_fastcheck import")
        (tmp / f"old_{name}.py").write_text(text, encoding="utf-8")
    sys.path.insert(0, str(tmp))
    spec = importlib.util.spec_from_file_location("old_events", tmp / "old_events.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_events"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def git_show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


# ---------------------------------------------------------------- SQL


def install_old_sql(conn: psycopg.Connection[Any], rev: str) -> None:
    """REV's schema interpreter in schema ``bench_old``: ``validate_json`` (0010),
    ``integral_json`` (0018) and the schemas in ``bench_old.event_types``, with
    ``bench_old.checked(type, payload)`` doing what REV's ``append_event`` did
    before its insert."""
    conn.execute("DROP SCHEMA IF EXISTS bench_old CASCADE")
    conn.execute("CREATE SCHEMA bench_old")
    conn.execute("CREATE TABLE bench_old.event_types (type text PRIMARY KEY, schema jsonb)")
    for name, schema in event_schemas().items():
        conn.execute(
            "INSERT INTO bench_old.event_types VALUES (%s, %s::jsonb)", (name, json.dumps(schema))
        )
    for path, function in (
        ("0010_envelope_data_bytes.sql", "validate_json"),
        ("0018_integral_numbers.sql", "integral_json"),
    ):
        text = git_show(rev, f"bothy_notify/store/migrations/{path}")
        start = text.index(f"FUNCTION bothy.{function}")
        body = text[start : text.index("$$;", start) + 3]
        conn.execute(("CREATE " + body.replace("bothy.", "bench_old.")).encode())
    conn.execute(
        """
        CREATE FUNCTION bench_old.checked(p_type text, p_payload jsonb) RETURNS jsonb
        LANGUAGE plpgsql AS $$
        DECLARE s jsonb; problem text;
        BEGIN
            SELECT schema INTO s FROM bench_old.event_types WHERE type = p_type;
            IF s IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'bothy: type: unknown';
            END IF;
            problem := bench_old.validate_json(s, p_payload, 'payload');
            IF problem IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'bothy: ' || problem;
            END IF;
            IF strpos(p_payload::text, '.') > 0 THEN
                p_payload := bench_old.integral_json(s, p_payload);
            END IF;
            RETURN p_payload;
        END $$;
        """
    )


SQL_BATCH = "SELECT count({check}) FROM unnest(%s::text[], %s::jsonb[]) AS e(t, p)"


def sql_us(conn: psycopg.Connection[Any], check: str, events: Events, copies: int) -> float:
    """The server process's CPU microseconds per event of one statement applying
    ``check`` to ``copies`` copies of ``events``."""
    batch = events * copies
    types = [t for t, _ in batch]
    payloads = [json.dumps(p) for _, p in batch]
    statement = SQL_BATCH.format(check=check).encode()
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    start = process_cpu(int(row[0]))
    conn.execute(statement, (types, payloads))
    return (process_cpu(int(row[0])) - start) / len(batch) * 1e6


# ---------------------------------------------------------------- run


def alternate(rounds: int, runs: Mapping[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each of ``runs`` once per round, in turn, ``rounds`` times (the first round is
    warm-up and dropped)."""
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds + 1):
        for name, run in runs.items():
            value = run()
            if round_:
                figures[name].append(value)
    return figures


def summary(figures: dict[str, list[float]]) -> dict[str, float]:
    return {name: round(statistics.median(values), 3) for name, values in figures.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=2000, help="Python: passes per round")
    parser.add_argument("--copies", type=int, default=1000, help="SQL: copies of the set")
    parser.add_argument("--against", metavar="REV", help="also REV's checkers, alternated")
    args = parser.parse_args(argv)
    valid, refused = valid_events(), refused_events()
    validator = EventValidator()
    busy0 = machine_busy()

    python: dict[str, Callable[[], float]] = {
        "floor": lambda: python_us(lambda t, p: VALID.get(t) and None, valid, args.repeat),
        "valid": lambda: python_us(validator.check, valid, args.repeat),
        "refused": lambda: python_us(validator.check, refused, args.repeat),
    }
    with tempfile.TemporaryDirectory(prefix="bothy-bench-check-") as tmp:
        if args.against:
            old = old_modules(args.against, Path(tmp)).EventValidator()
            python["valid_old"] = lambda: python_us(old.check, valid, args.repeat)
            python["refused_old"] = lambda: python_us(old.check, refused, args.repeat)
        py = summary(alternate(args.rounds, python))

    with bench_database() as url, psycopg.connect(url, autocommit=True) as conn:
        sql: dict[str, Callable[[], float]] = {
            "floor": lambda: sql_us(conn, "p", valid, args.copies),
            "valid": lambda: sql_us(conn, "bothy.checked_event(t, p)", valid, args.copies),
        }
        if args.against:
            install_old_sql(conn, args.against)
            sql["valid_old"] = lambda: sql_us(conn, "bench_old.checked(t, p)", valid, args.copies)
        pg = summary(alternate(args.rounds, sql))
    busy1 = machine_busy()
    load = (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1.0)

    print(f"python CPU us/event: {py}")
    print(f"sql CPU us/event (the server process): {pg}")
    figures: dict[str, Any] = {
        "python_valid_us": py["valid"],
        "python_refused_us": py["refused"],
        "python_floor_us": py["floor"],
        "sql_valid_us": pg["valid"],
        "sql_floor_us": pg["floor"],
    }
    if args.against:
        figures |= {
            "against": args.against,
            "python_valid_old_us": py["valid_old"],
            "python_refused_old_us": py["refused_old"],
            "sql_valid_old_us": pg["valid_old"],
            "python_valid_old_over_new": round(py["valid_old"] / py["valid"], 2),
            "python_refused_old_over_new": round(py["refused_old"] / py["refused"], 2),
            "sql_check_old_over_new": round(
                (pg["valid_old"] - pg["floor"]) / (pg["valid"] - pg["floor"]), 2
            ),
        }
        print(
            f"old/new: python valid {figures['python_valid_old_over_new']}x, refused "
            f"{figures['python_refused_old_over_new']}x; sql check (above the floor) "
            f"{figures['sql_check_old_over_new']}x"
        )
    report("event_check", **figures, machine_busy=round(load, 2), **machine())


if __name__ == "__main__":
    main()
