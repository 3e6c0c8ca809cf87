"""The ``fake`` provider: records every send; its outcome follows the token's prefix.

``dead-``, ``mismatch-``, ``rejected-`` and ``transient-`` tokens give those
outcomes; any other token is delivered. The most recent ``push.fake.keep`` sends
are kept in memory (:attr:`FakeProvider.sends`: a bounded deque, so a daemon left
running does not grow), every send is printed in dev mode and appended as one
JSON line to ``push.fake.record_file`` when set. Used by tests, the demo, black-box
checks and ``push test`` without credentials.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import trio

from bothy_notify.config import FakeProviderConfig
from bothy_notify.push.port import (
    Message,
    Outcome,
    OutcomeKind,
    PushMessage,
    Target,
    TopicMessage,
)

log = logging.getLogger("bothy.push.fake")

_PREFIXES = (
    ("dead-", OutcomeKind.DEAD),
    ("mismatch-", OutcomeKind.MISMATCH),
    ("rejected-", OutcomeKind.REJECTED),
    ("transient-", OutcomeKind.TRANSIENT),
)


@dataclass(frozen=True, slots=True)
class FakeSend:
    registration_id: str
    token: str
    payload: dict[str, Any]
    outcome: str

    def __repr__(self) -> str:
        return f"FakeSend(outcome={self.outcome!r})"


def outcome_for_token(token: str) -> Outcome:
    """The outcome a fake send to ``token`` gives."""
    for prefix, kind in _PREFIXES:
        if token.startswith(prefix):
            return Outcome(kind, None, f"fake_{kind.value}")
    return Outcome.delivered()


class FakeProvider:
    """A provider that speaks to nobody and remembers its ``keep`` most recent sends."""

    name = "fake"

    def __init__(
        self,
        *,
        record_file: str = "",
        echo: bool = False,
        stream: TextIO | None = None,
        keep: int = 1000,
    ) -> None:
        self._sends: deque[FakeSend] = deque(maxlen=keep)
        self._record = Path(record_file) if record_file else None
        self._echo = echo
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        self.changed = trio.Event()

    async def send(self, target: Target, message: Message) -> Outcome:
        outcome = outcome_for_token(target.token)
        record = FakeSend(
            target.registration_id, target.token, message.payload(), outcome.kind.value
        )
        self._sends.append(record)
        changed, self.changed = self.changed, trio.Event()
        changed.set()
        if self._record is not None:
            line = json.dumps(
                {
                    "at": datetime.now(UTC).isoformat(),
                    "registration_id": record.registration_id,
                    "token": record.token,
                    "payload": record.payload,
                    "outcome": record.outcome,
                },
                separators=(",", ":"),
            )
            with self._lock, self._record.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        if self._echo:
            if isinstance(message, TopicMessage):
                said = f"topic push sequence_id={message.sequence_id}"
            elif isinstance(message, PushMessage):
                said = (
                    f"kind={message.kind} count={message.count} quiet={str(message.quiet).lower()}"
                )
            else:
                said = f"kind={message.kind}"
            print(f"[fake push] {outcome.kind.value}: {said}", file=self._stream, flush=True)
        await trio.lowlevel.checkpoint()
        return outcome

    @property
    def sends(self) -> list[FakeSend]:
        """The most recent sends (at most ``keep``), oldest first: a copy."""
        return list(self._sends)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return f"FakeProvider(sends={len(self._sends)})"


TOKEN_MAX = 4096


def prepare(settings: FakeProviderConfig, key: str) -> FakeProviderConfig:
    """Nothing to check beyond the configuration's own rules."""
    return settings


def build(settings: FakeProviderConfig, *, dev: bool, stdout: TextIO | None) -> FakeProvider:
    """The fake provider; in dev mode it prints its sends."""
    return FakeProvider(
        record_file=settings.record_file, echo=dev, stream=stdout, keep=settings.keep
    )
