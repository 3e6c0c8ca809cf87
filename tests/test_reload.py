"""A reload (SIGHUP) applies the log level and the kind catalogue, and names every
other key that changed as waiting for a restart; the readiness checks an alert
watches are exported as a metric."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bothy_notify.config import ConfigError, LogLevel
from tests.harness import make_config, wait_for

KIND = {"social:poke": {"category": "social", "template": "{count} pokes"}}


@pytest.fixture(autouse=True)
def _log_levels() -> Any:
    """A reload sets the process's log levels; other tests keep theirs."""
    loggers = [logging.getLogger(), logging.getLogger("bothy")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


async def test_a_reload_takes_the_catalogue_and_the_log_level_in(
    launch: Any, tmp_path: Path
) -> None:
    kinds = tmp_path / "kinds" / "acme" / "chat"
    kinds.mkdir(parents=True)
    (kinds / "kinds.toml").write_text('[wave]\ncategory = "games"\n')
    notify = {"categories": ["social"], "kinds": KIND, "kinds_dir": str(tmp_path / "kinds")}
    node = await launch(config=make_config(notify=notify))
    daemon = node.daemon
    # acme/chat:wave names a category that is not configured yet: refused.
    assert daemon.catalogue.get("acme/chat:wave") is None

    new = make_config(
        notify={
            **notify,
            "categories": ["social", "games"],
            "kinds": {"social:poke": {"category": "social", "template": "{count} nudges"}},
        },
        log={"level": "debug"},
        server={"max_body_bytes": 4096},
    )
    later = await daemon.reload(new)

    poke, wave = daemon.catalogue.get("social:poke"), daemon.catalogue.get("acme/chat:wave")
    assert poke is not None and poke.template == "{count} nudges"
    assert wave is not None and wave.category == "games"
    assert logging.getLogger("bothy").level == logging.DEBUG
    assert daemon.config.log.level is LogLevel.DEBUG
    assert daemon.config.notify.categories == ("social", "games")
    assert later == ("server.max_body_bytes",)


async def test_a_reload_with_invalid_kinds_changes_nothing(launch: Any) -> None:
    node = await launch(config=make_config(notify={"categories": ["social"], "kinds": KIND}))
    daemon = node.daemon
    before = daemon.catalogue
    bad = make_config(
        notify={"categories": [], "kinds": KIND}, log={"level": "debug"}
    )  # social is not a category any more
    with pytest.raises(ConfigError, match="social:poke"):
        await daemon.reload(bad)
    assert daemon.catalogue == before
    assert daemon.config.notify.categories == ("social",)
    assert daemon.config.log.level is not LogLevel.DEBUG


async def test_the_readiness_checks_are_exported_as_a_metric(launch: Any) -> None:
    node = await launch()
    checks = (await node.request("GET", "/readyz")).json()["checks"]

    async def exported() -> bool:
        samples = {
            s.labels["check"]: s.value
            for family in node.metrics.registry.collect()
            if family.name == "bothy_readiness_check"
            for s in family.samples
        }
        return samples == dict.fromkeys(checks, 1.0)

    await wait_for(exported, what="bothy_readiness_check for every /readyz check")
