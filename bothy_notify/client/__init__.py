"""The reference client of topic mode (docs/topics.md): keeps one installation's
recipient and topic subscriptions on the daemon in step with the app."""

from bothy_notify.client.api import HttpRecipientApi, Identity, RecipientApi, Subscription
from bothy_notify.client.client import NotificationClient, RunResult
from bothy_notify.client.errors import (
    NotificationError,
    RecipientNotFound,
    RetryableError,
    RunnerDisabled,
    TerminalError,
    TopicLimitReached,
)
from bothy_notify.client.local import LocalStore
from bothy_notify.client.model import (
    Consent,
    Conversation,
    ConversationKind,
    ConversationSource,
    Delivery,
    MemoryConversations,
    NotificationState,
    Override,
    RecipientState,
    Rules,
    Status,
)

__all__ = [
    "Consent",
    "Conversation",
    "ConversationKind",
    "ConversationSource",
    "Delivery",
    "HttpRecipientApi",
    "Identity",
    "LocalStore",
    "MemoryConversations",
    "NotificationClient",
    "NotificationError",
    "NotificationState",
    "Override",
    "RecipientApi",
    "RecipientNotFound",
    "RecipientState",
    "RetryableError",
    "Rules",
    "RunResult",
    "RunnerDisabled",
    "Status",
    "Subscription",
    "TerminalError",
    "TopicLimitReached",
]
