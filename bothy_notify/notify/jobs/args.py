"""Job arguments of the notify jobs: IDs and integers only, never text.

Each args type turns into the JSON object stored in ``bothy.jobs.args``
(:meth:`to_args`) and back (:meth:`from_args`). Booleans travel as 0/1 and
times as Unix microseconds, so a test can walk every job's args and find
nothing but IDs, kind codes, catalogue versions (16 hex digits) and integers.

``mv`` is the kind catalogue's version fixed when the hint was decided; a job
queued by a release before it existed has none, and its handler sends the
version in use at send time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Self

from bothy_notify.kernel.values import fast_init
from bothy_notify.store import marks, quiet

PUSH_SEND = "notify.push_send"
GATEWAY_SEND = "notify.gateway_send"
FLUSH = "notify.flush"
PUSH_CLEAR = marks.PUSH_CLEAR
PUSH_REMOVED = marks.PUSH_REMOVED
QUIET_SUMMARY = quiet.QUIET_SUMMARY
PUSH_SUMMARY = "notify.push_summary"


class _Args:
    """Conversion shared by the args types: drop ``None``, bools as 0/1."""

    def to_args(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = int(value) if isinstance(value, bool) else value
        return out

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        names = _FIELDS.get(cls)
        if names is None:
            names = _FIELDS[cls] = tuple(
                (f.name, f.type in ("bool", bool))
                for f in fields(cls)  # type: ignore[arg-type]
            )
        kwargs: dict[str, Any] = {}
        for name, is_bool in names:
            if name in args:
                value = args[name]
                kwargs[name] = bool(value) if is_bool else value
        return cls(**kwargs)

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> Self | None:
        """:meth:`from_args`, or ``None`` when ``args`` lack a field (malformed)."""
        try:
            return cls.from_args(args)
        except TypeError:
            return None


_FIELDS: dict[type[_Args], tuple[tuple[str, bool], ...]] = {}
"""Each args type's field names and which are booleans (``dataclasses.fields`` once
per type, not once per job: job args are parsed per claimed job)."""


@fast_init
@dataclass(frozen=True, slots=True)
class PushSendArgs(_Args):
    """``notify.push_send``: one registration; ``release_seq`` > 0 for a delayed push."""

    nid: str
    user_id: str
    registration_id: str
    kind: str
    count: int
    quiet: bool
    due_at: int
    appended_at: int
    release_seq: int = 0
    thread_id: str | None = None
    message_id: str | None = None
    target_id: str | None = None
    mv: str | None = None
    category: str | None = None
    """The category the recipient hears the hint in (quiet hours' breakthrough); a
    job queued by a release before it existed has none (its kind's, then)."""


@fast_init
@dataclass(frozen=True, slots=True)
class GatewaySendArgs(_Args):
    """``notify.gateway_send``: one per (hint, recipient)."""

    nid: str
    user_id: str
    kind: str
    count: int
    quiet: bool
    due_at: int
    appended_at: int
    thread_id: str | None = None
    message_id: str | None = None
    target_id: str | None = None
    mv: str | None = None


@dataclass(frozen=True, slots=True)
class FlushArgs(_Args):
    """``notify.flush``: the end of the window of (user, thread) opened at ``opened_at``."""

    user_id: str
    thread_id: str
    opened_at: int


@dataclass(frozen=True, slots=True)
class PushClearArgs(_Args):
    """``notify.push_clear``: the read push of one (registration, thread), queued by
    :func:`bothy_notify.store.marks.queue_clears` with these args."""

    user_id: str
    registration_id: str
    thread_id: str


@dataclass(frozen=True, slots=True)
class PushRemovedArgs(_Args):
    """``notify.push_removed``: the push of one (registration, thread) after deletions
    in the thread, queued by :func:`bothy_notify.store.marks.queue_removals` with
    these args."""

    user_id: str
    registration_id: str
    thread_id: str


@dataclass(frozen=True, slots=True)
class QuietSummaryArgs(_Args):
    """``notify.quiet_summary``: the end of one person's quiet period, queued by
    :func:`bothy_notify.store.quiet.hold_many` with these args."""

    user_id: str


@dataclass(frozen=True, slots=True)
class PushSummaryArgs(_Args):
    """``notify.push_summary``: one registration's summary push; ``nid`` is shared
    by the summary's pushes to every registration of the person."""

    user_id: str
    registration_id: str
    count: int
    nid: str
