"""One valid payload of every event type of ``schemas/events/``, each as an app
would send it: the examples tests and benchmarks build their cases from
(``tests/store/test_eventlog.py`` checks there is one per schema)."""

from __future__ import annotations

from typing import Any

VALID_PAYLOADS: dict[str, dict[str, Any]] = {
    "user.upserted": {"user_id": "alex", "kind": "human", "active": True},
    "device.upserted": {"device_id": "d1", "user_id": "alex", "platform": "ios", "state": "active"},
    "thread.upserted": {"thread_id": "t1", "space_id": "s1", "channel_id": "c1"},
    "member.added": {"user_id": "alex", "scope_id": "s1"},
    "member.removed": {"user_id": "alex", "scope_id": "s1"},
    "thread.followed": {"user_id": "alex", "thread_id": "t1", "level": "all"},
    "thread.read": {"user_id": "alex", "thread_id": "t1", "seq": 4},
    "message.created": {
        "thread_id": "t1",
        "message_id": "m1",
        "thread_seq": 1,
        "author_id": "sam",
        "mentions": ["alex"],
    },
    "message.edited": {
        "thread_id": "t1",
        "message_id": "m1",
        "thread_seq": 1,
        "author_id": "sam",
        "mentions": ["alex", "robin"],
        "previous_mentions": ["alex"],
    },
    "message.deleted": {
        "thread_id": "t1",
        "message_id": "m1",
        "thread_seq": 1,
        "author_id": "sam",
        "mentions": ["alex"],
        "last_seq": 0,
    },
    "access.expiring": {"user_id": "alex", "target_id": "grant-1"},
    "hint.requested": {
        "recipients": ["alex", "sam"],
        "actor_id": "robin",
        "category": "social",
        "kind": "social:friend_request",
        "target_id": "robin",
        "idempotency_key": "req-1",
    },
    "envelope.published": {
        "topic": "AAECAwQFBgcICQoLDA0ODxA=",
        "kind": "application",
        "should_push": True,
        "sender_hmac": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        "data": "c2VhbGVkIGJ5dGVz",
    },
}
