"""The changelog keeps the Keep a Changelog 1.1.0 shape, and its newest release is the
version the package carries (``changes/README.md`` says how a release is cut)."""

from __future__ import annotations

import datetime
import re
import tomllib

from bothy_notify import __version__
from tests.support.repo import ROOT

CHANGELOG = ROOT / "CHANGELOG.md"
PYPROJECT = ROOT / "pyproject.toml"

RELEASE = re.compile(r"## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})")
"""A release heading: ``## [X.Y.Z] - YYYY-MM-DD``."""
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
"""The kinds of change Keep a Changelog 1.1.0 names, in its order."""
LONGEST_LINE = 160
"""Characters per line: a change is one or two lines of at most this (changes/README.md)."""


def sections() -> list[str]:
    """The ``## `` headings of the changelog, in order."""
    return [line for line in CHANGELOG.read_text().splitlines() if line.startswith("## ")]


def test_changelog_links_the_format_and_versioning() -> None:
    text = CHANGELOG.read_text()
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    assert "https://semver.org/spec/v2.0.0.html" in text


def test_unreleased_comes_first_then_releases_newest_first() -> None:
    headings = sections()
    assert headings[0] == "## [Unreleased]"
    releases = [RELEASE.fullmatch(heading) for heading in headings[1:]]
    assert releases and all(releases), headings[1:]
    versions = [tuple(int(part) for part in m.group(1, 2, 3)) for m in releases if m]
    dates = [datetime.date.fromisoformat(m.group(4)) for m in releases if m]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)


def test_newest_release_is_the_package_version() -> None:
    newest = RELEASE.fullmatch(sections()[1])
    assert newest is not None
    version = ".".join(newest.group(1, 2, 3))
    pyproject = tomllib.loads(PYPROJECT.read_text())
    assert version == pyproject["project"]["version"] == __version__


def test_changes_are_grouped_by_kind_in_order() -> None:
    kinds_of_section: dict[str, list[str]] = {}
    section = ""
    for line in CHANGELOG.read_text().splitlines():
        if line.startswith("## "):
            section = line
            kinds_of_section[section] = []
        elif line.startswith("### "):
            assert section, f"{line!r} before any version"
            kind = line.removeprefix("### ")
            assert kind in KINDS, f"{section}: {kind!r} is not a Keep a Changelog kind"
            kinds_of_section[section].append(kind)
    for section, kinds in kinds_of_section.items():
        assert kinds == sorted(kinds, key=KINDS.index), section
        assert len(set(kinds)) == len(kinds), section


def test_every_line_is_short() -> None:
    long = [
        (number, len(line))
        for number, line in enumerate(CHANGELOG.read_text().splitlines(), start=1)
        if len(line) > LONGEST_LINE
    ]
    assert long == []
