"""Errors of the gateway.

::

    GatewayError
    ├── ProtocolViolation    the client's input ends the connection; carries the Close
    │   └── Throttled        a device closed with 4029 identifies again too soon
    └── TransportError       the WebSocket connection itself
        ├── TransportClosed  the peer closed the connection or it broke ("it broke")
        ├── FrameTooLarge    a client message exceeded ``sync.max_frame_bytes`` (1009)
        ├── TooManyFrames    the client sent frames faster than ``sync.ops_per_second``
        └── FramingError     the client's bytes broke RFC 6455 (1002) or its text
                             was not UTF-8 (1007)

A close the server decides (replacement, revocation, shutdown, a stalled
write) is not an error: the hub records it on the connection and cancels the
connection's session, which then closes the transport with that code ("we
closed it").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.closes import Close


class GatewayError(Exception):
    """Base of every error the gateway raises."""


class ProtocolViolation(GatewayError):
    """The client's input ends the connection: it broke the protocol (4003), or its
    identify was refused (a bad token 4001, a revoked device 4010).

    Args:
        close: the close code and constant reason the connection ends with.
    """

    def __init__(self, close: Close) -> None:
        super().__init__(close.reason)
        self.close = close


class Throttled(ProtocolViolation):
    """A device closed with 4029 identified again before its cooldown ended.

    Attributes:
        until: when (Trio's clock) the cooldown ends.
    """

    def __init__(self, close: Close, until: float) -> None:
        super().__init__(close)
        self.until = until


class TransportError(GatewayError):
    """The WebSocket connection failed below the protocol."""


class TransportClosed(TransportError):
    """The peer closed the connection, or it broke; nothing more can be sent.

    Attributes:
        code: the close code the peer sent, ``None`` when the connection broke.
    """

    def __init__(self, code: int | None) -> None:
        super().__init__("the WebSocket connection is closed")
        self.code = code


class FrameTooLarge(TransportError):
    """A client message exceeded ``sync.max_frame_bytes``; it was never buffered whole."""


class TooManyFrames(TransportError):
    """The client's frames exceeded its token bucket (``sync.ops_per_second``,
    ``sync.ops_burst``); the rest are never served."""


class FramingError(TransportError):
    """The client's bytes broke RFC 6455's framing, or a text message or close reason
    was not UTF-8; nothing after them is read, and the connection ends with ``code``.

    Attributes:
        code: 1002 (protocol error) or 1007 (invalid payload data), as RFC 6455
            section 7.4.1 defines them.
    """

    def __init__(self, code: int) -> None:
        super().__init__("the client broke the WebSocket framing")
        self.code = code
