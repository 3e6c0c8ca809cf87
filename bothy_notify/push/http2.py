"""HTTP/2 to a push provider through libcurl's multi interface, driven by Trio.

Why not httpx: a push is one small request, and the pure-Python layers
(httpx -> httpcore -> h2 -> hpack -> Trio's TLS stream over ``ssl.MemoryBIO``)
cost many times the CPU per request of libcurl with nghttp2 and OpenSSL (the
``pycurl`` wheel bundles all three). The measurement is in
``docs/performance.md`` ("http2_clients") and ``bench/http2_clients.py``.

Shape: libcurl's socket interface (``curl_multi_socket_action``) run on
Trio's own thread. libcurl says which sockets it wants watched and when its
timer is due; Trio waits for them (``wait_readable``/``wait_writable``, an
event or a deadline for the timer), and each readiness is one call into
libcurl, which does the TLS and HTTP/2 work in C. No thread is added, so
nothing pays for hand-overs between threads: the requests made in one turn of
Trio's loop go out in one call (its socket writes corked into full TCP
segments), and the answers read in one call wake their tasks directly.

A request is a value in, a value out:
:class:`~.transport.ProviderAnswer` when the provider answered (whatever the
status), :class:`~.transport.NoAnswer` when it did not (connection, DNS, TLS,
protocol failure, or the backstop timeout), so the providers' pure mappers can
tell "no answer" apart from "answered 5xx".

Cancellation (the lessons of ``push/streams.py`` hold by construction): a
cancelled :meth:`Http2Client.request` raises ``Cancelled`` at once, and the
client's driver task removes the transfer from the multi handle. libcurl owns
every byte of the connection's framing and HPACK state and never leaves a
write half done between two calls, so a cancellation can never drop bytes the
protocol believes were sent: an HTTP/2 stream is reset (``RST_STREAM``) and the
connection stays usable; a transfer removed while its connection is still being
set up (TCP or TLS handshake) gives that half-made connection up, socket
included. Each request carries its bound (:data:`~.transport.REQUEST_BOUND`
for the providers), kept by libcurl's timer in C; a transfer past it ends as
``NoAnswer("timeout")`` the same way (its stream reset).
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Sequence
from typing import Any

import certifi
import outcome
import pycurl
import trio

from bothy_notify.push.transport import REQUEST_BOUND, NoAnswer, ProviderAnswer

log = logging.getLogger("bothy.push.http2")

BACKSTOP_SECONDS = 2 * REQUEST_BOUND
"""Longest a transfer may take whatever ``bound`` a caller asks for."""
_BACKSTOP_MS = int(BACKSTOP_SECONDS * 1000)
CONNECT_SECONDS = REQUEST_BOUND
"""libcurl's limit on setting up a connection (TCP and TLS)."""
MAX_STREAMS = 1000
"""Most HTTP/2 streams we open at once on one connection (the server's SETTINGS may
lower it; transfers past it wait inside libcurl). The per-provider permits
(``push.max_in_flight``) bound it long before."""
IDLE_HANDLES = 1024
"""Most finished easy handles kept for reuse (each holds its options, so reuse skips
setting them again)."""

# libcurl error codes -> the reason codes of NoAnswer (never a URL or token).
_REASONS = {
    pycurl.E_COULDNT_RESOLVE_HOST: "dns_error",
    pycurl.E_COULDNT_RESOLVE_PROXY: "proxy_error",
    pycurl.E_COULDNT_CONNECT: "connect_error",
    pycurl.E_OPERATION_TIMEDOUT: "timeout",
    pycurl.E_SSL_CONNECT_ERROR: "tls_error",
    pycurl.E_PEER_FAILED_VERIFICATION: "tls_error",
    pycurl.E_SSL_CACERT_BADFILE: "tls_error",
    pycurl.E_SSL_CERTPROBLEM: "tls_error",
    pycurl.E_SSL_CIPHER: "tls_error",
    pycurl.E_SSL_ISSUER_ERROR: "tls_error",
    pycurl.E_SSL_PINNEDPUBKEYNOTMATCH: "tls_error",
    pycurl.E_HTTP2: "protocol_error",
    92: "protocol_error",  # CURLE_HTTP2_STREAM (no pycurl name)
    8: "protocol_error",  # CURLE_WEIRD_SERVER_REPLY (no pycurl name)
    pycurl.E_UNSUPPORTED_PROTOCOL: "protocol_error",
}


def no_answer_reason(code: int) -> str:
    """The reason code of a libcurl error (``connect_error``, ``tls_error``...)."""
    return _REASONS.get(code, "network_error")


class _Transfer:
    """One request: its waiting task, and its easy handle while it runs."""

    __slots__ = ("body", "cancelled", "easy", "task")

    def __init__(self, body: bytes, task: trio.lowlevel.Task) -> None:
        self.body = body  # the bytes libcurl sends from, alive until the transfer ends
        self.task = task
        self.cancelled = False
        self.easy: _Easy | None = None


class _Easy:
    """A libcurl easy handle with its answer buffers; reused across requests."""

    __slots__ = ("body", "connect_to", "curl", "head", "transfer")

    def __init__(self, ca_file: str) -> None:
        self.curl = pycurl.Curl()
        self.body: list[bytes] = []
        self.head: list[bytes] = []
        self.transfer: _Transfer | None = None
        self.connect_to: str | None = None
        c = self.curl
        c.setopt(pycurl.NOSIGNAL, 1)
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTPS)
        c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2TLS)
        # Wait for the host's one connection to multiplex on rather than opening another.
        c.setopt(pycurl.PIPEWAIT, 1)
        c.setopt(pycurl.CAINFO, ca_file)
        c.setopt(pycurl.PROXY, "")  # never a proxy from the environment
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(CONNECT_SECONDS * 1000))
        c.setopt(pycurl.WRITEFUNCTION, self.body.append)
        c.setopt(pycurl.HEADERFUNCTION, self.head.append)

    def answer(self) -> ProviderAnswer:
        return ProviderAnswer(
            self.curl.getinfo(pycurl.RESPONSE_CODE), tuple(self.head), b"".join(self.body)
        )


class _Watch:
    """One socket libcurl wants watched: a reader and a writer task wait for it.

    Each task waits only while libcurl wants that direction (``want_*``; the
    ``*_wanted`` events wake it when it does again); a readiness that arrives
    after libcurl stopped wanting it costs one harmless call into libcurl.
    """

    __slots__ = ("fd", "in_wanted", "out_wanted", "want_in", "want_out")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.want_in = False
        self.want_out = False
        self.in_wanted = trio.Event()
        self.out_wanted = trio.Event()


class Http2Client:
    """HTTP/2 POSTs over libcurl, one connection per host, driven by Trio.

    Args:
        ca_file: the CA bundle to verify the provider with (empty: certifi's, the
            same bundle httpx uses).
        name: names the driver task (``bothy-push-<name>``).
        max_host_connections: connections per host (1: every request multiplexed on
            one HTTP/2 connection; more lets a host that answers over HTTP/1.1
            take requests in parallel).

    The client starts with the first request, in the Trio run that made it
    (a system task of that run drives libcurl), and stops in :meth:`aclose`.
    """

    def __init__(
        self, *, ca_file: str = "", name: str = "provider", max_host_connections: int = 1
    ) -> None:
        if not pycurl.version_info()[4] & pycurl.VERSION_HTTP2:
            # A pycurl built against a system libcurl without nghttp2 (the wheel has it).
            raise RuntimeError("pycurl's libcurl has no HTTP/2 support; install the pycurl wheel")
        self._ca_file = ca_file or certifi.where()
        self._name = name
        self._max_host_connections = max_host_connections
        self._multi: Any = None
        self._nursery: trio.Nursery | None = None
        self._driver = trio.CancelScope()
        self._closed = False
        self._idle: list[_Easy] = []
        self._running: dict[Any, _Easy] = {}  # pycurl.Curl -> its _Easy, while in the multi
        self._watched: dict[int, _Watch] = {}
        self._timer_at = math.inf
        self._timer_changed = trio.Event()
        self._cancelled: list[_Transfer] = []
        self._work = trio.Event()  # set: cancelled transfers to remove

    def __repr__(self) -> str:
        return f"Http2Client({self._name!r})"

    async def request(
        self,
        url: str,
        headers: Sequence[str],
        body: bytes,
        *,
        bound: float = BACKSTOP_SECONDS,
        connect_to: str | None = None,
    ) -> ProviderAnswer | NoAnswer:
        """POST ``body`` to ``url`` with ``headers`` (``"name: value"`` lines).

        ``connect_to`` (``"host:port:address:port"``, libcurl's ``CONNECT_TO``) pins
        the connection to an address checked by the caller: TLS and ``Host`` still
        name the URL's host, and a connection is reused only for the same host and
        address.

        Returns the answer, whatever its status, or :class:`NoAnswer` when none
        came: ``NoAnswer("timeout")`` once ``bound`` seconds have passed (libcurl's
        own per-transfer timer). Cancellation: raises at once; the transfer is
        then reset (its HTTP/2 stream only) and the connection stays usable for
        other requests.

        The bound is libcurl's rather than a cancel scope at the caller (as our
        style has it elsewhere) because a deadline scope per send was a large share
        of the APNs provider's CPU per push (``bench/push.py``); a caller's scope
        still cancels.
        """
        if self._closed:
            raise trio.ClosedResourceError("the provider client is closed")
        if self._multi is None:
            self._start()
        transfer = _Transfer(body, trio.lowlevel.current_task())
        easy = self._idle.pop() if self._idle else _Easy(self._ca_file)
        curl = easy.curl
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.POSTFIELDS, body)
        curl.setopt(pycurl.TIMEOUT_MS, max(1, min(int(bound * 1000), _BACKSTOP_MS)))
        if connect_to != easy.connect_to:
            curl.setopt(pycurl.CONNECT_TO, [connect_to] if connect_to else [])
            easy.connect_to = connect_to
        easy.transfer = transfer
        transfer.easy = easy
        try:
            # libcurl sets its timer to "now": the timer task starts every transfer
            # added in this turn of Trio's loop with one call.
            self._multi.add_handle(curl)
        except pycurl.error:
            self._recycle(easy)
            return NoAnswer("network_error")
        self._running[curl] = easy

        def abort(_: Any) -> trio.lowlevel.Abort:
            transfer.cancelled = True
            self._cancelled.append(transfer)
            self._work.set()
            return trio.lowlevel.Abort.SUCCEEDED

        result: ProviderAnswer | NoAnswer = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    async def aclose(self) -> None:
        """Close the connections; requests still waiting get :class:`NoAnswer` (``closed``)."""
        self._closed = True
        self._shut_down(NoAnswer("closed"))
        await trio.lowlevel.checkpoint()

    def _shut_down(self, result: NoAnswer) -> None:
        """Stop the driver, answer every waiting request with ``result``, close libcurl."""
        multi, self._multi = self._multi, None
        if multi is None:
            return
        self._driver.cancel()
        self._driver = trio.CancelScope()
        self._nursery = None
        self._timer_at = math.inf
        for fd in list(self._watched):
            del self._watched[fd]
            trio.lowlevel.notify_closing(fd)  # before libcurl closes it
        self._cancelled.clear()
        for easy in list(self._running.values()):
            multi.remove_handle(easy.curl)
            transfer = easy.transfer
            if transfer is not None and not transfer.cancelled:
                trio.lowlevel.reschedule(transfer.task, outcome.Value(result))
            easy.curl.close()
        self._running.clear()
        for easy in self._idle:
            easy.curl.close()
        self._idle.clear()
        multi.close()

    # ------------------------------------------------------------------ driving libcurl

    def _start(self) -> None:
        multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_PIPELINING, pycurl.PIPE_MULTIPLEX)
        multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, self._max_host_connections)
        multi.setopt(pycurl.M_MAX_CONCURRENT_STREAMS, MAX_STREAMS)
        self._multi = multi
        trio.lowlevel.spawn_system_task(self._drive, name=f"bothy-push-{self._name}")

    async def _drive(self) -> None:
        try:
            with self._driver:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._run_timer)
                    await self._remove_cancelled()
        except Exception:
            # A bug here must not end the daemon (this is a system task): every
            # waiting send gets no answer (transient), and the next request starts over.
            log.exception("the provider client failed; starting over with new connections")
            self._shut_down(NoAnswer("network_error"))

    async def _remove_cancelled(self) -> None:
        while True:
            await self._work.wait()
            self._work = trio.Event()
            if self._multi is None:
                return  # closed meanwhile
            cancelled, self._cancelled = self._cancelled, []
            for transfer in cancelled:
                easy = transfer.easy
                if easy is not None and easy.transfer is transfer:
                    # Reset that stream only; libcurl keeps the connection.
                    self._multi.remove_handle(easy.curl)
                    del self._running[easy.curl]
                    self._recycle(easy)
            self._collect()

    async def _run_timer(self) -> None:
        while True:
            if trio.current_time() >= self._timer_at:
                self._timer_at = math.inf
                self._act(pycurl.SOCKET_TIMEOUT, 0)
                await trio.lowlevel.checkpoint()
                continue
            # A new timer (mostly "now": every added transfer sets one) wakes this task
            # through the event; only a timer that really runs out ends the scope.
            changed = self._timer_changed = trio.Event()
            with trio.move_on_at(self._timer_at):
                await changed.wait()

    def _on_timer(self, timeout_ms: int) -> None:
        self._timer_at = math.inf if timeout_ms < 0 else trio.current_time() + timeout_ms / 1000
        self._timer_changed.set()

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        if what == pycurl.POLL_REMOVE:
            watch = self._watched.pop(fd, None)
            if watch is not None:
                watch.in_wanted.set()  # wake both tasks: they see they are done
                watch.out_wanted.set()
                trio.lowlevel.notify_closing(fd)  # libcurl may close it next
            return
        if self._nursery is None:
            return  # shutting down: nothing is watched any more
        watch = self._watched.get(fd)
        if watch is None:
            watch = self._watched[fd] = _Watch(fd)
            self._nursery.start_soon(self._read, watch)
            self._nursery.start_soon(self._write, watch)
        watch.want_in = what in (pycurl.POLL_IN, pycurl.POLL_INOUT)
        watch.want_out = what in (pycurl.POLL_OUT, pycurl.POLL_INOUT)
        if watch.want_in:
            watch.in_wanted.set()
        if watch.want_out:
            watch.out_wanted.set()

    async def _read(self, watch: _Watch) -> None:
        while self._watched.get(watch.fd) is watch:
            if not watch.want_in:
                watch.in_wanted = trio.Event()
                await watch.in_wanted.wait()
                continue
            try:
                await trio.lowlevel.wait_readable(watch.fd)
            except (trio.ClosedResourceError, OSError):
                return  # libcurl is done with this socket
            if self._watched.get(watch.fd) is watch:
                self._act(watch.fd, pycurl.CSELECT_IN)

    async def _write(self, watch: _Watch) -> None:
        while self._watched.get(watch.fd) is watch:
            if not watch.want_out:
                watch.out_wanted = trio.Event()
                await watch.out_wanted.wait()
                continue
            try:
                await trio.lowlevel.wait_writable(watch.fd)
            except (trio.ClosedResourceError, OSError):
                return
            if self._watched.get(watch.fd) is watch:
                self._act(watch.fd, pycurl.CSELECT_OUT)

    def _act(self, fd: int, mask: int) -> None:
        # libcurl writes each transfer's frames with their own send() calls; corked,
        # the kernel sends what one call wrote as full segments when it is uncorked,
        # instead of pushing every small write through the network stack on its own.
        corked = list(self._watched) if _TCP_CORK else []
        for sock in corked:
            _cork(sock, 1)
        try:
            self._multi.socket_action(fd, mask)
        except pycurl.error:
            log.exception("libcurl failed to drive its transfers")
        for sock in corked:
            if sock in self._watched:  # libcurl may have closed it meanwhile
                _cork(sock, 0)
        self._collect()

    def _collect(self) -> None:
        multi = self._multi
        while True:
            queued, ok, failed = multi.info_read()
            for curl in ok:
                easy = self._running.get(curl)
                if easy is not None:
                    self._finish(easy, easy.answer())
            for curl, code, _message in failed:
                easy = self._running.get(curl)
                if easy is not None:
                    self._finish(easy, NoAnswer(no_answer_reason(code)))
            if not queued:
                return

    def _finish(self, easy: _Easy, result: ProviderAnswer | NoAnswer) -> None:
        self._multi.remove_handle(easy.curl)
        del self._running[easy.curl]
        transfer = easy.transfer
        self._recycle(easy)
        if transfer is not None and not transfer.cancelled:
            trio.lowlevel.reschedule(transfer.task, outcome.Value(result))

    def _recycle(self, easy: _Easy) -> None:
        transfer = easy.transfer
        if transfer is not None:
            transfer.easy = None
        easy.transfer = None
        easy.body.clear()
        easy.head.clear()
        if len(self._idle) < IDLE_HANDLES and not self._closed:
            self._idle.append(easy)
        else:
            easy.curl.close()


_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux only


def _cork(fd: int, on: int) -> None:
    """Set ``TCP_CORK`` on libcurl's socket ``fd`` (a socket object that never owns it)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return  # not a socket: libcurl's resolver pipe
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK or 0, on)
    except OSError:
        pass  # not TCP (a Unix socket) or already gone
    finally:
        sock.detach()
