"""``schemas/openapi.yaml`` is the contract of the HTTP API, and it is kept true:

- the routes the app serves and the operations the document describes are the
  same set, both ways;
- a property-based run (schemathesis) against the live daemon, over real HTTP
  on 127.0.0.1 with valid tokens so it gets past auth, finds no 5xx and no
  answer that breaks the document, for valid and for invalid requests;
- after the run the consumer round has consumed every event the run appended,
  so nothing a producer may send poisons the round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
import trio
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi import checks as openapi_checks
from starlette.routing import Route

from bothy_notify.api.app import build_app
from bothy_notify.api.context import ApiContext
from bothy_notify.auth import TokenVerifier
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store.db import Database
from bothy_notify.store.events import EventValidator
from tests.harness import Launch, device_token, make_config, producer_token
from tests.support.repo import SCHEMA_DIR

OPENAPI = SCHEMA_DIR / "openapi.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}

EXAMPLES_PER_OPERATION = 30
"""Hypothesis examples per operation and mode: enough to walk every body shape,
few enough that the whole run stays far below the test deadline."""

CHECKS = [
    schemathesis.checks.not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_headers_conformance,
    openapi_checks.response_schema_conformance,
]
NEGATIVE_CHECKS = [*CHECKS, openapi_checks.negative_data_rejection]


def documented_operations() -> set[tuple[str, str]]:
    document = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    return {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def served_operations(*, operator_only: bool = False) -> set[tuple[str, str]]:
    config = make_config()
    ctx = ApiContext(
        db=Database("postgresql://unused.invalid/none"),
        verifier=TokenVerifier(config.auth),
        config=config,
        clock=FakeClock(),
        metrics=Metrics(),
        validator=EventValidator(),
        provider_names=frozenset({"fake"}),
    )
    app = build_app(ctx, operator_only=operator_only)
    served: set[tuple[str, str]] = set()
    for route in app.routes:
        assert isinstance(route, Route)
        # Starlette adds HEAD to every GET by itself; the document describes GET.
        served.update((route.path, m) for m in route.methods or () if m != "HEAD")
    return served


def test_every_served_route_is_documented() -> None:
    assert served_operations() - documented_operations() == set()


def test_every_documented_operation_is_served() -> None:
    assert documented_operations() - served_operations() == set()


def test_the_worker_role_serves_only_documented_operator_endpoints() -> None:
    assert served_operations(operator_only=True) == {
        ("/healthz", "GET"),
        ("/readyz", "GET"),
        ("/metrics", "GET"),
    }


def _fuzz(base_url: str, tokens: dict[str, str]) -> list[str]:
    """Run every operation in both modes; return the failures (blocking)."""
    schema = schemathesis.openapi.from_path(str(OPENAPI))
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]
        token = tokens["producer"] if operation.path == "/v1/events" else tokens["device"]
        headers = {"Authorization": f"Bearer {token}"}
        for mode, checks in (
            (schemathesis.GenerationMode.POSITIVE, CHECKS),
            (schemathesis.GenerationMode.NEGATIVE, NEGATIVE_CHECKS),
        ):
            strategy = operation.as_strategy(generation_mode=mode, headers=headers)
            run = _runner(strategy, base_url, headers, checks)
            try:
                run()
            except Unsatisfiable:
                # Nothing to make invalid: no body, no constrained parameter.
                assert mode is schemathesis.GenerationMode.NEGATIVE
            # Collect every operation's failure, then report them together. Schemathesis
            # raises its check failures as a FailureGroup, a BaseExceptionGroup.
            except (Exception, FailureGroup) as exc:
                failures.append(
                    f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}"
                )
    return failures


def _runner(
    strategy: Any, base_url: str, headers: dict[str, str], checks: list[Any]
) -> Callable[[], None]:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        case.call_and_validate(base_url=base_url, headers=headers, checks=checks)

    return run


@pytest.mark.slow
async def test_schemathesis_finds_no_server_error_and_no_answer_off_the_document(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify={"categories": ["social"]}))
    tokens = {"device": device_token("fuzz", "fuzz-phone"), "producer": producer_token()}
    failures = await trio.to_thread.run_sync(_fuzz, node.api, tokens)
    assert failures == [], "\n\n".join(failures)
    # Fails unless the round consumed every event the run appended and ran every job.
    await node.settle(timeout=20)
    assert await node.sql("SELECT count(*) FROM bothy.jobs WHERE state = 'failed'") == [(0,)]
