"""Schemathesis against a running daemon, driven by the document it serves.

:func:`run_contract` reads ``GET /v1/openapi.json`` from the daemon and runs
schemathesis' engine on it exactly as ``schemathesis run`` does: every phase
(examples, coverage, fuzzing, and the stateful phase that follows the
document's links) and every check, each operation in valid and invalid
requests. It knows nothing about the operations themselves:

- credentials are per security scheme of the document (``deviceToken``,
  ``producerToken``, ``operatorToken``); a scheme without one stops the run
  before it starts, naming it;
- data a request needs that the API's own operations cannot make (a thread
  the person may read: threads come from the producer's events) comes from
  fixtures keyed by path parameter name (:data:`tests.contract.fixtures.FIXTURES`),
  whose values become the parameter's ``examples`` in the document the run
  reads, so the examples and coverage phases use them; values holding a
  condition no schema can say (a browser's key on the P-256 curve) come from
  fixtures keyed by schema component (:data:`tests.contract.fixtures.SCHEMA_FIXTURES`),
  which the component takes as an ``enum`` beside its own schema;
- resources the API makes (registrations, recipients, subscriptions) come from
  the document's ``links``, which the stateful phase follows: a registration is
  deleted after it was created, a recipient's subscriptions are changed after it
  registered.

The report says, per operation, every status it answered, and lists every
failure (a failed check or an error of the engine).
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema

from bothy_notify.kernel.ids import new_id

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

NEGATIVE_REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429"]
"""Statuses that refuse an invalid request: schemathesis' defaults, nothing added (a
batch over ``server.max_batch_events``, the served document's ``maxItems``, is a
422 like any other body against the schema; 413 is for bodies over
``server.max_body_bytes``, which no generated body reaches)."""


REQUEST_TIMEOUT = 30
"""Seconds one request may take before it counts as a failure: every answer comes in
milliseconds, but a machine running several suites at once stalls a process for
seconds (a stall is not a contract failure; a daemon that stops answering still is)."""


@dataclass
class ContractReport:
    """What a run found.

    Attributes:
        statuses: per operation (``"GET /v1/preferences"``), how often each
            status was answered.
        failures: one line per distinct failure (operation, check, title), with
            the number of cases and the first request that showed it.
        elapsed: seconds the engine ran.
        seed: the run's seed (set ``CONTRACT_SEED`` to repeat it).
    """

    statuses: dict[str, collections.Counter[int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    seed: int = 0
    phases: dict[str, float] = field(default_factory=dict)

    def operations(self) -> list[str]:
        return sorted(self.statuses)

    def without_2xx(self, operations: Sequence[str]) -> list[str]:
        """The operations of ``operations`` never answered with a 2xx."""
        return [
            op
            for op in operations
            if not any(200 <= s < 300 for s in self.statuses.get(op, collections.Counter()))
        ]

    def summary(self) -> str:
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
        lines = [
            f"schemathesis: {len(self.statuses)} operations in {self.elapsed:.1f} s ({phases})"
        ]
        for op in self.operations():
            counts = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses[op].items()))
            lines.append(f"  {op:<48} {counts}")
        lines.append(f"failures: {len(self.failures)} (seed {self.seed})")
        lines.extend(f"  {line}" for line in self.failures)
        return "\n".join(lines)


def documented_operations(document: Mapping[str, Any]) -> list[str]:
    """``"METHOD /path"`` of every operation of ``document``."""
    return sorted(
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    )


def with_fixture_examples(
    document: Mapping[str, Any],
    examples: Mapping[str, Sequence[Any]],
    schema_values: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """``document`` with ``examples[name]`` as the examples of every path parameter
    called ``name`` (resolved through ``#/components/parameters``), and each
    ``#/components/schemas/<name>`` of ``schema_values`` narrowed to an ``enum`` of
    its values (its own schema kept beside it)."""
    out = copy.deepcopy(dict(document))
    schemas = out["components"]["schemas"]
    for name, narrowed in (schema_values or {}).items():
        if name not in schemas:
            raise ValueError(f"a schema fixture names {name!r}, which the document lacks")
        schemas[name] = {**schemas[name], "enum": list(narrowed), "examples": list(narrowed)}
    shared = out.get("components", {}).get("parameters", {})
    for item in out["paths"].values():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            for parameter in operation.get("parameters", []):
                ref = parameter.get("$ref", "")
                target = shared[ref.rsplit("/", 1)[1]] if ref else parameter
                values = examples.get(target.get("name", ""))
                if target.get("in") == "path" and values:
                    target["examples"] = {
                        f"fixture-{i}": {"value": value} for i, value in enumerate(values)
                    }
    return out


def run_contract(
    api: str,
    *,
    bearer: Mapping[str, str],
    examples: Mapping[str, Sequence[Any]],
    schema_values: Mapping[str, Sequence[Any]] | None = None,
    max_examples: int,
    seed: int,
) -> tuple[dict[str, Any], ContractReport]:
    """Run every phase and check against the daemon at ``api`` (``http://host:port``).

    Args:
        api: the daemon's HTTP API.
        bearer: a token per security scheme of the document.
        examples: fixture values per path parameter name.
        schema_values: fixture values per schema component name.
        max_examples: hypothesis examples per operation and phase.
        seed: the run's seed.

    Returns:
        The document the run read (fixtures included) and the report.

    Raises:
        ValueError: a security scheme of the document has no token in ``bearer``.
    """
    served = httpx.get(f"{api}/v1/openapi.json", timeout=REQUEST_TIMEOUT).raise_for_status().json()
    missing = sorted(set(served["components"].get("securitySchemes", {})) - set(bearer))
    if missing:
        raise ValueError(f"give the contract run a token for the security schemes {missing}")
    document = with_fixture_examples(served, examples, schema_values)
    config = SchemathesisConfig.from_dict(
        {
            "seed": seed,
            "base-url": api,
            "continue-on-failure": True,
            "suppress-health-check": ["all"],
            "request-timeout": REQUEST_TIMEOUT,
            "generation": {"max-examples": max_examples, "database": "none"},
            "auth": {"openapi": {name: {"bearer": token} for name, token in bearer.items()}},
            "checks": {"negative_data_rejection": {"expected-statuses": NEGATIVE_REJECTIONS}},
        }
    )
    schema = schemathesis.openapi.from_dict(document, config=config)
    report = ContractReport(seed=seed)
    statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    failures: dict[tuple[str, str, str], list[Any]] = {}
    seen: set[tuple[str, str]] = set()
    started = time.monotonic()
    phase_started: dict[str, float] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseStarted):
            phase_started[event.phase.name.value] = time.monotonic()
        elif isinstance(event, events.PhaseFinished):
            name = event.phase.name.value
            report.phases[name] = time.monotonic() - phase_started.get(name, started)
        recorder = getattr(event, "recorder", None)
        if recorder is not None:
            _tally(recorder, statuses, failures, seen)
        if isinstance(event, events.NonFatalError):
            key = (event.label, "engine error", type(event.value).__name__)
            failures.setdefault(key, [0, str(event.value)[:300]])[0] += 1
        elif isinstance(event, events.FatalError):
            failures[("(run)", "fatal error", type(event.exception).__name__)] = [
                1,
                str(event.exception)[:300],
            ]
        elif isinstance(event, events.EngineFinished):
            for failure in event.failures:
                key = ("(run)", "after run", failure.title)
                failures.setdefault(key, [0, failure.message[:300]])[0] += 1
    report.elapsed = time.monotonic() - started
    report.statuses = dict(statuses)
    report.failures = [
        f"{op} | {check} | {title} | {n} case(s) | first: {example}"
        for (op, check, title), (n, example) in sorted(failures.items())
    ]
    return document, report


def _tally(
    recorder: Any,
    statuses: dict[str, collections.Counter[int]],
    failures: dict[tuple[str, str, str], list[Any]],
    seen: set[tuple[str, str]],
) -> None:
    for case_id, interaction in recorder.interactions.items():
        if (recorder.label, case_id) in seen:
            continue
        seen.add((recorder.label, case_id))
        node = recorder.cases.get(case_id)
        label = node.value.operation.label if node is not None else recorder.label
        if interaction.response is not None:
            statuses[label][interaction.response.status_code] += 1
    for case_id, checks in recorder.checks.items():
        node = recorder.cases.get(case_id)
        label = node.value.operation.label if node is not None else recorder.label
        for check in checks:
            if check.failure_info is None:
                continue
            failure = check.failure_info.failure
            key = (label, check.name, failure.title)
            if key not in failures:
                failures[key] = [0, _request_of(recorder, case_id, failure.message)]
            failures[key][0] += 1


def _request_of(recorder: Any, case_id: str, message: str) -> str:
    interaction = recorder.interactions.get(case_id)
    if interaction is None:
        return message[:300]
    request = interaction.request
    body = (request.body or b"")[:300]
    status = interaction.response.status_code if interaction.response is not None else None
    first_line = message.splitlines()[0] if message else ""
    return f"{request.method} {request.uri} body={body!r} -> {status} ({first_line[:200]})"


def fresh_name(prefix: str) -> str:
    """An id no generator makes up (fixtures use them, so the run cannot hit them)."""
    return f"{prefix}-{new_id()}"
