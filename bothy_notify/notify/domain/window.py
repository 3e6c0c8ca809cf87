"""Coalescing windows (SPEC section 6, point 6).

The first routed message hint of a (recipient, thread) opens a window of
``notify.coalesce_window``. Later messages inside it only raise its count and
move its newest message. At the window's end :func:`flush_hint` gives one hint
whose count is the unread count, when the thread is still unread and something
was folded in; nothing when it was read. Messages deleted meanwhile
(``message.deleted``) are left out: a flush that would tell only of deleted ones
says nothing (:func:`only_deleted`, skip ``deleted``), and one whose newest folded
message was deleted points at the thread, up to its last message.
"""

from __future__ import annotations

from collections.abc import Collection
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


def only_deleted(window: Window, read_position: int, deleted: Collection[int]) -> bool:
    """Whether every message a flush of ``window`` would tell of was deleted: the
    sequences after the opening hint's and after the read position, up to the newest
    folded one, all in ``deleted`` (the thread's sequences deleted since the window
    opened; a thread's sequence is one per message)."""
    after = max(window.first_seq, read_position)
    if window.newest_seq <= after:
        return False
    gone = sum(1 for seq in set(deleted) if after < seq <= window.newest_seq)
    return gone >= window.newest_seq - after


def flush_hint(
    window: Window,
    *,
    nid: str,
    thread_id: str,
    read_position: int,
    last_message_seq: int,
    deleted: Collection[int] = (),
) -> Hint | None:
    """The hint at the end of ``window``, or ``None``.

    ``None`` when nothing was folded in after the opening hint, or when the
    recipient has read up to the newest folded message. Otherwise a hint that
    points at the newest message, with count = the unread count, quiet unless a
    folded message mentioned the recipient. When the newest folded message is
    among ``deleted`` (sequences deleted since the window opened), the hint points
    at the thread up to its last message (no message id) instead; the caller asks
    :func:`only_deleted` first.
    """
    if window.count <= 1 or window.newest_seq <= window.first_seq:
        return None
    seq: int = window.newest_seq
    message_id: str | None = window.newest_message_id
    if seq in deleted:
        seq, message_id = last_message_seq, None
    if read_position >= seq:
        return None
    newest = max(seq, last_message_seq)
    kind = Kind.MENTION if window.mention else Kind.MESSAGE
    return Hint(
        nid=nid,
        kind=kind.value,
        category="mentions" if window.mention else "messages",
        thread_id=thread_id,
        message_id=message_id,
        message_seq=seq,
        quiet=not window.mention,
        count=max(1, newest - read_position),
        is_flush=True,
    )
