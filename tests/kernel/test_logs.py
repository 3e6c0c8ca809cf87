"""Logs hold no values: third-party messages keep only their templates, exceptions
only their types and frames, in both formats."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from bothy_notify.config import LogConfig, LogFormat, LogLevel
from bothy_notify.logs import WITHHELD, JsonFormatter, TextFormatter, setup_logging

SECRET = "person-Zq9X-secret"


def record(
    name: str, msg: str, *args: object, exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, exc_info)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_a_third_party_template_is_kept_without_its_arguments(formatter: logging.Formatter) -> None:
    text = formatter.format(
        record("httpx", 'HTTP Request: %s %s "%s"', "POST", f"https://x/{SECRET}", "200")
    )
    assert "HTTP Request: %s %s" in text
    assert SECRET not in text


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_a_preformatted_third_party_message_is_withheld(formatter: logging.Formatter) -> None:
    text = formatter.format(record("trio-websocket", f"closing connection of {SECRET}"))
    assert WITHHELD in text
    assert SECRET not in text


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_an_exception_is_logged_as_its_type_and_frames_only(formatter: logging.Formatter) -> None:
    exc = raised(KeyError(SECRET))
    text = formatter.format(record("bothy.notify.round", "a round failed", exc=exc))
    assert "KeyError" in text
    assert "test_logs.py" in text
    assert SECRET not in text


def test_our_own_messages_and_extras_are_kept() -> None:
    line = JsonFormatter().format(
        logging.LogRecord("bothy.runner", logging.INFO, __file__, 1, "jobs rescued %d", (3,), None)
    )
    assert json.loads(line)["msg"] == "jobs rescued 3"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("bothy").setLevel(logging.NOTSET)
        logging.captureWarnings(False)


def test_third_party_debug_output_is_dropped_and_warnings_kept(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging(LogConfig(level=LogLevel.DEBUG, format=LogFormat.JSON), stream)
    logging.getLogger("hpack").debug("decoded header %s", SECRET)
    logging.getLogger("hypercorn.error").warning("peer went away: %s", SECRET)
    logging.getLogger("bothy.test").debug("ours at debug")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["msg"]) for line in lines] == [
        ("hypercorn.error", "peer went away: %s"),
        ("bothy.test", "ours at debug"),
    ]


def test_a_node_process_writes_its_ordinal_in_every_line_of_both_formats() -> None:
    own = record("bothy.runner", "jobs rescued")
    third = record("httpx", "HTTP Request: %s", "GET")
    for line in (JsonFormatter(process=2).format(own), JsonFormatter(process=2).format(third)):
        assert json.loads(line)["process"] == 2
    assert "process" not in json.loads(JsonFormatter().format(own))
    assert TextFormatter(process=2).format(own).startswith("[2] warning")
    assert TextFormatter().format(own).startswith("warning")
