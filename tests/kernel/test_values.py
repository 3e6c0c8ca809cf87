"""kernel.values.fast_init: a cheaper __init__ that keeps every frozen-dataclass behaviour."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import pytest

from bothy_notify.kernel.values import fast_init
from bothy_notify.notify.domain import Delivery, Hint, RecipientFacts, Route, Via


@fast_init
@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int
    label: str = "origin"


@dataclass(frozen=True, slots=True)
class Plain:
    x: int
    y: int
    label: str = "origin"


def test_the_signature_is_the_dataclass_one() -> None:
    assert inspect.signature(Point) == inspect.signature(Plain)


def test_positional_keyword_and_default_arguments_set_the_fields() -> None:
    assert (Point(1, 2).x, Point(1, 2).y, Point(1, 2).label) == (1, 2, "origin")
    assert Point(y=2, x=1, label="p") == Point(1, 2, "p")


def test_missing_and_unknown_arguments_fail_like_any_call() -> None:
    with pytest.raises(TypeError):
        Point(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, z=3)  # type: ignore[call-arg]


def test_an_instance_stays_frozen() -> None:
    point = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 3  # type: ignore[misc]


def test_equality_hash_repr_and_replace_are_the_dataclass_ones() -> None:
    point = Point(1, 2)
    assert point == Point(1, 2) and point != Point(2, 1)
    assert hash(point) == hash(Point(1, 2))
    assert repr(point) == "Point(x=1, y=2, label='origin')"
    assert dataclasses.replace(point, y=5) == Point(1, 5)


def test_a_class_it_cannot_keep_the_same_is_refused() -> None:
    with pytest.raises(TypeError):

        @fast_init
        @dataclass(frozen=True)
        class NoSlots:
            x: int

    with pytest.raises(TypeError):

        @fast_init
        @dataclass(slots=True)
        class NotFrozen:
            x: int

    with pytest.raises(TypeError):

        @fast_init
        @dataclass(frozen=True, slots=True)
        class Factory:
            xs: tuple[int, ...] = field(default_factory=tuple)


def test_the_decision_values_use_it_and_keep_their_defaults() -> None:
    route = Route(Via.PUSH, "phone", ("reg",))
    assert route.delay == dataclasses.fields(Route)[3].default
    hint = Hint(nid="n", kind="message", category="messages")
    assert hint.mentions == frozenset() and hint.count is None and hint.mv is None
    delivery = Delivery("alex", "message", "messages", 1, False, (route,))
    assert delivery.opens is None
    for cls in (Route, Hint, Delivery, RecipientFacts):
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
