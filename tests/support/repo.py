"""Where the repository's contract files are, for tests that read them as files.

The daemon itself reads them as package data (:mod:`bothy_notify.resources`);
tests check the files at the top of the repository, where SPEC section 3 puts
them and where they are edited.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "schemas"
EVENT_SCHEMA_DIR = SCHEMA_DIR / "events"
CONFIG_DIR = ROOT / "config"
