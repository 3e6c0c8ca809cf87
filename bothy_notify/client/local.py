"""The reference client's local state in SQLite: one settings row, the uploaded
set, and the per-conversation overrides.

Every method is one short local transaction (``BEGIN IMMEDIATE``), so a crash
at any point leaves a consistent file: a repair pass interrupted half-way
resumes from its stale marks, and the identity survives everything but the
deletion of the file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bothy_notify.client.api import Identity, Subscription
from bothy_notify.client.model import (
    Delivery,
    NotificationState,
    Override,
    RecipientState,
    Rules,
    Status,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    recipient_id      BLOB,
    recipient_secret  BLOB,
    status            TEXT NOT NULL DEFAULT 'disabled',
    error_code        TEXT,
    error_message     TEXT,
    delivery          TEXT,
    rules             TEXT,
    need_register     INTEGER NOT NULL DEFAULT 0,
    renewal_deadline  REAL,
    sync_deadline     REAL,
    retry_at          REAL,
    retry_backoff     REAL,
    repairing         INTEGER NOT NULL DEFAULT 0,
    pass_completed    INTEGER NOT NULL DEFAULT 0,
    high_warned       INTEGER NOT NULL DEFAULT 0,
    exhausted_digest  TEXT,
    topic_count       INTEGER,
    channel           TEXT,
    expires_at        REAL
);
INSERT OR IGNORE INTO settings (id) VALUES (1);
CREATE TABLE IF NOT EXISTS uploaded (
    topic            BLOB PRIMARY KEY,
    epoch_base       INTEGER,
    epoch_last       INTEGER,
    include_commits  INTEGER NOT NULL,
    fingerprint      TEXT,
    stale            INTEGER NOT NULL DEFAULT 0
);
-- The adds a topic limit refused (resource_exhausted), held back until the
-- desired set changes (settings.exhausted_digest names the set they belong to).
CREATE TABLE IF NOT EXISTS held_back (
    topic  BLOB PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS overrides (
    topic  BLOB PRIMARY KEY,
    value  TEXT NOT NULL CHECK (value IN ('enabled', 'disabled'))
);
"""


@dataclass(frozen=True, slots=True)
class Uploaded:
    """One topic the daemon has (as far as this client knows)."""

    topic: bytes
    epoch_base: int | None
    epoch_last: int | None
    include_commits: bool
    fingerprint: str | None
    stale: bool

    def __repr__(self) -> str:
        return f"Uploaded(stale={self.stale})"


@dataclass(frozen=True, slots=True)
class Settings:
    """The settings row."""

    status: Status
    error_code: str | None
    error_message: str | None
    delivery: Delivery | None
    rules: Rules
    need_register: bool
    renewal_deadline: datetime | None
    sync_deadline: datetime | None
    retry_at: datetime | None
    retry_backoff: float | None
    repairing: bool
    pass_completed: bool
    high_warned: bool
    exhausted_digest: str | None
    recipient: RecipientState | None

    def state(self) -> NotificationState:
        return NotificationState(self.status, self.error_code, self.error_message, self.recipient)


def _time(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _stamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _column_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return _stamp(value)
    if isinstance(value, Delivery | Rules):
        return json.dumps(value.to_json())
    if isinstance(value, Status):
        return value.value
    if isinstance(value, bool):
        return int(value)
    return value


class LocalStore:
    """The client's SQLite file (``":memory:"`` for a throwaway client)."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __repr__(self) -> str:
        return "LocalStore()"

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One local transaction: committed when the block ends, rolled back on error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------ identity and settings

    def identity(self, *, create: bool = False) -> Identity | None:
        """The recipient id and secret; with ``create``, made on first use (32 random
        bytes each, kept for the life of this file)."""
        row = self._db.execute(
            "SELECT recipient_id, recipient_secret FROM settings WHERE id = 1"
        ).fetchone()
        if row[0] is not None:
            return Identity(bytes(row[0]), bytes(row[1]))
        if not create:
            return None
        identity = Identity(os.urandom(32), os.urandom(32))
        self._db.execute(
            "UPDATE settings SET recipient_id = ?, recipient_secret = ? WHERE id = 1",
            (identity.recipient_id, identity.secret),
        )
        return identity

    def settings(self) -> Settings:
        row = self._db.execute(
            "SELECT status, error_code, error_message, delivery, rules, need_register,"
            " renewal_deadline, sync_deadline, retry_at, retry_backoff, repairing,"
            " pass_completed, high_warned, exhausted_digest, topic_count, channel, expires_at"
            " FROM settings WHERE id = 1"
        ).fetchone()
        recipient = None
        if row[14] is not None:
            expires = _time(row[16])
            assert expires is not None
            recipient = RecipientState(int(row[14]), str(row[15]), expires)
        return Settings(
            status=Status(row[0]),
            error_code=row[1],
            error_message=row[2],
            delivery=None if row[3] is None else Delivery.from_json(json.loads(row[3])),
            rules=Rules() if row[4] is None else Rules.from_json(json.loads(row[4])),
            need_register=bool(row[5]),
            renewal_deadline=_time(row[6]),
            sync_deadline=_time(row[7]),
            retry_at=_time(row[8]),
            retry_backoff=row[9],
            repairing=bool(row[10]),
            pass_completed=bool(row[11]),
            high_warned=bool(row[12]),
            exhausted_digest=row[13],
            recipient=recipient,
        )

    def update(self, **values: Any) -> None:
        """Set settings columns; datetimes, Delivery and Rules are converted."""
        columns = [f"{name} = ?" for name in values]
        params = [_column_value(v) for v in values.values()]
        self._db.execute(f"UPDATE settings SET {', '.join(columns)} WHERE id = 1", params)

    def record_state(self, state: RecipientState) -> None:
        self.update(
            topic_count=state.topic_count, channel=state.channel, expires_at=state.expires_at
        )

    # ------------------------------------------------------------ uploaded set

    def uploaded(self) -> dict[bytes, Uploaded]:
        return {
            bytes(r[0]): Uploaded(bytes(r[0]), r[1], r[2], bool(r[3]), r[4], bool(r[5]))
            for r in self._db.execute(
                "SELECT topic, epoch_base, epoch_last, include_commits, fingerprint, stale"
                " FROM uploaded"
            )
        }

    def uploaded_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM uploaded").fetchone()[0])

    def stale_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM uploaded WHERE stale = 1").fetchone()[0])

    def confirm(
        self, adds: Iterable[Subscription], removes: Iterable[bytes], fingerprint: str
    ) -> None:
        """Record what a successful request stored (clearing each add's stale mark)."""
        self._db.executemany(
            "INSERT INTO uploaded (topic, epoch_base, epoch_last, include_commits, fingerprint,"
            " stale) VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (topic) DO UPDATE SET"
            " epoch_base = excluded.epoch_base, epoch_last = excluded.epoch_last,"
            " include_commits = excluded.include_commits,"
            " fingerprint = excluded.fingerprint, stale = 0",
            [
                (
                    a.topic,
                    a.epoch_base if a.keys else None,
                    a.epoch_base + len(a.keys) - 1 if a.keys and a.epoch_base is not None else None,
                    int(a.include_commits),
                    fingerprint if a.keys else None,
                )
                for a in adds
            ],
        )
        self._db.executemany("DELETE FROM uploaded WHERE topic = ?", [(t,) for t in removes])

    # ------------------------------------------------------------ held-back adds

    def held_back(self, digest: str) -> frozenset[bytes]:
        """The topics whose adds a topic limit refused while the desired set was the
        one ``digest`` names; none once it has changed."""
        if self.settings().exhausted_digest != digest:
            return frozenset()
        return frozenset(bytes(r[0]) for r in self._db.execute("SELECT topic FROM held_back"))

    def hold_back(self, topics: Iterable[bytes], digest: str) -> None:
        """Hold back ``topics`` (the adds of a refused run) until the desired set is no
        longer the one ``digest`` names."""
        if self.settings().exhausted_digest != digest:
            self._db.execute("DELETE FROM held_back")
        self._db.executemany(
            "INSERT OR IGNORE INTO held_back (topic) VALUES (?)", [(t,) for t in topics]
        )
        self.update(exhausted_digest=digest)

    def clear_held_back(self) -> None:
        self._db.execute("DELETE FROM held_back")
        self.update(exhausted_digest=None)

    def mark_all_stale(self) -> int:
        return self._db.execute("UPDATE uploaded SET stale = 1").rowcount

    def clear_uploaded(self) -> None:
        self._db.execute("DELETE FROM uploaded")

    # ------------------------------------------------------------ overrides

    def overrides(self) -> dict[bytes, Override]:
        return {
            bytes(r[0]): Override(r[1])
            for r in self._db.execute("SELECT topic, value FROM overrides")
        }

    def set_override(self, topic: bytes, value: Override) -> None:
        if value is Override.NONE:
            self._db.execute("DELETE FROM overrides WHERE topic = ?", (topic,))
        else:
            self._db.execute(
                "INSERT INTO overrides (topic, value) VALUES (?, ?)"
                " ON CONFLICT (topic) DO UPDATE SET value = excluded.value",
                (topic, value.value),
            )
