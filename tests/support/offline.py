"""The HTTP app built on collaborators that never open anything, for tests that read
its route table (or call it where no database is needed)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from bothy_notify.api.app import build_app
from bothy_notify.api.context import ApiContext
from bothy_notify.auth import TokenVerifier
from bothy_notify.config import LiveConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store.db import Database
from bothy_notify.store.events import EventValidator
from tests.harness import make_config


def offline_context() -> ApiContext:
    """The test configuration's context; its database is never opened."""
    config = make_config()
    return ApiContext(
        db=Database("postgresql://unused.invalid/none"),
        verifier=TokenVerifier(config.auth),
        live_config=LiveConfig(config),
        clock=FakeClock(),
        metrics=Metrics(),
        validator=EventValidator(),
        provider_names=frozenset({"fake"}),
    )


def offline_app(**build: Any) -> Starlette:
    """``build_app`` on :func:`offline_context` (``build``: its keyword arguments)."""
    return build_app(offline_context(), **build)
