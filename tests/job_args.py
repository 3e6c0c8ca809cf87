"""The rule every job's args keep (SPEC section 7): IDs and integers only, never text.

A string is an ID (``[A-Za-z0-9._:-]{1,128}``), except under two keys whose
values are tokens of a closed shape: ``kind`` (a built-in kind or a kind code,
which may hold a ``/`` as in ``acme/chat:invite``) and ``mv`` (the catalogue's
version: 16 hex digits). Booleans are 0/1, so ``bool`` values fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bothy_notify.notify.catalogue import BUILTIN_KINDS, is_app_kind

ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
VERSION_RE = re.compile(r"[0-9a-f]{16}")
_BUILTIN = {e.kind for e in BUILTIN_KINDS}


def assert_ids_and_integers(args: Mapping[str, Any]) -> None:
    """Fail naming the key whose value is neither an integer nor an ID-like token."""
    for key, value in args.items():
        assert ID_RE.fullmatch(key), key
        if type(value) is int:
            continue
        assert isinstance(value, str), key
        if key == "kind":
            assert value in _BUILTIN or is_app_kind(value), key
        elif key == "mv":
            assert VERSION_RE.fullmatch(value), key
        else:
            assert ID_RE.fullmatch(value), key
