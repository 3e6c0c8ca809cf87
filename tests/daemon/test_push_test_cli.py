"""``bothy-notify push test --user ID`` tells the truth per registration."""

from __future__ import annotations

import base64
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify import commands
from bothy_notify.cli import main
from bothy_notify.config import ConfigError, structure_config
from bothy_notify.push import webpush
from bothy_notify.push.port import Registrant
from bothy_notify.store import registrations as regs
from bothy_notify.store import secrets as secret_store
from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.webpush import FakePushService
from tests.harness import make_config
from tests.support.threaded import served_in_a_thread

APNS_TOKEN = "ab" * 32


def register(database_url: str, token: str, provider: str = "fake", **extra: Any) -> str:
    with psycopg.connect(database_url) as conn:
        registration = regs.upsert(
            conn,
            user_id="alex",
            device_id=f"dev-{token[:12]}",
            provider=provider,
            token=token,
            environment=extra.get("environment"),
            app_id=None,
            signing_key=None,
            now=datetime.now(UTC),
        )
        return registration.registration.id


def state(database_url: str, registration_id: str) -> tuple[bool, str | None]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT invalidated_at, last_error FROM bothy.push_registrations WHERE id = %s",
            (registration_id,),
        ).fetchone()
    assert row is not None
    return row[0] is not None, row[1]


def run(config: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = commands.push_test_command(config, "alex", out)
    return code, out.getvalue()


def test_push_test_refuses_when_no_provider_is_configured(database_url: str) -> None:
    config = structure_config({"database": {"url": database_url}}, env={})
    with pytest.raises(commands.CommandError, match="no push provider is configured"):
        run(config)


def test_push_test_says_no_device_registered_instead_of_success(database_url: str) -> None:
    code, printed = run(make_config(database={"url": database_url}))
    assert code == 1
    assert "no device registered for this person: nothing was sent" in printed
    assert "delivered" not in printed


def test_push_test_counts_retired_registrations_as_no_device(database_url: str) -> None:
    config = make_config(database={"url": database_url})
    register(database_url, "dead-old")
    run(config)
    code, printed = run(config)
    assert code == 1
    assert "no device registered for this person (1 retired" in printed


def test_push_test_reports_what_happened_per_registration(database_url: str) -> None:
    ids = {
        token: register(database_url, token)
        for token in ("phone-ok", "dead-1", "mismatch-1", "rejected-1", "transient-1")
    }
    code, printed = run(make_config(database={"url": database_url}))

    lines = {line.split(" ", 2)[1]: line for line in printed.splitlines() if line.startswith("reg")}
    assert lines[ids["phone-ok"]].endswith(": delivered")
    assert "dead" in lines[ids["dead-1"]] and "retired" in lines[ids["dead-1"]]
    assert "mismatch" in lines[ids["mismatch-1"]] and "check" in lines[ids["mismatch-1"]]
    assert "rejected (fake_rejected): the provider refused" in lines[ids["rejected-1"]]
    assert "transient" in lines[ids["transient-1"]]
    assert printed.strip().endswith("1 of 5 delivered")
    assert code == 1
    assert state(database_url, ids["dead-1"]) == (True, "fake_dead")
    assert state(database_url, ids["mismatch-1"]) == (False, "fake_mismatch")
    # A test send is one attempt of a send that could retry: the error is recorded,
    # no strike is counted.
    assert state(database_url, ids["transient-1"]) == (False, "fake_transient")
    for token in ids:
        assert token not in printed  # tokens are never printed


def test_push_test_exits_zero_when_everything_was_delivered(database_url: str) -> None:
    register(database_url, "phone-ok")
    code, printed = run(make_config(database={"url": database_url}))
    assert code == 0 and printed.strip().endswith("1 of 1 delivered")


def apns_in_a_thread(ca: trustme.CA, key: ec.EllipticCurvePrivateKey) -> Any:
    """A fake APNs served by its own Trio run in a thread (``push test`` runs Trio itself)."""
    return served_in_a_thread(
        lambda: FakeApns(
            ca=ca,
            public_key=key.public_key(),
            key_id="KEY123ABCD",
            team_id="TEAM12345X",
            topic="com.example.chat",
        )
    )


def apns_config(database_url: str, endpoint: str, ca_file: str, key_ref: str) -> dict[str, Any]:
    return {
        "database": {"url": database_url},
        "push": {
            "apns": {
                "key": key_ref,
                "key_id": "KEY123ABCD",
                "team_id": "TEAM12345X",
                "bundle_id": "com.example.chat",
                "endpoint": endpoint,
                "ca_file": ca_file,
            }
        },
    }


def test_push_test_through_apns_with_a_stored_key_names_the_mismatch_to_check(
    database_url: str, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    commands.secret_set_command(
        make_config(database={"url": database_url}), "apns-key", io.StringIO(pem), io.StringIO()
    )
    registration_id = register(database_url, APNS_TOKEN, "apns", environment="sandbox")

    with apns_in_a_thread(ca, key) as fake:
        fake.answer(APNS_TOKEN, Answer(400, "BadDeviceToken"))
        config = structure_config(
            apns_config(database_url, fake.url, str(ca_file), "secret:apns-key"), env={}
        )
        code, printed = run(config)

    assert code == 1
    line = next(line for line in printed.splitlines() if registration_id in line)
    assert "(apns, sandbox): mismatch (BadDeviceToken)" in line
    assert "aps-environment" in line and "device is fine" in line
    assert fake.violations == []
    assert state(database_url, registration_id) == (False, "BadDeviceToken")


def test_push_test_names_the_key_of_a_malformed_stored_credential(
    database_url: str, tmp_path: Path
) -> None:
    commands.secret_set_command(
        make_config(database={"url": database_url}),
        "apns-key",
        io.StringIO("definitely-not-a-key-0000"),
        io.StringIO(),
    )
    register(database_url, APNS_TOKEN, "apns")
    config = structure_config(
        apns_config(database_url, "https://127.0.0.1:9", "", "secret:apns-key"), env={}
    )
    with pytest.raises(ConfigError, match=r"push\.apns\.key") as caught:
        run(config)
    assert "definitely-not-a-key" not in str(caught.value)


def push_service_in_a_thread(ca: trustme.CA, server_key: str) -> Any:
    """A fake push service served by its own Trio run in a thread."""
    return served_in_a_thread(
        lambda: FakePushService(ca=ca, server_key=server_key, hosts=("127.0.0.1",))
    )


def test_vapid_generate_stores_the_key_and_push_test_sends_web_push_with_it(
    database_url: str, tmp_path: Path
) -> None:
    config_file = tmp_path / "bothy.toml"
    config_file.write_text(f'[database]\nurl = "{database_url}"\n')
    out = io.StringIO()
    assert main(["vapid", "generate", "--config", str(config_file)], stdout=out) == 0
    printed = out.getvalue()
    public = printed.strip().splitlines()[-1]
    assert len(base64.urlsafe_b64decode(public + "=")) == 65  # an uncompressed P-256 point
    assert "PRIVATE" not in printed and 'vapid_private_key = "secret:vapid"' in printed
    with psycopg.connect(database_url) as conn:
        assert secret_store.get(conn, "vapid") is not None

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with push_service_in_a_thread(ca, public) as fake:
        browser = fake.subscribe("laptop", host="127.0.0.1")
        found = webpush.registrant({"subscription": browser.subscription()})
        assert isinstance(found, Registrant)
        with psycopg.connect(database_url) as conn:
            registration_id = regs.upsert(
                conn,
                user_id="alex",
                device_id="laptop",
                provider="webpush",
                token=found.token,
                environment=None,
                app_id=None,
                signing_key=found.secret,
                now=datetime.now(UTC),
            ).registration.id
        config = structure_config(
            {
                "database": {"url": database_url},
                "push": {
                    "webpush": {
                        "vapid_private_key": "secret:vapid",
                        "subject": "mailto:ops@example.com",
                        "allowed_endpoints": ["127.0.0.1"],
                        "allow_private_addresses": True,
                        "ca_file": str(ca_file),
                    }
                },
            },
            env={},
        )
        code, report = run(config)

    assert code == 0, report
    assert f"registration {registration_id} (webpush): delivered" in report
    (push,) = fake.delivered()
    assert push.payload["kind"] == "test"  # decrypted with the browser's own key
    assert fake.violations == []
    assert "laptop" not in report


def test_vapid_generate_again_retires_the_previous_key(database_url: str) -> None:
    config = make_config(database={"url": database_url})
    first, second = io.StringIO(), io.StringIO()
    commands.vapid_generate_command(config, "vapid-web", first)
    commands.vapid_generate_command(config, "vapid-web", second)
    assert first.getvalue().splitlines()[-1] != second.getvalue().splitlines()[-1]
    assert "the previous key was retired" in second.getvalue()
