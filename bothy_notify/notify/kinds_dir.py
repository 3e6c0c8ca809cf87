"""App kinds from ``notify.kinds_dir``, followed while the daemon runs.

Layout. The namespace of a kind is the place of its file, never what the file
declares::

    <notify.kinds_dir>/
      acme/                    publisher
        chat/                  app: its kinds are acme/chat:<key>
          kinds.toml           ["friend_request"]  category = "social" ...
          more.toml            any number of *.toml files
        board/                 another app of acme: a separate namespace

Each ``*.toml`` file of ``<publisher>/<app>/`` holds one table per kind, keyed
by the kind's name, with the fields of ``[notify.kinds]`` (``category``,
``template``, ``link``). The key ``K`` defines ``<publisher>/<app>:K`` whatever
``K`` is: ``friend_request`` becomes ``acme/chat:friend_request``, and a key
that names a built-in (``message``), an operator kind (``social:invite``) or
another app's kind (``other/app:invite``) becomes ``acme/chat:message``,
``acme/chat:social:invite``, ``acme/chat:other/app:invite``, leaving the
original untouched. That is the security property of the scheme: whoever can
write into one app's directory can define that app's kinds and nothing else.

Refused, with the path relative to ``notify.kinds_dir`` named:

- a ``*.toml`` file anywhere else (directly in ``notify.kinds_dir``, which was
  the flat layout of earlier releases, in a publisher directory, or deeper than
  an app directory): move it to ``<publisher>/<app>/``;
- a file under a directory whose name cannot be a namespace segment
  (``[a-z0-9][a-z0-9_-]{0,31}``);
- a file larger than :data:`MAX_FILE_BYTES` or not UTF-8 TOML, a kind with a
  bad field (the rules of :func:`~bothy_notify.notify.catalogue.entry_problems`),
  a key whose code would not have the shape of an app kind, the same key in two
  files of one app.

Names starting with ``.`` (editor and installer temporary files, ``.git``) and
files not ending in ``.toml`` are ignored, so an installer that writes
``kinds.toml.tmp`` and renames it is never seen half-written. Symlinks are
followed; the namespace is still the link's place.

Also written in ``docs/operations.md`` ("The kind catalogue"), with what became
of the flat layout of earlier releases.

Reload. :meth:`LiveCatalogue.refresh` runs once per ``GET /v1/catalogue``, per
consumer round and per flush batch (never per hint), and every
:data:`WATCH_INTERVAL` on every node (:meth:`LiveCatalogue.watch`), so a node
that serves no request and decides nothing still takes a change in and reports
a bad file. It lists the directories
and stats the files (path, mtime, size, inode); an app whose stamps are
unchanged is not read again. An app whose stamps changed is read whole and its
content hashed: the same bytes change nothing. A file modified within
:data:`RACY_WINDOW_NS` of the scan is read again at the next refresh too, since
a second write inside the filesystem's timestamp granularity could keep its
stamp. The catalogue's version is a hash of the content, so removing a file
brings the version back to what it was before the file came. A reload (SIGHUP,
:meth:`LiveCatalogue.reconfigure`) takes a new ``notify.kinds`` and
``notify.categories`` and reads every app again at once.

Invalid files. The unit of "last good" is the app: an app with any problem
keeps the entries of its last good state in this process (none if it never had
one; after a reload, only those whose category is still configured), so one
broken file never empties the catalogue nor takes other apps' kinds away, and a
half-written file during an install is harmless. Each new
problem is logged once (warning, the file relative to ``notify.kinds_dir``),
``bothy_catalogue_invalid_files`` counts the files refused now, and
``bothy-notify check-config`` fails naming them. A directory that cannot be
listed (gone, unmounted) is reported the same way and keeps every app as it
was. At start the daemon runs with the valid apps and reports the others; only
``notify.kinds`` (the configuration file) and a ``notify.kinds_dir`` that is
not a directory stop it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from bothy_notify.config import ConfigError, NotifyConfig
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify.catalogue import (
    SEGMENT_RE,
    Catalogue,
    KindEntry,
    base_entries,
    categories_of,
    entry_problems,
    is_app_kind,
    table_entry,
)

log = logging.getLogger("bothy.notify.catalogue")

KINDS_FILE_SUFFIX = ".toml"
"""Only files with this suffix are kinds files."""
APP_DEPTH = 3
"""``<publisher>/<app>/<file>``: the only depth a kinds file is read at."""
MAX_DEPTH = 8
"""How deep the scan looks for misplaced kinds files; also bounds a symlink loop."""
MAX_FILE_BYTES = 1 << 20
"""A kinds file larger than this is refused unread: kinds are a few lines each, and a
stray large file must not be read into memory at every change."""
WATCH_INTERVAL = 2.0
"""Seconds between two background refreshes (:meth:`LiveCatalogue.watch`): a bad file
is logged and counted within this on a node nobody asks, for a directory listing and
a few ``stat`` calls each time (``bench/catalogue.py``; docs/performance.md)."""
RACY_WINDOW_NS = 2_000_000_000
"""A file modified this recently may be written again without its stamp changing
(timestamp granularity), so its app is read again at the next refresh."""


@dataclass(frozen=True, slots=True, order=True)
class FileProblem:
    """Why a kinds file (or directory) is refused.

    Attributes:
        path: relative to ``notify.kinds_dir``, ``/``-separated (``.`` for the
            directory itself); characters that are not printable are shown as ``?``.
        problem: what is wrong, naming the kind and field when there is one.
    """

    path: str
    problem: str

    def __str__(self) -> str:
        return f"notify.kinds_dir: {self.path}: {self.problem}"


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What the scan knows of a file without reading it."""

    path: str
    mtime_ns: int
    size: int
    inode: int


@dataclass(frozen=True, slots=True)
class Layout:
    """One scan of ``notify.kinds_dir``.

    Attributes:
        apps: app namespace (``publisher/app``) -> its kinds files, sorted by path.
        refused: files in the wrong place, and directories that could not be listed.
        complete: every directory could be listed (else a missing app may only
            be unreadable, and is not taken as removed).
    """

    apps: Mapping[str, tuple[FileStamp, ...]]
    refused: tuple[FileProblem, ...]
    complete: bool


@dataclass(frozen=True, slots=True)
class AppRead:
    """The kinds files of one app, read and checked.

    ``digest`` hashes every file's path and bytes: equal digests, equal content.
    """

    entries: tuple[KindEntry, ...]
    problems: tuple[FileProblem, ...]
    digest: str


def scan(root: Path) -> Layout:
    """List the kinds files under ``root`` (blocking; stats files, reads none)."""
    apps: dict[str, list[FileStamp]] = {}
    refused: list[FileProblem] = []
    complete = True

    def walk(directory: str, parts: tuple[str, ...]) -> None:
        nonlocal complete
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            complete = False
            if parts and isinstance(exc, FileNotFoundError):
                return  # removed while we looked: the next scan sees what is left
            where = _shown("/".join(parts)) if parts else "."
            problem = "cannot be listed" if parts else "not a directory"
            refused.append(FileProblem(where, f"{problem} ({type(exc).__name__})"))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            here = (*parts, entry.name)
            try:
                if entry.is_dir():
                    if len(here) < MAX_DEPTH:
                        walk(entry.path, here)
                    continue
                if not entry.name.endswith(KINDS_FILE_SUFFIX) or not entry.is_file():
                    continue
                stat = entry.stat()
            except OSError:
                continue  # gone between the listing and the stat: the next scan sees it
            path = "/".join(here)
            if len(here) != APP_DEPTH:
                refused.append(FileProblem(_shown(path), _WRONG_PLACE))
                continue
            bad = next((p for p in here[:2] if not SEGMENT_RE.fullmatch(p)), None)
            if bad is not None:
                refused.append(FileProblem(_shown(path), _bad_segment(bad)))
                continue
            stamp = FileStamp(path, stat.st_mtime_ns, stat.st_size, stat.st_ino)
            apps.setdefault(f"{here[0]}/{here[1]}", []).append(stamp)

    walk(str(root), ())
    return Layout({ns: tuple(files) for ns, files in apps.items()}, tuple(refused), complete)


@dataclass(frozen=True, slots=True)
class AppFiles:
    """The bytes of one app's kinds files, before any parsing.

    ``contents`` holds ``(path, bytes)``, or ``(path, problem)`` for a file that
    could not be read; ``digest`` hashes paths and bytes: equal digests, equal
    content, so an app whose digest did not change is not parsed again.
    """

    contents: tuple[tuple[str, bytes | str], ...]
    digest: str


def read_files(root: Path, files: tuple[FileStamp, ...]) -> AppFiles:
    """Read the bytes of ``files`` (blocking)."""
    contents: list[tuple[str, bytes | str]] = []
    digest = hashlib.sha256()
    for stamp in files:
        digest.update(stamp.path.encode("utf-8", "surrogateescape") + b"\0")
        if stamp.size > MAX_FILE_BYTES:
            digest.update(b"\0too large\0" + stamp.size.to_bytes(8, "big"))
            contents.append((stamp.path, f"larger than {MAX_FILE_BYTES >> 20} MiB"))
            continue
        try:
            data = (root / stamp.path).read_bytes()
        except OSError as exc:
            digest.update(b"\0unreadable\0")
            contents.append((stamp.path, f"cannot be read ({type(exc).__name__})"))
            continue
        digest.update(len(data).to_bytes(8, "big") + data)
        contents.append((stamp.path, data))
    return AppFiles(tuple(contents), digest.hexdigest())


def check_app(namespace: str, files: AppFiles, categories: frozenset[str]) -> AppRead:
    """Parse and check the kinds files of the app ``namespace``."""
    entries: dict[str, KindEntry] = {}
    origin: dict[str, str] = {}
    problems: list[FileProblem] = []
    for path, data in files.contents:
        where = _shown(path)
        if isinstance(data, str):
            problems.append(FileProblem(where, data))
            continue
        try:
            tables = tomllib.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(FileProblem(where, "not UTF-8"))
            continue
        except tomllib.TOMLDecodeError as exc:
            problems.append(FileProblem(where, f"not valid TOML: {exc}"))
            continue
        except RecursionError:
            problems.append(FileProblem(where, "not valid TOML: nested too deeply"))
            continue
        for key, raw in tables.items():
            shown_key = json.dumps(key)
            code = f"{namespace}:{key}"
            if not is_app_kind(code):
                problems.append(FileProblem(where, f"{shown_key}: {_BAD_KEY}"))
                continue
            entry, form = table_entry(code, raw)
            if entry is not None:
                form = [f".{p}" for p in entry_problems(entry, categories)]
            if form:
                problems.extend(FileProblem(where, f"{shown_key}{p}") for p in form)
                continue
            assert entry is not None
            if code in origin:
                again = f"{shown_key}: the kind is already defined in {origin[code]}"
                problems.append(FileProblem(where, again))
                continue
            origin[code] = where
            entries[code] = entry
    return AppRead(tuple(entries.values()), tuple(problems), files.digest)


def read_app(
    root: Path, namespace: str, files: tuple[FileStamp, ...], categories: frozenset[str]
) -> AppRead:
    """Read, parse and check every kinds file of the app ``namespace`` (blocking)."""
    return check_app(namespace, read_files(root, files), categories)


@dataclass(slots=True)
class _App:
    """What the live catalogue holds for one app between refreshes."""

    files: tuple[FileStamp, ...] | None  # None: read again at the next refresh
    digest: str
    good: tuple[KindEntry, ...]  # the entries of its last good state
    problems: tuple[FileProblem, ...]


class LiveCatalogue:
    """The catalogue in use: built-ins, ``notify.kinds`` and the kinds directory as
    of the last :meth:`refresh` (see the module docstring for the rules).

    Thread-safe: refreshes are serialised by a lock; :meth:`current` takes none.

    Args:
        notify: the ``[notify]`` configuration.
        metrics: where ``bothy_catalogue_invalid_files`` is set (none: not counted).
        report: log each new problem (``check-config`` prints them instead).

    Raises:
        ConfigError: ``notify.kinds`` is invalid, or ``notify.kinds_dir`` is set
            and is not a directory.
    """

    def __init__(
        self, notify: NotifyConfig, *, metrics: Metrics | None = None, report: bool = True
    ) -> None:
        self._base = base_entries(notify)
        self._categories = categories_of(notify)
        self._root = Path(notify.kinds_dir) if notify.kinds_dir else None
        if self._root is not None and not self._root.is_dir():
            raise ConfigError("invalid configuration:\n  notify.kinds_dir: not a directory")
        self._metrics = metrics
        self._report = report
        self._lock = threading.Lock()
        self._apps: dict[str, _App] = {}
        self._problems: tuple[FileProblem, ...] = ()
        self._catalogue = Catalogue.of(self._base.values())
        self.refresh()

    def __repr__(self) -> str:
        return f"LiveCatalogue(version={self._catalogue.version!r}, apps={len(self._apps)})"

    def current(self) -> Catalogue:
        """The catalogue as of the last :meth:`refresh` (no IO)."""
        return self._catalogue

    def problems(self) -> tuple[FileProblem, ...]:
        """The files refused at the last :meth:`refresh`, sorted by path."""
        return self._problems

    def refresh(self) -> Catalogue:
        """Take in the directory's changes; return the catalogue in use now.

        Blocking: lists the directories and stats the kinds files, and reads only
        the apps whose files changed. Never raises for a bad file (it is reported
        and its app keeps its last good kinds).
        """
        if self._root is None:
            return self._catalogue
        with self._lock:
            layout = scan(self._root)
            changed = False
            if layout.complete:
                for gone in set(self._apps) - set(layout.apps):
                    changed |= bool(self._apps.pop(gone).good)
            racy_before = time.time_ns() - RACY_WINDOW_NS
            for namespace, files in layout.apps.items():
                changed |= self._take(self._root, namespace, files, racy_before)
            if changed:
                self._catalogue = self._build()
            problems = [*layout.refused]
            for app in self._apps.values():
                problems.extend(app.problems)
            self._set_problems(tuple(sorted(set(problems))))
            return self._catalogue

    async def watch(
        self,
        *,
        interval: float = WATCH_INTERVAL,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Refresh every ``interval`` seconds until cancelled (in a worker thread).

        Requests, rounds and flushes refresh on their own; this keeps the log
        lines and ``bothy_catalogue_invalid_files`` true on a node that has
        neither. Returns at once without ``notify.kinds_dir``. Cancellation: a
        refresh in progress finishes in its thread; its result is kept.
        """
        task_status.started()
        if self._root is None:
            return
        while True:
            await trio.sleep(interval)
            await trio.to_thread.run_sync(self.refresh)

    def reconfigure(self, notify: NotifyConfig) -> Catalogue:
        """Take a new ``notify.kinds`` and ``notify.categories`` (a reload) and read
        every app of the kinds directory again, as at a start: an app whose files
        are refused now (a category that was removed) keeps those of its last good
        kinds whose category still exists, so the catalogue never holds a kind of a
        category the rest of the node no longer knows. ``notify.kinds_dir`` itself
        stays (a new directory needs a restart).
        Blocking, like :meth:`refresh`; returns the catalogue in use now.

        Raises:
            ConfigError: the new ``notify.kinds`` is invalid; nothing changed.
        """
        base = base_entries(notify)
        with self._lock:
            self._base = base
            self._categories = categories_of(notify)
            for app in self._apps.values():
                app.files, app.digest = None, ""  # read and checked again
                app.good = tuple(e for e in app.good if e.category in self._categories)
            self._catalogue = self._build()
        return self.refresh()

    def _build(self) -> Catalogue:
        """The catalogue of the base entries and every app's last good kinds."""
        entries = dict(self._base)
        for app in self._apps.values():
            entries.update((e.kind, e) for e in app.good)
        return Catalogue.of(entries.values())

    def _take(
        self, root: Path, namespace: str, files: tuple[FileStamp, ...], racy_before: int
    ) -> bool:
        """Bring one app up to date; whether its entries in use changed."""
        app = self._apps.get(namespace)
        if app is not None and app.files == files:
            return False
        raw = read_files(root, files)
        settled = files if all(f.mtime_ns < racy_before for f in files) else None
        if app is not None and app.digest == raw.digest:
            app.files = settled
            return False
        read = check_app(namespace, raw, self._categories)
        before = app.good if app is not None else ()
        good = before if read.problems else read.entries
        self._apps[namespace] = _App(settled, read.digest, good, read.problems)
        return good != before

    def _set_problems(self, problems: tuple[FileProblem, ...]) -> None:
        if self._report and problems != self._problems:
            for new in sorted(set(problems) - set(self._problems)):
                log.warning(
                    "kinds file refused; the last good kinds stay in use",
                    extra={"file": new.path, "problem": new.problem},
                )
            for path in sorted({p.path for p in self._problems} - {p.path for p in problems}):
                log.info("kinds file no longer refused", extra={"file": path})
        self._problems = problems
        if self._metrics is not None:
            self._metrics.catalogue_invalid_files.set(len({p.path for p in problems}))


def load_catalogue(notify: NotifyConfig) -> Catalogue:
    """The catalogue of ``notify``, refusing any problem (``check-config``). Blocking.

    Raises:
        ConfigError: naming each bad key or file (``notify.kinds."code".template: ...``,
            ``notify.kinds_dir: acme/chat/kinds.toml: "invite".template: ...``).
    """
    live = LiveCatalogue(notify, report=False)
    if live.problems():
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(map(str, live.problems())))
    return live.current()


_WRONG_PLACE = (
    "in the wrong place: a kinds file goes in <publisher>/<app>/ under notify.kinds_dir,"
    " which gives its kinds the namespace publisher/app"
)
_BAD_KEY = (
    "kind code: expected a name like friend_request (lowercase letters, digits, _ and .;"
    " the namespace comes from the directory)"
)


def _bad_segment(name: str) -> str:
    return (
        f"directory {_shown(name)!r} cannot be a namespace: expected lowercase letters,"
        " digits, - and _, at most 32, starting with a letter or digit"
    )


def _shown(path: str) -> str:
    """``path`` fit for a log line: characters that are not printable become ``?``."""
    return "".join(c if c.isprintable() else "?" for c in path)
