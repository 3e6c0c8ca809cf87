"""The kind catalogue: what each hint kind code means, synced to devices.

A push carries a kind code and integers; the words and the deep link live
here, on the server, so a new kind is a server change and never an app
release. Devices fetch the catalogue (``GET /v1/catalogue``) and refresh their
copy whenever a hint's ``mv`` differs from the version they hold.

Where kinds come from, and who owns which codes (the namespaces never overlap):

- **built-ins** ``message``, ``mention``, ``security``, ``admin`` ship in code,
  so the catalogue is never empty; ``notify.kinds`` may change their template
  and link, never their category, and nothing on disk can touch them;
- **the operator's kinds** in ``notify.kinds`` (the configuration file) use a
  namespace without a slash (``social:friend_request``); they are checked when
  the daemon starts and a problem stops it, naming the key;
- **app kinds** come from ``notify.kinds_dir/<publisher>/<app>/*.toml`` and
  always get the code ``<publisher>/<app>:<key>``, whatever the key says: the
  namespace is where the file lands, never what it declares, so an app cannot
  claim a built-in, an operator kind or another app's kind (it gets its own
  namespaced copy, and the original is untouched). Those files are read while
  the daemon runs (:mod:`bothy_notify.notify.kinds_dir`).

The code shapes (:data:`APP_KIND_PATTERN`): a name is ``[a-z][a-z0-9_.]{0,63}``;
a namespace is one segment (``social``) or ``publisher/app``, each segment
``[a-z0-9][a-z0-9_-]{0,31}``; an app code is ``namespace:name``, or
``namespace:namespace:name`` for a file that wrote a namespaced key
(``acme/chat:social:invite``). Producers are checked against this shape only
(``schemas/events/hint.requested.json`` holds the same pattern), never against
the catalogue's content: a code the catalogue has not caught up with is still a
real event, delivered with the device's fallback text.

Entry rules: an app kind belongs to a built-in category or one of
``notify.categories``; a display template holds placeholders for counts only
(``{count}``), never user content; a deep-link template holds placeholders for
IDs only (``{thread_id}``, ``{message_id}``, ``{target_id}``) and starts with a
URL scheme; neither may hold other braces, so a client renders them with a
plain search and replace.

The version is a hash of the content: no counter to store, the same right after
a restore and on two servers built alike, and back to its earlier value when a
change is undone.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bothy_notify.config import BUILTIN_CATEGORIES, ConfigError, NotifyConfig
from bothy_notify.notify.domain.model import BUILTIN_KIND_CATEGORY

SEGMENT_PATTERN = r"[a-z0-9][a-z0-9_-]{0,31}"
"""One namespace segment: an operator namespace, a publisher or an app directory."""
NAME_PATTERN = r"[a-z][a-z0-9_.]{0,63}"
"""The name part of a kind code (what a kinds file writes as a key)."""
_NAMESPACE = rf"{SEGMENT_PATTERN}(/{SEGMENT_PATTERN})?"
APP_KIND_PATTERN = rf"^{_NAMESPACE}:({_NAMESPACE}:)?{NAME_PATTERN}$"
"""Shape of an app kind code; the same as ``kind`` in ``schemas/events/hint.requested.json``."""
OPERATOR_KIND_PATTERN = rf"^{SEGMENT_PATTERN}:{NAME_PATTERN}$"
"""Shape of a kind in ``notify.kinds``: a namespace without a slash (those belong to apps)."""
_APP_KIND_RE = re.compile(APP_KIND_PATTERN)
_OPERATOR_KIND_RE = re.compile(OPERATOR_KIND_PATTERN)
SEGMENT_RE = re.compile(SEGMENT_PATTERN)
"""Matches (with ``fullmatch``) a directory name that can be a namespace segment."""

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
ENTRY_FIELDS = frozenset({"category", "template", "link"})
"""The keys of one kind's table (in ``notify.kinds`` and in kinds files)."""
_BUILTIN_CATEGORY: dict[str, str] = {k.value: v for k, v in BUILTIN_KIND_CATEGORY.items()}


def is_app_kind(code: str) -> bool:
    """Whether ``code`` has the shape of an app kind code (not whether it is known)."""
    return _APP_KIND_RE.fullmatch(code) is not None


@dataclass(frozen=True, slots=True)
class KindEntry:
    """One kind of the catalogue.

    Attributes:
        kind: the kind code (``message``, ``social:friend_request``,
            ``acme/chat:invite``).
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

    def category_of(self, kind: str) -> str:
        """The category of ``kind``; ``messages`` for a kind the catalogue does not know."""
        entry = self.get(kind)
        return entry.category if entry is not None else "messages"

    def to_json(self) -> dict[str, Any]:
        """The ``GET /v1/catalogue`` answer: ``{"version", "kinds": {code: entry}}``."""
        return {"version": self.version, "kinds": {e.kind: e.to_json() for e in self.entries}}


class CatalogueSource(Protocol):
    """The catalogue in use: :class:`FixedCatalogue`, or
    :class:`~bothy_notify.notify.kinds_dir.LiveCatalogue`, which follows
    ``notify.kinds_dir`` while the daemon runs."""

    def current(self) -> Catalogue:
        """The catalogue as of the last :meth:`refresh` (no IO; any thread)."""
        ...

    def refresh(self) -> Catalogue:
        """Take in changes since the last call and return the catalogue in use now.

        Blocking (it may read files): call it from a worker thread, once per
        request, round or job batch, never once per hint.
        """
        ...


class FixedCatalogue:
    """A catalogue that never changes (no kinds directory; tests)."""

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self._catalogue = catalogue if catalogue is not None else Catalogue.builtin()

    def current(self) -> Catalogue:
        return self._catalogue

    def refresh(self) -> Catalogue:
        return self._catalogue

    def __repr__(self) -> str:
        return f"FixedCatalogue(version={self._catalogue.version!r})"


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
    """Problems of one entry's fields as ``"field: problem"`` texts (empty when valid).

    The shape of the code is the caller's to check: it depends on where the
    entry comes from (the configuration or a kinds file).
    """
    problems: list[str] = []
    builtin = _BUILTIN_CATEGORY.get(entry.kind)
    if builtin is not None:
        if entry.category != builtin:
            problems.append(f"category: the built-in kind belongs to {builtin!r}")
    elif entry.category not in categories:
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


def categories_of(notify: NotifyConfig) -> frozenset[str]:
    """The categories an app kind may belong to: built-in ones and ``notify.categories``."""
    return frozenset(BUILTIN_CATEGORIES) | frozenset(notify.categories)


def table_entry(code: str, raw: Any) -> tuple[KindEntry | None, list[str]]:
    """One kind's table of a kinds file (``{category, template?, link?}``) as an entry.

    Returns the entry, or ``None`` and the problems as ``"key: problem"`` texts
    (``": expected a table"`` when ``raw`` is not a table). Field rules are
    :func:`entry_problems`'; this checks the table's form only.
    """
    if not isinstance(raw, Mapping):
        return None, [": expected a table"]
    problems = [f".{key}: unknown key" for key in sorted(set(raw) - ENTRY_FIELDS)]
    if "category" not in raw:
        problems.append(".category: required key is missing")
    problems.extend(
        f".{key}: expected a string"
        for key in sorted(ENTRY_FIELDS & set(raw))
        if not isinstance(raw[key], str)
    )
    if problems:
        return None, problems
    return KindEntry(code, raw["category"], raw.get("template", ""), raw.get("link", "")), []


def base_entries(notify: NotifyConfig) -> dict[str, KindEntry]:
    """The built-ins with ``notify.kinds`` applied: every kind that is not an app's.

    Raises:
        ConfigError: naming each bad key (``notify.kinds."code".template: ...``).
    """
    categories = categories_of(notify)
    entries: dict[str, KindEntry] = {e.kind: e for e in BUILTIN_KINDS}
    errors: list[str] = []
    for code, kind in notify.kinds.items():
        where = f"notify.kinds.{json.dumps(code)}"
        entry = KindEntry(code, kind.category, kind.template, kind.link)
        problems = entry_problems(entry, categories)
        if code not in _BUILTIN_CATEGORY and not _OPERATOR_KIND_RE.fullmatch(code):
            if _APP_KIND_RE.fullmatch(code):
                problems.insert(
                    0,
                    "kind code: a publisher/app namespace belongs to the files of "
                    "notify.kinds_dir/<publisher>/<app>/; use one like social:invite here",
                )
            else:
                problems.insert(
                    0, "kind code: expected namespace:name in lowercase, like social:invite"
                )
        errors.extend(f"{where}.{problem}" for problem in problems)
        if not problems:
            entries[code] = entry
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return entries


def _names(names: Iterable[str]) -> str:
    return ", ".join("{" + n + "}" for n in sorted(names))
