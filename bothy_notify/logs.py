"""Structured logs: one JSON object per line (or plain text for humans).

Call sites pass context in ``extra={...}`` with closed-set values only (kinds,
reasons, counts, roles); never a person, device, thread, token, URL or secret.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from bothy_notify.config import LogConfig, LogFormat

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["error_type"] = record.exc_info[0].__name__
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        line = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        return f"{line} {extras}" if extras else line


def setup_logging(config: LogConfig, stream: TextIO | None = None) -> None:
    """Route the ``bothy`` loggers to ``stream`` (stderr) in the configured format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format is LogFormat.JSON else TextFormatter())
    root = logging.getLogger("bothy")
    root.handlers[:] = [handler]
    root.setLevel(config.level.value.upper())
    root.propagate = False
