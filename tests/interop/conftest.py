"""The interop tests run against real third-party software installed on demand
(``make interop``): only with ``BOTHY_INTEROP=1``, so ``make unit`` never waits for
an install of minutes. They use the push tests' fakes and keys."""

from __future__ import annotations

import os

from tests.push.conftest import apns_key, ca, ca_file, fake_apns, now_clock

__all__ = ["apns_key", "ca", "ca_file", "fake_apns", "now_clock"]

collect_ignore_glob = [] if os.environ.get("BOTHY_INTEROP") == "1" else ["test_*.py"]
