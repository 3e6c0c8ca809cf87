"""The kinds directory: namespaces derived from where a file lands, the files
refused, and a catalogue that follows the directory without a restart."""

from __future__ import annotations

import logging
import os
import shutil
from functools import partial
from pathlib import Path

import pytest
import trio

from bothy_notify.config import ConfigError
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify.catalogue import BUILTIN_KINDS, Catalogue, KindEntry
from bothy_notify.notify.kinds_dir import LiveCatalogue, load_catalogue
from tests.harness import make_config

INVITE = '["invite"]\ncategory = "social"\ntemplate = "{count} invitations"\n'
SOCIAL_KIND = {"category": "social", "template": "{count} friend requests"}
OLD = 1_000_000_000
"""An mtime (2001) far outside the racy window: such a file counts as settled."""


def put(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def live(root: Path, metrics: Metrics | None = None, **notify: object) -> LiveCatalogue:
    config = make_config(notify={"categories": ["social"], "kinds_dir": str(root), **notify})
    return LiveCatalogue(config.notify, metrics=metrics)


def codes(catalogue: Catalogue) -> set[str]:
    return {e.kind for e in catalogue.entries} - {e.kind for e in BUILTIN_KINDS}


def refused(root: Path, **notify: object) -> str:
    config = make_config(notify={"categories": ["social"], "kinds_dir": str(root), **notify})
    with pytest.raises(ConfigError) as caught:
        load_catalogue(config.notify)
    return str(caught.value)


# Namespaces come from the directory, never from the file.


def test_a_code_without_a_namespace_gets_the_namespace_of_its_directory(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE + 'link = "chat://invites/{target_id}"\n')
    catalogue = live(tmp_path).current()
    assert codes(catalogue) == {"acme/chat:invite"}
    assert catalogue.get("acme/chat:invite") == KindEntry(
        "acme/chat:invite", "social", "{count} invitations", "chat://invites/{target_id}"
    )


def test_every_toml_file_of_an_app_directory_adds_to_its_namespace(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    put(tmp_path, "acme/chat/more.toml", '["poke"]\ncategory = "social"\n')
    assert codes(live(tmp_path).current()) == {"acme/chat:invite", "acme/chat:poke"}


def test_a_file_writing_a_built_in_code_gets_its_own_code_and_the_built_in_is_untouched(
    tmp_path: Path,
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", '["message"]\ncategory = "messages"\ntemplate = "Hi"\n')
    catalogue = live(tmp_path).current()
    assert catalogue.get("acme/chat:message") == KindEntry("acme/chat:message", "messages", "Hi")
    assert catalogue.get("message") == BUILTIN_KINDS[0]


def test_a_file_writing_an_operator_kind_gets_its_own_code_and_the_original_is_untouched(
    tmp_path: Path,
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", '["social:friend_request"]\ncategory = "social"\n')
    catalogue = live(tmp_path, kinds={"social:friend_request": SOCIAL_KIND}).current()
    assert catalogue.get("acme/chat:social:friend_request") == KindEntry(
        "acme/chat:social:friend_request", "social"
    )
    assert catalogue.get("social:friend_request") == KindEntry(
        "social:friend_request", "social", "{count} friend requests"
    )


def test_a_file_writing_another_apps_code_gets_its_own_code_and_the_other_app_is_untouched(
    tmp_path: Path,
) -> None:
    put(tmp_path, "other/app/kinds.toml", INVITE)
    put(
        tmp_path,
        "acme/chat/kinds.toml",
        '["other/app:invite"]\ncategory = "social"\nlink = "evil://steal/{target_id}"\n',
    )
    catalogue = live(tmp_path).current()
    assert catalogue.get("other/app:invite") == KindEntry(
        "other/app:invite", "social", "{count} invitations"
    )
    assert catalogue.get("acme/chat:other/app:invite") == KindEntry(
        "acme/chat:other/app:invite", "social", "", "evil://steal/{target_id}"
    )


def test_a_file_writing_its_own_full_code_is_namespaced_again(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", '["acme/chat:invite"]\ncategory = "social"\n')
    assert codes(live(tmp_path).current()) == {"acme/chat:acme/chat:invite"}


def test_two_apps_of_one_publisher_are_separate_namespaces(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    put(tmp_path, "acme/board/kinds.toml", '["invite"]\ncategory = "social"\ntemplate = "Join"\n')
    catalogue = live(tmp_path).current()
    assert catalogue.get("acme/chat:invite") == KindEntry(
        "acme/chat:invite", "social", "{count} invitations"
    )
    assert catalogue.get("acme/board:invite") == KindEntry("acme/board:invite", "social", "Join")


def test_a_broken_file_of_one_app_leaves_the_other_app_of_its_publisher_alone(
    tmp_path: Path,
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    put(tmp_path, "acme/board/kinds.toml", "[oops\n")
    kinds = live(tmp_path)
    assert codes(kinds.current()) == {"acme/chat:invite"}
    assert [p.path for p in kinds.problems()] == ["acme/board/kinds.toml"]


@pytest.mark.parametrize(
    "rel", ["kinds.toml", "acme/kinds.toml", "acme/chat/extra/kinds.toml", "a/b/c/d/kinds.toml"]
)
def test_a_file_at_the_wrong_depth_is_refused_naming_its_path(tmp_path: Path, rel: str) -> None:
    put(tmp_path, rel, INVITE)
    message = refused(tmp_path)
    assert f"notify.kinds_dir: {rel}: in the wrong place: a kinds file goes in" in message
    assert str(tmp_path) not in message  # relative to kinds_dir, not absolute
    assert codes(live(tmp_path).current()) == set()


@pytest.mark.parametrize("rel", ["Acme/chat/kinds.toml", "acme/chat app/kinds.toml"])
def test_a_directory_that_cannot_be_a_namespace_is_refused_naming_the_file(
    tmp_path: Path, rel: str
) -> None:
    put(tmp_path, rel, INVITE)
    message = refused(tmp_path)
    assert f"notify.kinds_dir: {rel}: directory " in message
    assert "cannot be a namespace" in message
    assert codes(live(tmp_path).current()) == set()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '["invite"]\ncategory = "social"\ntemplate = "{who}"\n',
            '"invite".template: placeholder {who} is not allowed',
        ),
        ('["invite"]\ntemplate = "{count}"\n', '"invite".category: required key is missing'),
        ('["invite"]\ncategory = "social"\ncolour = "red"\n', '"invite".colour: unknown key'),
        ('["invite"]\ncategory = "sales"\n', '"invite".category: not a built-in category'),
        ('invite = "social"\n', '"invite": expected a table'),
        ('["Invite"]\ncategory = "social"\n', '"Invite": kind code: expected a name'),
        ('["a/b:c/d:e"]\ncategory = "social"\n', '"a/b:c/d:e": kind code: expected a name'),
        ("[oops\n", "not valid TOML"),
        ("a = " + "[" * 50_000 + "]" * 50_000, "not valid TOML: nested too deeply"),
    ],
)
def test_a_bad_kinds_file_is_refused_naming_the_file_and_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", text)
    assert f"notify.kinds_dir: acme/chat/kinds.toml: {problem}" in refused(tmp_path)


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "acme/chat").mkdir(parents=True)
    (tmp_path / "acme/chat/kinds.toml").write_bytes(b'["invite"]\ncategory = "\xff"\n')
    assert "notify.kinds_dir: acme/chat/kinds.toml: not UTF-8" in refused(tmp_path)


def test_a_file_larger_than_a_mebibyte_is_refused_unread(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE + "#" * (1 << 20))
    assert "notify.kinds_dir: acme/chat/kinds.toml: larger than 1 MiB" in refused(tmp_path)


def test_the_same_kind_in_two_files_of_one_app_is_refused_naming_both(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/a.toml", INVITE)
    put(tmp_path, "acme/chat/b.toml", INVITE)
    assert (
        'notify.kinds_dir: acme/chat/b.toml: "invite": the kind is already defined in '
        "acme/chat/a.toml"
    ) in refused(tmp_path)


def test_hidden_entries_and_files_without_the_toml_suffix_are_ignored(tmp_path: Path) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    put(tmp_path, "acme/chat/kinds.toml.tmp", "[half-writ")
    put(tmp_path, "acme/chat/.kinds.toml.swp", "[half-writ")
    put(tmp_path, ".git/x/y/config.toml", "[core")
    put(tmp_path, "README.md", "kinds live in publisher/app/")
    kinds = live(tmp_path)
    assert codes(kinds.current()) == {"acme/chat:invite"} and kinds.problems() == ()


def test_a_kinds_directory_that_does_not_exist_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"notify\.kinds_dir: not a directory"):
        live(tmp_path / "nowhere")


# Changes without a restart.


def test_a_file_added_changed_and_removed_is_followed_and_the_version_comes_back(
    tmp_path: Path,
) -> None:
    kinds = live(tmp_path)
    empty = kinds.current().version
    assert empty == Catalogue.builtin().version

    added = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    with_invite = kinds.refresh()
    assert codes(with_invite) == {"acme/chat:invite"} and with_invite.version != empty

    added.write_text(INVITE.replace("invitations", "invites"), encoding="utf-8")
    changed = kinds.refresh()
    assert changed.get("acme/chat:invite") == KindEntry(
        "acme/chat:invite", "social", "{count} invites"
    )
    assert changed.version not in (empty, with_invite.version)

    added.write_text(INVITE, encoding="utf-8")
    assert kinds.refresh().version == with_invite.version

    shutil.rmtree(tmp_path / "acme")
    assert kinds.refresh().version == empty and codes(kinds.current()) == set()


def test_a_rewrite_that_keeps_size_and_mtime_is_still_seen(tmp_path: Path) -> None:
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    kinds = live(tmp_path)
    stamp = path.stat().st_mtime_ns
    path.write_text(INVITE.replace("{count} invitations", "{count} requests!!!"), encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))
    assert path.stat().st_size == len(INVITE)
    assert kinds.refresh().get("acme/chat:invite") == KindEntry(
        "acme/chat:invite", "social", "{count} requests!!!"
    )


def test_a_settled_file_whose_stamp_did_not_change_is_not_read_again(tmp_path: Path) -> None:
    # The price of not reading every file per refresh: a file rewritten with the same
    # size, mtime and inode long after its last change is taken as unchanged.
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    os.utime(path, ns=(OLD, OLD))
    kinds = live(tmp_path)
    first = kinds.refresh()
    path.write_text(INVITE.replace("{count} invitations", "{count} requests!!!"), encoding="utf-8")
    os.utime(path, ns=(OLD, OLD))
    assert kinds.refresh() is first
    os.utime(path, ns=(OLD + 1, OLD + 1))  # any change of the stamp is read
    assert kinds.refresh().get("acme/chat:invite") == KindEntry(
        "acme/chat:invite", "social", "{count} requests!!!"
    )


def test_an_unchanged_directory_gives_the_same_catalogue(tmp_path: Path) -> None:
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    os.utime(path, ns=(OLD, OLD))
    kinds = live(tmp_path)
    assert kinds.refresh() is kinds.refresh() is kinds.current()


def test_an_invalid_file_keeps_the_last_good_kinds_and_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    kinds = live(tmp_path, metrics)
    good = kinds.current()

    path.write_text(INVITE + 'template2 = "x"\n', encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="bothy.notify.catalogue"):
        assert kinds.refresh() == good
        assert kinds.refresh() == good  # reported once, not per refresh
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage() == "kinds file refused; the last good kinds stay in use"
    assert record.__dict__["file"] == "acme/chat/kinds.toml"
    assert record.__dict__["problem"] == '"invite".template2: unknown key'
    assert metrics.catalogue_invalid_files._value.get() == 1
    assert [str(p) for p in kinds.problems()] == [
        'notify.kinds_dir: acme/chat/kinds.toml: "invite".template2: unknown key'
    ]

    put(tmp_path, "acme/chat/more.toml", '["poke"]\ncategory = "social"\n')
    assert kinds.refresh() == good  # the app as a whole stays at its last good state

    path.write_text(INVITE, encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bothy.notify.catalogue"):
        fixed = kinds.refresh()
    assert codes(fixed) == {"acme/chat:invite", "acme/chat:poke"}
    assert kinds.problems() == () and metrics.catalogue_invalid_files._value.get() == 0
    assert [r.getMessage() for r in caplog.records] == ["kinds file no longer refused"]


def test_a_new_app_with_an_invalid_file_adds_nothing_while_other_apps_still_change(
    tmp_path: Path,
) -> None:
    kinds = live(tmp_path)
    put(tmp_path, "acme/board/kinds.toml", '["invite"]\ncategory = "nope"\n')
    put(tmp_path, "acme/chat/kinds.toml", INVITE)
    catalogue = kinds.refresh()
    assert codes(catalogue) == {"acme/chat:invite"}
    assert [p.path for p in kinds.problems()] == ["acme/board/kinds.toml"]


def test_a_half_written_file_during_an_install_never_empties_the_app(tmp_path: Path) -> None:
    path = put(tmp_path, "acme/chat/kinds.toml", INVITE)
    kinds = live(tmp_path)
    good = kinds.current()
    path.write_text(INVITE[:12], encoding="utf-8")
    assert kinds.refresh() == good
    path.write_text(INVITE, encoding="utf-8")
    assert kinds.refresh() == good and kinds.problems() == ()


def test_the_directory_disappearing_keeps_the_last_good_catalogue_and_is_reported(
    tmp_path: Path,
) -> None:
    root = tmp_path / "kinds"
    put(root, "acme/chat/kinds.toml", INVITE)
    kinds = live(root)
    good = kinds.current()
    shutil.rmtree(root)
    assert kinds.refresh() == good
    assert [str(p) for p in kinds.problems()] == [
        "notify.kinds_dir: .: not a directory (FileNotFoundError)"
    ]
    put(root, "acme/chat/kinds.toml", INVITE)
    assert kinds.refresh() == good and kinds.problems() == ()


def test_a_symlinked_app_directory_takes_the_namespace_of_the_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "opt" / "chat-kinds"
    put(elsewhere, "kinds.toml", INVITE)
    root = tmp_path / "kinds"
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "chat").symlink_to(elsewhere, target_is_directory=True)
    assert codes(live(root).current()) == {"acme/chat:invite"}


async def test_watching_takes_changes_in_and_reports_a_bad_file_without_anyone_asking(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    kinds = live(tmp_path, metrics)
    with trio.fail_after(10), caplog.at_level(logging.INFO, logger="bothy.notify.catalogue"):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(kinds.watch, interval=0.02))
            put(tmp_path, "acme/chat/kinds.toml", INVITE)
            while codes(kinds.current()) != {"acme/chat:invite"}:
                await trio.sleep(0.01)
            good = kinds.current()

            put(tmp_path, "acme/chat/kinds.toml", INVITE.replace("{count}", "{name}"))
            while metrics.catalogue_invalid_files._value.get() != 1:
                await trio.sleep(0.01)
            assert kinds.current() == good
            nursery.cancel_scope.cancel()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.__dict__["file"] == "acme/chat/kinds.toml"


async def test_watching_without_a_kinds_directory_returns_at_once() -> None:
    kinds = LiveCatalogue(make_config().notify)
    with trio.fail_after(5):
        await kinds.watch(interval=0.01)


# A reload (notify.categories) reaches the apps of the directory.


def test_a_reload_that_removes_a_category_takes_its_kinds_out_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    put(tmp_path, "acme/chat/kinds.toml", INVITE + '["wave"]\ncategory = "games"\n')
    put(tmp_path, "acme/board/kinds.toml", '["move"]\ncategory = "games"\n')
    both = make_config(notify={"categories": ["social", "games"], "kinds_dir": str(tmp_path)})
    catalogue = LiveCatalogue(both.notify)
    assert codes(catalogue.current()) == {
        "acme/chat:invite",
        "acme/chat:wave",
        "acme/board:move",
    }

    social = make_config(notify={"categories": ["social"], "kinds_dir": str(tmp_path)})
    after = catalogue.reconfigure(social.notify)
    # Each app's files are refused now (games is no category); its last good kinds
    # stay, except those of the category that is gone.
    assert codes(after) == {"acme/chat:invite"}
    assert {p.path for p in catalogue.problems()} == {
        "acme/chat/kinds.toml",
        "acme/board/kinds.toml",
    }

    again = catalogue.reconfigure(both.notify)
    assert codes(again) == {"acme/chat:invite", "acme/chat:wave", "acme/board:move"}
    assert catalogue.problems() == ()
