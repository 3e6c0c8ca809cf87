"""The closes the gateway sends: the close codes and the constant reasons.

A value module below both :mod:`gateway.protocol` (which decides when a
connection closes) and :mod:`gateway.errors` (whose exceptions carry the
close), so neither imports the other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CloseCode(enum.IntEnum):
    """Close codes of SPEC section 8, ``OVER_LIMIT`` (4008), ours, and RFC 6455's::

        1001  SHUTDOWN       the node shuts down
        1002  FRAMING        the client's bytes broke RFC 6455's framing
        1007  INVALID_TEXT   a text message or a close reason that is not UTF-8
        1009  TOO_BIG        a message over sync.max_frame_bytes
        1011  SERVER_ERROR   the server failed to serve an op (the database is
                             unreachable, say); reconnect with backoff
        4001  AUTH           bad identify or reauth token; the token expired
        4003  PROTOCOL       malformed frame, unknown op, wrong phase, identify timeout
        4008  OVER_LIMIT     too many unidentified connections (the oldest goes),
                             or too many connections of one person
        4009  HEARTBEAT      no frame within the heartbeat timeout
        4010  REVOKED        the device is revoked, or the person deactivated
        4014  WRITE_STALLED  a write did not finish within sync.write_timeout
        4017  REPLACED       a newer connection of the same device is live
        4029  TOO_MANY       frames past the bucket (sync.ops_per_second, sync.ops_burst)

    4008 mirrors the WebSocket code 1008 (policy violation) and is not used by
    SPEC: ``sync.max_unidentified_connections`` and
    ``sync.max_connections_per_person``. A deactivated person gets 4010, not
    4001: the token is valid, and a client that fetched a new one would be
    refused again.
    """

    SHUTDOWN = 1001
    FRAMING = 1002
    INVALID_TEXT = 1007
    TOO_BIG = 1009
    SERVER_ERROR = 1011
    AUTH = 4001
    PROTOCOL = 4003
    OVER_LIMIT = 4008
    HEARTBEAT = 4009
    REVOKED = 4010
    WRITE_STALLED = 4014
    REPLACED = 4017
    TOO_MANY = 4029


@dataclass(frozen=True, slots=True)
class Close:
    """A close the server sends: a code (a :class:`CloseCode`) and a constant reason."""

    code: int
    reason: str


AUTH_FAILED = Close(CloseCode.AUTH, "authentication failed")
TOKEN_EXPIRED = Close(CloseCode.AUTH, "token expired")
MALFORMED = Close(CloseCode.PROTOCOL, "malformed frame")
UNKNOWN_OP = Close(CloseCode.PROTOCOL, "unknown op")
NOT_IDENTIFIED = Close(CloseCode.PROTOCOL, "identify first")
ALREADY_IDENTIFIED = Close(CloseCode.PROTOCOL, "already identified")
FRAME_TOO_LARGE = Close(CloseCode.TOO_BIG, "frame too large")
FRAMING_BROKEN = Close(CloseCode.FRAMING, "websocket protocol error")
INVALID_TEXT = Close(CloseCode.INVALID_TEXT, "invalid utf-8")
BAD_FOCUS = Close(CloseCode.PROTOCOL, "invalid focus")
BAD_READ = Close(CloseCode.PROTOCOL, "invalid read")
IDENTIFY_TIMEOUT = Close(CloseCode.PROTOCOL, "identify timeout")
HEARTBEAT_TIMEOUT = Close(CloseCode.HEARTBEAT, "heartbeat timeout")
REVOKED = Close(CloseCode.REVOKED, "device revoked")
DEACTIVATED = Close(CloseCode.REVOKED, "person deactivated")
TOO_MANY_UNIDENTIFIED = Close(CloseCode.OVER_LIMIT, "too many unidentified connections")
TOO_MANY_FOR_PERSON = Close(CloseCode.OVER_LIMIT, "too many connections for this person")
WRITE_STALLED = Close(CloseCode.WRITE_STALLED, "writes stalled")
REPLACED = Close(CloseCode.REPLACED, "replaced by a newer connection")
SHUTDOWN = Close(CloseCode.SHUTDOWN, "server shutting down")
TOO_MANY_FRAMES = Close(CloseCode.TOO_MANY, "too many frames")
SERVER_ERROR = Close(CloseCode.SERVER_ERROR, "server error")
