"""Benchmark: HTTP/2 clients for APNs, each in a bare loop against the fake APNs servers.

For each fake (``nginx``: C speed, checks the path only; ``python``:
``testkit/fakes/apns.py``, checks everything and costs more per request than a
client) and each client, ``--concurrency`` Trio tasks post ``--requests`` of
the provider's exact APNs requests (headers, body, a real ES256 provider JWT)
over one TLS connection:

- ``httpx``: the stack the providers used before (httpx over cancel-safe streams:
  ``httpx_client`` below: httpx -> httpcore -> h2 -> hpack -> Trio's TLS stream);
- ``h2``: h2 driven directly over one ``trio.SSLStream`` (no httpx/httpcore):
  headers and body with END_STREAM on the body's frame, one writer task that
  sends whatever h2 has queued in one write, window updates left to h2's
  batching;
- ``pycurl``: libcurl's multi interface driven by Trio
  (``bothy_notify.push.http2.Http2Client``, what the providers use now);
- ``aioapns`` (not by default): the APNs client Sygnal uses (asyncio + h2), in
  its own process and virtual environment (``pip install aioapns`` into a
  cached temporary venv on first use), with its defaults (up to 10
  connections). Sygnal itself (``matrix-sygnal``) is not available from the
  package registry here, so this is the nearest reproducible comparison.

Reported per (fake, client): requests/s, CPU per request in this process (both
threads) and in the fake. Prints a table and a last JSON line.

Usage: .venv/bin/python bench/http2_clients.py [--requests N] [--concurrency C]
       [--fakes nginx,python] [--clients httpx,h2,pycurl[,aioapns]]
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpcore
import httpx
import jwt
import outcome
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import Meter, machine, report  # noqa: E402
from bothy_notify.push.http2 import Http2Client  # noqa: E402
from bothy_notify.push.port import PushMessage  # noqa: E402
from bothy_notify.push.streams import CancelSafeBackend  # noqa: E402
from bothy_notify.push.transport import REQUEST_BOUND, ProviderAnswer, ssl_context  # noqa: E402
from testkit.fakes import KEY_ID, TEAM_ID, TOPIC, FakeApnsServer, start_fake  # noqa: E402

Post = Callable[[str, bytes], Awaitable[int]]
"""``(device token, body) -> status``."""


def httpx_client(ca_file: str) -> httpx.AsyncClient:
    """The APNs provider's former client: httpx over httpcore's HTTP/2 on cancel-safe
    streams, one connection."""
    context = ssl_context(ca_file, key="bench")
    transport = httpx.AsyncHTTPTransport(verify=context, http2=True, trust_env=False)
    # httpx takes no network backend; its pool is replaced by an equal one that has ours.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=context,
        max_connections=1,
        max_keepalive_connections=1,
        http1=True,
        http2=True,
        network_backend=CancelSafeBackend(),
    )
    return httpx.AsyncClient(
        transport=transport,
        timeout=2 * REQUEST_BOUND,
        follow_redirects=False,
        trust_env=False,
    )


def apns_request(pem: str) -> tuple[dict[str, str], bytes]:
    """The APNs provider's background-push headers (a fresh JWT) and body."""
    provider_jwt = jwt.encode(
        {"iss": TEAM_ID, "iat": int(time.time())}, pem, algorithm="ES256", headers={"kid": KEY_ID}
    )
    message = PushMessage(
        nid="0190c0de-0000-7000-8000-000000000000",
        kind="message",
        count=1,
        quiet=False,
        thread_id="t1",
        message_id="m1",
    )
    headers = {
        "authorization": f"bearer {provider_jwt}",
        "apns-topic": TOPIC,
        "apns-push-type": "background",
        "apns-priority": "5",
        "apns-collapse-id": "t1",
        "content-type": "application/json",
    }
    body = json.dumps(
        {"aps": {"content-available": 1}, **message.payload()}, separators=(",", ":")
    ).encode()
    return headers, body


class H2Direct:
    """A minimal HTTP/2 client: h2 over one ``trio.SSLStream``, no httpx/httpcore."""

    def __init__(self, url: str, ca_file: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self._host, self._port = parts.hostname, parts.port
        self._authority = parts.netloc
        self._ca_file = ca_file
        self._conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._waiting: dict[int, trio.lowlevel.Task] = {}
        self._status: dict[int, int] = {}
        self._dirty = trio.Event()
        self._slots = trio.Semaphore(1000)
        self._stream: trio.SSLStream[trio.SocketStream] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None]) -> None:
        context = ssl.create_default_context(cafile=self._ca_file)
        context.set_alpn_protocols(["h2"])
        tcp = await trio.open_tcp_stream(self._host, self._port)
        self._stream = trio.SSLStream(tcp, context, server_hostname=self._host)
        await self._stream.do_handshake()
        self._conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20}
        )
        self._conn.initiate_connection()
        self._conn.increment_flow_control_window(1 << 24)
        await self._stream.send_all(self._conn.data_to_send())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            task_status.started()
            await self._reader()
            nursery.cancel_scope.cancel()

    async def _writer(self) -> None:
        assert self._stream is not None
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            data = self._conn.data_to_send()
            if data:
                await self._stream.send_all(data)

    async def _reader(self) -> None:
        assert self._stream is not None
        while True:
            data = await self._stream.receive_some(65536)
            if not data:
                return
            for event in self._conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    for name, value in event.headers or ():
                        if name == b":status":
                            self._status[event.stream_id] = int(value)
                elif isinstance(event, h2.events.DataReceived):
                    self._conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    task = self._waiting.pop(event.stream_id, None)
                    if task is not None:
                        status = self._status.pop(event.stream_id, 0)
                        trio.lowlevel.reschedule(task, outcome.Value(status))
            self._dirty.set()

    async def post(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        async with self._slots:
            sid = self._conn.get_next_available_stream_id()
            self._conn.send_headers(
                sid,
                [
                    (b":method", b"POST"),
                    (b":scheme", b"https"),
                    (b":authority", self._authority.encode()),
                    (b":path", path.encode()),
                    *headers,
                ],
            )
            self._conn.send_data(sid, body, end_stream=True)
            self._waiting[sid] = trio.lowlevel.current_task()
            self._dirty.set()

            def abort(_: Any) -> trio.lowlevel.Abort:
                return trio.lowlevel.Abort.FAILED  # a bare loop never cancels a request

            status: int = await trio.lowlevel.wait_task_rescheduled(abort)
            return status


async def run_client(
    client: str, fake: FakeApnsServer, pem: str, total: int, concurrency: int
) -> dict[str, float]:
    """One bare loop: ``total`` requests from ``concurrency`` tasks; figures."""
    headers, body = apns_request(pem)
    results: dict[str, float] = {}

    async def loop(post: Post) -> None:
        await post(f"{0:064x}", body)  # the connection, the JWT verified once
        for _ in range(200):
            await post(f"{1:064x}", body)
        remaining = total
        failures = 0

        async def worker() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                if await post(f"{remaining:064x}", body) != 200:
                    failures += 1

        meter = Meter(fake.pid)
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - started
        cpu = meter.stop(total)
        if failures:
            raise RuntimeError(f"{client}: {failures} answers were not 200")
        results.update(
            requests_per_s=round(total / elapsed, 1),
            cpu_us_per_request=round(cpu["own_cpu_us"], 1),
            fake_cpu_us_per_request=round(cpu["fake_cpu_us"], 1),
            machine_busy_pct=round(cpu["machine_busy_pct"], 1),
        )

    if client == "httpx":
        async with httpx_client(fake.ca_file) as http:

            async def post_httpx(token: str, content: bytes) -> int:
                response = await http.post(
                    f"{fake.url}/3/device/{token}", content=content, headers=headers
                )
                return response.status_code

            await loop(post_httpx)
    elif client == "h2":
        direct = H2Direct(fake.url, fake.ca_file)
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        async with trio.open_nursery() as nursery:
            await nursery.start(direct.run)

            async def post_h2(token: str, content: bytes) -> int:
                return await direct.post(f"/3/device/{token}", raw, content)

            await loop(post_h2)
            nursery.cancel_scope.cancel()
    elif client == "pycurl":
        curl = Http2Client(ca_file=fake.ca_file, name="bench")
        lines = [f"{k}: {v}" for k, v in headers.items()]
        try:

            async def post_curl(token: str, content: bytes) -> int:
                answer = await curl.request(f"{fake.url}/3/device/{token}", lines, content)
                return answer.status if isinstance(answer, ProviderAnswer) else 0

            await loop(post_curl)
        finally:
            await curl.aclose()
    elif client == "aioapns":
        results.update(await run_aioapns(fake, pem, total, concurrency))
    else:
        raise ValueError(f"unknown client {client!r}")
    return results


def aioapns_python() -> str:
    """A virtual environment with aioapns (made once, kept in the temporary directory)."""
    venv = Path(tempfile.gettempdir()) / "bothy-bench-aioapns-venv"
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        print("installing aioapns into its own virtual environment", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "aioapns"],
            check=True,
        )
        (venv / ".installed").touch()
    return str(python)


async def run_aioapns(
    fake: FakeApnsServer, pem: str, total: int, concurrency: int
) -> dict[str, float]:
    """aioapns' bare loop in its own process; its CPU as it measured it."""
    python = await trio.to_thread.run_sync(aioapns_python)
    parts = urlsplit(fake.url)
    with tempfile.NamedTemporaryFile("w", suffix=".p8") as key_file:
        key_file.write(pem)
        key_file.flush()
        meter = Meter(fake.pid)
        done = await trio.run_process(
            [
                python,
                str(ROOT / "bench" / "_aioapns_loop.py"),
                str(parts.hostname),
                str(parts.port),
                fake.ca_file,
                key_file.name,
                KEY_ID,
                TEAM_ID,
                TOPIC,
                str(total),
                str(concurrency),
            ],
            capture_stdout=True,
        )
        cpu = meter.stop(total + 200)
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if got["failures"]:
        raise RuntimeError(f"aioapns: {got['failures']} answers were not 200")
    return {
        "requests_per_s": round(got["requests_per_s"], 1),
        "cpu_us_per_request": round(got["cpu_us_per_request"], 1),
        "fake_cpu_us_per_request": round(cpu["fake_cpu_us"], 1),
        "machine_busy_pct": round(cpu["machine_busy_pct"], 1),
    }


async def main_async(args: argparse.Namespace) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bothy-bench-http2-") as tmp:
        for fake_name in args.fakes.split(","):
            fake = start_fake(fake_name, Path(tmp), key)
            try:
                for client in args.clients.split(","):
                    got = await run_client(client, fake, pem, args.requests, args.concurrency)
                    figures.setdefault(fake_name, {})[client] = got
                    print(
                        f"{fake_name:>6} fake, {client:>6}: {got['requests_per_s']:>8,.0f} req/s,"
                        f" {got['cpu_us_per_request']:>6,.0f} us CPU per request here,"
                        f" {got['fake_cpu_us_per_request']:>5,.0f} us in the fake,"
                        f" machine {got['machine_busy_pct']:.0f}% busy",
                        flush=True,
                    )
            finally:
                fake.close()
    print(f"machine: {machine()}")
    report(
        "http2_clients",
        requests=args.requests,
        concurrency=args.concurrency,
        results=figures,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--fakes", default="nginx,python")
    parser.add_argument("--clients", default="httpx,h2,pycurl")
    args = parser.parse_args()
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
