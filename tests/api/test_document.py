"""``GET /v1/openapi.json``: the static document with the running configuration's
enumerations, standing alone, and saying exactly what the server accepts."""

from __future__ import annotations

import base64
import dataclasses
import os
import re
from typing import Any

import httpx
import pytest
import schemathesis
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from bothy_notify.api.document import (
    Enumerations,
    base_document,
    served_document,
)
from bothy_notify.config import PushConfig, load_config_text
from bothy_notify.push import providers as provider_table
from bothy_notify.push.providers import PROVIDER_NAMES, topic_channels
from bothy_notify.push.resolver import host_allowed
from bothy_notify.push.webpush import generate_vapid_key, registrant
from testkit.fakes.webpush import Browser
from tests.harness import Launch, make_config

ALL = frozenset(PROVIDER_NAMES)
CHANNELS = frozenset(topic_channels())


def enums(**changes: Any) -> Enumerations:
    values: dict[str, Any] = {
        "categories": ("messages", "mentions", "security", "admin", "social"),
        "app_categories": ("social",),
        "providers": ALL,
    }
    values.update(changes)
    return Enumerations(**values)


def accepts(document: dict[str, Any], schema: str, instance: object) -> bool:
    """Whether ``#/components/schemas/<schema>`` of ``document`` accepts ``instance``."""
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc", DRAFT202012.create_resource(document)
    )
    validator = Draft202012Validator(
        {"$ref": f"urn:doc#/components/schemas/{schema}"}, registry=registry
    )
    return validator.is_valid(instance)


def branches(document: dict[str, Any], schema: str, field: str) -> list[str]:
    schemas = document["components"]["schemas"]
    return [
        schemas[b["$ref"].rsplit("/", 1)[1]]["properties"][field]["const"]
        for b in schemas[schema].get("oneOf", [])
    ]


def test_the_served_document_stands_alone_and_loads() -> None:
    document = served_document(enums(matrix_devices=100))
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            assert "$id" not in node and "maxDecodedBytes" not in node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert refs and all(ref.startswith("#/components/") for ref in refs)
    schema = schemathesis.openapi.from_dict(document)
    served = {op.ok().label for op in schema.get_all_operations()}  # type: ignore[union-attr]
    base = {
        f"{method.upper()} {path}"
        for path, item in base_document()["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete")
    }
    assert served == base


def test_the_matrix_gateways_path_is_served_only_when_configured() -> None:
    assert "/_matrix/push/v1/notify" not in served_document(enums())["paths"]
    document = served_document(enums(matrix_devices=7))
    assert "/_matrix/push/v1/notify" in document["paths"]
    request = {"notification": {"devices": [{"app_id": "a", "pushkey": "k"}] * 7}}
    assert accepts(document, "MatrixNotifyRequest", request)
    request["notification"]["devices"] *= 2
    assert not accepts(document, "MatrixNotifyRequest", request)


def test_only_the_configured_providers_and_channels_have_a_branch() -> None:
    document = served_document(enums(providers=frozenset({"fake", "fcm"})))
    assert branches(document, "RegistrationRequest", "provider") == ["fcm", "fake"]
    assert branches(document, "RecipientRegistration", "channel") == ["fcm", "fake"]
    assert not accepts(document, "RegistrationRequest", {"provider": "apns", "token": "a" * 64})
    assert accepts(document, "RegistrationRequest", {"provider": "fcm", "token": "tok"})


def test_every_provider_the_daemon_can_configure_has_a_branch_in_the_base() -> None:
    document = served_document(enums())
    assert set(branches(document, "RegistrationRequest", "provider")) == ALL
    assert set(branches(document, "RecipientRegistration", "channel")) == CHANNELS
    # The provider blocks of push.*: each one a provider a registration may name.
    blocks = {f.name for f in dataclasses.fields(PushConfig) if f.default is None}
    assert blocks == ALL


def test_without_providers_no_registration_is_allowed() -> None:
    document = served_document(enums(providers=frozenset()))
    assert not accepts(document, "RegistrationRequest", {"provider": "fake", "token": "t"})


def test_per_channel_fields_are_the_servers() -> None:
    document = served_document(enums())
    identity = {"recipient_id": base64.b64encode(b"i" * 32).decode()}
    identity["recipient_secret"] = base64.b64encode(b"s" * 32).decode()
    key16 = base64.b64encode(b"k" * 16).decode()
    cases = [
        ({"channel": "fcm", "token": "t", "url": ""}, False),  # the example
        ({"channel": "fcm", "token": "t"}, True),
        ({"channel": "fcm", "token": "t", "environment": "sandbox"}, False),
        ({"channel": "apns", "token": "ab" * 32, "environment": "sandbox"}, True),
        ({"channel": "apns", "token": "not hex"}, False),
        ({"channel": "webhook", "url": "https://h.example/x", "signing_key": key16}, True),
        ({"channel": "webhook", "url": "https://h.example/x"}, False),
        ({"channel": "webhook", "url": "https://h.example/x", "signing_key": "AAAA"}, False),
        ({"channel": "fake", "token": "t", "signing_key": key16}, False),
    ]
    for body, allowed in cases:
        assert accepts(document, "RecipientRegistration", {**identity, **body}) is allowed, body


def test_topics_and_keys_are_their_exact_lengths() -> None:
    document = served_document(enums())
    schemas = document["components"]["schemas"]
    assert (schemas["Topic"]["minLength"], schemas["Topic"]["maxLength"]) == (24, 44)
    assert (schemas["Base64Bytes32"]["minLength"], schemas["Base64Bytes32"]["maxLength"]) == (
        44,
        44,
    )
    conversation = base64.b64encode(b"\x00" + b"c" * 16).decode()
    welcome = base64.b64encode(b"\x01" + b"w" * 32).decode()
    assert accepts(document, "Topic", conversation) and accepts(document, "Topic", welcome)
    assert not accepts(document, "Topic", base64.b64encode(b"\x00" + b"c" * 32).decode())
    assert not accepts(document, "Topic", conversation[:-1])


def test_categories_are_the_configured_ones() -> None:
    document = served_document(enums())
    assert accepts(document, "Preferences", {"categories": {"social": False, "admin": True}})
    assert not accepts(document, "Preferences", {"categories": {"billing": True}})
    assert not accepts(document, "Preferences", {"categories": {"security": False}})
    hint = {"recipients": ["a"], "kind": "social:poke"}
    assert accepts(document, "payload.hint.requested", {**hint, "category": "social"})
    assert not accepts(document, "payload.hint.requested", {**hint, "category": "admin"})


def test_without_app_categories_no_hint_requested_is_allowed() -> None:
    document = served_document(enums(app_categories=()))
    event = {
        "type": "hint.requested",
        "payload": {"recipients": ["a"], "category": "social", "kind": "social:poke"},
    }
    assert not accepts(document, "Event", event)
    assert accepts(
        document, "Event", {"type": "member.added", "payload": {"user_id": "a", "scope_id": "s"}}
    )


def test_apps_are_required_and_named_where_configured() -> None:
    document = served_document(enums(apps=(("fcm", ("beta", "release")),)))
    assert accepts(
        document, "RegistrationRequest", {"provider": "fcm", "token": "t", "app_id": "beta"}
    )
    assert not accepts(document, "RegistrationRequest", {"provider": "fcm", "token": "t"})
    assert not accepts(
        document, "RegistrationRequest", {"provider": "fcm", "token": "t", "app_id": "x"}
    )
    assert accepts(document, "RegistrationRequest", {"provider": "fake", "token": "t"})


def browser_subscription(endpoint: str = "https://push.example.test/p/1") -> dict[str, Any]:
    """``PushSubscription.toJSON()`` of a new browser key."""
    browser = Browser("b", endpoint, ec.generate_private_key(ec.SECP256R1()), os.urandom(16))
    return browser.subscription()


def test_a_web_push_registration_is_the_browsers_subscription() -> None:
    document = served_document(enums())
    subscription = browser_subscription()
    keys = subscription["keys"]
    cases: list[tuple[dict[str, Any], bool]] = [
        ({"subscription": subscription}, True),
        ({"subscription": subscription, "app_id": "web", "environment": "production"}, True),
        ({"subscription": {**subscription, "expirationTime": 4_102_444_800_000}}, True),
        ({}, False),
        ({"token": subscription["endpoint"]}, False),
        ({"subscription": subscription, "token": "t"}, False),
        ({"subscription": {**subscription, "extra": 1}}, False),
        ({"subscription": {**subscription, "expirationTime": 0}}, False),
        ({"subscription": {**subscription, "expirationTime": 253_402_300_800_000}}, False),
        ({"subscription": {**subscription, "endpoint": "http://push.example.test/p"}}, False),
        ({"subscription": {**subscription, "endpoint": "https://push.example.test/p#f"}}, False),
        (
            {"subscription": {**subscription, "keys": {**keys, "p256dh": "A" + keys["p256dh"]}}},
            False,
        ),
        ({"subscription": {**subscription, "keys": {**keys, "auth": keys["auth"][1:]}}}, False),
        ({"subscription": {**subscription, "keys": {**keys, "x": "y"}}}, False),
    ]
    for body, allowed in cases:
        request = {"provider": "webpush", **body}
        assert accepts(document, "RegistrationRequest", request) is allowed, body
        # The form the document gives is the server's (the curve and the clock aside).
        if "subscription" in body and set(request) <= {"provider", "subscription"}:
            found = registrant(request)
            assert (not hasattr(found, "field")) is allowed, (body, found)


ALLOWED = ("push.example.test", "*.push.example.org", "127.0.0.1", "::1")
HOSTS = [
    *("push.example.test", "PUSH.Example.TEST", "push.example.test.", "push.example.test.."),
    *("xpush.example.test", "push.example.test.evil", "push-example.test", "push.example"),
    *("a.push.example.org", "A.b-c.PUSH.example.org.", "a..b.push.example.org"),
    *("push.example.org", ".push.example.org", "a..push.example.org", "-.push.example.org"),
    *("apush.example.org", "127.0.0.1", "127.0.0.10", "[::1]", "[::2]", "[::1]."),
]


@settings(max_examples=300, deadline=None)
@given(
    host=st.sampled_from(HOSTS),
    rest=st.from_regex(r"\A(:[0-9]{1,5})?(/[!-~]{0,12})?\Z"),
)
def test_the_endpoint_pattern_names_exactly_the_allowed_hosts(host: str, rest: str) -> None:
    document = served_document(enums(webpush_hosts=((None, ALLOWED),)))
    endpoint = f"https://{host}{rest}"
    subscription = {**browser_subscription(), "endpoint": endpoint}
    in_document = accepts(document, "PushSubscription", subscription)
    found = registrant({"subscription": subscription})
    by_server = not hasattr(found, "field") and host_allowed(httpx.URL(endpoint).host, ALLOWED)
    assert in_document is by_server, (endpoint, found)


def test_apps_whose_hosts_differ_get_a_branch_each() -> None:
    hosts = (("chat", ("a.example",)), ("shop", ("b.example",)), ("blog", ("a.example",)))
    apps = (("webpush", ("blog", "chat", "shop")),)
    document = served_document(enums(apps=apps, webpush_hosts=hosts))
    for app_id, host, allowed in [
        ("chat", "a.example", True),
        ("blog", "a.example", True),
        ("shop", "b.example", True),
        ("shop", "a.example", False),
        ("chat", "b.example", False),
    ]:
        subscription = browser_subscription(f"https://{host}/p")
        body = {"provider": "webpush", "subscription": subscription, "app_id": app_id}
        assert accepts(document, "RegistrationRequest", body) is allowed, (app_id, host)
    body = {"provider": "webpush", "subscription": browser_subscription("https://a.example/")}
    assert not accepts(document, "RegistrationRequest", body)  # app_id is required
    same = served_document(
        enums(apps=apps, webpush_hosts=tuple((a, ("a.example",)) for a, _ in hosts))
    )
    assert branches(same, "RegistrationRequest", "provider").count("webpush") == 1
    nowhere = served_document(enums(webpush_hosts=((None, ()),)))
    assert "webpush" not in branches(nowhere, "RegistrationRequest", "provider")


def test_a_provider_with_apps_is_no_topic_channel_and_the_key_names_its_app() -> None:
    document = served_document(enums(apps=(("fcm", ("beta",)), ("webpush", ("chat", "shop")))))
    assert "fcm" not in branches(document, "RecipientRegistration", "channel")
    assert "apns" in branches(document, "RecipientRegistration", "channel")
    (app_id,) = document["paths"]["/v1/webpush/key"]["get"]["parameters"]
    assert app_id["required"] is True and app_id["schema"] == {"enum": ["chat", "shop"]}
    plain = served_document(enums())
    (app_id,) = plain["paths"]["/v1/webpush/key"]["get"]["parameters"]
    assert app_id["required"] is False  # without apps it is ignored


async def test_the_apps_and_hosts_are_the_running_configurations(launch: Launch) -> None:
    (pem_a, _), (pem_b, _) = generate_vapid_key(), generate_vapid_key()
    config = load_config_text(
        '[push.webpush]\nsubject = "mailto:ops@example.com"\n'
        'allowed_endpoints = ["push.example.test"]\n'
        '[push.webpush.apps.chat]\nvapid_private_key = "env:A"\n'
        '[push.webpush.apps.shop]\nvapid_private_key = "env:B"\n',
        env={"A": pem_a, "B": pem_b},
    )
    node = await launch(config=config, providers=provider_table.build(config.push, dev=False))
    document = (await node.request("GET", "/v1/openapi.json")).json()
    schemas = document["components"]["schemas"]
    assert branches(document, "RegistrationRequest", "provider") == ["webpush"]
    assert schemas["WebPushRegistrationRequest"]["properties"]["app_id"] == {
        "enum": ["chat", "shop"]
    }
    pattern = schemas["PushSubscription"]["properties"]["endpoint"]["pattern"]
    assert re.fullmatch(pattern, "https://Push.Example.Test/x")
    assert not re.fullmatch(pattern, "https://push.example.com/x")


def test_the_batch_bound_is_server_max_batch_events() -> None:
    document = served_document(enums(max_batch_events=3))
    member = {"type": "member.added", "payload": {"user_id": "a", "scope_id": "s"}}
    assert accepts(document, "EventBatch", {"events": [member] * 3})
    assert not accepts(document, "EventBatch", {"events": [member] * 4})


@pytest.mark.parametrize("decoded", [65_535, 65_536, 65_537])
def test_envelope_data_never_allows_more_than_the_server(decoded: int) -> None:
    document = served_document(enums())
    data = base64.b64encode(b"d" * decoded).decode()
    envelope = {
        "topic": base64.b64encode(b"\x00" + b"c" * 16).decode(),
        "kind": "application",
        "should_push": True,
        "data": data,
    }
    # 65,536 bytes is accepted by the server in its one 87,384-character form; the
    # document, in lengths alone, stops at 87,380 (its description names the form).
    assert accepts(document, "payload.envelope.published", envelope) is (decoded <= 65_535)


async def test_the_daemon_serves_it_without_a_token(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"categories": ["social"]}))
    answer = await node.request("GET", "/v1/openapi.json")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    document = answer.json()
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    assert schemas["payload.hint.requested"]["properties"]["category"]["enum"] == ["social"]
    assert branches(document, "RegistrationRequest", "provider") == ["fake"]


def test_the_links_make_resources_before_they_are_changed_or_deleted() -> None:
    # The stateful phase follows these: every link resolves to its target operation.
    schema = schemathesis.openapi.from_dict(served_document(enums()))
    assert schema.operations_with_incoming_links() == {
        "DELETE /v1/registrations/{registration_id}",
        "POST /v1/recipients/subscriptions",
        "POST /v1/recipients/unregister",
    }
    machine = schema.as_state_machine()
    linked = {name for name in dir(machine) if "___" in name and not name.startswith("RANDOM")}
    assert len(linked) == 7, sorted(linked)
