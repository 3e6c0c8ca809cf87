"""The files operators expect, checked against the code they describe: the container
image and compose file against the configuration, the Grafana dashboard and the
Prometheus alerts against the metrics the daemon exports. Images cannot be
pulled here, so nothing is built; ``promtool`` runs where Debian's ``prometheus``
package is installed (or can be)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bothy_notify.config import Config, load_config_text, parse_listen
from bothy_notify.kernel.metrics import Metrics
from tests.support.repo import ROOT
from tests.support.tools import ensure_tool

CONTAINERFILE = ROOT / "Containerfile"
COMPOSE = ROOT / "compose.yaml"
DASHBOARD = ROOT / "contrib" / "grafana" / "bothy-notify.json"
ALERTS = ROOT / "contrib" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "contrib" / "prometheus" / "alerts.test.yaml"


# ---------------------------------------------------------------- metric names


def exported_metrics() -> set[str]:
    """Every series name the daemon's registry exports (``bothy_x_total`` of a
    counter, ``_bucket``/``_count``/``_sum`` of a histogram)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
        else:
            names.add(family.name)
    return names


_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}
_KEYWORDS |= {"group_left", "group_right", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label
    matchers, ranges, grouping labels and Grafana variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group(0) in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def test_the_metric_name_reader_reads_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, route)"
        ' (rate(bothy_delivery_seconds_bucket{job=~"$job"}[$__rate_interval])))'
        " / on (route) group_left sum(rate(x_total[5m])) > bool 0.2"
        " and (sum(bothy_consumer_holder) or vector(0)) != 1"
    )
    assert metric_names(expr) == {
        "bothy_delivery_seconds_bucket",
        "x_total",
        "bothy_consumer_holder",
    }


def _dashboard_targets() -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel["title"], target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def test_the_dashboard_names_only_metrics_the_daemon_exports() -> None:
    exported = exported_metrics()
    targets = list(_dashboard_targets())
    assert targets
    for title, expr in targets:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, (title, names - exported)


def test_the_dashboard_shows_what_an_operator_looks_at_first() -> None:
    shown = set().union(*(metric_names(expr) for _title, expr in _dashboard_targets()))
    assert {
        "bothy_delivery_seconds_bucket",  # latency quantiles by route
        "bothy_delivery_seconds_count",  # deliveries by route
        "bothy_push_skipped_total",
        "bothy_push_sends_total",
        "bothy_jobs_depth",
        "bothy_jobs_lag_seconds",
        "bothy_consumer_lag_seconds",
        "bothy_consumer_lag_events",
        "bothy_gateway_connections",
        "bothy_events_dead_lettered_total",
    } <= shown
    exprs = [expr for _title, expr in _dashboard_targets()]
    assert any("histogram_quantile(0.99" in e and "route" in e for e in exprs)
    assert any("bothy_push_sends_total" in e and "app" in e and "outcome" in e for e in exprs)


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        for target in panel.get("targets", []):
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, used


def _alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_alerts_name_only_metrics_the_daemon_exports() -> None:
    exported = exported_metrics()
    for rule in _alert_rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)


def test_the_alerts_cover_lag_the_round_dead_letters_providers_and_readiness() -> None:
    by_metric: dict[str, list[str]] = {}
    for rule in _alert_rules():
        for name in metric_names(rule["expr"]):
            by_metric.setdefault(name, []).append(rule["expr"])
    assert "bothy_consumer_lag_seconds" in by_metric
    assert "bothy_consumer_holder" in by_metric
    assert "bothy_events_dead_lettered_total" in by_metric
    assert "bothy_readiness_check" in by_metric
    sends = " ".join(by_metric["bothy_push_sends_total"])
    assert 'outcome="dead"' in sends and "rejected" in sends


def test_promtool_checks_the_rules_and_their_tests() -> None:
    promtool = ensure_tool("promtool", "prometheus")
    for command in (["check", "rules", ALERTS.name], ["test", "rules", ALERT_TESTS.name]):
        done = subprocess.run(
            [promtool, *command],
            cwd=ALERTS.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- the container image


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions (continuation lines joined), last stage only."""
    joined = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    steps = [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in (raw.strip() for raw in joined.splitlines())
        if line and not line.startswith("#")
    ]
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value) if value.startswith("[") else shlex.split(value)
    return [str(v) for v in parsed]


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in _instructions():
        if op == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def _image_config() -> Config:
    overrides = {k: v for k, v in _image_env().items() if k.startswith("BOTHY_NOTIFY__")}
    return load_config_text("", env=overrides)


def _port(listen: str) -> int:
    address = parse_listen(listen)
    assert address is not None
    return address[1]


def test_the_image_runs_bothy_notify_run_as_a_user_without_privileges() -> None:
    steps = _instructions()
    ops = dict(steps)
    assert ops["USER"] not in ("root", "0")
    entry = _exec_form(ops["ENTRYPOINT"]) + _exec_form(ops.get("CMD", "[]"))
    assert entry == ["bothy-notify", "run"]
    assert any(op == "RUN" and "pip install" in a and ".whl" in a for op, a in steps)
    # The wheel is built from this checkout in the first stage.
    assert "python -m build --wheel" in CONTAINERFILE.read_text()


def test_the_images_environment_names_real_keys_and_its_ports_and_health_check_agree() -> None:
    config = _image_config()
    api, gateway = _port(config.server.api_listen), _port(config.server.gateway_listen)
    assert config.server.api_listen.startswith("0.0.0.0:")  # reachable from outside
    ops = dict(_instructions())
    assert {int(p) for p in ops["EXPOSE"].split()} == {api, gateway}
    health = ops["HEALTHCHECK"]
    assert f"http://127.0.0.1:{api}/readyz" in health
    assert config.database.data_dir.startswith(json.loads(ops["VOLUME"])[0] + "/")


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "data"} <= set(ignored)


# ---------------------------------------------------------------- compose


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``."""

    def one(match: re.Match[str]) -> str:
        name, op, rest = match.group(1), match.group(2) or "", match.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":-":
            return rest
        raise AssertionError(f"compose needs {name} ({rest or 'no default'})")

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


COMPOSE_ENV = {"POSTGRES_PASSWORD": "pw-for-the-test", "BOTHY_JWT_KEY": "k" * 64}


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def _daemon_env() -> dict[str, str]:
    raw = _compose()["services"]["bothy-notify"]["environment"]
    return {k: _interpolate(str(v), COMPOSE_ENV) for k, v in raw.items()}


def test_compose_configures_the_daemon_through_overrides_only() -> None:
    service = _compose()["services"]["bothy-notify"]
    env = _daemon_env()
    assert env and all(name.startswith("BOTHY_NOTIFY__") for name in env)
    assert "volumes" not in service and "BOTHY_NOTIFY_CONFIG" not in env  # no file
    config = load_config_text("", env=env)  # each variable names a key and parses
    assert config.auth.keys and config.auth.keys[0].key.source.startswith("env:")


def test_compose_runs_postgresql_16_and_the_daemon_waits_for_it() -> None:
    services = _compose()["services"]
    postgres, daemon = services["postgres"], services["bothy-notify"]
    assert postgres["image"].rsplit(":", 1)[1].split(".")[0] == "16"
    assert daemon["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = load_config_text("", env=_daemon_env()).database.url
    assert url is not None
    parts = urlsplit(url.reveal())
    assert (parts.hostname, parts.port) == ("postgres", 5432)
    pg_env = {k: _interpolate(str(v), COMPOSE_ENV) for k, v in postgres["environment"].items()}
    assert parts.username == pg_env["POSTGRES_USER"]
    assert parts.password == pg_env["POSTGRES_PASSWORD"]
    assert parts.path == "/" + pg_env["POSTGRES_DB"]


def test_compose_publishes_the_listeners_and_checks_readiness() -> None:
    daemon = _compose()["services"]["bothy-notify"]
    config = load_config_text("", env=_daemon_env())
    published = {int(str(p).rsplit(":", 1)[1]) for p in daemon["ports"]}
    assert published == {_port(config.server.api_listen), _port(config.server.gateway_listen)}
    # Plain HTTP and /metrics: on the host's loopback only, for a proxy in front.
    assert all(str(p).startswith("127.0.0.1:") for p in daemon["ports"])
    assert config.server.api_listen.startswith("0.0.0.0:")
    check = " ".join(daemon["healthcheck"]["test"])
    assert f"http://127.0.0.1:{_port(config.server.api_listen)}/readyz" in check
    assert Path(ROOT / daemon["build"]["dockerfile"]) == CONTAINERFILE
    # The daemon drains within server.drain_period before compose kills it.
    grace = int(daemon["stop_grace_period"].removesuffix("s"))
    assert grace > config.server.drain_period.total_seconds()


@pytest.mark.parametrize("name", ["POSTGRES_PASSWORD", "BOTHY_JWT_KEY"])
def test_compose_refuses_to_start_without_its_secrets(name: str) -> None:
    env = {k: v for k, v in COMPOSE_ENV.items() if k != name}
    raw = {**_compose()["services"]["bothy-notify"]["environment"]}
    with pytest.raises(AssertionError, match=name):
        for value in raw.values():
            _interpolate(str(value), env)
