"""HTTP/2 to a push provider through libcurl's multi interface, driven from one thread.

Why not httpx: a push is one small request, and the pure-Python layers
(httpx -> httpcore -> h2 -> hpack -> Trio's TLS stream over ``ssl.MemoryBIO``)
cost about a millisecond of CPU each; libcurl with nghttp2 and OpenSSL (the
``pycurl`` wheel bundles all three) costs tens of microseconds. The
measurement is in ``docs/performance.md`` and ``bench/http2_clients.py``.

Shape::

    Trio tasks ── request: deque + eventfd ──────────────> curl thread
                                                           epoll + curl_multi_socket_action,
                                                           one HTTP/2 connection per host
    waiting tasks <── answers, batched per loop turn ───── (TrioToken.run_sync_soon)

Only the curl thread touches libcurl. A request is a value in, a value out:
:class:`~.transport.ProviderAnswer` when the provider answered (whatever the
status), :class:`~.transport.NoAnswer` when it did not (connection, DNS, TLS,
protocol failure, or the backstop timeout), so the providers' pure mappers can
tell "no answer" apart from "answered 5xx".

Cancellation (the lessons of ``push/streams.py`` hold by construction): a
cancelled :meth:`Http2Client.request` raises ``Cancelled`` at once and tells
the curl thread, which removes the transfer from the multi handle. libcurl owns
every byte of the connection's framing and HPACK state in that one thread, so a
cancellation can never drop bytes the protocol believes were sent: an HTTP/2
stream is reset (``RST_STREAM``) and the connection stays usable; a transfer
removed while its connection is still being set up (TCP or TLS handshake) gives
that half-made connection up, socket included. Callers bound requests with
cancel scopes (:data:`~.transport.REQUEST_BOUND`); libcurl's own timeouts are a
backstop only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

import certifi
import outcome
import pycurl
import trio

from bothy_notify.push.transport import REQUEST_BOUND, NoAnswer, ProviderAnswer

log = logging.getLogger("bothy.push.http2")

BACKSTOP_SECONDS = 2 * REQUEST_BOUND
"""libcurl's own limit per transfer; the caller's cancel scope ends a request first."""
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
    """One request, shared by its Trio task and the curl thread.

    The Trio side sets ``cancelled`` (once); the curl thread sets everything
    else. ``result`` is handed back in the Trio thread, where ``cancelled`` is
    read, so the two never race.
    """

    __slots__ = ("body", "cancelled", "easy", "headers", "result", "task", "url")

    def __init__(
        self, url: str, headers: Sequence[str], body: bytes, task: trio.lowlevel.Task
    ) -> None:
        self.url = url
        self.headers = headers
        self.body = body
        self.task = task
        self.cancelled = False
        self.easy: _Easy | None = None
        self.result: ProviderAnswer | NoAnswer | None = None


class _Easy:
    """A libcurl easy handle with its answer buffers; reused across requests."""

    __slots__ = ("body", "curl", "head", "transfer")

    def __init__(self, ca_file: str) -> None:
        self.curl = pycurl.Curl()
        self.body: list[bytes] = []
        self.head: list[bytes] = []
        self.transfer: _Transfer | None = None
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
        c.setopt(pycurl.TIMEOUT_MS, int(BACKSTOP_SECONDS * 1000))
        c.setopt(pycurl.WRITEFUNCTION, self.body.append)
        c.setopt(pycurl.HEADERFUNCTION, self.head.append)

    def answer(self) -> ProviderAnswer:
        return ProviderAnswer(
            self.curl.getinfo(pycurl.RESPONSE_CODE), tuple(self.head), b"".join(self.body)
        )


class Http2Client:
    """HTTP/2 POSTs over libcurl, one connection per host, from one curl thread.

    Args:
        ca_file: the CA bundle to verify the provider with (empty: certifi's, the
            same bundle httpx uses).
        name: names the thread (``bothy-push-<name>``).

    The thread starts with the first request, in the Trio run that made it, and
    stops in :meth:`aclose`.
    """

    def __init__(self, *, ca_file: str = "", name: str = "provider") -> None:
        if not pycurl.version_info()[4] & pycurl.VERSION_HTTP2:
            # A pycurl built against a system libcurl without nghttp2 (the wheel has it).
            raise RuntimeError("pycurl's libcurl has no HTTP/2 support; install the pycurl wheel")
        self._ca_file = ca_file or certifi.where()
        self._name = name
        self._inbox: collections.deque[_Transfer] = collections.deque()
        self._wake_fd = -1
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopping = False
        self._closed = False
        self._kick = trio.Event()  # set: the curl thread has requests to take
        self._kicker = trio.CancelScope()
        # Curl-thread state (only that thread touches these once it runs).
        self._timer: float | None = None
        self._watched: set[int] = set()
        self._epoll: Any = None
        self._multi: Any = None
        self._running: dict[Any, _Easy] = {}  # pycurl.Curl -> its _Easy, while in the multi

    def __repr__(self) -> str:
        return f"Http2Client({self._name!r})"

    # ------------------------------------------------------------------ Trio side

    async def request(
        self, url: str, headers: Sequence[str], body: bytes
    ) -> ProviderAnswer | NoAnswer:
        """POST ``body`` to ``url`` with ``headers`` (``"name: value"`` lines).

        Returns the answer, whatever its status, or :class:`NoAnswer` when none
        came. Cancellation: raises at once; the transfer is reset in the curl
        thread and the connection stays usable for other requests.
        """
        if self._closed:
            raise trio.ClosedResourceError("the provider client is closed")
        if self._thread is None:
            self._start()
        transfer = _Transfer(url, headers, body, trio.lowlevel.current_task())
        self._post(transfer)

        def abort(_: Any) -> trio.lowlevel.Abort:
            transfer.cancelled = True
            self._post(transfer)  # the curl thread removes it if it is running
            return trio.lowlevel.Abort.SUCCEEDED

        result: ProviderAnswer | NoAnswer = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def _post(self, transfer: _Transfer) -> None:
        self._inbox.append(transfer)
        self._kick.set()

    async def _wake_curl_thread(self) -> None:
        # One wake-up per turn of Trio's loop, however many requests that turn made:
        # each wake-up costs a system call and a hand-over of the GIL.
        with self._kicker:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                os.eventfd_write(self._wake_fd, 1)

    def _start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_PIPELINING, pycurl.PIPE_MULTIPLEX)
        self._multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, 1)
        self._multi.setopt(pycurl.M_MAX_CONCURRENT_STREAMS, MAX_STREAMS)
        self._thread = threading.Thread(
            target=self._run, name=f"bothy-push-{self._name}", daemon=True
        )
        self._thread.start()
        trio.lowlevel.spawn_system_task(self._wake_curl_thread, name=f"bothy-push-{self._name}")

    def _deliver(self, done: list[_Transfer]) -> None:
        # Runs in the Trio thread: a transfer whose task was cancelled is not woken.
        for transfer in done:
            if not transfer.cancelled:
                assert transfer.result is not None
                trio.lowlevel.reschedule(transfer.task, outcome.Value(transfer.result))

    async def aclose(self) -> None:
        """Stop the curl thread and close the connections; waits for the thread.

        Requests still waiting get :class:`NoAnswer` (``closed``).
        """
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._kicker.cancel()
        os.eventfd_write(self._wake_fd, 1)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join)
        os.close(self._wake_fd)
        self._wake_fd = -1
        self._thread = None

    # ------------------------------------------------------------------ curl thread

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        if what == pycurl.POLL_REMOVE:
            if fd in self._watched:
                self._watched.discard(fd)
                with contextlib.suppress(OSError):  # libcurl may have closed it already
                    self._epoll.unregister(fd)
            return
        mask = 0
        if what in (pycurl.POLL_IN, pycurl.POLL_INOUT):
            mask |= select.EPOLLIN
        if what in (pycurl.POLL_OUT, pycurl.POLL_INOUT):
            mask |= select.EPOLLOUT
        if fd in self._watched:
            self._epoll.modify(fd, mask)
        else:
            self._epoll.register(fd, mask)
            self._watched.add(fd)

    def _on_timer(self, timeout_ms: int) -> None:
        self._timer = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000

    def _run(self) -> None:
        multi = self._multi
        idle: list[_Easy] = []
        running = self._running
        done: list[_Transfer] = []
        try:
            while not self._stopping:
                timer = self._timer
                wait = -1.0 if timer is None else max(0.0, timer - time.monotonic())
                for fd, event in self._epoll.poll(wait):
                    if fd == self._wake_fd:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(fd)
                        continue
                    mask = 0
                    if event & select.EPOLLIN:
                        mask |= pycurl.CSELECT_IN
                    if event & select.EPOLLOUT:
                        mask |= pycurl.CSELECT_OUT
                    if event & (select.EPOLLERR | select.EPOLLHUP):
                        mask |= pycurl.CSELECT_ERR
                    multi.socket_action(fd, mask)
                self._take_inbox(multi, idle, running, done)
                timer = self._timer
                if timer is not None and timer <= time.monotonic():
                    self._timer = None
                    multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
                self._collect(multi, idle, running, done)
                if done:
                    self._hand_back(done)
                    done = []
        finally:
            for easy in running.values():
                multi.remove_handle(easy.curl)
                transfer = easy.transfer
                if transfer is not None:
                    transfer.result = NoAnswer("closed")
                    done.append(transfer)
            if done:
                self._hand_back(done)
            for easy in (*running.values(), *idle):
                easy.curl.close()
            multi.close()
            self._epoll.close()

    def _take_inbox(
        self, multi: Any, idle: list[_Easy], running: dict[Any, _Easy], done: list[_Transfer]
    ) -> None:
        inbox = self._inbox
        while inbox:
            transfer = inbox.popleft()
            easy = transfer.easy
            if transfer.cancelled:
                if easy is not None and easy.transfer is transfer:
                    # Reset that stream only; libcurl keeps the connection.
                    multi.remove_handle(easy.curl)
                    del running[easy.curl]
                    self._recycle(easy, idle)
                continue
            if easy is not None or transfer.result is not None:
                continue  # already running or finished
            easy = idle.pop() if idle else _Easy(self._ca_file)
            easy.transfer = transfer
            transfer.easy = easy
            curl = easy.curl
            curl.setopt(pycurl.URL, transfer.url)
            curl.setopt(pycurl.HTTPHEADER, transfer.headers)
            curl.setopt(pycurl.POSTFIELDS, transfer.body)
            try:
                multi.add_handle(curl)
            except pycurl.error:
                transfer.result = NoAnswer("network_error")
                done.append(transfer)
                self._recycle(easy, idle)
                continue
            running[curl] = easy

    def _collect(
        self, multi: Any, idle: list[_Easy], running: dict[Any, _Easy], done: list[_Transfer]
    ) -> None:
        while True:
            queued, ok, failed = multi.info_read()
            for curl in ok:
                easy = running.get(curl)
                if easy is not None:
                    self._finish(multi, easy, easy.answer(), idle, running, done)
            for curl, code, _message in failed:
                easy = running.get(curl)
                if easy is not None:
                    self._finish(multi, easy, NoAnswer(no_answer_reason(code)), idle, running, done)
            if not queued:
                return

    def _finish(
        self,
        multi: Any,
        easy: _Easy,
        result: ProviderAnswer | NoAnswer,
        idle: list[_Easy],
        running: dict[Any, _Easy],
        done: list[_Transfer],
    ) -> None:
        multi.remove_handle(easy.curl)
        del running[easy.curl]
        transfer = easy.transfer
        if transfer is not None:
            transfer.result = result
            done.append(transfer)
        self._recycle(easy, idle)

    @staticmethod
    def _recycle(easy: _Easy, idle: list[_Easy]) -> None:
        transfer = easy.transfer
        if transfer is not None:
            transfer.easy = None
        easy.transfer = None
        easy.body.clear()
        easy.head.clear()
        if len(idle) < IDLE_HANDLES:
            idle.append(easy)
        else:
            easy.curl.close()

    def _hand_back(self, done: list[_Transfer]) -> None:
        assert self._token is not None
        try:
            self._token.run_sync_soon(self._deliver, done)
        except trio.RunFinishedError:
            log.debug("the Trio run ended before its provider answers were handed back")
