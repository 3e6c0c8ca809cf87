"""The pure decision, rule by rule (table-driven), then its properties (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bothy_notify.config import Level
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.notify.domain import (
    Delivery,
    Device,
    Fold,
    Hint,
    Policy,
    RecipientFacts,
    Skip,
    SkipReason,
    Via,
    Window,
    decide,
    flush_hint,
    fold_into,
    only_deleted,
    open_window,
    release_delayed,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = Policy(mobile_delay=timedelta(minutes=2), coalesce_window=timedelta(0))
COALESCING = Policy(mobile_delay=timedelta(minutes=2), coalesce_window=timedelta(seconds=30))

PHONE = Device("phone", "ios", ("reg-phone",))
TABLET = Device("tablet", "android", ("reg-tablet-1", "reg-tablet-2"))
BARE = Device("bare", "ios", ())


def live(device: str, platform: str = "macos", focus: tuple[str, ...] = (), idle: bool = False):
    return PresenceEntry(device, platform, frozenset(focus), idle)


def msg(seq: int = 5, **kw: object) -> Hint:
    base = Hint(
        nid="n1",
        kind="message",
        category="messages",
        thread_id="t1",
        message_id=f"m{seq}",
        message_seq=seq,
        actor_id="sam",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def facts(**kw: object) -> RecipientFacts:
    base = RecipientFacts(
        user_id="alex",
        human=True,
        active=True,
        has_access=True,
        level=Level.ALL,
        categories_off=frozenset(),
        read_position=0,
        devices=(PHONE,),
        presence=(),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def routes(decision: object) -> list[tuple[str, str]]:
    assert isinstance(decision, Delivery), decision
    return sorted((r.via.value, r.device_id) for r in decision.routes)


# ------------------------------------------------------------------ rule 1: skips

SKIP_TABLE = [
    ("no access", msg(), facts(has_access=False), SkipReason.NO_ACCESS),
    ("inactive", msg(), facts(active=False), SkipReason.NO_ACCESS),
    ("agent", msg(), facts(human=False), SkipReason.NO_ACCESS),
    ("author", msg(actor_id="alex"), facts(), SkipReason.NO_ACCESS),
    ("level none", msg(), facts(level=Level.NONE), SkipReason.PREFERENCE),
    (
        "level none silences mentions",
        msg(mentions=frozenset({"alex"})),
        facts(level=Level.NONE),
        SkipReason.PREFERENCE,
    ),
    ("level mentions, not mentioned", msg(), facts(level=Level.MENTIONS), SkipReason.PREFERENCE),
    ("messages off", msg(), facts(categories_off=frozenset({"messages"})), SkipReason.PREFERENCE),
    (
        "admin off",
        Hint("n", "admin", "admin", target_id="g"),
        facts(categories_off=frozenset({"admin"})),
        SkipReason.PREFERENCE,
    ),
    (
        "app category off",
        Hint("n", "social:friend_request", "social", target_id="p"),
        facts(categories_off=frozenset({"social"})),
        SkipReason.PREFERENCE,
    ),
    ("read at the message", msg(5), facts(read_position=5), SkipReason.READ),
    ("read past the message", msg(5), facts(read_position=9), SkipReason.READ),
    (
        "an edit's mention with mentions off never falls back to a message",
        msg(kind="mention", mentions=frozenset({"alex"}), mention_only=True),
        facts(categories_off=frozenset({"mentions"})),
        SkipReason.PREFERENCE,
    ),
    (
        "an edit's mention at level none",
        msg(kind="mention", mentions=frozenset({"alex"}), mention_only=True),
        facts(level=Level.NONE),
        SkipReason.PREFERENCE,
    ),
    ("no devices at all", msg(), facts(devices=()), SkipReason.NO_REGISTRATION),
    ("device without registration", msg(), facts(devices=(BARE,)), SkipReason.NO_REGISTRATION),
]


@pytest.mark.parametrize(
    ("name", "hint", "recipient", "reason"), SKIP_TABLE, ids=[row[0] for row in SKIP_TABLE]
)
def test_skip_rules(name: str, hint: Hint, recipient: RecipientFacts, reason: SkipReason) -> None:
    assert decide(hint, recipient, POLICY, now=NOW) == Skip("alex", reason)


def test_security_cannot_be_switched_off() -> None:
    hint = Hint("n", "security", "security", target_id="new-laptop")
    decision = decide(hint, facts(categories_off=frozenset({"security"})), POLICY, now=NOW)
    assert routes(decision) == [("push", "phone")]


def test_security_hint_never_goes_to_the_pending_device_itself() -> None:
    hint = Hint("n", "security", "security", target_id="phone")
    decision = decide(hint, facts(devices=(PHONE, TABLET)), POLICY, now=NOW)
    assert routes(decision) == [("push", "tablet")]


def test_mention_wins_over_message_for_a_mentioned_recipient() -> None:
    decision = decide(
        msg(mentions=frozenset({"alex"})), facts(level=Level.MENTIONS), POLICY, now=NOW
    )
    assert isinstance(decision, Delivery) and decision.kind == "mention"


def test_an_edits_mention_is_a_mention_at_level_mentions() -> None:
    hint = msg(kind="mention", mentions=frozenset({"alex"}), mention_only=True)
    decision = decide(hint, facts(level=Level.MENTIONS), POLICY, now=NOW)
    assert isinstance(decision, Delivery) and decision.kind == "mention"
    assert decision.category == "mentions" and not decision.quiet


def test_mentions_off_but_level_all_falls_back_to_message() -> None:
    decision = decide(
        msg(mentions=frozenset({"alex"})),
        facts(categories_off=frozenset({"mentions"})),
        POLICY,
        now=NOW,
    )
    assert isinstance(decision, Delivery) and decision.kind == "message"


def test_read_check_ignores_hints_without_a_message() -> None:
    hint = Hint("n", "admin", "admin", target_id="g")
    assert isinstance(decide(hint, facts(read_position=99), POLICY, now=NOW), Delivery)


# ------------------------------------------------------------------ rule 2: active in thread

ACTIVE_TABLE = [
    ("desktop focusing", (live("desk", focus=("t1",)),), SkipReason.ACTIVE_IN_THREAD),
    (
        "phone live and focusing",
        (live("phone", "ios", focus=("t1",)),),
        SkipReason.ACTIVE_IN_THREAD,
    ),
    (
        "any of several focusing",
        (live("desk", focus=("t2",)), live("lap", "linux", focus=("t1",))),
        SkipReason.ACTIVE_IN_THREAD,
    ),
]


@pytest.mark.parametrize(
    ("name", "presence", "reason"), ACTIVE_TABLE, ids=[row[0] for row in ACTIVE_TABLE]
)
def test_active_in_thread_stops_every_route(
    name: str, presence: tuple[PresenceEntry, ...], reason: SkipReason
) -> None:
    assert decide(msg(), facts(presence=presence), POLICY, now=NOW) == Skip("alex", reason)


def test_idle_desktop_focusing_the_thread_does_not_stop_the_hint() -> None:
    decision = decide(
        msg(), facts(presence=(live("desk", focus=("t1",), idle=True),)), POLICY, now=NOW
    )
    assert routes(decision) == [("gateway", "desk"), ("push", "phone")]


def test_focus_does_not_matter_for_hints_without_a_thread() -> None:
    hint = Hint("n", "admin", "admin", target_id="g")
    decision = decide(hint, facts(presence=(live("desk", focus=("t1",)),)), POLICY, now=NOW)
    assert routes(decision) == [("gateway", "desk"), ("push", "phone")]


# ------------------------------------------------------------------ rules 3-5: routes

ROUTE_TABLE = [
    ("nobody live: immediate push", (), [("push", "phone")]),
    (
        "active macos elsewhere: delayed",
        (live("desk", focus=("t2",)),),
        [("gateway", "desk"), ("push_delayed", "phone")],
    ),
    (
        "active windows: delayed",
        (live("lap", "windows"),),
        [("gateway", "lap"), ("push_delayed", "phone")],
    ),
    (
        "linux desktop does not delay",
        (live("box", "linux"),),
        [("gateway", "box"), ("push", "phone")],
    ),
    (
        "idle desktop does not delay",
        (live("desk", idle=True),),
        [("gateway", "desk"), ("push", "phone")],
    ),
    ("live phone gets gateway, not push", (live("phone", "ios"),), [("gateway", "phone")]),
]


@pytest.mark.parametrize(
    ("name", "presence", "expected"), ROUTE_TABLE, ids=[row[0] for row in ROUTE_TABLE]
)
def test_routes(
    name: str, presence: tuple[PresenceEntry, ...], expected: list[tuple[str, str]]
) -> None:
    assert routes(decide(msg(), facts(presence=presence), POLICY, now=NOW)) == expected


def test_delayed_route_carries_the_configured_delay_and_every_registration() -> None:
    decision = decide(msg(), facts(devices=(TABLET,), presence=(live("desk"),)), POLICY, now=NOW)
    assert isinstance(decision, Delivery)
    (delayed,) = [r for r in decision.routes if r.via is Via.PUSH_DELAYED]
    assert delayed.delay == timedelta(minutes=2)
    assert delayed.registrations == ("reg-tablet-1", "reg-tablet-2")


def test_zero_delay_means_immediate() -> None:
    policy = Policy(mobile_delay=timedelta(0), coalesce_window=timedelta(0))
    assert routes(decide(msg(), facts(presence=(live("desk"),)), policy, now=NOW)) == [
        ("gateway", "desk"),
        ("push", "phone"),
    ]


def test_hints_without_a_message_are_never_delayed() -> None:
    hint = Hint("n", "admin", "admin", target_id="g")
    assert routes(decide(hint, facts(presence=(live("desk"),)), POLICY, now=NOW)) == [
        ("gateway", "desk"),
        ("push", "phone"),
    ]


def test_count_is_the_unread_count() -> None:
    decision = decide(msg(9), facts(read_position=6), POLICY, now=NOW)
    assert isinstance(decision, Delivery) and decision.count == 3


# ------------------------------------------------------------------ coalescing


def test_routed_message_opens_a_window() -> None:
    decision = decide(msg(3), facts(), COALESCING, now=NOW)
    assert isinstance(decision, Delivery)
    assert decision.opens == Window(NOW, NOW + timedelta(seconds=30), 1, 3, 3, "m3")


def test_message_inside_an_open_window_folds() -> None:
    window = open_window(NOW, timedelta(seconds=30), 3, "m3")
    assert window is not None
    decision = decide(msg(4), facts(), COALESCING, window=window, now=NOW + timedelta(seconds=5))
    assert isinstance(decision, Fold)
    assert decision.window.count == 2 and decision.window.newest_seq == 4


def test_closed_window_does_not_fold() -> None:
    window = open_window(NOW, timedelta(seconds=30), 3, "m3")
    decision = decide(msg(4), facts(), COALESCING, window=window, now=NOW + timedelta(seconds=30))
    assert isinstance(decision, Delivery) and decision.opens is not None


def test_zero_window_turns_coalescing_off() -> None:
    decision = decide(msg(3), facts(), POLICY, now=NOW)
    assert isinstance(decision, Delivery) and decision.opens is None


def test_flush_gives_the_unread_count_and_points_at_the_newest_message() -> None:
    window = Window(NOW, NOW, 10, 1, 10, "m10")
    hint = flush_hint(window, nid="f", thread_id="t1", read_position=0, last_message_seq=10)
    assert hint is not None
    assert (hint.count, hint.message_id, hint.message_seq, hint.quiet) == (10, "m10", 10, True)


def test_flush_after_reading_gives_nothing() -> None:
    window = Window(NOW, NOW, 10, 1, 10, "m10")
    assert (
        flush_hint(window, nid="f", thread_id="t1", read_position=10, last_message_seq=10) is None
    )


def test_flush_of_a_window_with_nothing_folded_gives_nothing() -> None:
    window = Window(NOW, NOW, 1, 4, 4, "m4")
    assert flush_hint(window, nid="f", thread_id="t1", read_position=0, last_message_seq=4) is None


def test_flush_with_a_folded_mention_is_a_loud_mention() -> None:
    window = Window(NOW, NOW, 3, 1, 3, "m3", mention=True)
    hint = flush_hint(window, nid="f", thread_id="t1", read_position=0, last_message_seq=3)
    assert hint is not None and hint.kind == "mention" and hint.quiet is False


ONLY_DELETED = [
    # (folded after the opener: first_seq 1 .. newest 4), read position, deleted -> only deleted
    ("nothing deleted", 0, set(), False),
    ("every folded message deleted", 0, {2, 3, 4}, True),
    ("one folded message left", 0, {3, 4}, False),
    ("the rest was read", 2, {3, 4}, True),
    ("the opener's deletion does not count", 0, {1, 3, 4}, False),
    ("deletions outside the window do not count", 0, {5, 6, 7}, False),
    ("read up to the newest", 4, set(), False),
]


@pytest.mark.parametrize(
    ("name", "position", "deleted", "only"), ONLY_DELETED, ids=[row[0] for row in ONLY_DELETED]
)
def test_a_flush_counts_only_deleted_messages(
    name: str, position: int, deleted: set[int], only: bool
) -> None:
    window = Window(NOW, NOW, 4, 1, 4, "m4")
    assert only_deleted(window, position, deleted) is only


def test_a_flush_whose_newest_message_went_points_at_the_thread_up_to_its_last() -> None:
    window = Window(NOW, NOW, 4, 1, 4, "m4")
    hint = flush_hint(
        window, nid="f", thread_id="t1", read_position=1, last_message_seq=3, deleted={4}
    )
    assert hint is not None
    assert (hint.message_id, hint.message_seq, hint.count) == (None, 3, 2)


def test_a_flush_whose_newest_message_went_and_the_rest_was_read_gives_nothing() -> None:
    window = Window(NOW, NOW, 4, 1, 4, "m4")
    assert (
        flush_hint(
            window, nid="f", thread_id="t1", read_position=3, last_message_seq=3, deleted={4}
        )
        is None
    )


def test_release_check() -> None:
    assert release_delayed(5, 4)
    assert not release_delayed(5, 5)
    assert not release_delayed(5, 6)
    assert release_delayed(0, 100)


# ------------------------------------------------------------------ properties

ids = st.sampled_from(["alex", "sam", "robin", "kim"])
platforms = st.sampled_from(["ios", "android", "macos", "windows", "linux", "web"])
threads = st.sampled_from(["t1", "t2", "t3"])


@st.composite
def presence_entries(draw: st.DrawFn) -> tuple[PresenceEntry, ...]:
    devices = draw(st.lists(st.sampled_from(["d1", "d2", "d3", "phone"]), unique=True, max_size=3))
    return tuple(
        PresenceEntry(
            d, draw(platforms), frozenset(draw(st.lists(threads, max_size=3))), draw(st.booleans())
        )
        for d in devices
    )


@st.composite
def device_sets(draw: st.DrawFn) -> tuple[Device, ...]:
    devices = draw(st.lists(st.sampled_from(["d1", "d2", "d3", "phone"]), unique=True, max_size=3))
    return tuple(
        Device(
            d,
            draw(platforms),
            tuple(draw(st.lists(st.sampled_from(["r1", "r2"]), unique=True, max_size=2))),
        )
        for d in devices
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Hint, RecipientFacts, Policy]:
    seq = draw(st.integers(min_value=0, max_value=20))
    kind = draw(st.sampled_from(["message", "mention", "admin", "security", "social:x"]))
    category = {
        "message": "messages",
        "mention": "mentions",
        "admin": "admin",
        "security": "security",
    }.get(kind, "social")
    thread = draw(st.one_of(st.none(), threads)) if kind not in ("message", "mention") else "t1"
    hint = Hint(
        nid="n",
        kind=kind,
        category=category,
        thread_id=thread,
        message_id=f"m{seq}" if seq and thread else None,
        message_seq=seq if thread else 0,
        actor_id=draw(st.one_of(st.none(), ids)),
        mentions=frozenset(draw(st.lists(ids, max_size=2))),
        target_id=draw(st.one_of(st.none(), st.sampled_from(["d1", "g1"]))),
    )
    recipient = RecipientFacts(
        user_id=draw(ids),
        human=draw(st.booleans()),
        active=draw(st.booleans()),
        has_access=draw(st.booleans()),
        level=draw(st.sampled_from(list(Level))),
        categories_off=frozenset(
            draw(
                st.lists(
                    st.sampled_from(["messages", "mentions", "admin", "social", "security"]),
                    max_size=3,
                )
            )
        ),
        read_position=draw(st.integers(min_value=0, max_value=20)),
        devices=draw(device_sets()),
        presence=draw(presence_entries()),
    )
    policy = Policy(
        mobile_delay=timedelta(seconds=draw(st.sampled_from([0, 30, 120]))),
        coalesce_window=timedelta(seconds=draw(st.sampled_from([0, 30]))),
    )
    return hint, recipient, policy


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_property_live_non_idle_focus_on_the_thread_means_no_route(
    scenario: tuple[Hint, RecipientFacts, Policy],
) -> None:
    hint, recipient, policy = scenario
    focused = hint.thread_id is not None and any(
        hint.thread_id in e.focus and not e.idle for e in recipient.presence
    )
    decision = decide(hint, recipient, policy, now=NOW)
    if focused:
        assert not isinstance(decision, Delivery)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_property_delayed_routes_only_while_a_macos_or_windows_device_is_live_and_awake(
    scenario: tuple[Hint, RecipientFacts, Policy],
) -> None:
    hint, recipient, policy = scenario
    decision = decide(hint, recipient, policy, now=NOW)
    if isinstance(decision, Delivery) and any(r.via is Via.PUSH_DELAYED for r in decision.routes):
        assert any(e.platform in ("macos", "windows") and not e.idle for e in recipient.presence)
        assert hint.message_seq > 0


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_property_the_author_is_never_a_recipient(
    scenario: tuple[Hint, RecipientFacts, Policy],
) -> None:
    hint, recipient, policy = scenario
    hint = replace(hint, actor_id=recipient.user_id)
    assert decide(hint, recipient, policy, now=NOW) == Skip(recipient.user_id, SkipReason.NO_ACCESS)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_property_no_route_to_a_person_without_read_access(
    scenario: tuple[Hint, RecipientFacts, Policy],
) -> None:
    hint, recipient, policy = scenario
    decision = decide(hint, replace(recipient, has_access=False), policy, now=NOW)
    assert not isinstance(decision, Delivery | Fold)


@settings(max_examples=300, deadline=None)
@given(
    first=st.integers(min_value=1, max_value=50),
    later=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=30),
    read=st.integers(min_value=0, max_value=60),
)
def test_property_coalescing_never_loses_the_last_message_count(
    first: int, later: list[int], read: int
) -> None:
    window = open_window(NOW, timedelta(seconds=30), first, f"m{first}")
    assert window is not None
    for seq in later:
        window = fold_into(window, seq, f"m{seq}", mentioned=False)
    newest = max([first, *later])
    assert window.newest_seq == newest and window.newest_message_id == f"m{newest}"
    assert window.count == 1 + len(later)
    hint = flush_hint(window, nid="f", thread_id="t1", read_position=read, last_message_seq=newest)
    if hint is not None:
        assert hint.count == newest - read and hint.message_seq == newest
    else:
        assert read >= newest or newest == first


# ------------------------------------------------------------------ quiet hours


def test_a_quiet_recipient_is_still_decided_the_same_and_the_delivery_is_hushed() -> None:
    loud = decide(msg(), facts(presence=(live("desk"),)), POLICY, now=NOW)
    hushed = decide(msg(), facts(presence=(live("desk"),), quiet=True), POLICY, now=NOW)
    assert isinstance(loud, Delivery) and isinstance(hushed, Delivery)
    assert hushed.routes == loud.routes  # the phone's push is held at send, not here
    assert (loud.hushed, hushed.hushed) == (False, True)
    assert hushed.quiet is loud.quiet  # a push that breaks through still sounds


def test_quiet_hours_change_no_skip() -> None:
    assert decide(msg(), facts(quiet=True, read_position=5), POLICY, now=NOW) == Skip(
        "alex", SkipReason.READ
    )
