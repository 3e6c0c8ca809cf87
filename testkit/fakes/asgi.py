"""Serve an ASGI app over TLS with Hypercorn on 127.0.0.1 port 0, inside a test nursery."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio
import trustme
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve


async def serve_tls(
    app: Any,
    ca: trustme.CA,
    *hostnames: str,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with a certificate for ``hostnames``; ``started`` gets the port."""
    cert = ca.issue_cert(*hostnames)
    with tempfile.TemporaryDirectory() as tmp:
        pem = Path(tmp) / "server.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
        config = HypercornConfig()
        config.bind = ["127.0.0.1:0"]
        config.certfile = str(pem)
        config.keyfile = str(pem)
        config.accesslog = None
        config.errorlog = None
        # Hypercorn resets every stream of a connection after 1,000 requests by default.
        config.keep_alive_max_requests = 1_000_000
        config.h2_max_concurrent_streams = 1000
        config.graceful_timeout = 0.1
        async with trio.open_nursery() as nursery:
            found = await nursery.start(_run, app, config)
            task_status.started(int(found[0].rsplit(":", 1)[1]))


async def _run(
    app: Any, config: HypercornConfig, *, task_status: trio.TaskStatus[list[str]]
) -> None:
    await serve(app, config, task_status=task_status)
