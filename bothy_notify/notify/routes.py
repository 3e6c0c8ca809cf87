"""Routes become jobs: immediate pushes, gateway hints and delayed pushes.

The round (and the flush job) turn each :class:`Delivery` into jobs
(:class:`HintJobs`) that commit in their own transaction; nothing leaves the
process before the commit. Immediate push routes always become
``notify.push_send`` jobs. Gateway and
delayed routes go through the :class:`LiveRoutes` port, whose implementation
depends on the role (``docs/architecture.md``, role table):

- :class:`JobLiveRoutes` (role ``all``, and every deciding node of a
  ``cluster.mode = "multi"`` cluster): one unique ``notify.gateway_send`` per
  (hint, recipient), and in a cluster one per (hint, recipient, node holding
  a live connection of the recipient), targeted at that node so that only it
  runs the job; one ``notify.push_send`` per registration of a delayed route,
  scheduled at the end of the delay with ``release_seq`` = the message's
  thread sequence.
- Every job of a hint carries the hint's ``mv`` (the catalogue version fixed
  when it was decided), so all its copies show the same version.
- :class:`FailClosedRoutes` (role ``worker`` of a single-mode setup): without
  presence the decision never yields such routes; if one arrives anyway it is
  dropped and logged rather than sent to the wrong place.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Protocol

import orjson

from bothy_notify.kernel.clock import to_unix_micros
from bothy_notify.notify.domain import Delivery, Hint, Route, Via
from bothy_notify.notify.jobs.args import GATEWAY_SEND, PUSH_SEND, GatewaySendArgs
from bothy_notify.store.jobs import JobSpec, JobWriter

log = logging.getLogger("bothy.notify.routes")

GATEWAY_SEND_MAX_ATTEMPTS = 3
"""A gateway publish fails only on a programming fault; three tries show it in metrics."""


class LiveRoutes(Protocol):
    """Turns gateway and delayed routes into jobs (inside the caller's transaction)."""

    def gateway(
        self,
        hint: Hint,
        delivery: Delivery,
        *,
        now: datetime,
        appended_at: datetime,
        nodes: Collection[str] = (),
    ) -> Sequence[JobSpec]:
        """The job(s) for the gateway routes of ``delivery``.

        ``nodes`` are the nodes holding the routed live connections (a cluster):
        one job per node, each run only there. Empty (a single node): one job
        for whichever node runs it.
        """
        ...

    def delayed(
        self,
        hint: Hint,
        delivery: Delivery,
        route: Route,
        *,
        now: datetime,
        appended_at: datetime,
    ) -> Sequence[JobSpec]:
        """The job(s) for one delayed push route."""
        ...


def push_jobs(
    hint: Hint,
    delivery: Delivery,
    route: Route,
    *,
    scheduled_at: datetime,
    release_seq: int,
    appended_at: datetime,
    max_attempts: int,
) -> list[JobSpec]:
    """One ``notify.push_send`` per registration of ``route``.

    The args are the fields of :class:`PushSendArgs`, built as a plain dict because
    this is the round's hottest line (one per recipient device).
    """
    base: dict[str, int | str] = {
        "nid": hint.nid,
        "user_id": delivery.user_id,
        "kind": delivery.kind,
        "category": delivery.category,
        "count": delivery.count,
        "quiet": int(delivery.quiet),
        "due_at": to_unix_micros(scheduled_at),
        "appended_at": to_unix_micros(appended_at),
        "release_seq": release_seq,
    }
    if hint.thread_id is not None:
        base["thread_id"] = hint.thread_id
    if hint.message_id is not None:
        base["message_id"] = hint.message_id
    if hint.target_id is not None:
        base["target_id"] = hint.target_id
    if hint.mv is not None:
        base["mv"] = hint.mv
    return [
        JobSpec(PUSH_SEND, {**base, "registration_id": registration_id}, scheduled_at, max_attempts)
        for registration_id in route.registrations
    ]


class JobLiveRoutes:
    """The real live routes of role ``all``."""

    def __init__(self, *, push_max_attempts: int) -> None:
        self._push_max_attempts = push_max_attempts

    def gateway(
        self,
        hint: Hint,
        delivery: Delivery,
        *,
        now: datetime,
        appended_at: datetime,
        nodes: Collection[str] = (),
    ) -> Sequence[JobSpec]:
        args = GatewaySendArgs(
            nid=hint.nid,
            user_id=delivery.user_id,
            kind=delivery.kind,
            count=delivery.count,
            quiet=delivery.quiet or delivery.hushed,
            due_at=to_unix_micros(now),
            appended_at=to_unix_micros(appended_at),
            thread_id=hint.thread_id,
            message_id=hint.message_id,
            target_id=hint.target_id,
            mv=hint.mv,
        )
        key = f"gw:{hint.nid}:{delivery.user_id}"
        if not nodes:
            return [JobSpec(GATEWAY_SEND, args.to_args(), now, GATEWAY_SEND_MAX_ATTEMPTS, key)]
        as_args = args.to_args()
        return [
            JobSpec(
                GATEWAY_SEND,
                as_args,
                now,
                GATEWAY_SEND_MAX_ATTEMPTS,
                unique_key=f"{key}:{node}",
                node_id=node,
            )
            for node in sorted(nodes)
        ]

    def delayed(
        self,
        hint: Hint,
        delivery: Delivery,
        route: Route,
        *,
        now: datetime,
        appended_at: datetime,
    ) -> Sequence[JobSpec]:
        return push_jobs(
            hint,
            delivery,
            route,
            scheduled_at=now + route.delay,
            release_seq=hint.message_seq,
            appended_at=appended_at,
            max_attempts=self._push_max_attempts,
        )

    def __repr__(self) -> str:
        return "JobLiveRoutes()"


class FailClosedRoutes:
    """Live routes of a node without presence: drop and log, never guess."""

    def __init__(self) -> None:
        self._warned = False

    def _drop(self) -> Sequence[JobSpec]:
        if not self._warned:
            self._warned = True
            log.error("a live route reached a node without presence; dropped")
        return ()

    def gateway(
        self,
        hint: Hint,
        delivery: Delivery,
        *,
        now: datetime,
        appended_at: datetime,
        nodes: Collection[str] = (),
    ) -> Sequence[JobSpec]:
        return self._drop()

    def delayed(
        self,
        hint: Hint,
        delivery: Delivery,
        route: Route,
        *,
        now: datetime,
        appended_at: datetime,
    ) -> Sequence[JobSpec]:
        return self._drop()

    def __repr__(self) -> str:
        return "FailClosedRoutes()"


class HintJobs:
    """Writes the jobs of one hint's deliveries: immediate pushes here, the rest
    through ``live``.

    An immediate push (one ``notify.push_send`` per registration of a ``push``
    route) is the round's most frequent job, so its args are encoded as JSON
    here: the part every job of the hint shares once per hint, each job adding
    the recipient, the registration, the kind, the count and the quiet flag,
    and go to the writer already encoded (:meth:`JobWriter.add_json`). They are
    exactly the args :func:`push_jobs` builds (a test compares the two). Gateway
    and delayed routes become :class:`JobSpec` through ``live``.

    Args:
        hint: the hint, with its ``mv`` fixed.
        live: how gateway and delayed routes become jobs.
        writer: where the jobs go, in the caller's transaction.
        now: the round's time; immediate pushes are due then.
        appended_at: when the hint's event was appended.
        push_max_attempts: ``push.max_attempts``.
        encoded: a cache of JSON-encoded strings (IDs, kinds) shared by the hints
            of one round, so a recipient's IDs are encoded once per round.
    """

    def __init__(
        self,
        hint: Hint,
        live: LiveRoutes,
        writer: JobWriter,
        *,
        now: datetime,
        appended_at: datetime,
        push_max_attempts: int,
        encoded: dict[str, bytes],
    ) -> None:
        self._hint = hint
        self._live = live
        self._writer = writer
        self._now = now
        self._appended_at = appended_at
        self._max_attempts = push_max_attempts
        self._encoded = encoded
        shared: dict[str, int | str] = {
            "nid": hint.nid,
            "due_at": to_unix_micros(now),
            "appended_at": to_unix_micros(appended_at),
            "release_seq": 0,
        }
        if hint.thread_id is not None:
            shared["thread_id"] = hint.thread_id
        if hint.message_id is not None:
            shared["message_id"] = hint.message_id
        if hint.target_id is not None:
            shared["target_id"] = hint.target_id
        if hint.mv is not None:
            shared["mv"] = hint.mv
        # '"nid":...}': the shared members and the closing brace, after each job's own.
        self._shared = orjson.dumps(shared)[1:]
        self._shape = writer.row_shape(PUSH_SEND, now, push_max_attempts)

    def __repr__(self) -> str:
        return "HintJobs()"

    def _json(self, value: str) -> bytes:
        encoded = self._encoded.get(value)
        if encoded is None:
            encoded = self._encoded[value] = orjson.dumps(value)
        return encoded

    def add(self, delivery: Delivery, holders: Mapping[str, str] | None = None) -> int:
        """Write every job of ``delivery``; returns how many.

        ``holders`` maps each of the recipient's live devices to the node holding
        its connection (a cluster's shared presence); ``None`` on a single node.
        """
        hint, writer, added = self._hint, self._writer, 0
        gateway_done = False
        for route in delivery.routes:
            if route.via is Via.PUSH:
                user, kind = self._json(delivery.user_id), self._json(delivery.kind)
                category = self._json(delivery.category)
                count, quiet, shared = delivery.count, delivery.quiet, self._shared
                for registration_id in route.registrations:
                    writer.add_json(
                        self._shape,
                        b'{"user_id":%s,"kind":%s,"category":%s,"count":%d,"quiet":%d,'
                        b'"registration_id":%s,%s'
                        % (user, kind, category, count, quiet, self._json(registration_id), shared),
                    )
                added += len(route.registrations)
                continue
            if route.via is Via.GATEWAY:
                if gateway_done:
                    continue
                gateway_done = True
                nodes: Collection[str] = ()
                if holders:
                    nodes = {
                        holders[r.device_id]
                        for r in delivery.routes
                        if r.via is Via.GATEWAY and r.device_id in holders
                    }
                specs = self._live.gateway(
                    hint, delivery, now=self._now, appended_at=self._appended_at, nodes=nodes
                )
            else:
                specs = self._live.delayed(
                    hint, delivery, route, now=self._now, appended_at=self._appended_at
                )
            writer.extend(specs)
            added += len(specs)
        return added
