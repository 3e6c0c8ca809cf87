"""The kind catalogue: what each hint kind code means, synced to devices.

A push carries a kind code and integers; the words and the deep link live
here, on the server, so a new kind is a server change and never an app
release. Devices fetch the catalogue (``GET /v1/catalogue``) and refresh their
copy whenever a hint's ``mv`` differs from the version they hold.

Rules (checked when the daemon starts; a problem names its key):

- the built-in kinds ``message``, ``mention``, ``security`` and ``admin`` are
  always present, so the catalogue is never empty; configuration may change
  their template and link but not their category;
- an app kind code is namespaced (``social:friend_request``) and belongs to a
  built-in category or one of ``notify.categories``;
- a display template holds placeholders for counts only (``{count}``), never
  user content; a deep-link template holds placeholders for IDs only
  (``{thread_id}``, ``{message_id}``, ``{target_id}``) and starts with a URL
  scheme; neither may hold other braces, so a client renders them with a plain
  search and replace;
- the version is a hash of the content: no counter to store, the same right
  after a restore and on two servers built alike.

Entries come from code (built-ins), from ``notify.kinds`` and from the
``*.toml`` files of ``notify.kinds_dir`` (each file holds tables of the same
shape as ``[notify.kinds]``, keyed by kind code). A kind defined twice (in the
configuration and a file, or in two files) is an error.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bothy_notify.config import BUILTIN_CATEGORIES, ConfigError, NotifyConfig
from bothy_notify.notify.domain.model import BUILTIN_KIND_CATEGORY

APP_KIND_PATTERN = r"^[a-z][a-z0-9_]{0,31}:[a-z][a-z0-9_.]{0,63}$"
"""Shape of an app kind code; the same as ``kind`` in ``schemas/events/hint.requested.json``."""
_APP_KIND_RE = re.compile(APP_KIND_PATTERN)

COUNT_PLACEHOLDERS = frozenset({"count"})
"""What a display template may name: the hint's count, never user content."""
ID_PLACEHOLDERS = frozenset({"thread_id", "message_id", "target_id"})
"""What a deep-link template may name: the IDs a hint carries."""

TEMPLATE_MAX = 200
"""Longest display template; a notification line, not a paragraph."""
LINK_MAX = 500
"""Longest deep-link template (before IDs of up to 128 characters fill it in)."""
VERSION_LENGTH = 16
"""Hex digits of the version hash kept: 64 bits tell versions apart and keep pushes small."""

_SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]*:")
_FILE_FIELDS = frozenset({"category", "template", "link"})
_BUILTIN_CATEGORY: dict[str, str] = {k.value: v for k, v in BUILTIN_KIND_CATEGORY.items()}


@dataclass(frozen=True, slots=True)
class KindEntry:
    """One kind of the catalogue.

    Attributes:
        kind: the kind code (``message``, ``social:friend_request``).
        category: the preference category the kind belongs to.
        template: the display template (count placeholders only); empty means the
            app's generic text.
        link: the deep-link template (ID placeholders only); empty means none.
    """

    kind: str
    category: str
    template: str = ""
    link: str = ""

    def to_json(self) -> dict[str, str]:
        """The entry as served: absent members omitted, never null."""
        out = {"category": self.category}
        if self.template:
            out["template"] = self.template
        if self.link:
            out["link"] = self.link
        return out


BUILTIN_KINDS: tuple[KindEntry, ...] = (
    KindEntry("message", _BUILTIN_CATEGORY["message"], "New messages: {count}"),
    KindEntry("mention", _BUILTIN_CATEGORY["mention"], "Mentions: {count}"),
    KindEntry("security", _BUILTIN_CATEGORY["security"], "A new device is waiting for approval"),
    KindEntry("admin", _BUILTIN_CATEGORY["admin"], "Your access expires soon"),
)
"""Shipped in code so the catalogue is never empty; links are left to the app."""


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The kind catalogue and its content hash.

    Attributes:
        entries: every kind, sorted by code.
        version: the first :data:`VERSION_LENGTH` hex digits of the SHA-256 of
            the canonical JSON of ``entries``.
    """

    entries: tuple[KindEntry, ...]
    version: str

    @classmethod
    def of(cls, entries: Iterable[KindEntry]) -> Catalogue:
        """The catalogue of ``entries`` (sorted by code) with its version."""
        ordered = tuple(sorted(entries, key=lambda e: e.kind))
        content = {e.kind: e.to_json() for e in ordered}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
        return cls(ordered, digest[:VERSION_LENGTH])

    @classmethod
    def builtin(cls) -> Catalogue:
        """The catalogue with the built-in kinds only."""
        return cls.of(BUILTIN_KINDS)

    def get(self, kind: str) -> KindEntry | None:
        """The entry of ``kind``, or ``None`` when the catalogue does not know it."""
        return next((e for e in self.entries if e.kind == kind), None)

    def to_json(self) -> dict[str, Any]:
        """The ``GET /v1/catalogue`` answer: ``{"version", "kinds": {code: entry}}``."""
        return {"version": self.version, "kinds": {e.kind: e.to_json() for e in self.entries}}


def template_problem(template: str, allowed: frozenset[str]) -> str | None:
    """Why ``template`` is not acceptable (``None`` when it is).

    A placeholder is ``{name}`` with ``name`` in ``allowed``; conversions,
    format specs, positional fields and literal braces are refused.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return "unbalanced braces"
    for literal, name, spec, conversion in parts:
        if "{" in literal or "}" in literal:
            return "literal braces are not allowed"
        if name is None:
            continue
        if name not in allowed:
            shown = name if re.fullmatch(r"[a-z_]{1,40}", name) else "?"
            return f"placeholder {{{shown}}} is not allowed (allowed: {_names(allowed)})"
        if spec or conversion:
            return f"placeholder {{{name}}} takes no format or conversion"
    return None


def entry_problems(entry: KindEntry, categories: frozenset[str]) -> list[str]:
    """Problems of one entry as ``"field: problem"`` texts (empty when it is valid)."""
    problems: list[str] = []
    builtin = _BUILTIN_CATEGORY.get(entry.kind)
    if builtin is not None:
        if entry.category != builtin:
            problems.append(f"category: the built-in kind belongs to {builtin!r}")
    elif not _APP_KIND_RE.fullmatch(entry.kind):
        problems.append("kind code: expected namespace:name in lowercase, like social:invite")
    if builtin is None and entry.category not in categories:
        problems.append("category: not a built-in category nor one of notify.categories")
    if len(entry.template) > TEMPLATE_MAX:
        problems.append(f"template: longer than {TEMPLATE_MAX} characters")
    else:
        problem = template_problem(entry.template, COUNT_PLACEHOLDERS)
        if problem is not None:
            problems.append(f"template: {problem}")
    if entry.link:
        if len(entry.link) > LINK_MAX:
            problems.append(f"link: longer than {LINK_MAX} characters")
        elif not _SCHEME_RE.match(entry.link):
            problems.append("link: expected a URL with a scheme, like app://threads/{thread_id}")
        else:
            problem = template_problem(entry.link, ID_PLACEHOLDERS)
            if problem is not None:
                problems.append(f"link: {problem}")
    return problems


def load_catalogue(notify: NotifyConfig) -> Catalogue:
    """Build the catalogue from the built-ins, ``notify.kinds`` and ``notify.kinds_dir``.

    ``notify.kinds_dir`` is absolute (the configuration loader resolves a
    relative one against the configuration file's directory). Blocking (reads
    files); called once when the daemon is built.

    Args:
        notify: the ``[notify]`` configuration.

    Raises:
        ConfigError: naming each bad key (``notify.kinds."code".template: ...``
            or ``notify.kinds_dir: file.toml: "code".template: ...``).
    """
    categories = frozenset(BUILTIN_CATEGORIES) | frozenset(notify.categories)
    entries: dict[str, KindEntry] = {e.kind: e for e in BUILTIN_KINDS}
    origin: dict[str, str] = {}
    errors: list[str] = []

    def add(source: str, where: str, entry: KindEntry) -> None:
        if entry.kind in origin:
            errors.append(f"{where}: the kind is already defined in {origin[entry.kind]}")
            return
        origin[entry.kind] = source
        problems = entry_problems(entry, categories)
        errors.extend(f"{where}.{problem}" for problem in problems)
        if not problems:
            entries[entry.kind] = entry

    for code, kind in notify.kinds.items():
        entry = KindEntry(code, kind.category, kind.template, kind.link)
        add("notify.kinds", f"notify.kinds.{json.dumps(code)}", entry)
    if notify.kinds_dir:
        for path, code, raw in _read_kinds_dir(notify.kinds_dir, errors):
            source = f"notify.kinds_dir: {path.name}"
            where = f"{source}: {json.dumps(code)}"
            found = _raw_entry(code, raw, where, errors)
            if found is not None:
                add(source, where, found)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return Catalogue.of(entries.values())


def _read_kinds_dir(kinds_dir: str, errors: list[str]) -> list[tuple[Path, str, Any]]:
    directory = Path(kinds_dir)
    if not directory.is_dir():
        errors.append("notify.kinds_dir: not a directory")
        return []
    found: list[tuple[Path, str, Any]] = []
    for path in sorted(directory.glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"notify.kinds_dir: {path.name}: cannot be read ({type(exc).__name__})")
            continue
        except tomllib.TOMLDecodeError as exc:
            errors.append(f"notify.kinds_dir: {path.name}: not valid TOML: {exc}")
            continue
        found.extend((path, str(code), raw) for code, raw in data.items())
    return found


def _raw_entry(code: str, raw: Any, where: str, errors: list[str]) -> KindEntry | None:
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: expected a table")
        return None
    bad = False
    for key in sorted(set(raw) - _FILE_FIELDS):
        errors.append(f"{where}.{key}: unknown key")
        bad = True
    if "category" not in raw:
        errors.append(f"{where}.category: required key is missing")
        bad = True
    for key in sorted(_FILE_FIELDS & set(raw)):
        if not isinstance(raw[key], str):
            errors.append(f"{where}.{key}: expected a string")
            bad = True
    if bad:
        return None
    return KindEntry(code, raw["category"], raw.get("template", ""), raw.get("link", ""))


def _names(names: Iterable[str]) -> str:
    return ", ".join("{" + n + "}" for n in sorted(names))
