"""The metrics registry's own rules (label sets, gauges shared by processes)."""

from __future__ import annotations

from bothy_notify.kernel.metrics import Metrics


def depth(metrics: Metrics, kind: str, state: str) -> float | None:
    return metrics.registry.get_sample_value("bothy_jobs_depth", {"kind": kind, "state": state})


def test_a_job_state_that_empties_reads_zero_rather_than_its_last_depth() -> None:
    metrics = Metrics()
    metrics.set_jobs_depth({("notify.push_send", "running"): 3, ("notify.flush", "available"): 1})
    metrics.set_jobs_depth({("notify.flush", "available"): 2})
    assert depth(metrics, "notify.push_send", "running") == 0
    assert depth(metrics, "notify.flush", "available") == 2
    assert depth(metrics, "notify.gateway_send", "running") is None  # never seen: absent
