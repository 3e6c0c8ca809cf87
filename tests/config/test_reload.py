"""A reload (SIGHUP) applies the log level, the categories and the kind catalogue to
every part of every process at once, and names every other key that changed as
waiting for a restart; the readiness checks an alert watches are exported as a
metric."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from bothy_notify.config import ConfigError, LogLevel, Secret, plan_reload
from tests.faults.world import append
from tests.harness import device_token, ev, make_config, producer_token, wait_for
from tests.procs import DaemonProcess, read_fake_records, write_config

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


def test_a_reload_plan_applies_the_reloadable_keys_and_names_every_other() -> None:
    running = make_config(
        notify={"categories": ["social"], "kinds": KIND},
        auth={"keys": [{"algorithm": "HS256", "key": "secret:jwt"}]},
    )
    # The running configuration holds the store's secret resolved; the one loaded
    # again holds the same reference, not resolved yet: equal.
    resolved = replace(running.auth.keys[0], key=Secret("secret:jwt", "resolved"))
    running = replace(running, auth=replace(running.auth, keys=(resolved,)))
    new = make_config(
        notify={
            "categories": ["social", "games"],
            "kinds": {"social:poke": {"category": "social", "template": "{count} nudges"}},
            "default_level": "all",
            "urgency": {"social:poke": "high"},
        },
        auth={"keys": [{"algorithm": "HS256", "key": "secret:jwt"}]},
        log={"level": "debug"},
        server={"max_body_bytes": 4096},
        push={"fake": {"keep": 5}},
    )
    plan = plan_reload(running, new)
    assert plan.applied == (
        "notify.categories",
        "notify.kinds.social:poke.template",
        "log.level",
    )
    assert plan.restart_needed == (
        "server.max_body_bytes",
        "notify.default_level",
        "notify.urgency",
        "push.fake.keep",
    )
    assert plan.config.notify.categories == ("social", "games")
    assert plan.config.notify.kinds["social:poke"].template == "{count} nudges"
    assert plan.config.log.level is LogLevel.DEBUG
    # What needs a restart keeps its running value until then.
    assert plan.config.notify.default_level == running.notify.default_level
    assert plan.config.server == running.server and plan.config.push == running.push
    assert plan.config.auth == running.auth


# ---------------------------------------------------------------- SIGHUP, end to end

GAMES_KIND = "acme/chat:wave"
SAM = device_token("sam", "sam-phone", "ios")
PRODUCER = producer_token()


def games_hint(key: str) -> dict[str, Any]:
    return ev(
        "hint.requested",
        recipients=["sam"],
        actor_id="alex",
        category="games",
        kind=GAMES_KIND,
        target_id=key,
    )


def reloads_logged(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """The JSON log lines of the reloads (the parent's and every process's)."""
    lines = [json.loads(t) for t in daemon.log_text().splitlines() if t.startswith("{")]
    return [line for line in lines if line.get("msg") == "configuration reloaded"]


async def sighup(daemon: DaemonProcess, rewrite: Callable[[], object], *, done: int) -> None:
    """Write the new configuration, SIGHUP, and wait until every process logged its
    reload (``done`` lines in all)."""
    rewrite()
    daemon.kill(signal.SIGHUP)
    with trio.fail_after(20):
        while len(reloads_logged(daemon)) < done:
            await trio.sleep(0.02)


async def every_process_says(daemon: DaemonProcess, processes: int, *, games: bool) -> None:
    """On each process (one connection each: a connection stays with the process
    that accepted it), the app hints, preferences, quiet hours' breakthrough and
    the catalogue all know ``games``, or none does."""
    seen: set[str] = set()
    with trio.fail_after(20):
        while len(seen) < processes:
            async with httpx.AsyncClient(
                base_url=daemon.api_url, timeout=10, limits=httpx.Limits(max_connections=1)
            ) as http:
                ready = (await http.get("/readyz")).json()
                node = ready["cluster"]["node_id"] if processes > 1 else "single"
                if node in seen:
                    continue
                hint = await http.post(
                    "/v1/events",
                    json={"events": [games_hint(f"probe-{len(seen)}")]},
                    headers={"authorization": f"Bearer {PRODUCER}"},
                )
                sam = {"authorization": f"Bearer {SAM}"}
                preferences = await http.get("/v1/preferences", headers=sam)
                quiet = await http.put(
                    "/v1/quiet-hours", json={"breakthrough": ["games"]}, headers=sam
                )
                catalogue = await http.get("/v1/catalogue", headers=sam)
                said = {
                    "app hint": hint.status_code == 200,
                    "preferences": "games" in preferences.json()["categories"],
                    "breakthrough": quiet.status_code == 200,
                    "catalogue": catalogue.json()["kinds"].get(GAMES_KIND, {}).get("category")
                    == "games",
                }
                assert said == dict.fromkeys(said, games), (node, said, hint.text, quiet.text)
                if not games:
                    assert hint.json()["error"]["message"] == (
                        "events[0].payload.category: not a configured category"
                    )
                    assert "breakthrough" in quiet.json()["error"]["message"]
                seen.add(node)


async def preference_skips(daemon: DaemonProcess) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{daemon.api_url}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bothy_push_skipped_total" and sample.labels.get("reason") == "preference"
    )


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
async def test_a_category_added_then_removed_by_sighup_reaches_every_part_of_every_process(
    database_url: str, tmp_path: Path, processes: int
) -> None:
    kinds = tmp_path / "kinds" / "acme" / "chat"
    kinds.mkdir(parents=True)
    (kinds / "kinds.toml").write_text('[wave]\ncategory = "games"\n')
    record = tmp_path / "pushes.jsonl"

    def configure(categories: list[str]) -> Path:
        return write_config(
            tmp_path / "bothy.toml",
            database_url,
            record_file=record,
            server={"processes": processes},
            notify={"categories": categories, "kinds_dir": str(tmp_path / "kinds")},
        )

    config = configure(["social"])
    daemon = DaemonProcess(config_file=config, log_file=tmp_path / "daemon.log")
    await daemon.start(timeout=40)
    try:
        async with httpx.AsyncClient(base_url=daemon.api_url, timeout=10) as http:
            people = await http.post(
                "/v1/events",
                json={"events": [ev("user.upserted", user_id="sam", kind="human", active=True)]},
                headers={"authorization": f"Bearer {PRODUCER}"},
            )
            assert people.status_code == 200, people.text
            phone = await http.post(
                "/v1/registrations",
                json={"provider": "fake", "token": "sam-token"},
                headers={"authorization": f"Bearer {SAM}"},
            )
            assert phone.status_code in (200, 201), phone.text
        await every_process_says(daemon, processes, games=False)

        await sighup(daemon, partial(configure, ["social", "games"]), done=processes)
        await every_process_says(daemon, processes, games=True)
        for line in reloads_logged(daemon):
            assert line["applied"] == ["notify.categories"] and line["restart_needed"] == []
        # The round decided the app hints accepted above: the phone got its push.
        with trio.fail_after(20):
            while not any(
                r["token"] == "sam-token" and r["payload"].get("kind") == GAMES_KIND
                for r in read_fake_records(record)
            ):
                await trio.sleep(0.05)

        await sighup(daemon, partial(configure, ["social"]), done=2 * processes)
        await every_process_says(daemon, processes, games=False)
        # An app hint that comes by the outbox (no HTTP check in front) is skipped by
        # the round as a category that is not configured.
        before = await preference_skips(daemon)
        await append(database_url, [("hint.requested", games_hint("outbox")["payload"])])
        with trio.fail_after(20):
            while await preference_skips(daemon) < before + 1:
                await trio.sleep(0.05)
    finally:
        await daemon.stop()
