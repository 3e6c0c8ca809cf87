"""The Matrix gateway's tests use the push tests' fakes, keys and clock."""

from __future__ import annotations

from tests.push.conftest import apns_key, ca, ca_file, fake_apns, now_clock

__all__ = ["apns_key", "ca", "ca_file", "fake_apns", "now_clock"]
