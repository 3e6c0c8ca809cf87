"""Configuration: the loader, the example file and the JSON schema say the same thing,
and every bad input stops startup with a message naming the key."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import socket
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import cattrs
import pytest
import tomlkit
from jsonschema import Draft202012Validator

from bothy_notify.cli import main
from bothy_notify.config import (
    Config,
    ConfigError,
    Secret,
    default_data_dir,
    format_duration,
    iter_keys,
    load_config,
    load_config_text,
    parse_duration,
    resolve_store_secrets,
)
from bothy_notify.config.load import _make_converter
from bothy_notify.config.schema import _object, schema_text
from bothy_notify.config.values import _meta
from bothy_notify.kernel.ids import ID_PATTERN
from tests.support.repo import CONFIG_DIR, SCHEMA_DIR

EXAMPLE = CONFIG_DIR / "bothy-notify.example.toml"
SCHEMA = json.loads((SCHEMA_DIR / "config.schema.json").read_text())


def schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub:
            keys |= schema_keys(sub, path + ".")
        elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
            keys |= schema_keys(sub["items"], path + "[].")
        elif sub.get("type") == "object" and "properties" in sub.get("additionalProperties", {}):
            keys |= schema_keys(sub["additionalProperties"], path + ".*.")
        else:
            keys.add(path)
    return keys


def example_keys() -> set[str]:
    """Keys set or shown commented out in the example, with their section."""
    keys: set[str] = set()
    section = ""
    for raw in EXAMPLE.read_text().splitlines():
        line = raw.strip()
        commented = line.startswith("#")
        body = line.lstrip("#").strip()
        header = re.fullmatch(r"\[\[?([a-z_.\"*:]+)\]\]?", body)
        if header and (not commented or body.startswith("[")):
            name = header.group(1)
            if "." in name and '"' in name:
                name = re.sub(r'\."[^"]+"', ".*", name)
            section = name + ("[]" if body.startswith("[[") else "")
            continue
        assignment = re.fullmatch(r"([a-z_]+)\s*=.*", body)
        if assignment:
            keys.add(f"{section}.{assignment.group(1)}" if section else assignment.group(1))
    return keys


def test_the_schema_file_is_generated_from_the_definitions() -> None:
    # The definitions in bothy_notify/config/keys.py are the one table of keys;
    # `make schemas` writes the file from them.
    written = (SCHEMA_DIR / "config.schema.json").read_text(encoding="utf-8")
    assert written == schema_text(), "schemas/config.schema.json is stale: run `make schemas`"


def test_loader_example_and_schema_name_the_same_keys() -> None:
    loader = set(iter_keys())
    assert schema_keys(SCHEMA) == loader
    assert example_keys() == loader


def test_schema_defaults_equal_the_loader_defaults() -> None:
    defaults = Config()

    def walk(node: dict[str, Any], obj: Any, prefix: str) -> None:
        for name, sub in node.get("properties", {}).items():
            value = getattr(obj, name)
            if "default" in sub:
                expected = sub["default"]
                if isinstance(value, timedelta):
                    assert parse_duration(expected) == value, prefix + name
                elif isinstance(value, tuple):
                    assert list(value) == expected, prefix + name
                else:
                    assert value == expected, prefix + name
            elif sub.get("type") == "object" and "properties" in sub and value is not None:
                walk(sub, value, prefix + name + ".")

    walk(SCHEMA, defaults, "")


def test_the_example_file_is_a_valid_configuration_and_matches_the_schema() -> None:
    config = load_config(EXAMPLE)
    assert config == load_config(None)
    Draft202012Validator(SCHEMA).validate(tomlkit.parse(EXAMPLE.read_text()).unwrap())


def test_the_dev_configuration_loads() -> None:
    config = load_config(CONFIG_DIR / "dev.toml")
    assert config.server.dev and config.push.fake is not None


def test_the_dev_configuration_keeps_its_data_in_the_repository_data_directory() -> None:
    config = load_config(CONFIG_DIR / "dev.toml")
    assert config.push.fake is not None
    assert config.database.data_dir == str(CONFIG_DIR.parent / "data" / "postgres")
    assert config.push.fake.record_file == str(CONFIG_DIR.parent / "data" / "fake-pushes.jsonl")


def path_keys() -> set[str]:
    """Keys whose loader field is marked ``path=True``."""
    keys: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            inner = [
                a for a in (t, *get_args(t)) if isinstance(a, type) and dataclasses.is_dataclass(a)
            ]
            if inner:
                mapping = get_origin(t) is Mapping
                walk(inner[0], f"{prefix}{f.name}.{'*.' if mapping else ''}")
            elif f.metadata.get("path"):
                keys.add(prefix + f.name)

    walk(Config, "")
    return keys


def test_the_schema_marks_exactly_the_path_keys_of_the_loader() -> None:
    marked: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, sub in node.get("properties", {}).items():
            if sub.get("x-path"):
                marked.add(prefix + name)
            walk(sub, f"{prefix}{name}.")
            if isinstance(sub.get("additionalProperties"), dict):
                walk(sub["additionalProperties"], f"{prefix}{name}.*.")

    walk(SCHEMA, "")
    assert marked == path_keys()
    assert {
        "database.data_dir",
        "notify.kinds_dir",
        "push.fake.record_file",
        "push.apns.ca_file",
        "push.fcm.ca_file",
        "push.webhook.ca_file",
    } <= marked


PATHS_TOML = """
[database]
data_dir = "state/postgres"
[notify]
kinds_dir = "kinds"
[push.fake]
record_file = "../shared/pushes.jsonl"
[push.webhook]
ca_file = "tls/ca.pem"
"""


def test_relative_paths_start_at_the_configuration_files_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "bothy.toml").write_text(PATHS_TOML)
    config = load_config(tmp_path / "etc" / "bothy.toml", env={})
    etc = tmp_path / "etc"
    assert config.database.data_dir == str(etc / "state" / "postgres")
    assert config.notify.kinds_dir == str(etc / "kinds")
    assert config.push.fake is not None and config.push.webhook is not None
    assert config.push.fake.record_file == str(tmp_path / "shared" / "pushes.jsonl")
    assert config.push.webhook.ca_file == str(etc / "tls" / "ca.pem")


def test_paths_do_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bothy.toml").write_text(PATHS_TOML)
    (tmp_path / "elsewhere").mkdir()
    from_here = load_config(tmp_path / "bothy.toml", env={})
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_config("../bothy.toml", env={}) == from_here


def test_absolute_paths_are_kept_and_empty_ones_stay_empty(tmp_path: Path) -> None:
    config = load_config_text(
        f'[database]\ndata_dir = "{tmp_path}/pg"\n[push.fake]\n', env={}, base_dir="/elsewhere"
    )
    assert config.database.data_dir == f"{tmp_path}/pg"
    assert config.push.fake is not None and config.push.fake.record_file == ""
    assert config.notify.kinds_dir == ""


def test_a_relative_path_without_a_configuration_file_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"push\.fake\.record_file: a relative path needs a"):
        load_config_text('[push.fake]\nrecord_file = "pushes.jsonl"', env={})


def test_without_a_data_dir_the_embedded_server_lives_in_the_per_user_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert load_config(None, env={}).database.data_dir == default_data_dir()
    assert default_data_dir() == str(tmp_path / "xdg" / "bothy-notify" / "postgres")


@pytest.mark.parametrize("text", ['[database]\nurl = ""', "[database]", ""])
def test_an_empty_or_absent_database_url_means_the_embedded_server(text: str) -> None:
    assert load_config_text(text, env={}).database.url is None


def test_an_env_database_url_that_is_set_but_empty_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"database.url: env:DB is empty"):
        load_config_text('[database]\nurl = "env:DB"', env={"DB": ""})


def test_a_database_url_is_kept() -> None:
    config = load_config_text('[database]\nurl = "env:DB"', env={"DB": "postgresql://db/x"})
    assert config.database.url is not None
    assert config.database.url.reveal() == "postgresql://db/x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[server]\nrole = "boss"', "server.role: expected one of: all, worker, api"),
        ("[server]\nbogus = 1", "server.bogus: unknown key"),
        ("[bogus]\nx = 1", "bogus: unknown key"),
        ("[sync]\noutbound_queue_max = 0", "sync.outbound_queue_max: must be at least 1"),
        ('[sync]\noutbound_queue_max = "5"', "sync.outbound_queue_max: expected an integer"),
        ('[push]\nmax_age = "5 minutes"', "push.max_age: expected a duration"),
        ("[push]\nmax_age = 300", "push.max_age: expected a duration string"),
        ('[notify]\ncoalesce_window = "2d"', "notify.coalesce_window: must be at most 1d"),
        ('[server]\ndev = "yes"', "server.dev: expected true or false"),
        ('[server]\napi_listen = "nowhere"', "server.api_listen: expected host:port"),
        ('[notify]\ncategories = ["messages"]', "notify.categories: 'messages' is built in"),
        (
            '[[auth.keys]]\nalgorithm = "HS256"\nkey = "inline"',
            "auth.keys[0].key: an HS256 secret must be env:NAME or secret:NAME",
        ),
        ('[[auth.keys]]\nalgorithm = "RS512"\nkey = "x"', "auth.keys[0].algorithm"),
        (
            '[push.apns]\nkey = "env:APNS"\nkey_id = "K"\nteam_id = "T"',
            "push.apns.bundle_id: required key is missing",
        ),
        ('[database]\nurl = "secret:db"', "database.url: secret: cannot be used here"),
        (
            '[server]\nheartbeat = "2s"\n[cluster]\nnode_timeout = "3s"',
            "cluster.node_timeout: must be at least twice server.heartbeat",
        ),
        ('[cluster]\nnode_timeout = "20m"', "cluster.node_timeout: must be at most 10m"),
        ("[server]\nprocesses = 0", "server.processes: must be at least 1"),
        ("[server]\nprocesses = 257", "server.processes: must be at most 256"),
        ('[server]\nprocesses = "2"', "server.processes: expected an integer"),
        ("server = 3", "server: "),
        ("not toml at all [", "not valid TOML"),
    ],
)
def test_bad_configuration_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config_text(text, env={"APNS": "pem"})
    assert message in str(error.value)


def test_env_secrets_resolve_at_load_and_never_show_in_reprs_or_errors() -> None:
    config = load_config_text(
        '[[auth.keys]]\nalgorithm = "HS256"\nkey = "env:JWT_KEY"',
        env={"JWT_KEY": "super-secret-value-123"},
    )
    key = config.auth.keys[0].key
    assert key.reveal() == "super-secret-value-123"
    assert "super-secret" not in repr(config) and "super-secret" not in str(key)
    with pytest.raises(ConfigError) as error:
        load_config_text('[[auth.keys]]\nalgorithm = "HS256"\nkey = "env:MISSING"', env={})
    assert "environment variable MISSING is not set" in str(error.value)


def test_store_secrets_resolve_at_start_and_a_missing_one_names_the_key() -> None:
    text = '[push.fcm]\nservice_account = "secret:fcm-sa"'
    config = load_config_text(text, env={})
    stored = {"fcm-sa": "{json}"}
    resolved = resolve_store_secrets(config, stored.get)
    assert resolved.push.fcm is not None and resolved.push.fcm.service_account is not None
    assert resolved.push.fcm.service_account.reveal() == "{json}"
    with pytest.raises(ConfigError) as error:
        resolve_store_secrets(config, lambda _name: None)
    assert "push.fcm.service_account: secret 'fcm-sa' is not in the secret store" in str(
        error.value
    )


def test_secret_repr_never_shows_the_value() -> None:
    secret = Secret("literal", "hunter2-hunter2")
    assert "hunter2" not in repr(secret) and "hunter2" not in f"{secret}"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("2s", 2), ("5m", 300), ("1h", 3600), ("30d", 2_592_000), ("1.5s", 1.5)],
)
def test_durations_take_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


@pytest.mark.parametrize("text", ["5", "5 min", "", "-1s", "1y"])
def test_durations_without_a_known_unit_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_check_config_command(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[server]\nrole = "worker"\n')
    assert main(["check-config", "--config", str(good)]) == 0
    assert "configuration OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nrole = "boss"\n')
    assert main(["check-config", "--config", str(bad)]) == 2
    assert "server.role" in capsys.readouterr().err


def test_check_config_checks_the_kind_catalogue(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "kinds.toml"
    bad.write_text(
        '[notify]\ncategories = ["social"]\n'
        '[notify.kinds."social:poke"]\ncategory = "social"\ntemplate = "{name} poked you"\n'
    )
    assert main(["check-config", "--config", str(bad)]) == 2
    assert 'notify.kinds."social:poke".template' in capsys.readouterr().err


def test_check_config_says_how_many_processes(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "n.toml"
    config.write_text("[server]\nprocesses = 4\n")
    assert main(["check-config", "--config", str(config)]) == 0
    assert "role all, 4 processes" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "257"])
def test_run_refuses_processes_out_of_range_before_anything_starts(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--processes", value]) == 2
    assert "--processes: must be between 1 and 256" in capsys.readouterr().err


def test_run_with_processes_reports_an_unreachable_database_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "n.toml"
    config.write_text(
        '[server]\napi_listen = "127.0.0.1:0"\ngateway_listen = "127.0.0.1:0"\nprocesses = 2\n'
        '[database]\nurl = "postgresql://nobody@127.0.0.1:1/x"\n'
    )
    assert main(["run", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "bothy-notify: the database cannot be reached" in err
    assert "nobody" not in err


def test_run_with_processes_names_a_port_it_cannot_share(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:  # an ordinary listener: no SO_REUSEPORT
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "n.toml"
        config.write_text(f'[server]\napi_listen = "127.0.0.1:{port}"\nprocesses = 2\n')
        assert main(["run", "--config", str(config)]) == 1
    assert f"server.api_listen: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


class Urgency(enum.StrEnum):
    LOW = "low"
    HIGH = "high"


@dataclasses.dataclass(frozen=True)
class NewSection:
    """A section as another package adds one (notify.urgency, sync.ops_per_second)."""

    urgency: Urgency = dataclasses.field(default=Urgency.LOW, metadata=_meta("how urgent"))
    rate: float = dataclasses.field(
        default=10.0, metadata=_meta("ops per second", min=0.5, max=1000)
    )


def test_a_key_of_a_new_enum_or_a_float_needs_only_its_field() -> None:
    # Structured, checked and described from its field alone.
    conv = _make_converter({})
    assert conv.structure({"urgency": "high", "rate": 2}, NewSection) == NewSection(
        Urgency.HIGH, 2.0
    )
    for bad, message in (
        ({"urgency": "x"}, "expected one of: low, high"),
        ({"rate": "2"}, "a number"),
    ):
        with pytest.raises(cattrs.BaseValidationError) as error:
            conv.structure(bad, NewSection)
        assert message in str(error.value.exceptions[0])
    assert _object(NewSection)["properties"] == {
        "urgency": {
            "description": "how urgent",
            "type": "string",
            "enum": ["low", "high"],
            "default": "low",
        },
        "rate": {
            "description": "ops per second",
            "type": "number",
            "minimum": 0.5,
            "maximum": 1000,
            "default": 10.0,
        },
    }


@pytest.mark.parametrize("provider", ["apns", "fcm", "webpush"])
def test_an_app_id_has_the_daemons_id_form_in_the_schema_and_at_load(provider: str) -> None:
    apps = SCHEMA["properties"]["push"]["properties"][provider]["properties"]["apps"]
    assert apps["propertyNames"] == {"pattern": ID_PATTERN}
    with pytest.raises(ConfigError) as error:
        load_config_text(f'[push.{provider}.apps."bad app!"]')
    assert f"push.{provider}.apps: each key must match {ID_PATTERN}" in str(error.value)
