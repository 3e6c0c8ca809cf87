"""The kind catalogue: built-ins, configured kinds, template rules, the content
version, and ``GET /v1/catalogue``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bothy_notify.config import ConfigError, NotifyConfig
from bothy_notify.notify.catalogue import Catalogue, KindEntry, load_catalogue
from bothy_notify.wiring import Daemon
from tests.harness import Launch, device_token, make_config, producer_token

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


def test_the_daemon_refuses_to_start_with_a_bad_template() -> None:
    config = make_config(
        notify={
            "categories": ["social"],
            "kinds": {"social:x": {"category": "social", "template": "{title}"}},
        }
    )
    with pytest.raises(ConfigError, match=r'notify\.kinds\."social:x"\.template'):
        Daemon(config)


def write(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text, encoding="utf-8")


def test_a_kinds_directory_adds_kinds_from_every_toml_file(tmp_path: Path) -> None:
    write(
        tmp_path,
        "social.toml",
        '["social:friend_request"]\ncategory = "social"\n'
        'template = "{count} requests"\nlink = "app://people/{target_id}"\n',
    )
    write(tmp_path, "more.toml", '["social:invite"]\ncategory = "social"\n')
    write(tmp_path, "README.md", "not a kinds file")
    config = make_config(notify={"categories": ["social"], "kinds_dir": str(tmp_path)})
    catalogue = load_catalogue(config.notify)
    assert catalogue.get("social:invite") == KindEntry("social:invite", "social")
    assert catalogue.get("social:friend_request") == KindEntry(
        "social:friend_request", "social", "{count} requests", "app://people/{target_id}"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '["social:x"]\ncategory = "social"\ntemplate = "{who}"\n',
            'notify.kinds_dir: bad.toml: "social:x".template: placeholder {who}',
        ),
        (
            '["social:x"]\ntemplate = "{count}"\n',
            'notify.kinds_dir: bad.toml: "social:x".category: required',
        ),
        (
            '["social:x"]\ncategory = "social"\ncolour = "red"\n',
            'notify.kinds_dir: bad.toml: "social:x".colour: unknown key',
        ),
        (
            '["social:friend_request"]\ncategory = "social"\n',
            'notify.kinds_dir: bad.toml: "social:friend_request": the kind is already defined in '
            "notify.kinds",
        ),
        ("[oops\n", "notify.kinds_dir: bad.toml: not valid TOML"),
    ],
)
def test_a_bad_kinds_file_is_refused_naming_the_file_and_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    write(tmp_path, "bad.toml", text)
    config = make_config(
        notify={
            "categories": ["social"],
            "kinds_dir": str(tmp_path),
            "kinds": {"social:friend_request": FRIEND},
        }
    )
    with pytest.raises(ConfigError) as caught:
        load_catalogue(config.notify)
    assert problem in str(caught.value)


def test_a_missing_kinds_directory_is_refused(tmp_path: Path) -> None:
    config = make_config(notify={"kinds_dir": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"notify\.kinds_dir: not a directory"):
        load_catalogue(config.notify)


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
