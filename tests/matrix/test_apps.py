"""[matrix_gateway] apps: each Matrix app id's provider, app and environment, checked."""

from __future__ import annotations

import pytest

from bothy_notify.config import ConfigError, load_config_text
from bothy_notify.matrix.apps import AppRoute, parse_route, routes

PUSH = """
[push.apns]
key = "env:APNS_KEY"
key_id = "ABC123DEFG"
team_id = "DEF123GHIJ"
bundle_id = "com.example.chat"
[push.fcm.apps.example]
service_account = "env:FCM"
[push.fcm.apps.other]
service_account = "env:FCM"
[push.fake]
"""


def config(apps: str) -> str:
    return PUSH + "[matrix_gateway.apps]\n" + apps


def test_without_the_section_there_are_no_routes() -> None:
    assert routes(load_config_text(PUSH, env={"APNS_KEY": "k", "FCM": "{}"})) == {}


def test_each_form_of_an_entry_reads_as_its_route() -> None:
    loaded = load_config_text(
        config(
            '"im.example.ios" = "apns"\n'
            '"im.example.ios.dev" = "apns@sandbox"\n'
            '"im.example.android" = "fcm:example"\n'
            '"im.example.test" = "fake"\n'
        ),
        env={"APNS_KEY": "k", "FCM": "{}"},
    )
    assert routes(loaded) == {
        "im.example.ios": AppRoute("im.example.ios", "apns", None, None),
        "im.example.ios.dev": AppRoute("im.example.ios.dev", "apns", None, "sandbox"),
        "im.example.android": AppRoute("im.example.android", "fcm", "example", None),
        "im.example.test": AppRoute("im.example.test", "fake", None, None),
    }


def test_the_owner_of_a_matrix_apps_registrations_is_no_possible_person() -> None:
    owner = parse_route("im.example.ios", "apns").owner
    assert owner == "matrix-gateway/im.example.ios"
    assert "/" in owner  # outside [A-Za-z0-9._:-]: no JWT sub, no event's user_id


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("gcm", "expected provider[:app][@environment] with a provider of apns, fcm, webpush"),
        ("webhook", "expected provider[:app][@environment]"),
        ("webpush", "[push.webpush] is not configured"),
        ("fcm", "name one of [push.fcm.apps] as fcm:<app>"),
        ("fcm:nope", "fcm has no app of that name"),
        ("apns:beta", "[push.apns] has no apps: give the provider alone"),
        ("apns@staging", "the environment is one of sandbox, production"),
        ("fake@sandbox", "fake takes no @environment"),
    ],
)
def test_a_wrong_entry_is_named_with_what_is_wrong(value: str, problem: str) -> None:
    loaded = load_config_text(
        config(f'"im.example.ios" = "{value}"\n"im.example.ok" = "apns"\n'),
        env={"APNS_KEY": "k", "FCM": "{}"},
    )
    with pytest.raises(ConfigError) as caught:
        routes(loaded)
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == 1
    assert lines[0].strip().startswith('matrix_gateway.apps."im.example.ios": ' + problem)
