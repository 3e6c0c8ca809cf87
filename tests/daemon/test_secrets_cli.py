"""``bothy-notify secret set NAME``: the value comes from stdin only, is never printed,
and setting a name again retires the old value; startup names the key of a missing or
malformed credential without showing it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bothy_notify import commands
from bothy_notify.config import ConfigError, resolve_store_secrets, structure_config
from bothy_notify.store import secrets as secret_store
from tests.harness import make_config

VALUE = "s3cr3t-value-0123456789-abcdwxyz"


def config_for(database_url: str) -> object:
    return make_config(database={"url": database_url})


def rows(database_url: str, name: str) -> list[tuple[str, bool]]:
    with psycopg.connect(database_url) as conn:
        return [
            (str(r[0]), r[1] is not None)
            for r in conn.execute(
                "SELECT value, retired_at FROM bothy.secrets WHERE name = %s ORDER BY id", (name,)
            )
        ]


def set_secret(database_url: str, name: str, value: str) -> str:
    out = io.StringIO()
    config = make_config(database={"url": database_url})
    assert commands.secret_set_command(config, name, io.StringIO(value), out) == 0
    return out.getvalue()


def test_secret_set_stores_stdin_and_prints_only_length_and_last_four(database_url: str) -> None:
    printed = set_secret(database_url, "apns-key", VALUE + "\n")

    assert printed.strip() == f"stored secret apns-key: {len(VALUE)} characters, ending in ...wxyz"
    assert VALUE[:-4] not in printed
    assert rows(database_url, "apns-key") == [(VALUE, False)]


def test_setting_a_secret_again_retires_the_previous_value(database_url: str) -> None:
    set_secret(database_url, "fcm", "first-value-xxxxxxxx")
    printed = set_secret(database_url, "fcm", "second-value-yyyyyyy")

    assert "(the previous value was retired)" in printed
    assert rows(database_url, "fcm") == [
        ("first-value-xxxxxxxx", True),
        ("second-value-yyyyyyy", False),
    ]
    with psycopg.connect(database_url) as conn:
        assert secret_store.get(conn, "fcm") == "second-value-yyyyyyy"


def test_a_multi_line_value_keeps_its_newlines(database_url: str) -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n"
    printed = set_secret(database_url, "pem", pem)
    assert rows(database_url, "pem") == [(pem, False)]
    assert "\n" not in printed.strip()  # the escaped tail keeps the report on one line


def test_a_short_value_shows_no_characters_at_all(database_url: str) -> None:
    printed = set_secret(database_url, "short", "abc123")
    assert printed.strip() == "stored secret short: 6 characters"


@pytest.mark.parametrize("value", ["", "\n", "   \n"])
def test_an_empty_stdin_stores_nothing(database_url: str, value: str) -> None:
    with pytest.raises(commands.CommandError, match="no value"):
        commands.secret_set_command(
            make_config(database={"url": database_url}), "x", io.StringIO(value), io.StringIO()
        )
    assert rows(database_url, "x") == []


def test_a_malformed_name_is_refused() -> None:
    with pytest.raises(commands.CommandError, match="secret name"):
        commands.secret_set_command(make_config(), "bad name!", io.StringIO(VALUE), io.StringIO())


def test_a_missing_secret_reads_as_nothing_and_startup_names_the_key(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert secret_store.get(conn, "never-set") is None
        config = structure_config(
            {
                "push": {
                    "apns": {
                        "key": "secret:never-set",
                        "key_id": "KEY123ABCD",
                        "team_id": "TEAM12345X",
                        "bundle_id": "com.example.chat",
                    }
                }
            },
            env={},
        )
        with pytest.raises(ConfigError, match=r"push\.apns\.key: secret 'never-set' is not in"):
            resolve_store_secrets(config, lambda name: secret_store.get(conn, name))


def cli(args: list[str], config_file: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bothy_notify.cli", *args, "--config", str(config_file)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_config(tmp_path: Path, database_url: str, extra: str = "") -> Path:
    path = tmp_path / "bothy.toml"
    path.write_text(
        f'[server]\napi_listen = "127.0.0.1:0"\ngateway_listen = "127.0.0.1:0"\n'
        f"[database]\nurl = {database_url!r}\n"
        f'[log]\nlevel = "warning"\nformat = "text"\n{extra}',
        encoding="utf-8",
    )
    return path


def test_the_command_line_reads_stdin_and_has_no_value_flag(
    database_url: str, tmp_path: Path
) -> None:
    config_file = write_config(tmp_path, database_url)
    refused = cli(["secret", "set", "k", "--value", VALUE], config_file)
    stored = cli(["secret", "set", "k"], config_file, stdin=VALUE)

    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr
    assert stored.returncode == 0, stored.stderr
    assert "ending in ...wxyz" in stored.stdout
    assert VALUE[:-4] not in stored.stdout + stored.stderr
    assert rows(database_url, "k") == [(VALUE, False)]


def test_startup_names_the_key_of_a_malformed_stored_credential_without_its_value(
    database_url: str, tmp_path: Path
) -> None:
    garbage = "this-is-not-a-p8-key-but-a-secret-value"
    set_secret(database_url, "apns-key", garbage)
    config_file = write_config(
        tmp_path,
        database_url,
        '[push.apns]\nkey = "secret:apns-key"\nkey_id = "KEY123ABCD"\n'
        'team_id = "TEAM12345X"\nbundle_id = "com.example.chat"\n',
    )
    run = cli(["run"], config_file)

    assert run.returncode == 2, run.stderr
    assert "push.apns.key: not a .p8 key" in run.stderr
    assert garbage not in run.stderr + run.stdout
    assert "Traceback" not in run.stderr


def test_check_config_names_a_malformed_env_credential_and_skips_store_ones(
    tmp_path: Path,
) -> None:
    config_file = tmp_path / "bothy.toml"
    config_file.write_text(
        '[push.apns]\nkey = "env:BOTHY_TEST_APNS_KEY"\nkey_id = "KEY123ABCD"\n'
        'team_id = "TEAM12345X"\nbundle_id = "com.example.chat"\n'
        '[push.fcm]\nservice_account = "secret:fcm-account"\n',
        encoding="utf-8",
    )
    bad = subprocess.run(
        [sys.executable, "-m", "bothy_notify.cli", "check-config", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "BOTHY_TEST_APNS_KEY": "not-a-key-but-secret-text"},
    )
    assert bad.returncode == 2
    assert "push.apns.key: not a .p8 key" in bad.stderr
    assert "not-a-key-but-secret-text" not in bad.stderr + bad.stdout

    config_file.write_text('[push.fcm]\nservice_account = "secret:fcm-account"\n', "utf-8")
    ok = subprocess.run(
        [sys.executable, "-m", "bothy_notify.cli", "check-config", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "not checked here (read from the secret store at run): push.fcm.service_account" in (
        ok.stdout
    )
