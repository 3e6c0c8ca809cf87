"""The kind catalogue: built-ins, configured kinds, template rules, the content
version, and ``GET /v1/catalogue`` following the kinds directory while the daemon
runs (the directory's own rules are in ``test_kinds_dir.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from bothy_notify.cli import main
from bothy_notify.config import ConfigError, NotifyConfig
from bothy_notify.notify.catalogue import Catalogue, KindEntry
from bothy_notify.notify.kinds_dir import load_catalogue
from bothy_notify.wiring import Daemon
from tests.harness import Launch, Node, device_token, ev, make_config, producer_token

FRIEND = {"category": "social", "template": "{count} new friend requests"}


def notify(**kinds: dict[str, str]) -> NotifyConfig:
    return make_config(notify={"categories": ["social"], "kinds": kinds}).notify


def test_built_in_kinds_ship_in_code_so_the_catalogue_is_never_empty() -> None:
    catalogue = load_catalogue(NotifyConfig())
    assert {e.kind: e.category for e in catalogue.entries} == {
        "admin": "admin",
        "mention": "mentions",
        "message": "messages",
        "security": "security",
    }
    assert catalogue == Catalogue.builtin()


def test_configured_kinds_join_the_built_ins() -> None:
    kinds = {"social:friend_request": {**FRIEND, "link": "app://people/{target_id}"}}
    entry = load_catalogue(notify(**kinds)).get("social:friend_request")
    assert entry == KindEntry(
        "social:friend_request", "social", "{count} new friend requests", "app://people/{target_id}"
    )


def test_the_version_is_a_hash_of_the_content() -> None:
    one = load_catalogue(notify(**{"social:friend_request": FRIEND}))
    again = load_catalogue(notify(**{"social:friend_request": FRIEND}))
    other = load_catalogue(notify(**{"social:friend_request": {**FRIEND, "template": "{count}"}}))
    assert one.version == again.version
    assert one.version != other.version != Catalogue.builtin().version
    assert len(one.version) == 16 and int(one.version, 16) >= 0


def test_the_version_does_not_depend_on_the_order_kinds_are_given_in() -> None:
    a = {"social:a": FRIEND, "social:b": {"category": "social"}}
    b = {"social:b": {"category": "social"}, "social:a": FRIEND}
    assert load_catalogue(notify(**a)).version == load_catalogue(notify(**b)).version


def test_a_built_in_kind_may_change_its_words_but_not_its_category() -> None:
    changed = load_catalogue(notify(message={"category": "messages", "template": "{count} new"}))
    assert changed.get("message") == KindEntry("message", "messages", "{count} new")
    with pytest.raises(ConfigError, match=r'notify\.kinds\."message"\.category'):
        load_catalogue(notify(message={"category": "social"}))


@pytest.mark.parametrize(
    ("entry", "key", "problem"),
    [
        (
            {"category": "social", "template": "{name} wants to be friends"},
            "template",
            "placeholder {name} is not allowed",
        ),
        ({"category": "social", "template": "{count:>3} requests"}, "template", "takes no format"),
        ({"category": "social", "template": "{0} requests"}, "template", "is not allowed"),
        ({"category": "social", "template": "{count requests"}, "template", "unbalanced"),
        ({"category": "social", "template": "{{count}}"}, "template", "literal braces"),
        (
            {"category": "social", "link": "app://people/{count}"},
            "link",
            "placeholder {count} is not allowed",
        ),
        ({"category": "social", "link": "people/{target_id}"}, "link", "scheme"),
        ({"category": "sales"}, "category", "notify.categories"),
    ],
)
def test_a_bad_kind_is_refused_naming_the_key(
    entry: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_catalogue(notify(**{"social:friend_request": entry}))
    assert f'notify.kinds."social:friend_request".{key}: ' in str(caught.value)
    assert problem in str(caught.value)


def test_a_kind_code_must_be_namespaced() -> None:
    with pytest.raises(ConfigError, match=r'notify\.kinds\."friend_request"\.kind code'):
        load_catalogue(notify(friend_request={"category": "social"}))


def test_a_configured_kind_cannot_take_a_publisher_app_namespace() -> None:
    with pytest.raises(ConfigError) as caught:
        load_catalogue(notify(**{"acme/chat:invite": {"category": "social"}}))
    assert 'notify.kinds."acme/chat:invite".kind code: a publisher/app namespace belongs' in str(
        caught.value
    )


def test_the_daemon_refuses_to_start_with_a_bad_template() -> None:
    config = make_config(
        notify={
            "categories": ["social"],
            "kinds": {"social:x": {"category": "social", "template": "{title}"}},
        }
    )
    with pytest.raises(ConfigError, match=r'notify\.kinds\."social:x"\.template'):
        Daemon(config)


SOCIAL_KINDS: dict[str, Any] = {
    "categories": ["social"],
    "kinds": {"social:friend_request": {**FRIEND, "link": "app://people/{target_id}"}},
}


async def test_get_catalogue_serves_every_kind_with_the_version(launch: Launch) -> None:
    node = await launch(config=make_config(notify=SOCIAL_KINDS))
    response = await node.request("GET", "/v1/catalogue", token=device_token("alex", "phone"))
    assert response.status_code == 200
    body = response.json()
    assert body["version"] == node.daemon.catalogue.version
    assert response.headers["etag"] == f'"{body["version"]}"'
    assert body["kinds"]["social:friend_request"] == {
        "category": "social",
        "template": "{count} new friend requests",
        "link": "app://people/{target_id}",
    }
    assert body["kinds"]["message"] == {"category": "messages", "template": "New messages: {count}"}
    assert set(body["kinds"]) == {
        "admin",
        "mention",
        "message",
        "security",
        "social:friend_request",
    }


async def test_two_servers_built_alike_serve_the_same_version(launch: Launch) -> None:
    config = make_config(notify=SOCIAL_KINDS)
    first, second = await launch(config=config), await launch(config=config)
    token = device_token("alex", "phone")
    one = (await first.request("GET", "/v1/catalogue", token=token)).json()
    two = (await second.request("GET", "/v1/catalogue", token=token)).json()
    assert one == two


async def test_if_none_match_with_the_current_version_gives_304(launch: Launch) -> None:
    node = await launch()
    token = device_token("alex", "phone")
    etag = (await node.request("GET", "/v1/catalogue", token=token)).headers["etag"]
    same = await node.request(
        "GET", "/v1/catalogue", token=token, headers={"If-None-Match": f'W/"x", {etag}'}
    )
    assert same.status_code == 304 and same.content == b""
    stale = await node.request(
        "GET", "/v1/catalogue", token=token, headers={"If-None-Match": '"0000000000000000"'}
    )
    assert stale.status_code == 200


async def test_the_catalogue_needs_a_device_token(launch: Launch) -> None:
    node = await launch()
    assert (await node.request("GET", "/v1/catalogue")).status_code == 401
    response = await node.request("GET", "/v1/catalogue", token=producer_token())
    assert response.status_code == 401


# The catalogue follows notify.kinds_dir while the daemon runs.

INVITE = '["invite"]\ncategory = "social"\ntemplate = "{count} invitations"\n'


def kinds_dir_config(root: Path) -> Any:
    return make_config(notify={"categories": ["social"], "kinds_dir": str(root)})


def put(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


async def fetch(node: Node, etag: str | None = None) -> Any:
    headers = {"If-None-Match": etag} if etag else {}
    return await node.request(
        "GET", "/v1/catalogue", token=device_token("alex", "phone"), headers=headers
    )


async def test_get_catalogue_follows_a_kinds_file_added_changed_and_removed(
    launch: Launch, tmp_path: Path
) -> None:
    node = await launch(config=kinds_dir_config(tmp_path))
    before = await fetch(node)
    assert "acme/chat:invite" not in before.json()["kinds"]

    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    added = await fetch(node, before.headers["etag"])
    assert added.status_code == 200
    assert added.json()["kinds"]["acme/chat:invite"] == {
        "category": "social",
        "template": "{count} invitations",
    }
    assert added.headers["etag"] == f'"{added.json()["version"]}"' != before.headers["etag"]

    path.write_text(INVITE.replace("invitations", "invites"), encoding="utf-8")
    changed = await fetch(node, added.headers["etag"])
    assert changed.status_code == 200
    assert changed.json()["kinds"]["acme/chat:invite"]["template"] == "{count} invites"

    path.unlink()
    removed = await fetch(node, before.headers["etag"])
    assert removed.status_code == 304 and removed.headers["etag"] == before.headers["etag"]
    assert (await fetch(node)).json() == before.json()


async def test_an_invalid_kinds_file_keeps_the_last_good_catalogue_and_is_reported(
    launch: Launch, tmp_path: Path
) -> None:
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    node = await launch(config=kinds_dir_config(tmp_path))
    good = (await fetch(node)).json()
    assert "acme/chat:invite" in good["kinds"]

    path.write_text(INVITE.replace("{count}", "{name}"), encoding="utf-8")
    assert (await fetch(node)).json() == good
    metrics = (await node.request("GET", "/metrics")).text
    assert "bothy_catalogue_invalid_files 1.0" in metrics


async def test_the_daemon_starts_with_an_invalid_kinds_file_and_serves_the_rest(
    launch: Launch, tmp_path: Path
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    put(tmp_path, "acme/board/kinds.toml", "[oops\n")
    put(tmp_path, "flat.toml", INVITE)
    node = await launch(config=kinds_dir_config(tmp_path))
    kinds = (await fetch(node)).json()["kinds"]
    assert "acme/chat:invite" in kinds and not any(k.startswith("acme/board:") for k in kinds)
    assert node.metrics.catalogue_invalid_files._value.get() == 2


def test_check_config_fails_naming_an_invalid_kinds_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kinds = tmp_path / "kinds"
    put(kinds, "acme/chat/kinds.toml", INVITE.replace("{count}", "{name}"))
    put(kinds, "flat.toml", INVITE)
    config = tmp_path / "bothy.toml"
    config.write_text(f'[notify]\ncategories = ["social"]\nkinds_dir = "{kinds}"\n')
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert 'notify.kinds_dir: acme/chat/kinds.toml: "invite".template: placeholder {name}' in err
    assert "notify.kinds_dir: flat.toml: in the wrong place" in err


async def test_new_decisions_carry_the_version_of_the_directory_at_their_round(
    launch: Launch, tmp_path: Path
) -> None:
    # No GET in between: the round itself takes the directory's changes in.
    node = await launch(config=kinds_dir_config(tmp_path))
    await node.append(ev("user.upserted", user_id="sam", kind="human", active=True))
    await node.register("sam", "sam-phone", "sam-token")

    def invite(key: str) -> dict[str, Any]:
        return ev(
            "hint.requested",
            recipients=["sam"],
            category="social",
            kind="acme/chat:invite",
            target_id="alex",
            idempotency_key=key,
        )

    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    installed = load_catalogue(kinds_dir_config(tmp_path).notify).version
    await node.append(invite("first"))
    await node.settle()
    (tmp_path / "acme/chat/kinds.toml").unlink()
    await node.append(invite("second"))
    await node.settle()

    assert installed != Catalogue.builtin().version
    assert [s.payload["mv"] for s in node.fake.sends] == [installed, Catalogue.builtin().version]


async def test_an_idle_node_reports_a_kinds_file_that_becomes_invalid(
    launch: Launch, tmp_path: Path
) -> None:
    # A worker serves no GET /v1/catalogue, and no event arrives: the node's own watch
    # still takes the change in, so the metric an operator alerts on is true.
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    config = make_config(
        server={"role": "worker"}, notify={"categories": ["social"], "kinds_dir": str(tmp_path)}
    )
    node = await launch(config=config)
    good = node.daemon.catalogue
    path.write_text(INVITE.replace("{count}", "{name}"), encoding="utf-8")
    with trio.fail_after(15):
        while (
            "bothy_catalogue_invalid_files 1.0" not in (await node.request("GET", "/metrics")).text
        ):
            await trio.sleep(0.05)
    assert node.daemon.catalogue == good
    path.write_text(INVITE.replace("invitations", "invites"), encoding="utf-8")
    with trio.fail_after(15):
        while node.daemon.catalogue.get("acme/chat:invite") == good.get("acme/chat:invite"):
            await trio.sleep(0.05)
    assert "bothy_catalogue_invalid_files 0.0" in (await node.request("GET", "/metrics")).text
