"""Replaying dead letters (``bothy-notify events retry``).

A dead letter is an event the consumer round set aside (see
:mod:`bothy_notify.notify.round`). Once its cause is fixed (an upgrade that
knows its type, a fixed bug), a replay applies its projection and decides its
hints exactly as the round would, in one transaction that also deletes its
dead-letter row: it commits whole or not at all.

A replay is decided with today's facts, in the log position of now: the
projection as it stands (every event consumed since the event was appended
has been applied; a ``thread.read`` that came later already counts), the
configuration of now, and no presence (the command has no gateway
connections, so every device is reached by push, as on a ``worker`` node). It
takes the consumer cursor's row lock first, so it runs between two rounds of
a running daemon, never inside one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bothy_notify.config import Config
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.kernel.supervise import error_type, error_where
from bothy_notify.notify.planner import RoundOutcome, RoundPlanner
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store import deadletters
from bothy_notify.store.db import Conn, StoreUnavailable, translate_errors
from bothy_notify.store.events import CURSOR_NAME


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one replay did.

    ``replayed``: applied and decided, the dead letter removed; ``outcome`` says
    what was decided. Otherwise ``error_type`` and ``error_where`` say why it
    failed again (the dead letter is kept, its retry counted), or ``gone`` is
    true when the dead letter or its event no longer exists.
    """

    seq: int
    replayed: bool
    outcome: RoundOutcome | None = None
    error_type: str = ""
    error_where: str = ""
    gone: bool = False


def replay(conn: Conn, seq: int, *, config: Config, now: datetime) -> ReplayResult:
    """Replay dead letter ``seq`` on ``conn`` (autocommit, no transaction open). Blocking.

    Raises :class:`StoreUnavailable` when the database is lost (nothing is
    changed then); every other failure is the event's and is returned.
    """
    try:
        with translate_errors(), conn.transaction():
            # Every round takes this row first: the replay runs between two rounds.
            conn.execute(
                "SELECT 1 FROM bothy.consumer_cursor WHERE name = %s FOR UPDATE", (CURSOR_NAME,)
            )
            event = deadletters.load_event(conn, seq)
            if event is None:
                return ReplayResult(seq, replayed=False, gone=True)
            planner = RoundPlanner(
                conn, now=now, config=config, presence=NoPresence(), live=FailClosedRoutes()
            )
            planner.feed([event])
            planner.finish()
            deadletters.remove(conn, seq)
    except StoreUnavailable:
        raise
    except Exception as exc:
        kind, where = error_type(exc), error_where(exc)
        with translate_errors(), conn.transaction():
            deadletters.count_retry(conn, seq, kind, where, now)
        return ReplayResult(seq, replayed=False, error_type=kind, error_where=where)
    return ReplayResult(seq, replayed=True, outcome=planner.outcome)
