"""A bot keeps its topic subscriptions in step with its conversations.

Against a daemon in development mode (``make run`` serves the fake channel)::

    export BOTHY_URL=http://127.0.0.1:8700
    export BOTHY_TOKEN=$(.venv/bin/bothy-notify dev-token --config config/dev.toml \\
        --user bot --device bot-1 --platform linux)
    .venv/bin/python -m bothy_notify.client.example

The identity (recipient id and secret) lives in ``bot-notifications.db`` and is
kept across runs, disable and enable.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import trio

from bothy_notify.client import (
    Conversation,
    Delivery,
    HttpRecipientApi,
    LocalStore,
    MemoryConversations,
    NotificationClient,
    NotificationState,
    Rules,
)
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.topics.model import epoch_of


def group_key(root: bytes, topic: bytes, epoch: int) -> bytes:
    """Stand-in for the app's own key derivation: 42 bytes per (topic, epoch)."""
    material = hmac.digest(root, topic + epoch.to_bytes(8, "big"), "sha512")
    return material[:42]


async def main(api_url: str, token: str, db_path: str) -> NotificationState:
    root = hashlib.sha256(b"the bot's root key; keep yours secret").digest()
    conversations = MemoryConversations(welcome=b"\x01" + os.urandom(32))
    team = b"\x00" + hashlib.sha256(b"team room").digest()[:16]
    conversations.add(Conversation(team))
    now = epoch_of(SystemClock().now())
    for epoch in range(now - 1, now + 2):  # the window the daemon needs
        conversations.keys[(team, epoch)] = group_key(root, team, epoch)

    api = HttpRecipientApi(api_url, token)
    client = NotificationClient(store=LocalStore(db_path), api=api, source=conversations)
    try:
        delivery = Delivery("fake", token="bot-1")  # noqa: S106 - a fake channel's token
        state = await client.enable(delivery, Rules(include_commits=True))
        print(f"enabled: {state.status.value}")
        # The task runner (client.run) would do this in the background, after every
        # wake and at least hourly; here one pass until nothing is left to send.
        while (await client.sync_once()).more:
            pass
        state = client.state()
        assert state.recipient is not None
        print(f"subscribed topics: {state.recipient.topic_count}")
        print(f"expires unless renewed: {state.recipient.expires_at.isoformat()}")
        return state
    finally:
        await api.aclose()


if __name__ == "__main__":
    trio.run(
        main,
        os.environ.get("BOTHY_URL", "http://127.0.0.1:8700"),
        os.environ["BOTHY_TOKEN"],
        "bot-notifications.db",
    )
