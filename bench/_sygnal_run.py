"""Start Sygnal (run by ``bench/matrix.py`` with the Python of Sygnal's own virtualenv)
pointed at the benchmark's fake APNs instead of Apple.

Sygnal's APNs pushkin uses aioapns, which always dials Apple's host with a default
TLS context: here its host and port are the fake's (``BENCH_APNS_HOST``,
``BENCH_APNS_PORT``), and the default context trusts the fake's CA
(``BENCH_CA_FILE``) and offers ``h2`` by ALPN (nginx speaks HTTP/2 only when ALPN
asks for it). Nothing else of Sygnal changes: its configuration is
``SYGNAL_CONF``, as Sygnal reads it.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import aioapns.connection
from sygnal.sygnal import main

_default_context = ssl.create_default_context


def _fake_apns_context(*args: Any, **kwargs: Any) -> ssl.SSLContext:
    context = _default_context(*args, **kwargs)
    context.load_verify_locations(cafile=os.environ["BENCH_CA_FILE"])
    context.set_alpn_protocols(["h2"])
    return context


if __name__ == "__main__":
    protocol = aioapns.connection.APNsProductionClientProtocol
    protocol.APNS_SERVER = os.environ["BENCH_APNS_HOST"]
    protocol.APNS_PORT = int(os.environ["BENCH_APNS_PORT"])
    ssl.create_default_context = _fake_apns_context
    main()
