"""What the next request should send: the desired set against the uploaded set,
computed from local state alone (no IO, no clock: the caller passes the epoch).

Desired: every conversation where the installation is an active member and
whose effective value is enabled (an override beats the rules; without one,
its consent must be one of ``consent_states``), sync groups only by
``include_sync_groups`` (no override), and the welcome topic when
``include_welcomes``. Every conversation topic carries the ``include_commits``
rule and the HMAC keys for epochs current - 1 to current + 1.

A request holds at most :data:`MAX_PER_REQUEST` adds and removes together, in
this order of priority, so that every desired topic is subscribed within
ceil(desired / 1000) runs whatever a repair pass still has to re-send:

1. removes: uploaded topics no longer desired;
2. adds of desired topics never uploaded;
3. re-uploads: a commit flag that differs from the rule, a key window that
   does not reach current + 1, keys from another root key;
4. re-uploads of rows a repair pass marked stale.

Topics whose adds a topic limit refused are held back (no add of any kind)
until the desired set changes; every other topic's adds go on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from bothy_notify.client.api import Subscription
from bothy_notify.client.local import Uploaded
from bothy_notify.client.model import Conversation, ConversationKind, Override, Rules
from bothy_notify.topics.model import MAX_HMAC_KEYS

MAX_PER_REQUEST = 1000
"""Subscriptions (adds and removes) in one request."""

KeyLookup = Callable[[bytes, int], bytes | None]


@dataclass(frozen=True, slots=True)
class Desired:
    """A topic the client wants subscribed; ``conversation`` topics carry keys and
    the commit rule, the welcome topic neither."""

    topic: bytes
    conversation: bool

    def __repr__(self) -> str:
        return f"Desired(conversation={self.conversation})"


@dataclass(frozen=True, slots=True)
class Plan:
    """One request's worth of changes, and whether more remain after it."""

    adds: tuple[Subscription, ...]
    removes: tuple[bytes, ...]
    more: bool

    @property
    def empty(self) -> bool:
        return not self.adds and not self.removes


def effective(conversation: Conversation, override: Override, rules: Rules) -> bool:
    """Whether a conversation is subscribed (its override, else the rules)."""
    if not conversation.active:
        return False
    if conversation.kind is ConversationKind.SYNC:
        return rules.include_sync_groups
    if override is Override.ENABLED:
        return True
    if override is Override.DISABLED:
        return False
    return conversation.consent in rules.consent_states


def desired_set(
    conversations: Iterable[Conversation],
    welcome: bytes,
    overrides: Mapping[bytes, Override],
    rules: Rules,
) -> dict[bytes, Desired]:
    out = {
        c.topic: Desired(c.topic, True)
        for c in conversations
        if effective(c, overrides.get(c.topic, Override.NONE), rules)
    }
    if rules.include_welcomes:
        out[welcome] = Desired(welcome, False)
    return out


def digest(desired: Mapping[bytes, Desired]) -> str:
    """Identifies a desired set (adds dropped after a topic limit wait for a new one)."""
    h = hashlib.sha256()
    for topic in sorted(desired):
        h.update(len(topic).to_bytes(2, "big") + topic)
    return h.hexdigest()


def key_window(topic: bytes, epoch: int, keys: KeyLookup) -> tuple[int | None, tuple[bytes, ...]]:
    """The keys for epochs ``epoch - 1`` to ``epoch + 1`` that the source has, as a
    window: the first epoch with a key and the consecutive keys from there."""
    found: list[bytes] = []
    base: int | None = None
    for e in range(epoch - 1, epoch - 1 + MAX_HMAC_KEYS):
        key = keys(topic, e)
        if key is None:
            if found:
                break
            continue
        if base is None:
            base = e
        found.append(key)
    return base, tuple(found)


def plan(
    desired: Mapping[bytes, Desired],
    uploaded: Mapping[bytes, Uploaded],
    *,
    rules: Rules,
    keys: KeyLookup,
    epoch: int,
    fingerprint: str,
    held_back: Collection[bytes] = (),
    limit: int = MAX_PER_REQUEST,
) -> Plan:
    """The next request (see the module docstring for what goes first); no add for a
    topic in ``held_back``."""
    removes = [t for t in uploaded if t not in desired]
    missing: list[bytes] = []
    refresh: list[bytes] = []
    stale: list[bytes] = []
    for topic, want in desired.items():
        if topic in held_back:
            continue
        row = uploaded.get(topic)
        if row is None:
            missing.append(topic)
        elif want.conversation and _needs_refresh(row, rules, keys, epoch, fingerprint):
            refresh.append(topic)
        elif row.stale:
            stale.append(topic)
    queue = removes + missing + refresh + stale
    chosen = queue[:limit]
    chosen_removes = tuple(t for t in chosen if t not in desired)
    adds = tuple(_subscription(desired[t], rules, keys, epoch) for t in chosen if t in desired)
    return Plan(adds, chosen_removes, len(queue) > limit)


def _needs_refresh(
    row: Uploaded, rules: Rules, keys: KeyLookup, epoch: int, fingerprint: str
) -> bool:
    if row.include_commits != rules.include_commits:
        return True
    if row.fingerprint is not None and row.fingerprint != fingerprint:
        return True
    if row.epoch_last is not None and row.epoch_last >= epoch + 1:
        return False
    # The window does not reach the next epoch: send one when there are keys for it.
    return keys(row.topic, epoch + 1) is not None


def _subscription(want: Desired, rules: Rules, keys: KeyLookup, epoch: int) -> Subscription:
    if not want.conversation:
        return Subscription(want.topic)
    base, window = key_window(want.topic, epoch, keys)
    return Subscription(want.topic, rules.include_commits, base, window)
