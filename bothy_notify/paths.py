"""Where the project's data files live (schemas, example configuration).

The schemas are part of the external contract and sit at the repository's top
level (``schemas/``); the package is installed in place (``pip install -e``),
so they are found next to it.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = PROJECT_ROOT / "schemas"
EVENT_SCHEMA_DIR = SCHEMA_DIR / "events"
CONFIG_DIR = PROJECT_ROOT / "config"
