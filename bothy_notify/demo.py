"""``bothy-notify demo``: the plan cases, live, on a throwaway database.

The demo starts a real daemon (role ``all``) on a throwaway embedded
PostgreSQL, talks to it as an app would (producer events and a phone
registration over HTTP, a desktop over the WebSocket gateway), and prints a
timeline a newcomer can follow:

1. looking at the thread on the desktop: no hint anywhere;
2. active in another thread: the desktop gets a hint, the phone's push waits
   the desktop delay, the desktop reads the message, the push is dropped;
3. not read: the phone's push goes out after the delay, with the desktop
   hint's ``nid``;
4. the desktop is gone: the phone's push goes out at once;
5. clear-on-read: the desktop comes back and reads, and the phone, which was
   pushed for the thread, gets one content-free ``read`` push after
   ``push.clear_delay`` to drop its notification;
6. a quiet period: alex snoozes (``PUT /v1/quiet-hours``), the desktop's hints
   say ``quiet: true``, the phone's pushes are held, and when the snooze ends
   the phone gets one ``summary`` push;
7. a deleted message: sam deletes what he just wrote; the desktop gets
   ``notification.removed`` at once, and the phone, which was pushed for it,
   one content-free ``removed`` push after ``push.clear_delay`` to drop it.

It runs on the real clock with the short delay given on the command line
(``--delay``, default 3s) and uses the fake push provider, so it needs no
credentials. Nothing it does touches the configured database.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

import httpx
import trio
import trio_websocket

from bothy_notify.auth import mint_token
from bothy_notify.config import (
    AuthKey,
    Config,
    FakeProviderConfig,
    JwtAlgorithm,
    LogLevel,
    Role,
    Secret,
    format_duration,
    parse_duration,
)
from bothy_notify.push.fake import FakeProvider
from bothy_notify.store.embedded import EmbeddedPostgres

if TYPE_CHECKING:
    from bothy_notify.wiring import Daemon

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

STEP_TIMEOUT = 15.0
"""Seconds any single step may take beyond the delay before the demo gives up."""

CLEAR_DELAY = timedelta(seconds=1)
"""``push.clear_delay`` of the demo: the wait between a read and its ``read`` push."""

PHONE_TOKEN = "demo-phone-token"  # noqa: S105 - a fake provider token, not a credential


class DemoFailed(Exception):
    """Something did not happen as the plan says; the message says what."""


def run_demo(config: Config, delay: str, out: TextIO, *, database_url: str | None = None) -> int:
    """Run the demo and print its timeline to ``out``.

    Args:
        config: the loaded configuration (only ``auth.keys`` is reused; the demo
            listens on free local ports with its own settings).
        delay: ``notify.mobile_delay_when_desktop_active`` for the demo, e.g. ``"3s"``.
        out: where the timeline goes.
        database_url: an existing database to use instead of a throwaway
            embedded server (tests).

    Returns:
        0 when every case behaved as planned, 1 otherwise, 2 for a bad delay.
    """
    try:
        wait = parse_duration(delay)
    except ValueError as exc:
        print(f"bothy-notify demo: --delay: {exc}", file=out)
        return EXIT_USAGE
    if not timedelta(milliseconds=100) <= wait <= timedelta(minutes=5):
        print("bothy-notify demo: --delay must be between 100ms and 5m", file=out)
        return EXIT_USAGE
    demo_config, key = _demo_config(config, wait)
    bothy = logging.getLogger("bothy")
    level = bothy.level
    bothy.setLevel(logging.WARNING)  # the timeline is the output; daemon chatter is noise
    try:
        return trio.run(_main, demo_config, key, wait, out, database_url)
    except KeyboardInterrupt:
        print("\ninterrupted", file=out)
        return EXIT_FAILED
    finally:
        bothy.setLevel(level)


def _demo_config(config: Config, wait: timedelta) -> tuple[Config, str]:
    """The demo's settings, and an HS256 key to mint its tokens with."""
    key = next(
        (k.key.reveal() for k in config.auth.keys if k.algorithm is JwtAlgorithm.HS256),
        None,
    )
    auth = config.auth
    if key is None:
        key = secrets.token_urlsafe(32)
        auth = dataclasses.replace(
            auth, keys=(*auth.keys, AuthKey(JwtAlgorithm.HS256, Secret("literal", key)))
        )
    return (
        dataclasses.replace(
            config,
            server=dataclasses.replace(
                config.server,
                role=Role.ALL,
                api_listen="127.0.0.1:0",
                gateway_listen="127.0.0.1:0",
                drain_period=timedelta(seconds=2),
                dev=True,
            ),
            auth=auth,
            notify=dataclasses.replace(
                config.notify,
                mobile_delay_when_desktop_active=wait,
                coalesce_window=timedelta(0),
                poll_interval=timedelta(milliseconds=100),
            ),
            push=dataclasses.replace(
                config.push, fake=FakeProviderConfig(), clear_on_read=True, clear_delay=CLEAR_DELAY
            ),
            log=dataclasses.replace(config.log, level=LogLevel.WARNING),
        ),
        key,
    )


class Timeline:
    """Prints lines with the seconds since the demo started."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._start = time.monotonic()

    def __repr__(self) -> str:
        return "Timeline()"

    def say(self, text: str = "") -> None:
        print(text, file=self._out, flush=True)

    def event(self, who: str, text: str) -> None:
        elapsed = time.monotonic() - self._start
        print(f"   [{elapsed:5.1f}s] {who:<8} {text}", file=self._out, flush=True)

    async def wait(self, what: str, seconds: float) -> None:
        """Wait ``seconds`` on the real clock, showing a dot every half second."""
        elapsed = time.monotonic() - self._start
        print(f"   [{elapsed:5.1f}s]          ... {what} ", end="", file=self._out, flush=True)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await trio.sleep(min(0.5, left))
            print(".", end="", file=self._out, flush=True)
        print(" done", file=self._out, flush=True)


class Desktop:
    """Alex's desktop: one gateway connection that keeps every frame it receives."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, stream: trio.SocketStream) -> None:
        self._ws = ws
        self._stream = stream
        self.frames: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"Desktop(frames={len(self.frames)})"

    @classmethod
    async def connect(cls, nursery: trio.Nursery, address: str) -> Desktop:
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        ws = await trio_websocket.wrap_client_stream(nursery, stream, host, "/v1/gateway")
        desktop = cls(ws, stream)
        nursery.start_soon(desktop._read)
        return desktop

    async def _read(self) -> None:
        try:
            while True:
                self.frames.append(json.loads(await self._ws.get_message()))
        except trio_websocket.ConnectionClosed:
            pass
        finally:
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    async def send(self, op: str, d: dict[str, Any] | None = None) -> None:
        frame: dict[str, Any] = {"op": op} if d is None else {"op": op, "d": d}
        await self._ws.send_message(json.dumps(frame))

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], after: int = 0
    ) -> dict[str, Any]:
        with trio.move_on_after(STEP_TIMEOUT):
            while True:
                for frame in self.frames[after:]:
                    if predicate(frame):
                        return frame
                await trio.sleep(0.01)
        raise DemoFailed("the desktop did not receive what it waited for")

    async def close(self) -> None:
        await self._ws.aclose()


async def _main(
    config: Config, key: str, wait: timedelta, out: TextIO, database_url: str | None
) -> int:
    from bothy_notify.wiring import Daemon  # the daemon's whole tree, only when it runs
    from gateway.service import build_gateway

    line = Timeline(out)
    delay = format_duration(wait)
    line.say(f"Bothy Notify demo: one desktop, one phone; the desktop delay is {delay}.")
    fake = FakeProvider()
    with tempfile.TemporaryDirectory(prefix="bothy-demo-") as tmp:
        embedded: EmbeddedPostgres | None = None
        if database_url is None:
            line.say("   starting a throwaway PostgreSQL and the daemon (a few seconds) ...")
            embedded = EmbeddedPostgres(f"{tmp}/postgres")
            database_url = await trio.to_thread.run_sync(embedded.start)
        try:
            daemon = Daemon(
                config,
                database_url=database_url,
                providers={"fake": fake},
                gateway_factory=build_gateway,
            )
            async with trio.open_nursery() as nursery:
                addresses = await nursery.start(daemon.run)
                line.say(
                    f"   daemon ready: API http://{addresses.api},"
                    f" gateway ws://{addresses.gateway}/v1/gateway"
                )
                try:
                    async with httpx.AsyncClient(
                        base_url=f"http://{addresses.api}", timeout=10
                    ) as http:
                        scenario = Scenario(line, http, key, fake, daemon, nursery, wait)
                        await scenario.run(addresses.gateway)
                    line.say()
                    line.say("All seven cases behaved as planned. Read docs/protocol.md next.")
                    return EXIT_OK
                except DemoFailed as exc:
                    line.say()
                    line.say(f"Unexpected: {exc}.")
                    return EXIT_FAILED
                finally:
                    daemon.request_shutdown()
        finally:
            if embedded is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(embedded.stop)


class Scenario:
    """The seven plan cases against a running daemon."""

    def __init__(
        self,
        line: Timeline,
        http: httpx.AsyncClient,
        key: str,
        fake: FakeProvider,
        daemon: Daemon,
        nursery: trio.Nursery,
        wait: timedelta,
    ) -> None:
        self.line = line
        self.http = http
        self.key = key
        self.fake = fake
        self.daemon = daemon
        self.nursery = nursery
        self.wait = wait
        self.delay = format_duration(wait)
        self.seq = 0

    def __repr__(self) -> str:
        return "Scenario()"

    def _token(self, claims: dict[str, Any]) -> str:
        return mint_token(self.key, claims, lifetime=timedelta(hours=1))

    def _device(self, device: str, platform: str) -> str:
        return self._token({"sub": "alex", "did": device, "plat": platform, "kind": "user"})

    async def _events(self, *events: tuple[str, dict[str, Any]]) -> int:
        response = await self.http.post(
            "/v1/events",
            json={"events": [{"type": t, "payload": p} for t, p in events]},
            headers={
                "authorization": f"Bearer {self._token({'sub': 'demo', 'scope': 'events:write'})}"
            },
        )
        if response.status_code != 200:
            raise DemoFailed(f"POST /v1/events answered {response.status_code}")
        seqs: list[int] = response.json()["seqs"]
        return seqs[-1]

    async def _sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        db = self.daemon.db
        assert db is not None  # the daemon is running
        rows: list[tuple[Any, ...]] = await db.run(lambda c: c.execute(query, params).fetchall())
        return rows

    async def _until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        """Poll ``check`` (a database or a fake provider, nothing to wait on) briefly."""
        with trio.move_on_after(STEP_TIMEOUT):
            while True:
                if await check():
                    return
                await trio.sleep(0.02)
        raise DemoFailed(f"timed out waiting until {what}")

    async def _decided(self, seq: int) -> None:
        async def consumed() -> bool:
            rows = await self._sql("SELECT seq FROM bothy.consumer_cursor WHERE name = 'notify'")
            return bool(rows) and rows[0][0] >= seq

        await self._until(consumed, "the round decided the message")

    async def _push_jobs(self) -> list[tuple[Any, ...]]:
        return await self._sql(
            "SELECT id, state, scheduled_at, args->>'nid', args->>'release_seq'"
            " FROM bothy.jobs WHERE kind = 'notify.push_send' ORDER BY id"
        )

    async def _sam_writes(self, thread: str) -> int:
        self.seq += 1
        seq = await self._events(
            (
                "message.created",
                {
                    "thread_id": thread,
                    "message_id": f"m{self.seq}",
                    "thread_seq": self.seq,
                    "author_id": "sam",
                    "mentions": [],
                },
            )
        )
        self.line.event("sam", f"writes message {self.seq} in #{thread}")
        return seq

    def _skipped(self, reason: str) -> float:
        return self.daemon.metrics.skipped(reason)

    async def run(self, gateway: str) -> None:
        line = self.line
        line.say()
        line.say("Setup")
        await self._events(
            ("user.upserted", {"user_id": "alex", "kind": "human", "active": True}),
            ("user.upserted", {"user_id": "sam", "kind": "human", "active": True}),
            ("thread.upserted", {"thread_id": "design", "space_id": "acme"}),
            ("thread.upserted", {"thread_id": "lunch", "space_id": "acme"}),
            ("member.added", {"user_id": "alex", "scope_id": "acme"}),
            ("thread.followed", {"user_id": "alex", "thread_id": "design", "level": "all"}),
        )
        line.event("app", "alex follows #design; sam writes there (POST /v1/events)")
        response = await self.http.post(
            "/v1/registrations",
            json={"provider": "fake", "token": PHONE_TOKEN},
            headers={"authorization": f"Bearer {self._device('alex-phone', 'ios')}"},
        )
        if response.status_code not in (200, 201):
            raise DemoFailed(f"POST /v1/registrations answered {response.status_code}")
        line.event("phone", "registers for pushes with the fake provider")
        desktop = await Desktop.connect(self.nursery, gateway)
        await desktop.wait_for(lambda f: f.get("op") == "hello")
        await desktop.send("identify", {"token": self._device("alex-desktop", "macos")})
        await desktop.wait_for(lambda f: f.get("op") == "catchup.complete")
        ops = " -> ".join(str(f["op"]) for f in desktop.frames)
        line.event("desktop", f"connects: {ops} (live)")

        await self._looking_at_the_thread(desktop)
        nid = await self._active_elsewhere_then_read(desktop)
        await self._not_read(desktop, nid)
        await self._desktop_gone(desktop)
        desktop = await self._cleared_on_read(gateway)
        await self._quiet_period(desktop)
        await self._deleted(desktop)
        await desktop.close()

    async def _focus(self, desktop: Desktop, threads: list[str]) -> None:
        mark = len(desktop.frames)
        await desktop.send("focus", {"thread_ids": threads, "idle": False})
        await desktop.wait_for(lambda f: f.get("op") == "focus.ack", after=mark)
        shown = ", ".join(f"#{t}" for t in threads) or "nothing"
        self.line.event("desktop", f"focuses {shown} (not idle) -> focus.ack")

    async def _hint(self, desktop: Desktop, mark: int) -> dict[str, Any]:
        frame = await desktop.wait_for(lambda f: f.get("type") == "notification.created", mark)
        payload: dict[str, Any] = frame["payload"]
        self.line.event(
            "desktop",
            f"<- notification.created kind={payload['kind']} count={payload['count']}"
            f" (nid ...{payload['nid'][-6:]})",
        )
        return payload

    async def _looking_at_the_thread(self, desktop: Desktop) -> None:
        line = self.line
        line.say()
        line.say("1. Alex is looking at #design on the desktop: nobody is disturbed")
        await self._focus(desktop, ["design"])
        before = self._skipped("active_in_thread")
        mark = len(desktop.frames)
        await self._decided(await self._sam_writes("design"))
        if self._skipped("active_in_thread") != before + 1 or await self._push_jobs():
            raise DemoFailed("a hint was routed although alex looks at the thread")
        if any(f.get("type") for f in desktop.frames[mark:]):
            raise DemoFailed("the desktop got a hint although it looks at the thread")
        line.event("bothy", "no hint, no push: active in the thread (skipped: active_in_thread)")
        await self._read(desktop, "it is on screen")

    async def _read(self, desktop: Desktop, why: str) -> None:
        mark = len(desktop.frames)
        await desktop.send("read", {"thread_id": "design", "seq": self.seq})
        await desktop.wait_for(lambda f: f.get("op") == "read.ack", mark)
        self.line.event("desktop", f"reads #design up to message {self.seq} ({why}) -> read.ack")

    async def _active_elsewhere_then_read(self, desktop: Desktop) -> str:
        line = self.line
        line.say()
        line.say(
            f"2. Alex works in #lunch: a desktop hint, the phone waits {self.delay},"
            " alex reads, the push is dropped"
        )
        await self._focus(desktop, ["lunch"])
        mark = len(desktop.frames)
        await self._decided(await self._sam_writes("design"))
        hint = await self._hint(desktop, mark)
        (job,) = await self._push_jobs()
        line.event("phone", f"push waits until the desktop delay ({self.delay}) is over")
        await self._read(desktop, "alex opens the hint")
        await line.wait("the delay runs out", self.wait.total_seconds())
        await self._job_done(job[0])
        if self.fake.sends or self._skipped("read") != 1:
            raise DemoFailed("the phone was pushed although alex read the message")
        line.event("phone", "nothing: the push was dropped, alex read it (skipped: read)")
        return str(hint["nid"])

    async def _not_read(self, desktop: Desktop, previous: str) -> None:
        line = self.line
        line.say()
        line.say(f"3. Not read on the desktop: the phone gets the push after {self.delay}")
        mark = len(desktop.frames)
        await self._decided(await self._sam_writes("design"))
        hint = await self._hint(desktop, mark)
        started = time.monotonic()
        line.event("phone", f"push waits {self.delay}; alex does not read")

        async def pushed() -> bool:
            return bool(self.fake.sends)

        await line.wait("the delay runs out", self.wait.total_seconds())
        await self._until(pushed, "the phone was pushed")
        (send,) = self.fake.sends
        if send.payload.get("nid") != hint["nid"] or hint["nid"] == previous:
            raise DemoFailed("the phone's push does not carry the desktop hint's nid")
        line.event(
            "phone",
            f"<- push kind={send.payload['kind']} count={send.payload['count']}"
            f" (same nid ...{hint['nid'][-6:]}) after {time.monotonic() - started:.1f}s",
        )

    async def _desktop_gone(self, desktop: Desktop) -> None:
        line = self.line
        line.say()
        line.say("4. The desktop is gone: the phone gets the push at once")
        await desktop.close()
        line.event("desktop", "closes its connection")
        sent = len(self.fake.sends)
        started = time.monotonic()
        await self._decided(await self._sam_writes("design"))

        async def pushed() -> bool:
            return len(self.fake.sends) > sent

        await self._until(pushed, "the phone was pushed")
        if time.monotonic() - started >= self.wait.total_seconds():
            raise DemoFailed("the push waited although no desktop is connected")
        send = self.fake.sends[-1]
        line.event(
            "phone",
            f"<- push kind={send.payload['kind']} after {time.monotonic() - started:.1f}s"
            " (no delay: no desktop is live)",
        )

    async def _cleared_on_read(self, gateway: str) -> Desktop:
        line = self.line
        line.say()
        line.say("5. Alex reads on the desktop: the phone is told to drop its notification")
        desktop = await Desktop.connect(self.nursery, gateway)
        await desktop.wait_for(lambda f: f.get("op") == "hello")
        await desktop.send("identify", {"token": self._device("alex-desktop", "macos")})
        await desktop.wait_for(lambda f: f.get("op") == "catchup.complete")
        line.event("desktop", "connects again (live)")
        started = time.monotonic()
        await self._read(desktop, "the phone was pushed for it")

        def reads() -> list[dict[str, Any]]:
            return [s.payload for s in self.fake.sends if s.payload.get("kind") == "read"]

        async def cleared() -> bool:
            return bool(reads())

        await self._until(cleared, "the phone got its read push")
        (payload,) = reads()
        if payload.get("seq") != self.seq or "nid" in payload:
            raise DemoFailed("the read push does not carry the new read position alone")
        line.event(
            "phone",
            f"<- push kind=read thread_id={payload['thread_id']} seq={payload['seq']}"
            f" badge={payload.get('badge')} after {time.monotonic() - started:.1f}s"
            f" (clear_delay {format_duration(CLEAR_DELAY)}: drops the notification)",
        )
        return desktop

    async def _quiet_period(self, desktop: Desktop) -> None:
        line = self.line
        snooze = self.wait * 2 + timedelta(seconds=1)
        line.say()
        line.say(
            f"6. Alex snoozes for {format_duration(snooze)}: hints say quiet, the phone's"
            " pushes are held, one summary at the end"
        )
        until = datetime.now(UTC) + snooze
        response = await self.http.put(
            "/v1/quiet-hours",
            json={"snooze_until": until.isoformat().replace("+00:00", "Z")},
            headers={"authorization": f"Bearer {self._device('alex-phone', 'ios')}"},
        )
        if response.status_code != 200:
            raise DemoFailed(f"PUT /v1/quiet-hours answered {response.status_code}")
        line.event("phone", "snoozes (PUT /v1/quiet-hours snooze_until)")
        sent = len(self.fake.sends)
        for _ in range(2):
            mark = len(desktop.frames)
            await self._decided(await self._sam_writes("design"))
            hint = await self._hint(desktop, mark)
            if hint.get("quiet") is not True:
                raise DemoFailed("a hint to a snoozed person does not say quiet")
        line.event("desktop", "shows both hints without a sound (quiet: true)")
        await line.wait(
            "the snooze runs out", max(0.0, (until - datetime.now(UTC)).total_seconds())
        )

        def summaries() -> list[dict[str, Any]]:
            return [s.payload for s in self.fake.sends[sent:] if s.payload.get("kind") == "summary"]

        async def summarised() -> bool:
            return bool(summaries())

        await self._until(summarised, "the phone got its summary")
        others = [s.payload for s in self.fake.sends[sent:] if s.payload.get("kind") != "summary"]
        (payload,) = summaries()
        if others or payload.get("count") != 1:
            raise DemoFailed("the phone was pushed during the snooze, or not summarised once")
        line.event(
            "phone",
            f"<- push kind=summary count={payload['count']} badge={payload.get('badge')}"
            " (held pushes summarised: one thread still unread)",
        )

    async def _deleted(self, desktop: Desktop) -> None:
        line = self.line
        line.say()
        line.say("7. Sam deletes a message: the desktop and the phone drop it")
        mark = len(desktop.frames)
        await desktop.send("focus", {"thread_ids": [], "idle": True})
        await desktop.wait_for(lambda f: f.get("op") == "focus.ack", after=mark)
        line.event("desktop", "goes idle (focus.ack): the phone is pushed at once")
        sent = len(self.fake.sends)
        mark = len(desktop.frames)
        await self._decided(await self._sam_writes("design"))
        await self._hint(desktop, mark)

        async def pushed() -> bool:
            return len(self.fake.sends) > sent

        await self._until(pushed, "the phone was pushed")
        line.event("phone", f"<- push kind={self.fake.sends[-1].payload['kind']}")
        mark = len(desktop.frames)
        started = time.monotonic()
        await self._events(
            (
                "message.deleted",
                {
                    "thread_id": "design",
                    "message_id": f"m{self.seq}",
                    "thread_seq": self.seq,
                    "author_id": "sam",
                    "mentions": [],
                    "last_seq": self.seq - 1,
                },
            )
        )
        line.event("sam", f"deletes message {self.seq} (message.deleted, last_seq {self.seq - 1})")
        frame = await desktop.wait_for(lambda f: f.get("type") == "notification.removed", mark)
        removed = frame["payload"]
        line.event(
            "desktop",
            f"<- notification.removed message_id={removed['message_id']}"
            f" badge={removed.get('badge')}",
        )

        def removals() -> list[dict[str, Any]]:
            return [s.payload for s in self.fake.sends[sent:] if s.payload.get("kind") == "removed"]

        async def cleared() -> bool:
            return bool(removals())

        await self._until(cleared, "the phone got its removed push")
        (payload,) = removals()
        if payload.get("message_id") != f"m{self.seq}" or "nid" in payload:
            raise DemoFailed("the removed push does not name the deleted message alone")
        line.event(
            "phone",
            f"<- push kind=removed message_id={payload['message_id']}"
            f" badge={payload.get('badge')} after {time.monotonic() - started:.1f}s"
            f" (clear_delay {format_duration(CLEAR_DELAY)}: drops the notification)",
        )

    async def _job_done(self, job_id: int) -> None:
        async def finished() -> bool:
            rows = await self._sql("SELECT state FROM bothy.jobs WHERE id = %s", job_id)
            return bool(rows) and rows[0][0] in ("completed", "failed")

        await self._until(finished, "the delayed push job ran")
