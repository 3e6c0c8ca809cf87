"""Protocol-speaking stand-ins for what the daemon talks to, for tests and benchmarks.

Each serves on 127.0.0.1 (port 0) over the real protocol and records what it
is sent; tests script its answers.

- :mod:`~testkit.fakes.apns`: APNs, HTTP/2 over TLS (h2 on Trio), checking the
  provider JWT, the path, the headers and the body the way Apple does; in the
  test's nursery, or in a process of its own (:class:`~testkit.fakes.apns.ApnsProcess`).
- :mod:`~testkit.fakes.nginx`: nginx answering APNs-shaped 200s and Web Push
  201s at C speed, checking nothing (a throughput fake for benchmarks).
- :mod:`~testkit.fakes.fcm`: FCM's HTTP v1 send and its OAuth token endpoint.
- :mod:`~testkit.fakes.webpush`: a Web Push service (RFC 8030, VAPID, aes128gcm),
  and a browser that decrypts what it is sent.
- :mod:`~testkit.fakes.webhook`: a webhook receiver verifying Standard Webhooks
  signatures.
- :mod:`~testkit.fakes.distributor`: a UnifiedPush distributor's push server
  (ntfy's endpoints), holding the daemon to UnifiedPush's server rules.
- :mod:`~testkit.fakes.matrix_gateway`: an upstream Matrix push gateway
  (Sygnal's side of the Push Gateway API).
- :mod:`~testkit.fakes.asgi`: serving an ASGI app over TLS with Hypercorn (the
  Starlette apps among them).

:func:`start_fake` starts the fake APNs a push benchmark names (``--fake``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric import ec

KEY_ID = "BENCHKEY01"
"""The APNs key id a process-hosted fake expects (``push.apns.key_id``)."""
TEAM_ID = "BENCHTEAM1"
"""The APNs team a process-hosted fake expects (``push.apns.team_id``)."""
TOPIC = "com.example.bench"
"""The APNs topic a process-hosted fake expects (``push.apns.bundle_id``)."""


class FakeApnsServer(Protocol):
    """What a benchmark needs from a fake APNs in a process of its own."""

    name: str
    url: str
    ca_file: str
    pid: int

    def stall(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


def start_fake(name: str, tmp: Path, key: ec.EllipticCurvePrivateKey) -> FakeApnsServer:
    """The fake APNs called ``name`` (``nginx`` or ``python``), serving on 127.0.0.1;
    ``key`` is the provider key whose signatures the ``python`` one checks."""
    if name == "nginx":
        from testkit.fakes.nginx import NginxFake

        return NginxFake(tmp)
    if name == "python":
        from testkit.fakes.apns import ApnsProcess

        return ApnsProcess(tmp, key, key_id=KEY_ID, team_id=TEAM_ID, topic=TOPIC)
    raise ValueError(f"unknown fake {name!r}")


__all__ = ["KEY_ID", "TEAM_ID", "TOPIC", "FakeApnsServer", "start_fake"]
