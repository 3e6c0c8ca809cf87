"""The provider table: what every other part reads about a provider comes from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bothy_notify.config import ConfigError, PushConfig, load_config_text
from bothy_notify.push import providers as table
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.registry import Providers
from bothy_notify.push.webpush import generate_vapid_key
from tests.support.repo import SCHEMA_DIR

PACKAGE = Path(table.__file__).resolve().parent.parent


def test_every_entry_is_a_provider_block_of_the_configuration() -> None:
    fields = PushConfig.__dataclass_fields__
    assert set(table.PROVIDER_NAMES) <= set(fields)
    assert [n for n in fields if n in table.PROVIDER_NAMES] == sorted(
        table.PROVIDER_NAMES, key=list(fields).index
    )


def test_the_openapi_documents_static_enumerations_list_every_provider() -> None:
    document = yaml.safe_load((SCHEMA_DIR / "openapi.yaml").read_text())
    schemas = document["components"]["schemas"]

    def branches(name: str, field: str) -> list[str]:
        """The ``const`` of ``field`` in each branch of ``name``'s ``oneOf``."""
        return [
            schemas[b["$ref"].rsplit("/", 1)[1]]["properties"][field]["const"]
            for b in schemas[name]["oneOf"]
        ]

    assert branches("RegistrationRequest", "provider") == list(table.PROVIDER_NAMES)
    channels = list(table.topic_channels())
    assert branches("RecipientRegistration", "channel") == channels
    assert schemas["RecipientState"]["properties"]["channel"]["enum"] == channels


def test_the_apns_device_token_is_checked_in_one_place() -> None:
    holders = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "{64,200}" in path.read_text()
    ]
    assert holders == ["push/apns.py"]


def test_configured_apps_and_vapid_keys_come_from_the_running_providers() -> None:
    pem, public = generate_vapid_key()
    config = load_config_text(
        '[push.webpush]\nvapid_private_key = "env:V"\nsubject = "mailto:a@b.example"\n',
        env={"V": pem},
    )
    built = table.build(config.push, dev=False)
    providers = Providers(
        {**built, "apns": {"com.a": FakeProvider(), "com.b": FakeProvider()}}, max_in_flight=1
    )
    assert table.configured_apps(providers) == {"apns": ("com.a", "com.b"), "webpush": ()}
    assert table.vapid_keys(providers) == {"": public}


def test_check_lists_the_secrets_it_could_not_read_and_names_each_bad_key() -> None:
    config = load_config_text(
        '[push.apns]\nkey = "secret:apns"\nkey_id = "KEYAAAAAAA"\nteam_id = "TEAMAAAAAA"\n'
        '[push.apns.apps."com.a"]\n[push.apns.apps."com.b"]\nkey_id = "short"\n'
        '[push.webpush]\nvapid_private_key = "secret:vapid"\nsubject = "mailto:a@b.example"\n',
        env={},
    )
    with pytest.raises(Exception, match=r"push\.apns\.apps\.com\.b\.key_id") as caught:
        table.check(config.push)
    assert "com.a" not in str(caught.value)
    good = load_config_text(
        '[push.apns]\nkey = "secret:apns"\nkey_id = "KEYAAAAAAA"\nteam_id = "TEAMAAAAAA"\n'
        'bundle_id = "com.a.b"\n'
        '[push.webpush]\nvapid_private_key = "secret:vapid"\nsubject = "mailto:a@b.example"\n',
        env={},
    )
    assert table.check(good.push) == ["push.apns.key", "push.webpush.vapid_private_key"]


def test_a_provider_outside_the_table_gets_a_plain_token_entry() -> None:
    entry = table.entry("stall")
    assert entry.name == "stall" and entry.token_max == 4096 and entry.moves


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            '[push.webhook]\nallowed_domains = ["*.example.org", "*.org."]',
            "push.webhook.allowed_domains: each entry is a host or *.suffix",
        ),
        (
            '[push.webpush]\nvapid_private_key = "env:V"\nsubject = "mailto:a@b.example"\n'
            'allowed_endpoints = ["*"]',
            "push.webpush.allowed_endpoints: each entry is a host or *.suffix",
        ),
        (
            '[push.webpush]\nvapid_private_key = "env:V"\nsubject = "http://ops.example"',
            "push.webpush.subject: expected mailto:address or an https:// URL",
        ),
        (
            '[push.webpush]\nvapid_private_key = "env:V"\nsubject = "mailto:a@b.example"\n'
            '[push.webpush.apps.beta]\nsubject = "ops"',
            "push.webpush.apps.beta.subject: expected mailto:address or an https:// URL",
        ),
    ],
)
def test_a_providers_own_rules_are_checked_by_its_prepare_naming_the_key(
    block: str, message: str
) -> None:
    pem, _public = generate_vapid_key()
    config = load_config_text(block, env={"V": pem})  # the loader knows the keys only
    with pytest.raises(ConfigError) as caught:
        table.check(config.push)
    assert message in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        table.build(config.push, dev=False)
    assert message in str(caught.value)


def test_only_the_key_table_of_the_configuration_names_a_provider() -> None:
    # A provider's rules live in its prepare: the loader, the overrides and the schema
    # name no provider and no provider's block (the package re-exports the blocks).
    def names_a_provider(text: str) -> bool:
        return any(
            f'"{name}"' in text
            or f"{name}settings" in text.lower()
            or f"{name}config" in text.lower()
            for name in table.PROVIDER_NAMES
        )

    naming = sorted(
        path.name
        for path in (PACKAGE / "config").glob("*.py")
        if names_a_provider(path.read_text())
    )
    assert naming == ["__init__.py", "keys.py"]
