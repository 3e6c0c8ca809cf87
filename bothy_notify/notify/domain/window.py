"""Coalescing windows (SPEC section 6, point 6).

The first routed message hint of a (recipient, thread) opens a window of
``notify.coalesce_window``. Later messages inside it only raise its count and
move its newest message. At the window's end :func:`flush_hint` gives one hint
whose count is the unread count, when the thread is still unread and something
was folded in; nothing when it was read.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from bothy_notify.notify.domain.model import Hint, Kind, Window


def open_window(
    now: datetime, length: timedelta, message_seq: int, message_id: str
) -> Window | None:
    """The window a routed hint for message ``message_seq`` opens; ``None`` when off."""
    if length <= timedelta(0):
        return None
    return Window(
        opened_at=now,
        closes_at=now + length,
        count=1,
        first_seq=message_seq,
        newest_seq=message_seq,
        newest_message_id=message_id,
    )


def fold_into(window: Window, message_seq: int, message_id: str, *, mentioned: bool) -> Window:
    """``window`` after folding in one more message (never loses the newest one)."""
    newer = message_seq >= window.newest_seq
    return Window(
        opened_at=window.opened_at,
        closes_at=window.closes_at,
        count=window.count + 1,
        first_seq=window.first_seq,
        newest_seq=message_seq if newer else window.newest_seq,
        newest_message_id=message_id if newer else window.newest_message_id,
        mention=window.mention or mentioned,
    )


def flush_hint(
    window: Window,
    *,
    nid: str,
    thread_id: str,
    read_position: int,
    last_message_seq: int,
) -> Hint | None:
    """The hint at the end of ``window``, or ``None``.

    ``None`` when nothing was folded in after the opening hint, or when the
    recipient has read up to the newest folded message. Otherwise a hint that
    points at the newest message, with count = the unread count, quiet unless a
    folded message mentioned the recipient.
    """
    if window.count <= 1 or window.newest_seq <= window.first_seq:
        return None
    if read_position >= window.newest_seq:
        return None
    newest = max(window.newest_seq, last_message_seq)
    kind = Kind.MENTION if window.mention else Kind.MESSAGE
    return Hint(
        nid=nid,
        kind=kind.value,
        category="mentions" if window.mention else "messages",
        thread_id=thread_id,
        message_id=window.newest_message_id,
        message_seq=window.newest_seq,
        quiet=not window.mention,
        count=max(1, newest - read_position),
        is_flush=True,
    )
