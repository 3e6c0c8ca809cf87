"""The operator's status page: ``GET /admin`` and ``GET /v1/admin/status`` (scope
``admin:read``), the dead-letter actions (scope ``admin:write``), aggregates only.

Real daemons on the test's database (the gateway on 127.0.0.1:0, the fake
provider, a fake clock); in a cluster, two nodes on one database.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import psycopg
import trio

from bothy_notify.api.status import PHASES
from bothy_notify.auth import TokenVerifier, mint_token
from bothy_notify.cli import main
from bothy_notify.kernel.metrics import SKIP_REASONS
from bothy_notify.push.recent import BUCKET_SECONDS, WINDOW_SECONDS, RecentSends
from gateway.service import build_gateway
from tests.cluster.support import cluster_config
from tests.daemon.test_dead_letters_cli import SETUP, bothy_logger, fix_the_triggers
from tests.gateway.client import connect_live
from tests.gateway.world import DELAY, message, start
from tests.harness import TEST_KEY, Launch, Node, device_token, ev, make_config, producer_token
from tests.runner.test_poison import FUTURE_TYPE, POISON_MEMBER, prepare

__all__ = ["bothy_logger"]  # a fixture: main() sets up the bothy logger, put back after


def operator_token(scope: str = "admin:read") -> str:
    return mint_token(TEST_KEY, {"sub": "ops", "scope": scope})


async def status(node: Node, token: str | None = None) -> dict[str, Any]:
    """The status as of now (the one-second reuse is skipped)."""
    assert node.daemon.status is not None
    node.daemon.status.forget()
    response = await node.request("GET", "/v1/admin/status", token=token or operator_token())
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body: dict[str, Any] = response.json()
    return body


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value: keys and values, at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


async def test_the_status_needs_an_operator_token_and_the_actions_admin_write(
    launch: Launch,
) -> None:
    node = await launch(config=make_config())
    answer = await node.request("GET", "/v1/admin/status")
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json()["error"]["code"] == "unauthorized"
    for token in (device_token("alex", "alex-desktop"), producer_token()):
        answer = await node.request("GET", "/v1/admin/status", token=token)
        assert answer.status_code == 403
        assert answer.json()["error"] == {
            "code": "forbidden",
            "message": "the token lacks scope admin:read",
        }
    for scope in ("admin:read", "admin:write", "events:write admin:read"):
        answer = await node.request("GET", "/v1/admin/status", token=operator_token(scope))
        assert answer.status_code == 200, scope

    for action in ("retry", "discard"):
        path = f"/v1/admin/dead-letters/{action}"
        answer = await node.request("POST", path, token=operator_token("admin:read"), json={})
        assert answer.status_code == 403
        assert answer.json()["error"]["message"] == "the token lacks scope admin:write"
        answer = await node.request("POST", path, token=operator_token("admin:write"), json={})
        assert answer.status_code == 200
        bad = await node.request(
            "POST", path, token=operator_token("admin:write"), json={"type": "no type!"}
        )
        assert (bad.status_code, bad.json()["error"]["message"]) == (422, "type: not an event type")
        null = await node.request(
            "POST", path, token=operator_token("admin:write"), json={"type": None}
        )
        assert (null.status_code, null.json()["error"]["message"]) == (
            422,
            "type: must not be null",
        )
        extra = await node.request(
            "POST", path, token=operator_token("admin:write"), json={"seqs": [1]}
        )
        assert (extra.status_code, extra.json()["error"]["message"]) == (
            422,
            "(body): unknown field",
        )


async def test_the_page_is_served_with_its_files_and_a_strict_policy(launch: Launch) -> None:
    node = await launch(config=make_config())
    page = await node.request("GET", "/admin")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script src="/admin/admin.js"' in page.text
    assert '<link rel="stylesheet" href="/admin/admin.css">' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    for path, kind in (("/admin/admin.js", "text/javascript"), ("/admin/admin.css", "text/css")):
        answer = await node.request("GET", path)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith(kind)
        assert answer.headers["content-security-policy"] == policy
    # Everything the page loads is its own: no CDN, no other host.
    for text in (page.text, (await node.request("GET", "/admin/admin.js")).text):
        assert "http://" not in text and "https://" not in text
    # The worker role serves no page (operator endpoints only).
    worker = await launch(config=make_config(server={"role": "worker"}))
    assert (await worker.request("GET", "/admin")).status_code == 404


async def test_the_status_shows_this_node_and_counts_that_follow_what_happens(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    before = await status(node)
    assert before["cluster_mode"] == "single"
    [me] = before["nodes"]
    assert me["node_id"] == node.daemon.node_id
    assert (me["this"], me["role"], me["ready"], me["holds_round"]) == (True, "all", True, True)
    assert before["consumer"]["holder"] == node.daemon.node_id
    assert me["connections"] == dict.fromkeys(PHASES, 0)
    assert before["consumer"]["lag_events"] == 0
    assert before["registrations"] == [{"provider": "fake", "state": "active", "count": 1}]
    assert before["providers"] == [{"provider": "fake", "in_flight": 0, "apps": []}]
    assert set(before["skips"]) == set(SKIP_REASONS)
    decided = before["consumer"]["events_decided"]
    assert decided >= 9

    # A desktop connects; a message comes: alex's desktop is told, his phone waits.
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await node.append(message(1))
    await node.settle()
    await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    during = await status(node)
    assert during["connections"]["live"] == 1
    assert during["nodes"][0]["connections"]["live"] == 1
    assert during["consumer"]["events_decided"] == decided + 1
    [push] = [j for j in during["jobs"] if j["kind"] == "notify.push_send"]
    assert (push["state"], push["count"], push["due"], push["oldest_due_seconds"]) == (
        "available",
        1,
        0,
        None,
    )
    # sam follows t1 but has no device at all: a skip.
    assert during["skips"]["no_registration"] == before["skips"]["no_registration"] + 1

    await desktop.close()
    await node.advance(DELAY)
    after = await status(node)
    assert after["connections"]["live"] == 0
    [fake] = after["providers"]
    assert fake["provider"] == "fake"
    assert fake["apps"] == [
        {
            "app": None,
            "sends": {"delivered": 1},
            "sent": 1,
            "last_error": None,
            "last_error_seconds": None,
        }
    ]
    assert not any(j["kind"] == "notify.push_send" for j in after["jobs"])


async def test_the_status_names_no_person_device_thread_token_or_url(
    launch: Launch, nursery: trio.Nursery
) -> None:
    person, other, device, phone = "pqx-person", "pqx-other", "pqx-laptop", "pqx-phone"
    thread, message_id, space = "pqx-thread", "pqx-message", "pqx-space"
    url = "https://hooks.pqx.example/secret-path"
    node = await launch(gateway_factory=build_gateway, config=make_config())
    await node.append(
        ev("user.upserted", user_id=person, kind="human", active=True),
        ev("thread.upserted", thread_id=thread, space_id=space, channel_id="pqx-channel"),
        ev("member.added", user_id=person, scope_id=space),
        ev("thread.followed", user_id=person, thread_id=thread, level="all"),
    )
    registration = await node.register(person, phone, url)
    failing = await node.register(person, "pqx-tablet", "transient-pqx-token")
    await connect_live(nursery, node, person, device, "windows")
    await node.append(
        ev(
            "message.created",
            thread_id=thread,
            message_id=message_id,
            thread_seq=1,
            author_id=other,
        )
    )
    await node.settle()
    await node.advance(DELAY)
    await node.advance(3600)
    body = await status(node)
    # The scenario really happened: a connection, sends of both outcomes.
    assert body["connections"]["live"] == 1
    [fake] = body["providers"]
    assert fake["apps"][0]["sends"]["delivered"] >= 1
    assert fake["apps"][0]["last_error"] == "transient:fake_transient"

    secrets = {
        person,
        other,
        device,
        phone,
        thread,
        message_id,
        space,
        url,
        "pqx",
        registration["id"],
        failing["id"],
        TEST_KEY,
        device_token(person, device, "windows"),
        operator_token(),
    }
    found = [(s, secret) for s in strings(body) for secret in secrets if secret in s]
    assert found == []
    assert not [s for s in strings(body) if "://" in s or s.startswith("eyJ")]


async def test_dead_letters_are_counted_by_type_and_retried_or_discarded(
    launch: Launch, database_url: str
) -> None:
    prepare(database_url, [*SETUP, (FUTURE_TYPE, {"x": 1}), POISON_MEMBER])
    node = await launch(config=make_config())
    await node.settle()
    dead = (await status(node))["dead_letters"]
    assert dead["count"] == 2
    assert sorted((t["type"], t["count"]) for t in dead["types"]) == [
        (FUTURE_TYPE, 1),
        ("member.added", 1),
    ]
    assert dead["newest_seconds"] is not None

    write = operator_token("admin:write")
    # Still failing: a retry counts it and keeps it.
    answer = await node.request(
        "POST", "/v1/admin/dead-letters/retry", token=write, json={"type": "member.added"}
    )
    assert answer.json() == {"replayed": 0, "failed": 1, "remaining": 1}
    fix_the_triggers(database_url)
    answer = await node.request(
        "POST", "/v1/admin/dead-letters/retry", token=write, json={"type": "member.added"}
    )
    assert answer.json() == {"replayed": 1, "failed": 0, "remaining": 0}
    with psycopg.connect(database_url) as conn:
        members = conn.execute(
            "SELECT count(*) FROM bothy.members WHERE scope_id = 'poison-scope'"
        ).fetchone()
    assert members == (1,)

    answer = await node.request("POST", "/v1/admin/dead-letters/discard", token=write, json={})
    assert answer.json() == {"discarded": 1, "remaining": 0}
    # The status right after the action is computed afresh.
    assert node.daemon.status is not None
    response = await node.request("GET", "/v1/admin/status", token=operator_token())
    assert response.json()["dead_letters"] == {"count": 0, "newest_seconds": None, "types": []}
    with psycopg.connect(database_url) as conn:
        kept = conn.execute("SELECT count(*) FROM bothy.events WHERE type = %s", (FUTURE_TYPE,))
        assert kept.fetchone() == (1,), "a discarded dead letter's event stays in the log"


async def test_a_cluster_shows_every_live_node_with_the_figures_of_its_heartbeat(
    launch: Launch, nursery: trio.Nursery
) -> None:
    first = await launch(gateway_factory=build_gateway, config=cluster_config())
    second = await launch(gateway_factory=build_gateway, config=cluster_config())
    await first.append(ev("user.upserted", user_id="alex", kind="human", active=True))
    await connect_live(nursery, second, "alex", "alex-desktop", "macos")

    async def seen() -> dict[str, Any]:
        with trio.fail_after(10):
            while True:
                body = await status(first)
                by_id = {n["node_id"]: n for n in body["nodes"]}
                other = by_id.get(second.daemon.node_id)
                if other is not None and other["connections"]["live"] == 1:
                    return body
                await trio.sleep(0.05)

    body = await seen()
    assert body["cluster_mode"] == "multi"
    by_id = {n["node_id"]: n for n in body["nodes"]}
    assert set(by_id) == {first.daemon.node_id, second.daemon.node_id}
    assert by_id[first.daemon.node_id]["this"] is True
    assert by_id[second.daemon.node_id]["this"] is False
    assert body["connections"]["live"] == 1
    holders = [n for n in body["nodes"] if n["holds_round"]]
    assert len(holders) == 1
    assert body["consumer"]["holder"] == holders[0]["node_id"]


def test_recent_sends_keep_five_minutes_and_the_last_error_class() -> None:
    now = [1_000_000.0]
    recent = RecentSends(now=lambda: now[0])
    recent.record("apns", "com.example.chat", "delivered")
    recent.record("apns", "com.example.chat", "transient", "http_503")
    recent.record("apns", None, "rejected", "Bad Reason <script>")
    [no_app, chat] = recent.snapshot()
    assert (chat.app, chat.sends, chat.last_error) == (
        "com.example.chat",
        {"delivered": 1, "transient": 1},
        "transient:http_503",
    )
    assert (no_app.app, no_app.last_error) == (None, "rejected:other")
    now[0] += WINDOW_SECONDS - BUCKET_SECONDS
    recent.record("apns", "com.example.chat", "delivered")
    assert recent.snapshot()[1].sends == {"delivered": 2, "transient": 1}
    now[0] += BUCKET_SECONDS
    # The first bucket left the window; the last error stays known.
    assert recent.snapshot()[1].sends == {"delivered": 1}
    assert recent.snapshot()[1].last_error == "transient:http_503"


def test_dev_token_mints_an_operator_token_without_a_device(
    tmp_path: Any, bothy_logger: None
) -> None:
    config = tmp_path / "dev.toml"
    config.write_text(
        f'[server]\ndev = true\n[[auth.keys]]\nalgorithm = "HS256"\nkey = "{TEST_KEY}"\n'
        '[log]\nlevel = "error"\n'
    )
    out = io.StringIO()
    args = ["dev-token", "--config", str(config), "--user", "ops", "--scope", "admin:read"]
    assert main(args, stdout=out) == 0
    verifier = TokenVerifier(make_config().auth)
    claims = verifier.operator(out.getvalue().strip(), "admin:read")
    assert claims.scopes == frozenset({"admin:read"})
    assert main(["dev-token", "--config", str(config), "--user", "ops"], stdout=out) == 1
