"""The operator's status (``GET /v1/admin/status``): aggregates only.

What a node knows only of itself (connections by phase, whether it holds the
consumer round, its provider sends of the last 5 minutes and those in flight,
its skips by reason since it started, the events it decided, the Matrix push
gateway's devices by app and outcome and its requests by answer) is its
*snapshot* (:func:`node_snapshot`). In a cluster every node writes its snapshot
with its heartbeat (``bothy.nodes.stats``), and the answering node shows each
live node's last one beside its own fresh one; a single node shows itself.
What every node reads alike (consumer lag, jobs, registrations, dead letters)
comes from the database at the time of the request.

Nothing in the answer names a person, device, thread, token or URL: the
values are counts under closed label sets (phases, skip reasons, job kinds and
states, providers and the apps of their configuration, registration states,
event types, outcome classes), times, node ids (UUIDv7s made at each process
start) and roles (``tests/api/test_admin.py`` walks the JSON).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import trio
from prometheus_client.metrics import MetricWrapperBase

from bothy_notify.kernel.metrics import SKIP_REASONS, Metrics
from bothy_notify.push.recent import WINDOW_SECONDS, RecentSends
from bothy_notify.store import events as event_log
from bothy_notify.store import status as store_status
from bothy_notify.store.db import Conn, Database

PHASES = ("connecting", "catching_up", "live", "closing")
"""The gateway's phases (docs/protocol.md, "Phases")."""
REUSE_SECONDS = 1.0
"""A status computed less than this long ago is answered again: several open pages
(and the 2 s refresh of each) cost the database one set of queries a second."""
REGISTRATIONS_REUSE_SECONDS = 10.0
"""Registrations by state are counted over the whole table: at most this often."""


@dataclass
class StatusSource:
    """What the status needs of this node (built by ``wiring``).

    Attributes:
        node_id: this node's id (the registry's in a cluster).
        role: ``server.role``.
        multi: ``cluster.mode = "multi"``: the other nodes are read from the registry.
        node_timeout: a node without a heartbeat this long is not shown (``cluster.node_timeout``).
        snapshot: this node's aggregates now (:func:`node_snapshot`).
    """

    node_id: str
    role: str
    multi: bool
    node_timeout: timedelta
    snapshot: Callable[[], dict[str, Any]]

    def __post_init__(self) -> None:
        self._lock = trio.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._registrations: tuple[float, list[tuple[str, str, int]]] | None = None

    def __repr__(self) -> str:
        return f"StatusSource(role={self.role!r}, multi={self.multi})"

    async def status(self, db: Database, now: datetime) -> dict[str, Any]:
        """The status document, reused for :data:`REUSE_SECONDS` (callers that arrive
        while one is computed wait for it)."""
        async with self._lock:
            cached = self._cached
            if cached is not None and trio.current_time() - cached[0] < REUSE_SECONDS:
                return cached[1]
            body = await self._compute(db, now)
            self._cached = (trio.current_time(), body)
            return body

    def forget(self) -> None:
        """Compute afresh at the next request (after an action changed something)."""
        self._cached = None

    async def _compute(self, db: Database, now: datetime) -> dict[str, Any]:
        counted = self._registrations
        age = trio.current_time() - counted[0] if counted is not None else None
        fresh = age is not None and age < REGISTRATIONS_REUSE_SECONDS
        since = now - self.node_timeout

        def read(conn: Conn) -> tuple[Any, ...]:
            return (
                store_status.nodes(conn, since=since) if self.multi else [],
                event_log.lag(conn),
                store_status.jobs(conn, now=now),
                None if fresh else store_status.registrations(conn),
                store_status.dead_letters(conn),
            )

        rows, lag, jobs, registrations, dead = await db.run(read, transaction=False)
        if registrations is None:
            assert counted is not None
            registrations = counted[1]
        else:
            self._registrations = (trio.current_time(), registrations)
        local = self.snapshot()
        nodes = [self._node(row, local, now) for row in rows] if self.multi else []
        if not any(n["this"] for n in nodes):
            # A single node, or one whose row is missing right now (it rejoins at the
            # next heartbeat): it still shows itself.
            nodes.insert(0, _node_entry(self.node_id, self.role, now, now, local, this=True))
        return {
            "generated_at": _iso(now),
            "cluster_mode": "multi" if self.multi else "single",
            "nodes": nodes,
            "connections": _sum_maps(n["connections"] for n in nodes),
            "consumer": {
                "lag_events": lag.events,
                "lag_seconds": _age(lag.oldest, now) if lag.events else 0.0,
                "holder": next((n["node_id"] for n in nodes if n["holds_round"]), None),
                "events_decided": sum(n["events_decided"] for n in nodes),
            },
            "jobs": [
                {
                    "kind": j.kind,
                    "state": j.state,
                    "count": j.count,
                    "due": j.due,
                    "oldest_due_seconds": _age(j.oldest_due_at, now) if j.oldest_due_at else None,
                }
                for j in jobs
            ],
            "providers": _merge_providers(nodes, now),
            "registrations": [{"provider": p, "state": s, "count": n} for p, s, n in registrations],
            "dead_letters": {
                "count": dead.count,
                "newest_seconds": _age(dead.newest_at, now) if dead.newest_at else None,
                "types": [
                    {"type": t, "count": n, "newest_seconds": _age(at, now)}
                    for t, n, at in dead.types
                ],
            },
            "skips": _sum_maps(n["skips"] for n in nodes),
            "matrix": _merge_matrix(nodes),
            "window_seconds": WINDOW_SECONDS,
        }

    def _node(
        self, row: store_status.NodeStatus, local: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        this = row.node_id == self.node_id
        stats = local if this else (row.stats or {})
        return _node_entry(row.node_id, row.role, row.seen_at, now, stats, this=this)


def _node_entry(
    node_id: str,
    role: str,
    seen_at: datetime,
    now: datetime,
    stats: Mapping[str, Any],
    *,
    this: bool,
) -> dict[str, Any]:
    connections = {phase: int(stats.get("connections", {}).get(phase, 0)) for phase in PHASES}
    return {
        "node_id": node_id,
        "this": this,
        "role": role,
        "last_heartbeat": _iso(seen_at),
        "heartbeat_age_seconds": _age(seen_at, now),
        "ready": bool(stats.get("ready", False)),
        "holds_round": bool(stats.get("holds_round", False)),
        "connections": connections,
        "events_decided": int(stats.get("events_decided", 0)),
        "skips": {str(k): int(v) for k, v in dict(stats.get("skips", {})).items()},
        "providers": list(stats.get("providers", [])),
        "matrix": dict(stats.get("matrix", {})),
    }


def node_snapshot(
    metrics: Metrics,
    recent: RecentSends,
    in_flight: Mapping[str, int],
    *,
    ready: bool,
) -> dict[str, Any]:
    """This node's aggregates (JSON-ready): read from its own metrics and sends."""
    connections = dict.fromkeys(PHASES, 0)
    for labels, value in _samples(metrics.gateway_connections):
        if labels.get("phase") in connections:
            connections[labels["phase"]] = int(value)
    skips = dict.fromkeys(SKIP_REASONS, 0)
    for labels, value in _samples(metrics.push_skipped):
        reason = labels.get("reason", "")
        skips[reason] = skips.get(reason, 0) + int(value)
    holder = max((v for _l, v in _samples(metrics.consumer_holder)), default=0.0)
    decided = sum(v for _l, v in _samples(metrics.events_consumed))
    windows: dict[str, list[dict[str, Any]]] = {name: [] for name in in_flight}
    for w in recent.snapshot():
        windows.setdefault(w.provider, []).append(
            {
                "app": w.app,
                "sends": dict(w.sends),
                "last_error": w.last_error,
                "last_error_at": w.last_error_at,
            }
        )
    matrix: dict[str, dict[str, int]] = {}
    for labels, value in _samples(metrics.matrix_notifications):
        outcomes = matrix.setdefault(labels.get("app", ""), {})
        outcomes[labels.get("outcome", "")] = int(value)
    requests = {labels.get("answer", ""): int(v) for labels, v in _samples(metrics.matrix_requests)}
    return {
        "ready": ready,
        "holds_round": holder >= 1,
        "connections": connections,
        "events_decided": int(decided),
        "skips": skips,
        "matrix": {"apps": matrix, "requests": requests},
        "providers": [
            {"provider": name, "in_flight": int(in_flight.get(name, 0)), "apps": apps}
            for name, apps in sorted(windows.items())
        ],
    }


def _samples(metric: MetricWrapperBase) -> Iterator[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of this process's ``metric``."""
    for family in metric.collect():
        for sample in family.samples:
            yield dict(sample.labels), float(sample.value)


def _merge_providers(nodes: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Providers over every node: sends and in-flight summed, the newest last error."""
    merged: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for entry in node["providers"]:
            name = str(entry.get("provider", ""))
            provider = merged.setdefault(name, {"provider": name, "in_flight": 0, "apps": {}})
            provider["in_flight"] += int(entry.get("in_flight", 0))
            for app in entry.get("apps", []):
                key = app.get("app")
                into = provider["apps"].setdefault(
                    key, {"app": key, "sends": {}, "last_error": None, "last_error_at": None}
                )
                for outcome, n in dict(app.get("sends", {})).items():
                    into["sends"][str(outcome)] = into["sends"].get(str(outcome), 0) + int(n)
                at = app.get("last_error_at")
                if at is not None and (into["last_error_at"] is None or at > into["last_error_at"]):
                    into["last_error"], into["last_error_at"] = app.get("last_error"), at
    out = []
    for name in sorted(merged):
        provider = merged[name]
        apps = []
        for app in sorted(provider["apps"].values(), key=lambda a: a["app"] or ""):
            at = app.pop("last_error_at")
            app["sent"] = sum(app["sends"].values())
            app["last_error_seconds"] = (
                max(0.0, round(now.timestamp() - at, 3)) if at is not None else None
            )
            apps.append(app)
        out.append({"provider": name, "in_flight": provider["in_flight"], "apps": apps})
    for node in nodes:
        del node["providers"]
    return out


def _merge_matrix(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The Matrix push gateway's traffic since the nodes started, over every node: the
    devices of its notify requests by configured app and outcome, and the requests by
    answer (empty where no node serves the gateway)."""
    apps: dict[str, dict[str, int]] = {}
    requests: dict[str, int] = {}
    for node in nodes:
        found = node.pop("matrix", {})
        for app, outcomes in dict(found.get("apps", {})).items():
            into = apps.setdefault(str(app), {})
            for outcome, n in dict(outcomes).items():
                into[str(outcome)] = into.get(str(outcome), 0) + int(n)
        for answer, n in dict(found.get("requests", {})).items():
            requests[str(answer)] = requests.get(str(answer), 0) + int(n)
    return {
        "apps": [
            {"app": app, "devices": sum(outcomes.values()), "outcomes": outcomes}
            for app, outcomes in sorted(apps.items())
        ],
        "requests": requests,
    }


def _sum_maps(maps: Iterator[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for m in maps:
        for key, n in m.items():
            total[key] = total.get(key, 0) + int(n)
    return total


def _age(when: datetime | None, now: datetime) -> float:
    if when is None:
        return 0.0
    return max(0.0, round((now - when).total_seconds(), 3))


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
