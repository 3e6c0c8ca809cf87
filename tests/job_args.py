"""The rule every job's args keep (SPEC section 7): IDs and integers only, never text.

A string is an ID (``kernel.ids.is_valid_id``), except under two keys whose
values are tokens of a closed shape: ``kind`` (a built-in kind or a kind code,
which may hold a ``/`` as in ``acme/chat:invite``) and ``mv`` (the catalogue's
version: 16 hex digits). Booleans are 0/1, so ``bool`` values fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bothy_notify.kernel.ids import is_valid_id
from bothy_notify.notify.catalogue import BUILTIN_KINDS, is_app_kind

VERSION_RE = re.compile(r"[0-9a-f]{16}")
_BUILTIN = {e.kind for e in BUILTIN_KINDS}


def assert_ids_and_integers(args: Mapping[str, Any]) -> None:
    """Fail naming the key whose value is neither an integer nor an ID-like token."""
    for key, value in args.items():
        assert is_valid_id(key), key
        if type(value) is int:
            continue
        assert isinstance(value, str), key
        if key == "kind":
            assert value in _BUILTIN or is_app_kind(value), key
        elif key == "mv":
            assert VERSION_RE.fullmatch(value), key
        else:
            assert is_valid_id(value), key
