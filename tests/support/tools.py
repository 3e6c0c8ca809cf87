"""Command-line tools some tests run (``systemd-analyze``, ``promtool``): found on the
``PATH``, else installed from Debian's archive where this process may (root, with
``apt-get``), else the test is skipped with the reason, which pytest prints."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

INSTALL_TIMEOUT = 150.0
"""Seconds an ``apt-get install`` may take before the test is skipped instead (the
per-test timeout is 180 s)."""


def ensure_tool(binary: str, package: str) -> str:
    """The path of ``binary``, installing the Debian package ``package`` if needed.

    Skips the calling test, naming why, when the tool is missing and cannot be
    installed (not root, no ``apt-get``, no network, no such package).
    """
    found = shutil.which(binary)
    if found is not None:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip(f"{binary} is not installed, and apt-get cannot install {package} here")
    command = [apt, "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in ([*command, package], [apt, "update"], [*command, package]):
        try:
            done = subprocess.run(
                attempt,
                capture_output=True,
                text=True,
                env=env,
                timeout=INSTALL_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"{binary} is not installed; installing {package} took too long")
        found = shutil.which(binary)
        if found is not None:
            return found
    last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    pytest.skip(f"{binary} is not installed; apt-get could not install {package}: {last[0]}")
