"""Environment overrides (``BOTHY_NOTIFY__<SECTION>__<KEY>``), typed and checked like
the file, and ``check-config --print``: the effective configuration with each
value's source and no secret."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from bothy_notify import __version__
from bothy_notify.cli import main
from bothy_notify.config import (
    Config,
    ConfigError,
    JwtAlgorithm,
    Role,
    Secret,
    changed_keys,
    env_name,
    format_duration,
    iter_keys,
    load,
    load_config_text,
)
from bothy_notify.config.schema import REDACTED, render_effective

SECRET = "hunter2-value-that-must-never-show"


def loads(text: str = "", **env: str) -> Config:
    return load_config_text(text, env=env)


def refused(text: str = "", **env: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config_text(text, env=env)
    return str(error.value)


def test_the_variable_of_a_key_joins_its_path_with_two_underscores() -> None:
    assert env_name("server.role") == "BOTHY_NOTIFY__SERVER__ROLE"
    assert env_name("push.apns.key_id") == "BOTHY_NOTIFY__PUSH__APNS__KEY_ID"
    assert env_name("auth.keys[0].kid") == "BOTHY_NOTIFY__AUTH__KEYS__0__KID"
    assert env_name("auth.keys[].kid") == "BOTHY_NOTIFY__AUTH__KEYS__<N>__KID"


def test_no_key_name_holds_two_underscores_in_a_row() -> None:
    # The separator of the variables must never be part of a key.
    assert not [key for key in iter_keys() if "__" in key]


def test_scalars_are_typed_like_the_file() -> None:
    config = loads(
        BOTHY_NOTIFY__SERVER__ROLE="worker",
        BOTHY_NOTIFY__SERVER__PROCESSES="4",
        BOTHY_NOTIFY__SERVER__DEV="TRUE",
        BOTHY_NOTIFY__SERVER__DRAIN_PERIOD="250ms",
        BOTHY_NOTIFY__SERVER__API_LISTEN="0.0.0.0:9000",
        BOTHY_NOTIFY__SERVER__MAX_BODY_BYTES="2_097_152",
    )
    assert config.server.role is Role.WORKER
    assert config.server.processes == 4
    assert config.server.dev is True
    assert config.server.drain_period == timedelta(milliseconds=250)
    assert config.server.api_listen == "0.0.0.0:9000"
    assert config.server.max_body_bytes == 2_097_152


def test_a_variable_overrides_the_file() -> None:
    config = loads('[server]\nrole = "api"\ndev = true\n', BOTHY_NOTIFY__SERVER__ROLE="worker")
    assert config.server.role is Role.WORKER and config.server.dev is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [("HS256, RS256", ("HS256", "RS256")), ('["ES256"]', ("ES256",)), ("", ())],
)
def test_a_list_is_comma_separated_or_a_toml_array(value: str, expected: tuple[str, ...]) -> None:
    config = loads(BOTHY_NOTIFY__AUTH__ALGORITHMS=value)
    assert tuple(a.value for a in config.auth.algorithms) == expected


def test_a_provider_block_is_created_by_its_keys() -> None:
    config = loads(
        BOTHY_NOTIFY__PUSH__APNS__KEY=SECRET,
        BOTHY_NOTIFY__PUSH__APNS__KEY_ID="ABC123DEFG",
        BOTHY_NOTIFY__PUSH__APNS__TEAM_ID="DEF123GHIJ",
        BOTHY_NOTIFY__PUSH__APNS__BUNDLE_ID="com.example.app",
        BOTHY_NOTIFY__PUSH__FAKE="{}",
    )
    assert config.push.apns is not None and config.push.fake is not None
    assert config.push.apns.key_id == "ABC123DEFG"
    # A secret given in its variable counts as env:THAT_VARIABLE (push.apns.key must
    # be env: or secret:, never inline in a file).
    assert config.push.apns.key is not None
    assert config.push.apns.key.source == "env:BOTHY_NOTIFY__PUSH__APNS__KEY"
    assert config.push.apns.key.reveal() == SECRET
    assert SECRET not in repr(config)


def test_a_provider_block_missing_keys_names_their_variables() -> None:
    message = refused(BOTHY_NOTIFY__PUSH__APNS__KEY_ID="ABC123DEFG")
    assert "push.apns.team_id: required key is missing" in message
    assert "set BOTHY_NOTIFY__PUSH__APNS__TEAM_ID" in message


def test_a_secret_variable_may_name_another_variable() -> None:
    config = loads(BOTHY_NOTIFY__DATABASE__URL="env:DB_URL", DB_URL="postgresql://db/x")
    assert config.database.url is not None
    assert config.database.url.source == "env:DB_URL"
    assert config.database.url.reveal() == "postgresql://db/x"


def test_an_hs256_key_from_its_variable_is_not_inline() -> None:
    config = loads(
        BOTHY_NOTIFY__AUTH__KEYS__0__ALGORITHM="HS256", BOTHY_NOTIFY__AUTH__KEYS__0__KEY=SECRET
    )
    assert config.auth.keys[0].key == Secret("env:BOTHY_NOTIFY__AUTH__KEYS__0__KEY", SECRET)


def test_array_entries_are_set_by_index_over_the_files_entries() -> None:
    text = '[[auth.keys]]\nalgorithm = "RS256"\nkey = "pem"\nkid = "a"\n'
    config = loads(
        text,
        BOTHY_NOTIFY__AUTH__KEYS__0__KID="first",
        BOTHY_NOTIFY__AUTH__KEYS__1__ALGORITHM="ES256",
        BOTHY_NOTIFY__AUTH__KEYS__1__KEY="pem2",
    )
    assert [(k.algorithm, k.kid) for k in config.auth.keys] == [
        (JwtAlgorithm.RS256, "first"),
        (JwtAlgorithm.ES256, ""),
    ]


def test_a_whole_array_of_tables_replaces_the_files() -> None:
    text = '[[auth.keys]]\nalgorithm = "RS256"\nkey = "pem"\n'
    config = loads(text, BOTHY_NOTIFY__AUTH__KEYS='[{algorithm = "ES256", key = "pem2"}]')
    assert [k.algorithm for k in config.auth.keys] == [JwtAlgorithm.ES256]


def test_an_index_that_leaves_a_gap_is_refused() -> None:
    message = refused(BOTHY_NOTIFY__AUTH__KEYS__1__KID="x")
    assert "BOTHY_NOTIFY__AUTH__KEYS__1__KID: index 1 leaves a gap" in message


def test_a_table_of_named_entries_is_given_whole_and_merged_by_entry() -> None:
    text = '[notify.kinds."social:poke"]\ncategory = "messages"\ntemplate = "{count} pokes"\n'
    config = loads(text, BOTHY_NOTIFY__NOTIFY__KINDS='{"social:wave" = {category = "messages"}}')
    assert set(config.notify.kinds) == {"social:poke", "social:wave"}
    assert "named entries" in refused(BOTHY_NOTIFY__NOTIFY__KINDS__X__CATEGORY="messages")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"BOTHY_NOTIFY__SERVER__PROCESSES": "four"},
            "BOTHY_NOTIFY__SERVER__PROCESSES: expected an integer",
        ),
        (
            {"BOTHY_NOTIFY__SERVER__PROCESSES": "0"},
            "BOTHY_NOTIFY__SERVER__PROCESSES (server.processes): must be at least 1",
        ),
        (
            {"BOTHY_NOTIFY__SERVER__ROLE": "boss"},
            "BOTHY_NOTIFY__SERVER__ROLE (server.role): expected one of: all, worker, api",
        ),
        ({"BOTHY_NOTIFY__SERVER__DEV": "yes"}, "BOTHY_NOTIFY__SERVER__DEV: expected true or false"),
        (
            {"BOTHY_NOTIFY__PUSH__MAX_AGE": "5 minutes"},
            "BOTHY_NOTIFY__PUSH__MAX_AGE (push.max_age): expected a duration",
        ),
        (
            {"BOTHY_NOTIFY__SERVER__ROLEE": "worker"},
            "BOTHY_NOTIFY__SERVER__ROLEE: names no configuration key (server.rolee)",
        ),
        ({"BOTHY_NOTIFY__NOPE": "1"}, "BOTHY_NOTIFY__NOPE: names no configuration key (nope)"),
        ({"BOTHY_NOTIFY__SERVER": "3"}, "BOTHY_NOTIFY__SERVER: expected a table"),
        ({"BOTHY_NOTIFY__SERVER____ROLE": "x"}, "BOTHY_NOTIFY__SERVER____ROLE: expected BOTHY"),
        (
            {"BOTHY_NOTIFY__SERVER__API_LISTEN": "nowhere"},
            "BOTHY_NOTIFY__SERVER__API_LISTEN (server.api_listen): expected host:port",
        ),
        (
            {"BOTHY_NOTIFY__DATABASE__URL": "secret:db"},
            "BOTHY_NOTIFY__DATABASE__URL (database.url): secret: cannot be used here",
        ),
        (
            {"BOTHY_NOTIFY__DATABASE__URL": ""},
            "BOTHY_NOTIFY__DATABASE__URL (database.url): env:BOTHY_NOTIFY__DATABASE__URL is empty",
        ),
    ],
)
def test_a_bad_variable_is_named(env: dict[str, str], message: str) -> None:
    assert message in refused(**env)


def test_no_error_shows_a_variables_value() -> None:
    cases: list[dict[str, str]] = [
        {"BOTHY_NOTIFY__SERVER__PROCESSES": SECRET},
        {"BOTHY_NOTIFY__SERVER__DEV": SECRET},
        {"BOTHY_NOTIFY__SERVER__ROLE": SECRET},
        {"BOTHY_NOTIFY__PUSH__MAX_AGE": SECRET},
        {"BOTHY_NOTIFY__NOTIFY__KINDS": "{" + SECRET},
        {"BOTHY_NOTIFY__AUTH__KEYS__0__KEY": SECRET},
        {"BOTHY_NOTIFY__AUTH__ALGORITHMS": SECRET},
        {"BOTHY_NOTIFY__DATABASE__URL": f"postgresql://u:{SECRET}@db/x", "BOTHY_NOTIFY__X": "1"},
    ]
    for env in cases:
        message = refused(**env)
        assert SECRET not in message, env


def test_other_variables_of_the_daemon_are_not_overrides() -> None:
    assert loads(BOTHY_NOTIFY_CONFIG="/etc/x.toml", BOTHY_NOTIFY_SUPERVISED="3") == loads()


def _scalar_keys() -> list[str]:
    """Keys of the sections themselves with a default (not inside an optional block or
    section, an array or a map; ``database.url``'s default is no value)."""
    defaults = Config()
    keys = []
    for key in iter_keys():
        if "[" in key or "*" in key:
            continue
        section, _, rest = key.partition(".")
        table = getattr(defaults, section)
        if table is not None and getattr(table, rest.split(".")[0]) is not None:
            keys.append(key)
    return keys


def _as_text(value: Any) -> str:
    """A default as an operator writes it in a variable."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(_as_text(v) for v in value)
    if isinstance(value, Mapping):
        return "{}" if not value else tomlkit.item(dict(value)).as_string()
    return str(value)


@pytest.mark.parametrize("key", _scalar_keys())
def test_every_key_has_a_variable_that_takes_its_default(key: str) -> None:
    section, name = key.split(".", 1)
    env = {env_name(key): _as_text(getattr(getattr(Config(), section), name))}
    assert loads(**env) == loads(), key
    assert load(None, env=env).source_of(key) == f"environment {env_name(key)}"


# ---------------------------------------------------------------- check-config --print

FILE_TEXT = f"""
[server]
role = "api"
dev = true
[database]
url = "postgresql://bothy:{SECRET}@db.internal/bothy"
[[auth.keys]]
algorithm = "HS256"
key = "{SECRET}"
[push.webhook]
endpoint = "http://proxy-user:{SECRET}@proxy.internal:3128"
"""


def _loaded(tmp_path: Path, **env: str) -> Any:
    file = tmp_path / "bothy.toml"
    file.write_text(FILE_TEXT)
    return load(file, env=env)


def test_print_names_each_values_source(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, BOTHY_NOTIFY__SERVER__ROLE="worker", JWT="x")
    assert loaded.source_of("server.role") == "environment BOTHY_NOTIFY__SERVER__ROLE"
    assert loaded.source_of("server.dev") == "file"
    assert loaded.source_of("auth.keys[0].key") == "file"
    assert loaded.source_of("auth.keys[0].kid") == "default"
    assert loaded.source_of("server.api_listen") == "default"
    lines = render_effective(loaded).splitlines()
    by_key = {line.split(" = ")[0]: line for line in lines if " = " in line}
    assert by_key["role"].startswith('role = "worker"')
    assert by_key["role"].endswith("# environment BOTHY_NOTIFY__SERVER__ROLE")
    assert by_key["dev"].endswith("# file")
    assert by_key["api_listen"].endswith("# default")


def test_print_never_shows_a_secret_and_is_toml(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, BOTHY_NOTIFY__PUSH__FCM__SERVICE_ACCOUNT=SECRET)
    text = render_effective(loaded)
    assert SECRET not in text
    printed = tomlkit.parse(text).unwrap()
    assert printed["database"]["url"] == REDACTED
    assert printed["auth"]["keys"][0]["key"] == REDACTED
    assert (
        printed["push"]["fcm"]["service_account"] == "env:BOTHY_NOTIFY__PUSH__FCM__SERVICE_ACCOUNT"
    )
    assert printed["push"]["webhook"]["endpoint"] == f"http://{REDACTED}@proxy.internal:3128"
    assert printed["server"]["role"] == "api"
    # Paths as the daemon uses them: absolute.
    assert Path(printed["database"]["data_dir"]).is_absolute()


def test_print_shows_a_secrets_reference(tmp_path: Path) -> None:
    text = render_effective(_loaded(tmp_path, BOTHY_NOTIFY__DATABASE__URL="env:DB", DB=SECRET))
    assert 'url = "env:DB"' in text and SECRET not in text


def test_check_config_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "bothy.toml"
    file.write_text(FILE_TEXT)
    monkeypatch.setenv("BOTHY_NOTIFY__SERVER__HEARTBEAT", "3s")
    assert main(["check-config", "--print", "--config", str(file)]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    assert out.startswith("# configuration OK")
    assert "# environment BOTHY_NOTIFY__SERVER__HEARTBEAT" in out
    assert tomlkit.parse(out).unwrap()["server"]["heartbeat"] == "3s"


def test_check_config_names_a_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOTHY_NOTIFY__SYNC__OUTBOUND_QUEUE_MAX", "0")
    assert main(["check-config"]) == 2
    assert "BOTHY_NOTIFY__SYNC__OUTBOUND_QUEUE_MAX (sync.outbound_queue_max)" in (
        capsys.readouterr().err
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"bothy-notify {__version__}"
    pyproject = tomlkit.parse((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == __version__


def test_changed_keys_compare_secrets_by_reference() -> None:
    old = loads('[database]\nurl = "env:DB"\n', DB="one")
    new = loads('[database]\nurl = "env:DB"\n[server]\nmax_body_bytes = 2048\n', DB="two")
    assert changed_keys(old, new) == ["server.max_body_bytes"]
    resolved = dataclasses.replace(
        old, database=dataclasses.replace(old.database, url=Secret("env:DB", None))
    )
    assert changed_keys(old, resolved) == []
