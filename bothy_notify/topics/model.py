"""Topic mode's shared rules, without IO: what the daemon and the reference client
both rely on (docs/topics.md).

- **Topics** are opaque bytes: a kind byte and an identifier of the kind's
  length (:data:`TOPIC_ID_BYTES`). Kind ``0x00`` is a conversation, ``0x01``
  an installation's welcome topic.
- **HMAC epochs** are 30-day periods of Unix time: ``epoch = seconds // 30
  days``. The daemon takes the envelope's append time; the client its own clock
  (near a boundary the two may differ, and the sender then gets its own push:
  fail open).
- **Sender suppression**: a delivery is skipped exactly when the envelope has a
  ``sender_hmac``, the subscription's key window holds a key for the envelope's
  epoch, and HMAC-SHA256(key, data) equals ``sender_hmac``. Every other case
  sends.
- **Push eligibility**: a welcome always; an application message only with
  ``should_push``; a commit or proposal always, but only to subscriptions with
  ``include_commits``.
- **The push payload** is ``{"topic": base64, "sequence_id": "<decimal>"}``
  (decimal text, so JavaScript never rounds it).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
from collections.abc import Sequence
from datetime import UTC, datetime

RECIPIENT_ID_BYTES = 32
"""A recipient id is 32 random bytes, made once by the client."""
RECIPIENT_SECRET_BYTES = 32
"""A recipient secret is 32 random bytes: no slow hash is needed, SHA-256 suffices."""
HMAC_KEY_BYTES = 42
"""The size of a per-topic HMAC key the client derives for one epoch."""
MAX_HMAC_KEYS = 3
"""A key window holds keys for at most three consecutive epochs."""
EPOCH_SECONDS = 30 * 86_400
"""One HMAC epoch: 30 days."""
TOPIC_ID_BYTES = {0x00: 16, 0x01: 32}
"""Identifier length by topic kind byte: conversations 16 bytes, welcome topics 32."""

_SHA256_BLOCK = 64


class EnvelopeKind(enum.StrEnum):
    """What an envelope is, as far as pushes care."""

    WELCOME = "welcome"
    APPLICATION = "application"
    COMMIT = "commit"
    PROPOSAL = "proposal"


def push_eligible(kind: EnvelopeKind, should_push: bool) -> bool:
    """Whether an envelope may be pushed at all."""
    return kind is not EnvelopeKind.APPLICATION or should_push


def reaches(kind: EnvelopeKind, include_commits: bool) -> bool:
    """Whether an eligible envelope of ``kind`` reaches a subscription with that flag."""
    return kind not in (EnvelopeKind.COMMIT, EnvelopeKind.PROPOSAL) or include_commits


def topic_is_valid(topic: bytes) -> bool:
    """A known kind byte followed by an identifier of that kind's length."""
    return len(topic) >= 1 and TOPIC_ID_BYTES.get(topic[0]) == len(topic) - 1


def epoch_of(when: datetime) -> int:
    """The HMAC epoch of a point in time (30-day periods since the Unix epoch)."""
    return int(when.astimezone(UTC).timestamp()) // EPOCH_SECONDS


def secret_hash(secret: bytes) -> bytes:
    """What the daemon stores in place of a recipient secret."""
    return hashlib.sha256(secret).digest()


def sender_hmac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256(key, data): what a sender attaches to its envelope."""
    return hmac.digest(key, data, "sha256")


def hmac_pads(key: bytes) -> bytes:
    """The key's HMAC-SHA256 inner and outer pads (64 bytes each), concatenated.

    HMAC(key, m) = SHA256(outer || SHA256(inner || m)), so with the pads stored
    the daemon checks a sender in SQL with the built-in ``sha256()``. The pads
    are as secret as the key.
    """
    if len(key) > _SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    padded = key.ljust(_SHA256_BLOCK, b"\x00")
    inner = bytes(b ^ 0x36 for b in padded)
    outer = bytes(b ^ 0x5C for b in padded)
    return inner + outer


def window_key(epoch_base: int | None, keys: Sequence[bytes | None], epoch: int) -> bytes | None:
    """The key a window holds for ``epoch``, if any (slot n is epoch ``base + n``)."""
    if epoch_base is None:
        return None
    slot = epoch - epoch_base
    if 0 <= slot < len(keys):
        return keys[slot]
    return None


def is_own_message(
    epoch_base: int | None,
    keys: Sequence[bytes | None],
    epoch: int,
    data: bytes,
    hmac_value: bytes | None,
) -> bool:
    """The suppression rule in Python (the daemon runs the same rule in SQL)."""
    if hmac_value is None:
        return False
    key = window_key(epoch_base, keys, epoch)
    if key is None:
        return False
    return hmac.compare_digest(sender_hmac(key, data), hmac_value)


def b64(data: bytes) -> str:
    """Standard base64 with padding: every binary field on the wire."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes | None:
    """Decode standard base64 strictly: ``None`` unless ``text`` is its canonical form."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    # Refuse non-canonical spellings (stray bits in the last group): one topic, one text.
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def push_payload(topic: bytes, sequence_id: int) -> dict[str, str]:
    """The content-free payload of a topic push."""
    return {"topic": b64(topic), "sequence_id": str(sequence_id)}
