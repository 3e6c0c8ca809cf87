"""Structured logs: one JSON object per line (or plain text for humans), and nothing
in them that names a person, device, thread, token, URL or secret.

Our own call sites (loggers under ``bothy``) pass context in ``extra={...}``
with closed-set values only (kinds, reasons, counts, roles). Everything else
that can write to the process's output is routed through the same handler and
made safe by construction rather than by review:

- **Third-party loggers** (httpx, hypercorn, trio-websocket, pgserver,
  ``py.warnings``...) log at ``WARNING`` and above whatever
  ``log.level`` says (their debug output carries headers and URLs). Their
  message keeps only a ``%``-style template whose arguments were separate
  (a constant in the library's code); the arguments are dropped, and a message
  that arrived already formatted is withheld (:data:`WITHHELD`). httpx's
  ``HTTP Request: %s %s ...`` therefore keeps its shape and loses the URL.
- **Exceptions** are logged as their type and a traceback of frames (file,
  line, function) without any exception message or local value: messages of
  drivers and libraries quote values (a psycopg error quotes a key, a
  ``KeyError`` its key).
- **Crashes**: :func:`install_crash_hooks` replaces ``sys.excepthook``,
  ``threading.excepthook`` and ``sys.unraisablehook`` so an exception that
  escapes everything is written the same way.

A node process of ``server.processes > 1`` writes its ordinal (1 to N) in
every line: ``"process": 2`` in JSON, ``[2]`` before the level in text; the
parent's own lines (logger ``bothy.processes``) carry none.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO

from bothy_notify.config import LogConfig, LogFormat

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}

OWN_LOGGER = "bothy"
"""The root of our own loggers; everything else counts as third-party."""
THIRD_PARTY_MIN_LEVEL = logging.WARNING
"""Third-party loggers' floor: their debug and info output carries URLs and headers."""
WITHHELD = "(message withheld: it may hold values)"
"""What a third-party message that arrived already formatted becomes."""


def _own(record: logging.LogRecord) -> bool:
    return record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + ".")


def safe_message(record: logging.LogRecord) -> str:
    """The message of ``record`` as it may be written.

    Our own records are written as they are (call sites keep values out); a
    third-party record keeps its template only when its arguments came
    separately, and is withheld otherwise.
    """
    if _own(record):
        return record.getMessage()
    if record.args and isinstance(record.msg, str):
        return record.msg
    return WITHHELD


def safe_traceback(tb: TracebackType | None) -> list[str]:
    """``file:line in function`` for every frame of ``tb``: no message, no values."""
    return [
        f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in traceback.extract_tb(tb)
    ]


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the leaves of exception groups."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        if current.__cause__ is not None:
            todo.append(current.__cause__)
        elif current.__context__ is not None and not current.__suppress_context__:
            todo.append(current.__context__)


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """An exception as safe fields: its type, the types of its chain, its frames."""
    chain = [type(e).__name__ for e in _exception_chain(exc)]
    return {
        "error_type": type(exc).__name__,
        "error_chain": chain[1:],
        "traceback": safe_traceback(exc.__traceback__),
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``process``: the node process's ordinal, if any."""

    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": safe_message(record),
        }
        if self._process is not None:
            out["process"] = self._process
        if _own(record):
            for key, value in record.__dict__.items():
                if key not in _STANDARD:
                    out[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            out.update(describe_exception(record.exc_info[1]))
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Plain text; ``[N]`` first: the node process's ordinal, if any."""

    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self._prefix = f"[{process}] " if process is not None else ""

    def format(self, record: logging.LogRecord) -> str:
        extras = ""
        if _own(record):
            extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        line = f"{self._prefix}{record.levelname.lower():7} {record.name}: {safe_message(record)}"
        if extras:
            line = f"{line} {extras}"
        if record.exc_info and record.exc_info[1] is not None:
            described = describe_exception(record.exc_info[1])
            line += f" error_type={described['error_type']}"
            for frame in described["traceback"]:
                line += f"\n    {frame}"
        return line


class _ThirdPartyFloor(logging.Filter):
    """Drops third-party records below :data:`THIRD_PARTY_MIN_LEVEL`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _own(record) or record.levelno >= THIRD_PARTY_MIN_LEVEL


def setup_logging(
    config: LogConfig, stream: TextIO | None = None, *, process: int | None = None
) -> None:
    """Route every logger of the process to ``stream`` (stderr) in the configured
    format: ours at ``log.level``, third-party ones at :data:`THIRD_PARTY_MIN_LEVEL`
    or above, and Python warnings through ``py.warnings``. Installs the crash hooks.

    ``process``: this node process's ordinal (``server.processes > 1``), written
    in every line."""
    formatter: logging.Formatter = (
        JsonFormatter(process) if config.format is LogFormat.JSON else TextFormatter(process)
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(_ThirdPartyFloor())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(min(logging.getLevelName(config.level.value.upper()), THIRD_PARTY_MIN_LEVEL))
    own = logging.getLogger(OWN_LOGGER)
    own.handlers.clear()
    own.setLevel(config.level.value.upper())
    own.propagate = True
    logging.captureWarnings(True)
    install_crash_hooks()


def set_level(config: LogConfig) -> None:
    """Change the level of our own loggers to ``log.level`` (a reload); the format,
    the handler and the third-party floor stay as :func:`setup_logging` set them."""
    level = logging.getLevelName(config.level.value.upper())
    logging.getLogger().setLevel(min(level, THIRD_PARTY_MIN_LEVEL))
    logging.getLogger(OWN_LOGGER).setLevel(level)


_crash_log = logging.getLogger("bothy.crash")


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return
    _crash_log.critical("the process stopped on an unexpected error", exc_info=(kind, exc, tb))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _crash_log.critical(
            "a thread stopped on an unexpected error",
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )


def _unraisablehook(unraisable: Any) -> None:
    exc = unraisable.exc_value
    if exc is not None:
        _crash_log.error(
            "an error could not be raised", exc_info=(type(exc), exc, exc.__traceback__)
        )


def install_crash_hooks() -> None:
    """Write exceptions that escape everything as safe log records."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
