"""The protocol without IO: decoding client frames and the phase rules."""

from __future__ import annotations

import json

import pytest

from gateway.closes import (
    ALREADY_IDENTIFIED,
    BAD_FOCUS,
    BAD_READ,
    MALFORMED,
    NOT_IDENTIFIED,
    UNKNOWN_OP,
)
from gateway.errors import ProtocolViolation
from gateway.protocol import (
    Focus,
    Identify,
    Phase,
    Ping,
    Read,
    check_allowed,
    decode_client_frame,
    unread_frame,
)

VALID = [
    ('{"op":"identify","d":{"token":"abc"}}', Identify("abc")),
    ('{"op":"ping"}', Ping()),
    ('{"op":"ping","d":{}}', Ping()),
    ('{"op":"focus","d":{"thread_ids":["t1","t2","t1"],"idle":true}}', Focus(("t1", "t2"), True)),
    ('{"op":"focus","d":{"thread_ids":[]}}', Focus((), False)),
    ('{"op":"read","d":{"thread_id":"t1","seq":9007199254740991}}', Read("t1", 2**53 - 1)),
]

INVALID = [
    ("{", MALFORMED),
    ("[]", MALFORMED),
    ('"ping"', MALFORMED),
    ('{"op":"ping","x":1}', MALFORMED),
    ('{"op":null}', MALFORMED),
    ('{"op":"ping","d":[1]}', MALFORMED),
    ('{"op":"resume","d":{}}', UNKNOWN_OP),
    ('{"op":"identify"}', MALFORMED),
    ('{"op":"identify","d":{"token":5}}', MALFORMED),
    ('{"op":"identify","d":{"token":"a","extra":1}}', MALFORMED),
    ('{"op":"focus","d":{"thread_ids":"t1"}}', BAD_FOCUS),
    ('{"op":"focus","d":{"thread_ids":["t1"],"idle":1}}', BAD_FOCUS),
    ('{"op":"focus","d":{"thread_ids":["a","b","c","d"]}}', BAD_FOCUS),
    ('{"op":"focus","d":{"thread_ids":[""]}}', BAD_FOCUS),
    ('{"op":"focus","d":{"thread_ids":["' + "x" * 129 + '"]}}', BAD_FOCUS),
    ('{"op":"focus","d":{"thread_ids":[],"other":1}}', BAD_FOCUS),
    ('{"op":"read","d":{"thread_id":"t1"}}', BAD_READ),
    ('{"op":"read","d":{"thread_id":"t1","seq":true}}', BAD_READ),
    ('{"op":"read","d":{"thread_id":"t1","seq":1.5}}', BAD_READ),
    ('{"op":"read","d":{"thread_id":"t 1","seq":1}}', BAD_READ),
    ('{"op":"read","d":{"thread_id":"t1","seq":9007199254740992}}', BAD_READ),
]


@pytest.mark.parametrize(("text", "op"), VALID)
def test_valid_client_frames_decode_into_their_op(text: str, op: object) -> None:
    assert decode_client_frame(text, max_focused_threads=3) == op


@pytest.mark.parametrize(("text", "close"), INVALID)
def test_invalid_client_frames_raise_a_constant_4003(text: str, close: object) -> None:
    with pytest.raises(ProtocolViolation) as raised:
        decode_client_frame(text, max_focused_threads=3)

    assert raised.value.close == close
    assert raised.value.close.code == 4003


def test_a_binary_message_is_malformed() -> None:
    with pytest.raises(ProtocolViolation) as raised:
        decode_client_frame(b'{"op":"ping"}', max_focused_threads=3)

    assert raised.value.close == MALFORMED


@pytest.mark.parametrize(
    ("phase", "op", "close"),
    [
        (Phase.CONNECTING, Ping(), NOT_IDENTIFIED),
        (Phase.CONNECTING, Focus((), False), NOT_IDENTIFIED),
        (Phase.CONNECTING, Read("t1", 1), NOT_IDENTIFIED),
        (Phase.LIVE, Identify("x"), ALREADY_IDENTIFIED),
        (Phase.CATCHING_UP, Identify("x"), ALREADY_IDENTIFIED),
    ],
)
def test_ops_their_phase_does_not_allow_are_refused(
    phase: Phase, op: object, close: object
) -> None:
    with pytest.raises(ProtocolViolation) as raised:
        check_allowed(phase, op)  # type: ignore[arg-type]

    assert raised.value.close == close


def test_each_phase_allows_exactly_the_ops_of_the_table() -> None:
    ops: list[Identify | Focus | Read | Ping] = [
        Identify("x"),
        Focus((), False),
        Read("t1", 1),
        Ping(),
    ]
    allowed: dict[Phase, list[str]] = {}
    for phase in Phase:
        allowed[phase] = []
        for op in ops:
            try:
                check_allowed(phase, op)
            except ProtocolViolation:
                continue
            allowed[phase].append(type(op).__name__)

    assert allowed == {
        Phase.CONNECTING: ["Identify"],
        Phase.CATCHING_UP: ["Focus", "Read", "Ping"],
        Phase.LIVE: ["Focus", "Read", "Ping"],
        Phase.CLOSING: [],
    }


def test_reprs_of_client_ops_show_no_token_or_ids() -> None:
    for op in (Identify("secret-token"), Focus(("t1",), False), Read("t1", 3)):
        assert "secret" not in repr(op) and "t1" not in repr(op)


def test_server_frames_are_compact_json_without_nulls() -> None:
    text = unread_frame([("t1", 2)])

    assert json.loads(text) == {
        "op": "unread",
        "d": {"threads": [{"thread_id": "t1", "unread": 2}]},
    }
    assert " " not in text and "null" not in text
