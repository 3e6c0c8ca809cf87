"""Errors of the reference client: the daemon's answers in three classes.

::

    NotificationError            a notification call did not succeed
    ├── TerminalError            the request can never succeed as it is: the state
    │                            becomes failed and notification tasks stop
    │                            (permission_denied, invalid_argument,
    │                            failed_precondition, an endpoint this daemon
    │                            does not have, a refused token scope)
    ├── RecipientNotFound        the daemon does not know the recipient (expired,
    │                            or the backend was restored): clear the uploaded
    │                            set, register again, repair
    ├── TopicLimitReached        resource_exhausted: drop the run's adds until the
    │                            desired set changes
    └── RetryableError           anything else (unavailable, a 5xx, a timeout, a
                                 connection failure, an expired token): retried
                                 with backoff, first after 60 s
    RunnerDisabled               enable() on a client whose task runner is off

Messages are the daemon's constant messages or constant text of our own; none
names an id, secret, token, URL or topic.
"""

from __future__ import annotations


class NotificationError(Exception):
    """A notification call failed. ``code`` is the daemon's error code (or ours)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TerminalError(NotificationError):
    """Not worth retrying: the client's state becomes failed with this error."""


class RecipientNotFound(NotificationError):
    """The daemon does not know this recipient."""


class TopicLimitReached(NotificationError):
    """The recipient is at ``limits.max_push_topics``."""


class RetryableError(NotificationError):
    """Try again later."""


class RunnerDisabled(Exception):
    """Notifications need the client's task runner; enable() refuses without it."""
