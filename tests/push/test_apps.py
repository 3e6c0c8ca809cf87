"""Several apps per server: ``[push.<provider>.apps.<app_id>]`` override their block,
a registration's ``app_id`` selects its app, and each app has its own provider
token, connections and permits (one app's stall never holds another's sends)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bothy_notify import commands
from bothy_notify.cli import main
from bothy_notify.config import ConfigError, load_config_text, provider_apps, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push import providers as provider_table
from bothy_notify.push.apns import ApnsProvider
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.webpush import generate_vapid_key
from bothy_notify.store import registrations as regs
from testkit.fakes.apns import FakeApns
from testkit.fakes.fcm import PROJECT, FakeFcm
from tests.harness import Launch, Node, device_token, make_config, wait_for
from tests.push.test_delivery import message, people
from tests.support.threaded import served_in_a_thread

RELEASE, BETA = "com.example.chat", "com.example.chat.beta"
KEY_A, TEAM_A, KEY_B, TEAM_B = "KEYAAAAAAA", "TEAMAAAAAA", "KEYBBBBBBB", "TEAMBBBBBB"


def pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@pytest.fixture(scope="module")
def keys() -> tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey]:
    return ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())


def apns_apps(endpoint: str, ca_file: str) -> dict[str, Any]:
    """Two apps: the release one takes the block's key and team, the beta its own;
    neither names its bundle id (it defaults to the app id)."""
    return {
        "key": "env:APNS_A",
        "key_id": KEY_A,
        "team_id": TEAM_A,
        "endpoint": endpoint,
        "ca_file": ca_file,
        "apps": {
            RELEASE: {},
            BETA: {"key": "env:APNS_B", "key_id": KEY_B, "team_id": TEAM_B},
        },
    }


def env(keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey]) -> dict[str, str]:
    return {"APNS_A": pem(keys[0]), "APNS_B": pem(keys[1])}


# ---------------------------------------------------------------- configuration


def test_each_app_overrides_its_block_and_the_bundle_id_defaults_to_the_app_id(
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
) -> None:
    config = structure_config(
        {"push": {"apns": apns_apps("https://127.0.0.1:1", "")}}, env=env(keys)
    )
    assert config.push.apns is not None
    apps = {a.app_id: a for a in provider_apps("apns", config.push.apns)}
    assert set(apps) == {RELEASE, BETA}
    assert apps[RELEASE].settings.bundle_id == RELEASE
    assert apps[BETA].settings.bundle_id == BETA
    assert (apps[RELEASE].settings.key_id, apps[BETA].settings.key_id) == (KEY_A, KEY_B)
    assert apps[BETA].settings.endpoint == "https://127.0.0.1:1"  # inherited
    assert apps[BETA].key == f"push.apns.apps.{BETA}"


def test_a_block_without_apps_is_one_default_app_as_before(
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
) -> None:
    block = {"key": "env:APNS_A", "key_id": KEY_A, "team_id": TEAM_A, "bundle_id": RELEASE}
    config = structure_config({"push": {"apns": block}}, env=env(keys))
    built = provider_table.build(config.push, dev=False)
    assert isinstance(built["apns"], ApnsProvider)


@pytest.mark.parametrize(
    ("apps", "message"),
    [
        ({BETA: {"key_id": "short"}}, f"push.apns.apps.{BETA}.key_id: expected the key's"),
        ({BETA: {"team_id": ""}}, f"push.apns.apps.{BETA}.team_id: required key is missing"),
        ({BETA: {"bundle_id": "nodots"}}, f"push.apns.apps.{BETA}.bundle_id: expected a bundle"),
        ({BETA: {"colour": "red"}}, f"push.apns.apps.{BETA}.colour: unknown key"),
        ({"bad app!": {}}, "push.apns.apps: each key must match"),
    ],
)
def test_a_bad_app_fails_startup_naming_the_app_and_the_key(
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    apps: dict[str, Any],
    message: str,
) -> None:
    block = {"key": "env:APNS_A", "key_id": KEY_A, "team_id": TEAM_A, "apps": apps}
    with pytest.raises(ConfigError) as caught:
        config = structure_config({"push": {"apns": block}}, env=env(keys))
        provider_table.build(config.push, dev=False)
    assert message in str(caught.value)


def test_check_config_loads_every_apps_credentials_and_names_the_failing_app(
    tmp_path: Path,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("APNS_A", pem(keys[0]))
    monkeypatch.setenv("APNS_B", "not a key at all")
    path = tmp_path / "bothy.toml"
    path.write_text(
        '[push.apns]\nkey = "env:APNS_A"\nkey_id = "KEYAAAAAAA"\nteam_id = "TEAMAAAAAA"\n'
        f'[push.apns.apps."{RELEASE}"]\n'
        f'[push.apns.apps."{BETA}"]\nkey = "env:APNS_B"\n'
        '[push.fcm.apps."other"]\nservice_account = "secret:fcm-other"\n'
    )
    assert main(["check-config", "--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert f"push.apns.apps.{BETA}.key: not a .p8 key" in error
    assert "not a key at all" not in error

    monkeypatch.setenv("APNS_B", pem(keys[1]))
    out = io.StringIO()
    assert main(["check-config", "--config", str(path)], stdout=out) == 0
    printed = out.getvalue()
    assert f"provider apns: apps {RELEASE}, {BETA}" in printed
    assert "push.fcm.apps.other.service_account" in printed  # from the store at run


# ---------------------------------------------------------------- registrations


async def register(node: Node, user: str, token: str, **extra: Any) -> Any:
    return await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "apns", "token": token, **extra},
        token=device_token(user, f"{user}-phone"),
    )


async def test_with_apps_a_registration_must_name_one_of_them(launch: Launch) -> None:
    node = await launch(providers={"apns": {RELEASE: FakeProvider(), BETA: FakeProvider()}})
    missing = await register(node, "alex", "ab" * 32)
    unknown = await register(node, "alex", "ab" * 32, app_id="com.example.other")
    known = await register(node, "alex", "ab" * 32, app_id=BETA)

    for refused in (missing, unknown):
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "unknown_app"
        assert "com.example.other" not in refused.text
    assert known.status_code == 201
    assert await node.sql("SELECT app_id FROM bothy.push_registrations") == [(BETA,)]


async def test_without_apps_the_app_id_selects_nothing(launch: Launch) -> None:
    node = await launch(providers={"apns": FakeProvider()})
    assert (await register(node, "alex", "ab" * 32, app_id="anything")).status_code == 201


# ---------------------------------------------------------------- per-app sends


@pytest.fixture
async def two_app_apns(
    nursery: trio.Nursery,
    ca: trustme.CA,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    now_clock: FakeClock,
) -> AsyncIterator[FakeApns]:
    fake = FakeApns(
        ca=ca,
        public_key=keys[0].public_key(),
        key_id=KEY_A,
        team_id=TEAM_A,
        topic=RELEASE,
        clock=now_clock.now,
        apps={
            RELEASE: (keys[0].public_key(), KEY_A, TEAM_A),
            BETA: (keys[1].public_key(), KEY_B, TEAM_B),
        },
    )
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the provider broke an APNs rule"


async def start_apps(
    launch: Launch,
    fake: FakeApns,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    ca_file: str,
    clock: FakeClock,
    **push: Any,
) -> Node:
    config = structure_config({"push": {"apns": apns_apps(fake.url, ca_file)}}, env=env(keys))
    built = provider_table.build(config.push, dev=False, clock=clock)
    node = await launch(config=make_config(push=push), providers=built, clock=clock)
    await people(node)
    return node


def sent(node: Node, app: str, outcome: str = "delivered") -> float:
    value = node.daemon.metrics.registry.get_sample_value(
        "bothy_push_sends_total", {"provider": "apns", "outcome": outcome, "app": app}
    )
    return value or 0.0


async def test_each_app_sends_with_its_own_topic_and_provider_token(
    launch: Launch,
    two_app_apns: FakeApns,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start_apps(launch, two_app_apns, keys, ca_file, now_clock)
    assert (await register(node, "alex", "aa" * 32, app_id=RELEASE)).status_code == 201
    await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "apns", "token": "bb" * 32, "app_id": BETA},
        token=device_token("alex", "alex-ipad"),
    )
    await node.append(message(1))
    await node.settle()

    seen = {
        r.device_token: (r.headers["apns-topic"], r.jwt_header["kid"], r.jwt_claims["iss"])
        for r in two_app_apns.delivered()
    }
    assert seen == {"aa" * 32: (RELEASE, KEY_A, TEAM_A), "bb" * 32: (BETA, KEY_B, TEAM_B)}
    assert (sent(node, RELEASE), sent(node, BETA)) == (1, 1)
    assert sent(node, "default") == 0


async def test_one_apps_stall_never_holds_another_apps_sends(
    launch: Launch,
    two_app_apns: FakeApns,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start_apps(launch, two_app_apns, keys, ca_file, now_clock, max_in_flight=4)
    two_app_apns.stall_topics.add(BETA)  # the beta app's sends hang (its key is revoked...)
    for i in range(6):
        await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "apns", "token": f"{i:02x}" * 32, "app_id": BETA},
            token=device_token("alex", f"beta-{i}"),
        )
    assert (await register(node, "alex", "aa" * 32, app_id=RELEASE)).status_code == 201
    messages = 20

    await node.append(*[message(seq) for seq in range(1, messages + 1)])
    with trio.fail_after(8):  # inside the 10 s request bound: no held send has timed out
        while two_app_apns.count < messages + 4:
            await two_app_apns.changed.wait()

    async def released_all() -> bool:
        await trio.lowlevel.checkpoint()
        return sent(node, RELEASE) == messages

    await wait_for(released_all, timeout=8, what="the release app's pushes")
    assert node.daemon.providers is not None
    in_flight = node.daemon.providers.app_statistics()
    assert in_flight[("apns", BETA)] == 4  # every beta permit is held by its stall
    assert sent(node, RELEASE) == messages  # the release app delivered every push meanwhile
    assert sent(node, BETA) == 0
    two_app_apns.resume()


async def test_each_fcm_app_sends_to_its_own_project(
    nursery: trio.Nursery,
    ca: trustme.CA,
    ca_file: str,
    fcm_key: rsa.RSAPrivateKey,
    now_clock: FakeClock,
    launch: Launch,
) -> None:
    fake = FakeFcm(
        ca=ca,
        key=fcm_key,
        projects={"bothy-beta": ("push@bothy-beta.iam.gserviceaccount.com", fcm_key)},
    )
    await nursery.start(fake.serve)
    block = {
        "service_account": "env:FCM_RELEASE",
        "endpoint": fake.url,
        "ca_file": ca_file,
        "apps": {"release": {}, "beta": {"service_account": "env:FCM_BETA"}},
    }
    config = structure_config(
        {"push": {"fcm": block}},
        env={
            "FCM_RELEASE": fake.service_account(),
            "FCM_BETA": fake.service_account(project="bothy-beta"),
        },
    )
    built = provider_table.build(config.push, dev=False, clock=now_clock)
    node = await launch(providers=built, clock=now_clock)
    await people(node)
    for device, app in (("alex-phone", "release"), ("alex-tablet", "beta")):
        response = await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "fcm", "token": f"fcm-{device}", "app_id": app},
            token=device_token("alex", device, "android"),
        )
        assert response.status_code == 201
    await node.append(message(1))
    await node.settle()

    projects = {r.body["message"]["token"]: r.project for r in fake.requests}
    assert projects == {"fcm-alex-phone": PROJECT, "fcm-alex-tablet": "bothy-beta"}
    assert fake.violations == []  # each token was its own project's
    assert fake.token_fetches == 2  # one access token cache per app


async def test_each_web_push_app_serves_its_own_vapid_key(launch: Launch) -> None:
    (pem_a, public_a), (pem_b, public_b) = generate_vapid_key(), generate_vapid_key()
    config = load_config_text(
        '[push.webpush]\nsubject = "mailto:ops@example.com"\n'
        '[push.webpush.apps.chat]\nvapid_private_key = "env:A"\n'
        '[push.webpush.apps.shop]\nvapid_private_key = "env:B"\n',
        env={"A": pem_a, "B": pem_b},
    )
    node = await launch(providers=provider_table.build(config.push, dev=False))
    keys = {}
    for app in ("chat", "shop"):
        response = await node.request("GET", f"/v1/webpush/key?app_id={app}")
        keys[app] = response.json()["public_key"]
    unknown = await node.request("GET", "/v1/webpush/key?app_id=other")
    missing = await node.request("GET", "/v1/webpush/key")

    assert keys == {"chat": public_a, "shop": public_b}
    assert (unknown.status_code, missing.status_code) == (422, 422)
    assert unknown.json()["error"]["code"] == "unknown_app"


def test_push_test_reports_per_app(
    database_url: str,
    tmp_path: Path,
    keys: tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey],
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    def make() -> FakeApns:
        return FakeApns(
            ca=ca,
            public_key=keys[0].public_key(),
            key_id=KEY_A,
            team_id=TEAM_A,
            topic=RELEASE,
            apps={
                RELEASE: (keys[0].public_key(), KEY_A, TEAM_A),
                BETA: (keys[1].public_key(), KEY_B, TEAM_B),
            },
        )

    with served_in_a_thread(make) as fake:
        with psycopg.connect(database_url) as conn:
            for token, app in (("aa" * 32, RELEASE), ("bb" * 32, BETA), ("cc" * 32, BETA)):
                regs.upsert(
                    conn,
                    user_id="alex",
                    device_id=f"d-{token[:4]}",
                    provider="apns",
                    token=token,
                    environment="production",
                    app_id=app,
                    signing_key=None,
                    now=datetime.now(UTC),
                )
        config = structure_config(
            {
                "database": {"url": database_url},
                "push": {"apns": apns_apps(fake.url, str(ca_file))},
            },
            env=env(keys),
        )
        out = io.StringIO()
        code = commands.push_test_command(config, "alex", out)

    printed = out.getvalue()
    assert code == 0, printed
    assert f"apns app {RELEASE}: 1 of 1 delivered" in printed
    assert f"apns app {BETA}: 2 of 2 delivered" in printed
    assert f"(apns, production, app {BETA}): delivered" in printed
    assert fake.violations == []
    assert {r.headers["apns-topic"] for r in fake.delivered()} == {RELEASE, BETA}
