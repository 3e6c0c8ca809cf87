"""The capacity model of ``docs/scaling.md``, recomputed from a JSON of inputs.

Every input is a figure measured on the reference machine (with the command that
measured it), or a named assumption; ``--inputs FILE`` replaces any of them (a
JSON object of input names to numbers), so that new measurements go in here
and the model is recomputed, never edited by hand. ``--list`` prints every
input with its value and source. The formulas are the ones ``docs/scaling.md``
writes out; each output names its formula.

Usage: .venv/bin/python bench/capacity.py [--inputs FILE] [--list]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import report


@dataclass(frozen=True)
class Input:
    value: float
    source: str


PERF = "docs/performance.md"
GATEWAY_RUNS = "bench/results/2026-12-04-gateway.md"
PUSH_RUNS = "bench/results/2026-12-02-push.md"
ISSUE = "issue 19 (measured 2026-12-03)"
PUBLIC = "bench/results/2026-12-04-public-path.md (bench/public_path.py, i19-http, loaded)"
SCALE = "bench/decide.py --scale (this branch, loaded machine)"
CEILING = "bench/pg_ceiling.py (this branch, loaded machine)"
BEAT = "bench/results/2026-12-04-heartbeat.md (bench/heartbeat.py, i19-gateway, loaded)"

INPUTS: dict[str, Input] = {
    # The deployment to size (the issue's figures).
    "people": Input(10_000_000, "target"),
    "connections": Input(1_000_000, "target: concurrent WebSocket connections"),
    "events_per_s": Input(50_000, "target: events appended per second, all types"),
    # The event mix and the fan-out: assumptions (no deployment measured).
    "share_message": Input(0.60, "assumption: share of message.created"),
    "share_read": Input(0.30, "assumption: share of thread.read"),
    "share_follow": Input(0.04, "assumption: share of thread.followed"),
    "share_member": Input(0.02, "assumption: share of member.added/removed"),
    "share_user": Input(0.01, "assumption: share of user.upserted"),
    "share_device": Input(0.01, "assumption: share of device.upserted"),
    "share_app_hint": Input(0.02, "assumption: share of hint.requested"),
    "recipients_per_message": Input(10, "assumption; bench/decide.py's 10, 9.7 at --scale"),
    "recipients_per_app_hint": Input(1, "assumption"),
    "registrations_per_person": Input(1.2, "assumption: push registrations per recipient"),
    "folded_share": Input(0.30, "assumption: hints folded into an open coalescing window"),
    "flush_hint_share": Input(0.50, "assumption: flushes that find folded messages unread"),
    "batch_size": Input(500, "notify.batch_size (default)"),
    # Gateway.
    "kb_per_connection": Input(
        9.04, f"{PERF}: bench/gateway.py, idle identified connection (11.78 before i19-gateway)"
    ),
    "idle_cpu_us_per_connection_s": Input(
        3.2, f"{ISSUE}: 5,000 connections without heartbeats took 1.6 % of a core"
    ),
    "cpu_us_per_ping": Input(
        105,
        f"{BEAT}: daemon CPU per ping, net, the highest of four runs (80-105 us; 235 in"
        f" {PUBLIC}, 540 in {ISSUE}; target <= 50; the bare wsproto floor 145-188 us)",
    ),
    "heartbeat_s": Input(30, "sync.heartbeat (default): one ping per connection per period"),
    "identifies_per_s_per_process": Input(
        521,
        f"{BEAT}: the best storm of four at 100 % machine load (87-521/s; 150 in {PUBLIC},"
        f" 475 in {ISSUE}); by CPU alone 1,040-1,500/s",
    ),
    "cpu_us_per_identify": Input(
        959, f"{BEAT}: daemon CPU per identify in the storm, the highest of four (666-959 us)"
    ),
    "connections_per_process": Input(
        19_000, f"{PERF}: 19,000 in one process at 11.77 KB (ulimit -n 20,000)"
    ),
    "connection_lifetime_s": Input(3_600, "assumption: a connection's mean life"),
    "identify_pg_us": Input(
        71, f"{BEAT}: PostgreSQL CPU per identify in the storm, the highest of four (45-71 us)"
    ),
    "usable_core_share": Input(0.7, "assumption: share of a core a process may use"),
    "gateway_hint_cpu_us": Input(
        150, "assumption: a gateway_send job and its frame (a push's runner share, 137.7 us)"
    ),
    # The HTTP path (producers appending one event per POST).
    "http_cpu_ms_per_event": Input(
        2.0,
        f"{PUBLIC}: phase (a), daemon CPU per single-event POST end to end, 1.9-2.1 ms"
        f" (8.7 in {ISSUE}; target 1.5); an upper bound for the API's share: it includes"
        " the round's and the jobs' for 10 recipients (about a third, by its profile)",
    ),
    "append_pg_us_per_event": Input(
        350, f"{GATEWAY_RUNS}: one append_event costs PostgreSQL 0.25-0.45 ms alone (53 us in tens)"
    ),
    # The round (one, across the cluster).
    "round_python_us_per_recipient": Input(
        23.5, f"{SCALE}: 228 us per event of 9.7 recipients (one job each)"
    ),
    "round_pg_us_per_recipient": Input(25.2, f"{SCALE}: 245 us per event of 9.7 recipients"),
    "round_us_per_projection": Input(
        90,
        f"{SCALE}: thread.read, 40-49 us round + 40-42 us PostgreSQL (its one round trip,"
        " which the round waits for; 280-385 us wall under load)",
    ),
    "projection_pg_us": Input(41, f"{SCALE}: thread.read, PostgreSQL per event"),
    # The job runner.
    "push_cpu_us": Input(137.7, f"{PUSH_RUNS}: bench/push.py, daemon CPU per push (quiet)"),
    "push_pg_us": Input(55.8, f"{PUSH_RUNS}: bench/push.py, PostgreSQL CPU per push (quiet)"),
    # PostgreSQL, one primary.
    "pg_cpu_us_per_row_insert": Input(10.8, f"{CEILING}: insert_100"),
    "pg_cpu_us_per_row_update": Input(7.96, f"{CEILING}: update_100 (deletes taken alike)"),
    "pg_rows_per_s_measured": Input(52_513, f"{CEILING}: insert_100 rows/s on 2 shared cores"),
    "primary_cores": Input(64, "assumption: the biggest primary one would run"),
    "primary_efficiency": Input(0.6, "assumption: share of a primary's cores writes may use"),
}


def load_inputs(path: str | None) -> dict[str, float]:
    values = {name: i.value for name, i in INPUTS.items()}
    if path:
        given = json.loads(Path(path).read_text())
        unknown = sorted(set(given) - set(values))
        if unknown:
            raise SystemExit(f"unknown inputs: {', '.join(unknown)} (see --list)")
        for name, value in given.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise SystemExit(f"input {name}: a number is needed")
            values[name] = float(value)
    return values


def writes_per_event(v: dict[str, float]) -> dict[str, float]:
    """Rows written in PostgreSQL per event of each type, from the code (the lists in
    docs/scaling.md, "Writes per event")."""
    lifecycle = 3.0  # a job: claimed, completed (updates), pruned (delete)
    push_jobs = v["registrations_per_person"]
    hint_jobs = push_jobs + v["connections"] / v["people"]  # pushes + a gateway job if live
    per_push = 1.0  # a delivery stamps its registration (mark_delivered_many)
    opened = 1 - v["folded_share"]
    per_recipient = (
        opened * (hint_jobs * (1 + lifecycle) + push_jobs * per_push)  # the hint's jobs
        + opened * (1 + 1 + lifecycle)  # the window upsert, its flush job
        + v["folded_share"] * 1  # a folded message updates the window
        + opened * (1 + v["flush_hint_share"] * (hint_jobs * (1 + lifecycle) + push_jobs))
        # the flush: the window deleted, a hint with its jobs when something is unread
    )
    batch = 1 / v["batch_size"]  # the cursor, once per round
    return {
        "message.created": 1 + 1 + batch + v["recipients_per_message"] * per_recipient,
        "thread.read": 2 + batch,
        "thread.followed": 2 + batch,
        "member": 2 + batch,
        "user.upserted": 2 + batch,
        "device.upserted": 2 + batch,
        "hint.requested": 1
        + batch
        + v["recipients_per_app_hint"] * (1 + hint_jobs * (1 + lifecycle) + push_jobs),
    }


SHARES = {
    "message.created": "share_message",
    "thread.read": "share_read",
    "thread.followed": "share_follow",
    "member": "share_member",
    "user.upserted": "share_user",
    "device.upserted": "share_device",
    "hint.requested": "share_app_hint",
}


def model(v: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rate = {t: v["events_per_s"] * v[s] for t, s in SHARES.items()}
    live = v["connections"] / v["people"]
    opened = 1 - v["folded_share"]
    # Hints decided per second and the jobs they make.
    message_hints = rate["message.created"] * v["recipients_per_message"] * opened
    flush_hints = message_hints * v["flush_hint_share"]
    app_hints = rate["hint.requested"] * v["recipients_per_app_hint"]
    hints = message_hints + flush_hints + app_hints
    pushes = hints * v["registrations_per_person"]
    gateway_hints = hints * live
    flush_jobs = message_hints
    jobs = pushes + gateway_hints + flush_jobs
    out["hints_per_s"] = round(hints)
    out["jobs_per_s"] = round(jobs)
    out["pushes_per_s"] = round(pushes)
    # Gateway: pings, identifies, CPU, memory, processes.
    pings = v["connections"] / v["heartbeat_s"]
    identifies = v["connections"] / v["connection_lifetime_s"]
    identify_us = v["cpu_us_per_identify"]
    gateway_cores = (
        v["connections"] * v["idle_cpu_us_per_connection_s"]
        + pings * v["cpu_us_per_ping"]
        + identifies * identify_us
        + gateway_hints * v["gateway_hint_cpu_us"]
    ) / 1e6
    out["gateway"] = {
        "pings_per_s": round(pings),
        "ping_cores": round(pings * v["cpu_us_per_ping"] / 1e6, 2),
        "idle_cores": round(v["connections"] * v["idle_cpu_us_per_connection_s"] / 1e6, 2),
        "identify_cores": round(identifies * identify_us / 1e6, 2),
        "hint_cores": round(gateway_hints * v["gateway_hint_cpu_us"] / 1e6, 2),
        "cores": round(gateway_cores, 1),
        "memory_gb": round(v["connections"] * v["kb_per_connection"] / 1e6, 1),
        "processes": max(
            math.ceil(v["connections"] / v["connections_per_process"]),
            math.ceil(gateway_cores / v["usable_core_share"]),
        ),
    }
    storm_processes = out["gateway"]["processes"]
    storm_rate = storm_processes * v["identifies_per_s_per_process"]
    out["gateway"]["reconnect_storm_s"] = round(v["connections"] / storm_rate, 1)
    out["gateway"]["reconnect_storm_pg_cores"] = round(storm_rate * v["identify_pg_us"] / 1e6, 1)
    # The HTTP path.
    http_cores = v["events_per_s"] * v["http_cpu_ms_per_event"] / 1e3
    out["api"] = {
        "cores": round(http_cores, 1),
        "processes": math.ceil(http_cores / v["usable_core_share"]),
    }
    # The round: one thread across the cluster. It decides every recipient of a
    # message (folded or not) and of an app hint; the flushes' hints are decided by
    # the runners' flush jobs.
    decided = rate["message.created"] * v["recipients_per_message"] + app_hints
    projections = v["events_per_s"] - rate["message.created"] - rate["hint.requested"]
    round_thread = (
        decided * v["round_python_us_per_recipient"] + projections * v["round_us_per_projection"]
    ) / 1e6
    out["round"] = {
        "recipients_per_s": round(decided),
        "thread_load": round(round_thread, 2),
        "max_events_per_s": round(v["events_per_s"] / round_thread) if round_thread else None,
    }
    # The runner: push sends, and the flushes deciding their hints (gateway sends are
    # counted with the gateway).
    runner_cores = (
        pushes * v["push_cpu_us"] + flush_jobs * v["round_python_us_per_recipient"]
    ) / 1e6
    out["runner"] = {
        "cores": round(runner_cores, 1),
        "processes": math.ceil(runner_cores / v["usable_core_share"]),
    }
    # PostgreSQL: rows written, and CPU against one primary.
    per_event = writes_per_event(v)
    rows = sum(rate[t] * per_event[t] for t in per_event) + identifies  # identify: device row
    row_us = (v["pg_cpu_us_per_row_insert"] + v["pg_cpu_us_per_row_update"]) / 2
    round_backend = (  # one connection
        decided * v["round_pg_us_per_recipient"] + projections * v["projection_pg_us"]
    ) / 1e6
    pg_cores = (
        v["events_per_s"] * v["append_pg_us_per_event"]
        + (decided + flush_jobs) * v["round_pg_us_per_recipient"]
        + pushes * v["push_pg_us"]
        + identifies * v["identify_pg_us"]
        + projections * v["projection_pg_us"]
    ) / 1e6
    primary = v["primary_cores"] * v["primary_efficiency"]
    out["postgres"] = {
        "writes_per_event": {t: round(n, 2) for t, n in per_event.items()},
        "rows_per_s": round(rows),
        "row_cores": round(rows * row_us / 1e6, 1),
        "cores": round(pg_cores, 1),
        "primary_usable_cores": round(primary, 1),
        "primary_load": round(pg_cores / primary, 2),
        "rows_ceiling_per_s": round(primary * 1e6 / row_us),
        "round_backend_load": round(round_backend, 2),
    }
    # What breaks first: the parts of which there is exactly one.
    single = {
        "the round (one thread)": round_thread,
        "the round's PostgreSQL backend (one process)": round_backend,
        "one PostgreSQL primary": pg_cores / primary,
    }
    out["first_to_break"] = max(single, key=lambda k: single[k])
    out["single_instance_load"] = {k: round(x, 2) for k, x in single.items()}
    return out


def print_model(v: dict[str, float], out: dict[str, Any]) -> None:
    print(
        f"deployment: {v['people']:,.0f} people, {v['connections']:,.0f} connections,"
        f" {v['events_per_s']:,.0f} events/s"
    )
    print(
        f"hints {out['hints_per_s']:,}/s, jobs {out['jobs_per_s']:,}/s,"
        f" pushes {out['pushes_per_s']:,}/s"
    )
    g = out["gateway"]
    print(
        f"gateway: {g['pings_per_s']:,} pings/s = {g['ping_cores']} cores; idle {g['idle_cores']};"
        f" identifies {g['identify_cores']}; hints {g['hint_cores']}; in all {g['cores']} cores,"
        f" {g['memory_gb']} GB, {g['processes']} processes; a reconnect storm of every"
        f" connection: {g['reconnect_storm_s']} s, {g['reconnect_storm_pg_cores']} PostgreSQL"
        " cores meanwhile"
    )
    print(f"HTTP appends: {out['api']['cores']} cores, {out['api']['processes']} processes")
    r = out["round"]
    print(
        f"round: {r['recipients_per_s']:,} recipients/s = {r['thread_load']} of its one thread"
        f" (breaks above 1); at most {r['max_events_per_s']:,} events/s of this mix"
    )
    print(f"runner: {out['runner']['cores']} cores, {out['runner']['processes']} processes")
    p = out["postgres"]
    print("PostgreSQL rows written per event:")
    for t, n in p["writes_per_event"].items():
        print(f"  {t:16s} {n:7.2f}")
    print(
        f"PostgreSQL: {p['rows_per_s']:,} rows/s ({p['row_cores']} cores at the measured cost"
        f" per row); {p['cores']} cores in all against {p['primary_usable_cores']} usable on one"
        f" primary: load {p['primary_load']}; the round's own backend: {p['round_backend_load']}"
        " of one core"
    )
    print(f"first to break: {out['first_to_break']} ({out['single_instance_load']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", metavar="FILE", help="JSON object: input name -> number")
    parser.add_argument("--list", action="store_true", help="print every input and its source")
    args = parser.parse_args()
    values = load_inputs(args.inputs)
    if args.list:
        for name, given in INPUTS.items():
            print(f"{name:32s} {values[name]:>14,.2f}  {given.source}")
    out = model(values)
    print_model(values, out)
    report("capacity", inputs=values, **out)


if __name__ == "__main__":
    main()
