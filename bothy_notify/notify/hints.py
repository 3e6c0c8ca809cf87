"""Hints from events: which event raises which hint, and who its recipients are.

Pure functions over event payloads; the round adds the facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bothy_notify.kernel.ids import new_id
from bothy_notify.notify.domain.model import BUILTIN_KIND_CATEGORY, Hint, Kind


@dataclass(frozen=True, slots=True)
class HintRequest:
    """A hint with an explicit recipient list (everything but ``message.created``)."""

    hint: Hint
    recipients: tuple[str, ...]
    idempotency_key: str | None = None


def message_hint(payload: Mapping[str, Any], mv: str | None = None) -> Hint:
    """The hint of a ``message.created`` event (recipients come from follows); ``mv``:
    the catalogue version to fix on it."""
    return Hint(
        nid=new_id(),
        kind=Kind.MESSAGE.value,
        category=BUILTIN_KIND_CATEGORY[Kind.MESSAGE],
        thread_id=payload["thread_id"],
        message_id=payload["message_id"],
        message_seq=int(payload["thread_seq"]),
        actor_id=payload["author_id"],
        mentions=frozenset(payload.get("mentions") or ()),
        mv=mv,
    )


def edit_hint(payload: Mapping[str, Any], mv: str | None = None) -> HintRequest:
    """``message.edited``: a ``mention`` hint to each person in ``mentions`` and not in
    ``previous_mentions``, never the author; ``mention_only`` (a recipient who does
    not hear mentions hears nothing). The app gives both lists: no mention history
    is kept here. The request's key is the message's (:func:`edit_key`)."""
    author = payload["author_id"]
    before = set(payload["previous_mentions"])
    recipients = tuple(
        dict.fromkeys(u for u in payload["mentions"] if u not in before and u != author)
    )
    return HintRequest(
        Hint(
            nid=new_id(),
            kind=Kind.MENTION.value,
            category=BUILTIN_KIND_CATEGORY[Kind.MENTION],
            thread_id=payload["thread_id"],
            message_id=payload["message_id"],
            message_seq=int(payload["thread_seq"]),
            actor_id=author,
            mentions=frozenset(recipients),
            mv=mv,
            mention_only=True,
        ),
        recipients,
    )


def edit_key(payload: Mapping[str, Any]) -> str:
    """The hint idempotency key of an edited message's mentions: one hint per
    (message, person), however often the message is edited."""
    return f"edit|{payload['thread_id']}|{payload['message_id']}"


def security_hint(payload: Mapping[str, Any]) -> HintRequest:
    """A device entered ``pending``: tell the person's other devices."""
    return HintRequest(
        Hint(
            nid=new_id(),
            kind=Kind.SECURITY.value,
            category=BUILTIN_KIND_CATEGORY[Kind.SECURITY],
            target_id=payload["device_id"],
        ),
        (payload["user_id"],),
    )


def admin_hint(payload: Mapping[str, Any]) -> HintRequest:
    """``access.expiring``: an admin hint without a thread to that person."""
    return HintRequest(
        Hint(
            nid=new_id(),
            kind=Kind.ADMIN.value,
            category=BUILTIN_KIND_CATEGORY[Kind.ADMIN],
            target_id=payload["target_id"],
        ),
        (payload["user_id"],),
    )


def dedupe_key(request: HintRequest) -> str:
    """The idempotency key of an app-requested hint, shared by every recipient.

    The producer's ``idempotency_key`` when it gave one; otherwise what the hint
    is about: its kind, thread and target. A retried request carries the same
    payload, so it always finds the same key.
    """
    if request.idempotency_key:
        return f"key|{request.idempotency_key}"
    hint = request.hint
    return f"about|{hint.kind}|{hint.thread_id or ''}|{hint.target_id or ''}"


def requested_hint(payload: Mapping[str, Any]) -> HintRequest:
    """``hint.requested``: the app names kind, category and recipients; never the actor."""
    actor = payload.get("actor_id")
    recipients = tuple(dict.fromkeys(r for r in payload["recipients"] if r != actor))
    return HintRequest(
        Hint(
            nid=new_id(),
            kind=payload["kind"],
            category=payload["category"],
            thread_id=payload.get("thread_id"),
            target_id=payload.get("target_id"),
            actor_id=actor,
        ),
        recipients,
        payload.get("idempotency_key"),
    )
