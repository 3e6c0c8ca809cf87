"""The closed sets of what a job came to: its result and, for a skip, the reason.

Both are metric labels, so both are enums and nothing builds one from a string:

- :class:`SkipReason`: why a hint or a send stopped, the values of
  ``bothy_push_skipped_total{reason}``; the pure decision returns one, and the
  jobs that check again at send time return one.
- :class:`Result`: the values of ``bothy_jobs_finished_total{result}``. A
  finished job (the runner's ``Done``) carries one; the runner labels the other
  ends (``retry``, ``fail``, ``defer``, ``lost_lease``) itself. A counted skip's
  result is :attr:`SkipReason.result` (``skipped_<reason>``); a few results are
  skips that ``bothy_push_skipped_total`` does not count (``skipped_unmarked``,
  ``skipped_no_recipient``, a topic push's ``skipped_expired``).

A new reason or result is a new member here (the metric's documentation in
``docs/operations.md`` lists them), never a label made where it is counted.
"""

from __future__ import annotations

import enum


class SkipReason(enum.StrEnum):
    """Why no hint (or no send) happened: the values of ``bothy_push_skipped_total``."""

    NO_ACCESS = "no_access"
    PREFERENCE = "preference"
    READ = "read"
    ACTIVE_IN_THREAD = "active_in_thread"
    NO_REGISTRATION = "no_registration"
    EXPIRED = "expired"
    NODE_GONE = "node_gone"
    NO_CONNECTION = "no_connection"
    DELETED = "deleted"
    """The message was deleted before the send (``message.deleted``)."""

    @property
    def result(self) -> Result:
        """The job result of a job that stopped for this reason (``skipped_<reason>``)."""
        return _SKIPPED[self]


class Result(enum.StrEnum):
    """How a job attempt ended: the values of ``bothy_jobs_finished_total{result}``."""

    DONE = "done"
    """A job without a more telling result."""

    # A push's provider answer (push.port.OutcomeKind; a transient one retries).
    DELIVERED = "delivered"
    DEAD = "dead"
    MISMATCH = "mismatch"
    REJECTED = "rejected"

    HELD = "held"
    """A push held for quiet hours (``notify.push_send``)."""
    PUBLISHED = "published"
    """A gateway hint queued to at least one connection (``notify.gateway_send``)."""
    SENT = "sent"
    """A quiet period's end that queued its summary pushes (``notify.quiet_summary``)."""
    NOTHING_UNREAD = "nothing_unread"
    """A summary or a coalescing window's flush with nothing left to tell."""
    FLUSHED = "flushed"
    """A coalescing window's flush that queued its hint (``notify.flush``)."""
    REPLACED = "replaced"
    """A flush whose window was closed or reopened meanwhile (``notify.flush``)."""
    SKIPPED = "skipped"
    """A flush whose hint was decided and reached nobody (``notify.flush``)."""

    SKIPPED_NO_ACCESS = "skipped_no_access"
    SKIPPED_PREFERENCE = "skipped_preference"
    SKIPPED_READ = "skipped_read"
    SKIPPED_ACTIVE_IN_THREAD = "skipped_active_in_thread"
    SKIPPED_NO_REGISTRATION = "skipped_no_registration"
    SKIPPED_EXPIRED = "skipped_expired"
    SKIPPED_NODE_GONE = "skipped_node_gone"
    SKIPPED_NO_CONNECTION = "skipped_no_connection"
    SKIPPED_DELETED = "skipped_deleted"
    SKIPPED_UNMARKED = "skipped_unmarked"
    """A read clear whose mark is gone (cleared already, or its registration deleted)."""
    SKIPPED_NO_RECIPIENT = "skipped_no_recipient"
    """A topic push whose recipient is gone."""

    # The runner's own labels.
    RETRY = "retry"
    FAIL = "fail"
    DEFER = "defer"
    LOST_LEASE = "lost_lease"


_SKIPPED: dict[SkipReason, Result] = {
    SkipReason.NO_ACCESS: Result.SKIPPED_NO_ACCESS,
    SkipReason.PREFERENCE: Result.SKIPPED_PREFERENCE,
    SkipReason.READ: Result.SKIPPED_READ,
    SkipReason.ACTIVE_IN_THREAD: Result.SKIPPED_ACTIVE_IN_THREAD,
    SkipReason.NO_REGISTRATION: Result.SKIPPED_NO_REGISTRATION,
    SkipReason.EXPIRED: Result.SKIPPED_EXPIRED,
    SkipReason.NODE_GONE: Result.SKIPPED_NODE_GONE,
    SkipReason.NO_CONNECTION: Result.SKIPPED_NO_CONNECTION,
    SkipReason.DELETED: Result.SKIPPED_DELETED,
}
"""Each skip reason's job result; complete (a test walks every reason)."""
