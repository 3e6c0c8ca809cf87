"""The real-process cluster tests share the fault tests' harness: one PostgreSQL for
the module, a fresh database per test, daemons as child processes on it."""

from __future__ import annotations

from tests.faults.conftest import daemons, fault_db, pg_cluster

__all__ = ["daemons", "fault_db", "pg_cluster"]
