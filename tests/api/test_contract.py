"""``schemas/openapi.yaml`` is the contract of the HTTP API, and it is kept true:

- the routes the app serves and the operations the document describes are the
  same set, both ways (here);
- schemathesis with every phase and check against a running daemon, on the
  document it serves, finds no failure and reaches a 2xx on every operation
  (``tests/contract``, ``make contract``).
"""

from __future__ import annotations

import yaml
from starlette.routing import Route

from tests.support.offline import offline_app
from tests.support.repo import SCHEMA_DIR

OPENAPI = SCHEMA_DIR / "openapi.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def documented_operations() -> set[tuple[str, str]]:
    document = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    return {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def served_operations(*, operator_only: bool = False) -> set[tuple[str, str]]:
    app = offline_app(operator_only=operator_only)
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
