"""The metrics registry: every Prometheus metric the daemon exports, in one place.

Each daemon instance owns one :class:`Metrics` with its own
:class:`~prometheus_client.CollectorRegistry`, so two instances in one process
(tests) never share counters. Label values are closed sets (reasons,
providers, outcomes, phases, job kinds): never a person, device, thread, token
or URL.

**Several node processes** (``server.processes > 1``): the parent gives every
child the same directory in ``PROMETHEUS_MULTIPROC_DIR`` (read by
``prometheus_client`` when it is imported), each child's values live in files
there, and :meth:`Metrics.render` on any child answers for all of them
(prometheus_client's multiprocess mode): counters and histograms are the sums
over every process that ran, the processes that died and were restarted
included (so they never go down); each gauge says how it combines
(``multiprocess_mode``, ignored by a single process): connections add up over
the live processes, ``bothy_consumer_holder`` is shown per live process with a
``pid`` label, and gauges every process reads from the same database (lag,
depth, nodes) show the value written last by a live process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from bothy_notify.kernel.results import SkipReason

# The *_created series double every counter's output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

SKIP_REASONS = tuple(reason.value for reason in SkipReason)
"""Why a hint or a send stopped; the values of ``bothy_push_skipped_total{reason}``."""

REGISTRATION_ACTIONS = ("registered", "restored", "invalidated", "expired", "deleted")
"""What happened to push registrations; the values of ``bothy_registrations_total{action}``."""
INVALIDATION_CAUSES = ("dead", "strikes", "device_revoked", "not_renewed")
"""Why registrations were invalidated; ``bothy_registrations_invalidated_total{cause}``."""
TOPIC_RECIPIENT_ACTIONS = ("registered", "unregistered", "expired", "dead")
"""Values of ``bothy_topic_recipients_total{action}``."""
TOPIC_OUTCOMES = ("delivered", "failed", "rejected", "mismatch", "dead", "suppressed")
"""Values of ``bothy_topic_deliveries_total{outcome}``."""

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The environment variable of prometheus_client's multiprocess mode (set by the
parent of ``server.processes`` for its children)."""

SHARED: Final = "livemostrecent"
"""Gauges every process measures from the same database: the value written last
by a live process (a single process ignores the mode)."""

_M = TypeVar("_M", bound=MetricWrapperBase)


class Children(Generic[_M]):
    """The labelled children of one metric, each looked up once.

    ``prometheus_client``'s ``labels()`` validates and joins the label values and
    takes a lock on every call (it showed in ``bench/push.py``'s profile); a hot
    path keeps the child instead. Label values
    are closed sets, so the cache stays small.
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: _M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], _M] = {}

    def __repr__(self) -> str:
        return f"Children(children={len(self._children)})"

    def __call__(self, *values: str) -> _M:
        """The child for ``values`` (the metric's label values, in order)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


_DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600)


class Metrics:
    """All metrics of one daemon instance."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.push_skipped = Counter(
            "bothy_push_skipped", "Hints or sends that stopped, by reason.", ["reason"], registry=r
        )
        for reason in SKIP_REASONS:
            self.push_skipped.labels(reason)
        self.push_sends = Counter(
            "bothy_push_sends",
            "Provider sends by provider, outcome and app (an operator-configured app id,"
            " default for a provider without apps).",
            ["provider", "outcome", "app"],
            registry=r,
        )
        self.push_held = Counter(
            "bothy_push_held",
            "Pushes held while their person was in quiet hours, by category.",
            ["category"],
            registry=r,
        )
        self.quiet_summaries = Counter(
            "bothy_quiet_summaries",
            "Ends of quiet periods that held pushes: sent (a summary push to each"
            " registration) or nothing_unread (everything held was read meanwhile).",
            ["result"],
            registry=r,
        )
        for result in ("sent", "nothing_unread"):
            self.quiet_summaries.labels(result)
        self.delivery_seconds = Histogram(
            "bothy_delivery_seconds",
            "From the event's append to the frame written or the provider's answer.",
            ["route"],
            buckets=_DELIVERY_BUCKETS,
            registry=r,
        )
        self.gateway_connections = Gauge(
            "bothy_gateway_connections",
            "Gateway connections by phase.",
            ["phase"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.gateway_dropped = Counter(
            "bothy_gateway_dropped",
            "Ephemeral frames dropped by the gateway, by reason.",
            ["reason"],
            registry=r,
        )
        self.gateway_closed = Counter(
            "bothy_gateway_closed",
            "Gateway connections closed, by close code.",
            ["code"],
            registry=r,
        )
        self.gateway_rate_limited = Counter(
            "bothy_gateway_rate_limited",
            "Gateway connections closed with 4029: frames past sync.ops_per_second.",
            registry=r,
        )
        self.hints = Counter(
            "bothy_hints",
            "Hints decided with at least one route, by kind class.",
            ["kind"],
            registry=r,
        )
        self.hints_coalesced = Counter(
            "bothy_hints_coalesced",
            "Messages folded into an open coalescing window instead of a hint.",
            registry=r,
        )
        self.hints_deduplicated = Counter(
            "bothy_hints_deduplicated",
            "App hint recipients skipped because the same request reached them before.",
            registry=r,
        )
        self.group_mentions_refused = Counter(
            "bothy_group_mentions_refused",
            "Group mentions (mention_groups all or here) whose audience was larger than"
            " notify.group_mention_limit, so they added nobody.",
            registry=r,
        )
        self.events_appended = Counter(
            "bothy_events_appended", "Events appended through the HTTP API.", registry=r
        )
        self.events_consumed = Counter(
            "bothy_events_consumed", "Events the consumer round applied and decided.", registry=r
        )
        self.consumer_holder = Gauge(
            "bothy_consumer_holder",
            "1 on the node holding the consumer round.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.consumer_lock_attempts = Counter(
            "bothy_consumer_lock_attempts",
            "Tries of this node to take the consumer round's lock (taken or not).",
            registry=r,
        )
        self.consumer_lag_events = Gauge(
            "bothy_consumer_lag_events",
            "Events appended but not yet consumed.",
            registry=r,
            multiprocess_mode=SHARED,
        )
        self.consumer_blocked_seconds = Gauge(
            "bothy_consumer_blocked_seconds",
            "How long the round has waited for committed events behind an older running"
            " transaction (0 when not blocked).",
            registry=r,
            multiprocess_mode=SHARED,
        )
        self.events_dead_lettered = Counter(
            "bothy_events_dead_lettered",
            "Events the round could not apply or decide, set aside in bothy.dead_letters,"
            " by type (known types by name, any other as 'unknown').",
            ["type"],
            registry=r,
        )
        self.service_restarts = Counter(
            "bothy_service_restarts",
            "Long-running services restarted after a failure, by service.",
            ["service"],
            registry=r,
        )
        self.consumer_lag_seconds = Gauge(
            "bothy_consumer_lag_seconds",
            "Age of the oldest event not yet consumed (0 when caught up).",
            registry=r,
            multiprocess_mode=SHARED,
        )
        self.jobs_depth = Gauge(
            "bothy_jobs_depth",
            "Jobs in the queue by kind and state.",
            ["kind", "state"],
            registry=r,
            multiprocess_mode=SHARED,
        )
        self._jobs_depth_seen: set[tuple[str, str]] = set()
        self.jobs_lag_seconds = Gauge(
            "bothy_jobs_lag_seconds",
            "How long the oldest due job has waited past its scheduled time.",
            registry=r,
            multiprocess_mode=SHARED,
        )
        self.jobs_finished = Counter(
            "bothy_jobs_finished",
            "Job attempts finished, by kind and result.",
            ["kind", "result"],
            registry=r,
        )
        self.jobs_rescued = Counter(
            "bothy_jobs_rescued",
            "Running jobs whose lease ran out (their runner stopped, or lost the database"
            " before recording them), by outcome: made available again or failed.",
            ["outcome"],
            registry=r,
        )
        for outcome in ("again", "failed"):
            self.jobs_rescued.labels(outcome)
        self.registrations = Counter(
            "bothy_registrations",
            "Push registrations registered, restored, invalidated, expired or deleted.",
            ["action"],
            registry=r,
        )
        for action in REGISTRATION_ACTIONS:
            self.registrations.labels(action)
        self.cluster_nodes = Gauge(
            "bothy_cluster_nodes",
            "Live nodes this node sees in the registry, by role (cluster.mode multi).",
            ["role"],
            registry=r,
            multiprocess_mode=SHARED,
        )
        self.cluster_heartbeat_failures = Counter(
            "bothy_cluster_heartbeat_failures",
            "Heartbeats of this node that could not be written.",
            registry=r,
        )
        self.presence_writes = Counter(
            "bothy_cluster_presence_writes",
            "Batches of presence facts this node wrote to the database.",
            registry=r,
        )
        self.presence_rows = Counter(
            "bothy_cluster_presence_rows",
            "Presence entries this node wrote (one per live device of a changed person).",
            registry=r,
        )
        self.presence_cpu_seconds = Counter(
            "bothy_cluster_presence_cpu_seconds",
            "CPU time the presence publisher used (snapshot, encoding and write).",
            registry=r,
        )
        self.registrations_invalidated = Counter(
            "bothy_registrations_invalidated",
            "Push registrations invalidated, by cause (dead, strikes, device_revoked,"
            " not_renewed).",
            ["cause"],
            registry=r,
        )
        self.readiness_check = Gauge(
            "bothy_readiness_check",
            "1 while a check of /readyz is true, 0 while it is false, by check (database,"
            " round, runner, ...); refreshed every few seconds.",
            ["check"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self.catalogue_invalid_files = Gauge(
            "bothy_catalogue_invalid_files",
            "Kinds files of notify.kinds_dir refused now (their app keeps its last good kinds).",
            registry=r,
            multiprocess_mode=SHARED,
        )

        # Topic mode (docs/topics.md). Labels: channel in apns, fcm, webhook, fake.
        self.topic_deliveries = Counter(
            "bothy_topic_deliveries",
            "Topic-mode deliveries by channel and outcome (delivered, failed, rejected,"
            " mismatch, dead, suppressed).",
            ["channel", "outcome"],
            registry=r,
        )
        self.topic_recipients = Counter(
            "bothy_topic_recipients",
            "Topic-mode recipients by action (registered, unregistered, expired, dead).",
            ["action"],
            registry=r,
        )
        for action in TOPIC_RECIPIENT_ACTIONS:
            self.topic_recipients.labels(action)
        self.topic_subscriptions = Counter(
            "bothy_topic_subscriptions",
            "Topic-mode subscriptions by action (added, removed).",
            ["action"],
            registry=r,
        )
        for action in ("added", "removed"):
            self.topic_subscriptions.labels(action)

        # The Matrix push gateway (SPEC section 14c). Labels: app, a Matrix app id of
        # [matrix_gateway] apps (a closed set from the configuration; unknown for any
        # other); outcome, a bothy_notify.matrix.gateway.MatrixOutcome.
        self.matrix_notifications = Counter(
            "bothy_matrix_notifications",
            "Devices of the Matrix push gateway's notify requests by app and outcome"
            " (delivered, rejected, refused, pending, duplicate).",
            ["app", "outcome"],
            registry=r,
        )
        self.matrix_requests = Counter(
            "bothy_matrix_requests",
            "Notify requests of the Matrix push gateway by answer (ok, bad_json,"
            " rate_limited, unavailable).",
            ["answer"],
            registry=r,
        )

    def skip(self, reason: SkipReason, amount: int = 1) -> None:
        """Count ``amount`` skips with ``reason``."""
        if amount:
            self.push_skipped.labels(reason).inc(amount)

    def registration(self, action: str, amount: int = 1, *, cause: str | None = None) -> None:
        """Count ``amount`` registrations with ``action`` (one of
        :data:`REGISTRATION_ACTIONS`); an invalidation also counts its ``cause``
        (one of :data:`INVALIDATION_CAUSES`)."""
        if amount:
            self.registrations.labels(action).inc(amount)
            if cause is not None:
                self.registrations_invalidated.labels(cause).inc(amount)

    def set_jobs_depth(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Set ``bothy_jobs_depth{kind,state}`` to ``counts``; a (kind, state) seen
        before and absent now is set to 0 (rather than removed: in multiprocess
        mode a removed child would keep its last value in the files)."""
        for key in self._jobs_depth_seen - counts.keys():
            self.jobs_depth.labels(*key).set(0)
        for (kind, state), n in counts.items():
            self.jobs_depth.labels(kind, state).set(n)
        self._jobs_depth_seen |= counts.keys()

    def skipped(self, reason: str) -> float:
        """The current value of ``bothy_push_skipped_total{reason}`` (tests, demo)."""
        return float(self.push_skipped.labels(reason)._value.get())

    def render(self) -> bytes:
        """The registry in the Prometheus text format; in multiprocess mode (see the
        module docstring) every process's values, combined."""
        directory = os.environ.get(MULTIPROCESS_DIR_ENV)
        if not directory:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(combined)
