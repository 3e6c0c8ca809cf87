"""The gateway protocol (SPEC section 8) without any IO: frames, phases, close codes.

Every frame is a JSON object in a text frame. Client ops and server replies
carry ``op`` and ``d``; server events carry ``type``.

The connection's state machine (every rule is here, as h11's ``_state.py``
holds HTTP's): :class:`ConnectionState` holds the phase and the decided
close, :data:`TRANSITIONS` says which trigger moves which phase, and
:data:`ALLOWED` which ops each phase accepts::

    phase        entered when                        client ops allowed
    -----------  ----------------------------------  ---------------------------
    connecting   the WebSocket is open; hello sent    identify
    catching_up  identify verified                    focus, read, ping, reauth (read once live)
    live         catchup.complete written             focus, read, ping, reauth
    closing      the server decided to close, or      (none; frames are ignored)
                 the peer went

    connecting --IDENTIFIED--> catching_up --CAUGHT_UP--> live
    any phase but closing --CLOSE--> closing

A trigger that its phase does not take changes nothing (a second close, a
late ``catchup.complete`` of a connection already closing). The hub applies
the triggers (under its lock, moving ``bothy_gateway_connections{phase}``);
nothing else changes a phase.

An op that its phase does not allow closes the connection with 4003: any op
but ``identify`` before identify, a second ``identify`` after it. Malformed
frames (not JSON, not an object, a binary frame, an unknown op, bad members)
close with 4003 too. Close reasons are constants: they never echo input.

Every client frame takes a token of the connection's bucket
(``sync.ops_per_second``, ``sync.ops_burst``; pings and control frames
included); past it the connection closes with 4029 ``too many frames``. The
bucket counts frames as they are read, in :class:`gateway.frames.FrameFilter`.

A frame is malformed when it is not strict JSON: ``NaN`` and ``Infinity``,
numbers beyond a double, a member named twice (readers disagree on which one
counts), and nesting too deep to parse are all refused. Invalid UTF-8 never
gets here: :mod:`gateway.frames` refuses it with 1007.

Beyond SPEC section 8 the gateway adds the op ``reauth`` (a fresh token for
the same person, device, platform and kind moves the connection's expiry;
answered by ``reauth.ack``), the close code 4008 (a limit on connections:
see :class:`CloseCode`) and the WebSocket code 1011 for a server error.
What breaks the WebSocket layer itself closes with RFC 6455's codes, not 4003:
1002 for bytes that break the framing, 1007 for text (or a close reason) that
is not UTF-8, 1009 for a message over ``sync.max_frame_bytes``.

:func:`decode_client_frame` turns one received message into a :class:`ClientOp`
or raises :class:`~gateway.errors.ProtocolViolation`; the ``*_frame``
functions build the server's replies as JSON text.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bothy_notify.kernel import strict_json
from bothy_notify.kernel.ids import is_valid_id
from gateway.closes import (
    ALREADY_IDENTIFIED,
    BAD_FOCUS,
    BAD_READ,
    MALFORMED,
    NOT_IDENTIFIED,
    UNKNOWN_OP,
    Close,
)
from gateway.errors import ProtocolViolation

MAX_SEQ = 9_007_199_254_740_991
"""Largest sequence a JavaScript client holds exactly (2**53 - 1), as in the HTTP API."""


class Phase(enum.StrEnum):
    """Where a connection is in its life; the label of ``bothy_gateway_connections``."""

    CONNECTING = "connecting"
    CATCHING_UP = "catching_up"
    LIVE = "live"
    CLOSING = "closing"


# -- client ops -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identify:
    """``{"op":"identify","d":{"token":JWT}}``. The repr hides the token."""

    token: str

    def __repr__(self) -> str:
        return "Identify()"


@dataclass(frozen=True, slots=True)
class Focus:
    """``{"op":"focus","d":{"thread_ids":[...],"idle":bool}}``: IDs deduplicated, in order."""

    thread_ids: tuple[str, ...]
    idle: bool

    def __repr__(self) -> str:
        return f"Focus(threads={len(self.thread_ids)}, idle={self.idle})"


@dataclass(frozen=True, slots=True)
class Read:
    """``{"op":"read","d":{"thread_id","seq"}}``."""

    thread_id: str
    seq: int

    def __repr__(self) -> str:
        return "Read()"


@dataclass(frozen=True, slots=True)
class Ping:
    """``{"op":"ping"}``; answered by ``pong``. Any client frame counts as a heartbeat."""


@dataclass(frozen=True, slots=True)
class Reauth:
    """``{"op":"reauth","d":{"token":JWT}}``: a fresh token for the same identity.

    Answered by ``reauth.ack``; the repr hides the token.
    """

    token: str

    def __repr__(self) -> str:
        return "Reauth()"


ClientOp = Identify | Focus | Read | Ping | Reauth

PING = Ping()
"""The one ``ping`` op (it has no members)."""
_PING_TEXTS = frozenset(('{"op":"ping"}', '{"op": "ping"}'))
"""``ping`` as clients write it, decoded without the JSON parser (the strict parser
answers the same for these texts)."""

ALLOWED: Mapping[Phase, tuple[type[ClientOp], ...]] = {
    Phase.CONNECTING: (Identify,),
    Phase.CATCHING_UP: (Focus, Read, Ping, Reauth),
    Phase.LIVE: (Focus, Read, Ping, Reauth),
    Phase.CLOSING: (),
}
"""Which ops each phase accepts (the table in the module docstring)."""


def check_allowed(phase: Phase, op: ClientOp) -> None:
    """Raise :class:`ProtocolViolation` unless ``op`` is allowed in ``phase``."""
    if isinstance(op, ALLOWED[phase]):
        return
    raise ProtocolViolation(ALREADY_IDENTIFIED if isinstance(op, Identify) else NOT_IDENTIFIED)


class Trigger(enum.Enum):
    """What moves a connection from one phase to the next."""

    IDENTIFIED = "identified"
    """Its identify token was verified; it is indexed under its person and device."""
    CAUGHT_UP = "caught_up"
    """Its ``catchup.complete`` was written to the socket."""
    CLOSE = "close"
    """The server decided to close it, or the peer closed it, or it broke."""


TRANSITIONS: Mapping[tuple[Phase, Trigger], Phase] = {
    (Phase.CONNECTING, Trigger.IDENTIFIED): Phase.CATCHING_UP,
    (Phase.CATCHING_UP, Trigger.CAUGHT_UP): Phase.LIVE,
    (Phase.CONNECTING, Trigger.CLOSE): Phase.CLOSING,
    (Phase.CATCHING_UP, Trigger.CLOSE): Phase.CLOSING,
    (Phase.LIVE, Trigger.CLOSE): Phase.CLOSING,
}
"""The phase each (phase, trigger) moves to; a pair not here changes nothing."""


class ConnectionState:
    """One connection's phase and the close the server decided (no IO, no lock).

    The hub applies triggers (:meth:`advance`, :meth:`decide`) under its lock
    and moves the phase gauges; the session asks :meth:`check` of each op.
    """

    __slots__ = ("close", "phase")

    def __init__(self) -> None:
        self.phase = Phase.CONNECTING
        self.close: Close | None = None

    def advance(self, trigger: Trigger) -> Phase | None:
        """Apply ``trigger``: the phase left, or ``None`` when it changed nothing."""
        left = self.phase
        phase = TRANSITIONS.get((left, trigger))
        if phase is None:
            return None
        self.phase = phase
        return left

    def decide(self, close: Close) -> bool:
        """Record the server's decision to close with ``close`` (the first one
        stands); whether it was the first."""
        if self.close is not None:
            return False
        self.close = close
        return True

    def check(self, op: ClientOp) -> None:
        """Raise :class:`ProtocolViolation` unless the phase allows ``op``."""
        check_allowed(self.phase, op)


def decode_client_frame(message: str | bytes, *, max_focused_threads: int) -> ClientOp:
    """Parse one client message.

    Args:
        message: the WebSocket message as received (a binary message is malformed).
        max_focused_threads: ``sync.max_focused_threads``.

    Returns:
        The op.

    Raises:
        ProtocolViolation: with the constant 4003 close that names the problem
            class (malformed frame, unknown op, invalid focus, invalid read).
    """
    if not isinstance(message, str):
        raise ProtocolViolation(MALFORMED)
    if message in _PING_TEXTS:
        return PING
    try:
        frame = strict_json.loads(message)
    except ValueError:
        raise ProtocolViolation(MALFORMED) from None
    if not isinstance(frame, dict) or not set(frame) <= {"op", "d"}:
        raise ProtocolViolation(MALFORMED)
    op, d = frame.get("op"), frame.get("d")
    if not isinstance(op, str):
        raise ProtocolViolation(MALFORMED)
    if op == "ping":
        if d is not None and d != {}:
            raise ProtocolViolation(MALFORMED)
        return PING
    if op not in ("identify", "focus", "read", "reauth"):
        raise ProtocolViolation(UNKNOWN_OP)
    if not isinstance(d, dict):
        raise ProtocolViolation(MALFORMED)
    if op in ("identify", "reauth"):
        token = d.get("token")
        if set(d) != {"token"} or not isinstance(token, str):
            raise ProtocolViolation(MALFORMED)
        return Identify(token) if op == "identify" else Reauth(token)
    if op == "focus":
        return _focus(d, max_focused_threads)
    return _read(d)


def _focus(d: Mapping[str, Any], limit: int) -> Focus:
    ids, idle = d.get("thread_ids"), d.get("idle", False)
    if not set(d) <= {"thread_ids", "idle"} or not isinstance(ids, list):
        raise ProtocolViolation(BAD_FOCUS)
    if type(idle) is not bool or len(ids) > limit:
        raise ProtocolViolation(BAD_FOCUS)
    if not all(is_valid_id(i) for i in ids):
        raise ProtocolViolation(BAD_FOCUS)
    return Focus(tuple(dict.fromkeys(ids)), idle)


def _read(d: Mapping[str, Any]) -> Read:
    thread_id, seq = d.get("thread_id"), d.get("seq")
    if set(d) != {"thread_id", "seq"} or not is_valid_id(thread_id):
        raise ProtocolViolation(BAD_READ)
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise ProtocolViolation(BAD_READ)
    assert isinstance(thread_id, str)
    return Read(thread_id, seq)


# -- server frames ----------------------------------------------------------------


def encode(frame: Mapping[str, Any]) -> str:
    """One frame as compact JSON text."""
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def hello_frame(heartbeat_ms: int) -> str:
    """``{"op":"hello","d":{"heartbeat_ms":N}}``: the first frame on every connection."""
    return encode({"op": "hello", "d": {"heartbeat_ms": heartbeat_ms}})


def ready_frame(user_id: str, device_id: str) -> str:
    """``{"op":"ready","d":{"user_id","device_id"}}``: identify was accepted."""
    return encode({"op": "ready", "d": {"user_id": user_id, "device_id": device_id}})


def unread_frame(threads: Iterable[tuple[str, int]]) -> str:
    """``{"op":"unread","d":{"threads":[{"thread_id","unread"}]}}``."""
    return encode(
        {"op": "unread", "d": {"threads": [{"thread_id": t, "unread": n} for t, n in threads]}}
    )


def catchup_complete_frame() -> str:
    """``{"op":"catchup.complete"}``: the connection is live from here on."""
    return encode({"op": "catchup.complete"})


def focus_ack_frame(kept: Sequence[str]) -> str:
    """``{"op":"focus.ack","d":{"thread_ids":[kept]}}``: the readable threads kept."""
    return encode({"op": "focus.ack", "d": {"thread_ids": list(kept)}})


def read_ack_frame(thread_id: str, last_read_seq: int) -> str:
    """``{"op":"read.ack","d":{"thread_id","last_read_seq"}}``: the stored read position."""
    return encode({"op": "read.ack", "d": {"thread_id": thread_id, "last_read_seq": last_read_seq}})


def pong_frame() -> str:
    """``{"op":"pong"}``: the answer to ``ping``."""
    return encode({"op": "pong"})


def reauth_ack_frame(expires_at: int) -> str:
    """``{"op":"reauth.ack","d":{"exp":N}}``: the new token's ``exp`` (Unix seconds)."""
    return encode({"op": "reauth.ack", "d": {"exp": expires_at}})
