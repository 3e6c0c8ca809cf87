"""A bare loop of aioapns (the APNs client Sygnal uses), run by ``bench/http2_clients.py``
in its own virtual environment with ``asyncio``: the same background pushes to the
same fake, with aioapns' defaults (up to 10 connections). Prints one JSON line:
requests/s and this process's CPU per request.

Usage (by the benchmark): python _aioapns_loop.py HOST PORT CA_FILE KEY_PEM_FILE
       KEY_ID TEAM_ID TOPIC REQUESTS CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from pathlib import Path

import aioapns.connection
from aioapns import APNs, NotificationRequest, PushType


async def main(key: str) -> None:
    host, port, ca_file, _, key_id, team_id, topic = sys.argv[1:8]
    total, concurrency = int(sys.argv[8]), int(sys.argv[9])
    # aioapns always dials Apple's host: point it at the fake instead.
    aioapns.connection.APNsProductionClientProtocol.APNS_SERVER = host
    aioapns.connection.APNsProductionClientProtocol.APNS_PORT = int(port)
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"])  # nginx speaks HTTP/2 only when ALPN asks for it
    client = APNs(
        key=key,
        key_id=key_id,
        team_id=team_id,
        topic=topic,
        use_sandbox=False,
        ssl_context=context,
    )
    message = {
        "aps": {"content-available": 1},
        "nid": "0190c0de-0000-7000-8000-000000000000",
        "kind": "message",
        "thread_id": "t1",
        "message_id": "m1",
        "count": 1,
        "quiet": False,
    }

    async def post(token: str) -> bool:
        result = await client.send_notification(
            NotificationRequest(
                device_token=token,
                message=message,
                priority=5,
                collapse_key="t1",
                push_type=PushType.BACKGROUND,
            )
        )
        return bool(result.is_successful)

    for _ in range(200):
        await post(f"{1:064x}")
    remaining = total
    failures = 0

    async def worker() -> None:
        nonlocal remaining, failures
        while remaining > 0:
            remaining -= 1
            if not await post(f"{remaining:064x}"):
                failures += 1

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        json.dumps(
            {
                "requests_per_s": total / elapsed,
                "cpu_us_per_request": cpu / total * 1e6,
                "failures": failures,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[4]).read_text()))
