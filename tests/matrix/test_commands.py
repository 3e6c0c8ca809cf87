"""``check-config`` and ``push test`` know the Matrix push gateway's apps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bothy_notify import commands
from bothy_notify.cli import main
from bothy_notify.config import load_config_text

CONFIG = """
[push.fake]
[matrix_gateway.apps]
"im.example.test" = "fake"
"""


def test_check_config_lists_each_matrix_app_and_its_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bothy.toml"
    path.write_text(CONFIG)
    assert main(["check-config", "--config", str(path)]) == 0
    assert "matrix gateway app im.example.test: fake" in capsys.readouterr().out


def test_check_config_names_a_matrix_app_of_an_unconfigured_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bothy.toml"
    path.write_text(CONFIG + '"im.example.ios" = "apns"\n')
    assert main(["check-config", "--config", str(path)]) == 2
    assert 'matrix_gateway.apps."im.example.ios": [push.apns] is not configured' in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("pushkey", "code", "said"),
    [
        ("phone-1", 0, "app im.example.test (fake): delivered"),
        ("dead-phone", 1, "the gateway would list this pushkey in rejected: yes"),
        ("mismatch-phone", 1, "the gateway would list this pushkey in rejected: no"),
    ],
)
def test_push_test_sends_to_a_pushkey_as_the_gateway_would(
    pushkey: str, code: int, said: str
) -> None:
    out = io.StringIO()
    config = load_config_text(CONFIG)
    assert commands.push_test_matrix_command(config, "im.example.test", pushkey, None, out) == code
    assert said in out.getvalue()


def test_push_test_refuses_an_app_that_is_not_configured() -> None:
    config = load_config_text(CONFIG)
    with pytest.raises(commands.CommandError, match=r"configured: im\.example\.test"):
        commands.push_test_matrix_command(config, "im.other", "k", None, io.StringIO())


def test_push_test_without_the_gateway_says_so() -> None:
    with pytest.raises(commands.CommandError, match=r"\[matrix_gateway\] is not configured"):
        commands.push_test_matrix_command(
            load_config_text("[push.fake]\n"), "im.example.test", "k", None, io.StringIO()
        )


def test_push_test_of_a_matrix_app_needs_a_pushkey(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bothy.toml"
    path.write_text(CONFIG)
    assert main(["push", "test", "--config", str(path), "--matrix-app", "im.example.test"]) == 2
    assert "needs --pushkey" in capsys.readouterr().err
