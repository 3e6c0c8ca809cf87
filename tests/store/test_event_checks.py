"""The two event checkers agree with the schemas and with each other.

``schemas/events/*.json`` are the one source. The Python checker
(:mod:`bothy_notify.store.eventcheck`, the HTTP path) and the SQL one
(``bothy.checked_event``, generated into a migration by
:mod:`bothy_notify.store.eventsql`, the outbox path) are both built from them;
here ``jsonschema`` is the oracle (with ECMA-262 patterns through ``regress``,
JSON Schema's own regular-expression dialect, and ``maxDecodedBytes`` by really
decoding the base64), and hypothesis-jsonschema generates valid payloads of
every type from the same files. Each valid payload is then broken in one to
three places: members missing or unknown (nameable or not), wrong types, bounds
and just inside them, patterns off by a newline or a character, NUL and lone
surrogates, integers beyond 64 bits, integral floats, deep nesting.

For every case: the Python checker's verdict is the oracle's, the field and
problem it names are among the oracle's errors, and the SQL checker names
exactly the same field and problem, or for a valid payload returns it with
every integer written without a fraction. A payload PostgreSQL cannot store
(NUL, a lone surrogate) never reaches the SQL check; the schemas must refuse it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import regress
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from psycopg.conninfo import make_conninfo

from bothy_notify.store import eventsql
from bothy_notify.store.eventcheck import Refusal, compile_schema
from bothy_notify.store.events import EventRejected, EventValidator
from bothy_notify.store.eventschema import (
    EXPECTED,
    NAMEABLE_MEMBER,
    Problem,
    UnsupportedSchema,
    check_pattern,
    python_pattern,
    read,
)
from bothy_notify.store.migrate import load_event_schemas, migrate
from tests.conftest import TEMPLATE

SCHEMAS = load_event_schemas()

EXAMPLES = int(os.environ.get("BOTHY_EVENT_CHECK_EXAMPLES", "500"))
"""Generated cases per run; a longer search: BOTHY_EVENT_CHECK_EXAMPLES=20000."""

NESTED: dict[str, Any] = {
    "type": "object",
    "description": "Not an event type: nesting the files do not use yet (issue 33's kind).",
    "properties": {
        "thread_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
        "groups": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"enum": ["all", "here"]},
                    "seqs": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 4,
                        "items": {"type": "integer", "minimum": -5, "maximum": 2**60},
                    },
                    "weight": {"type": "number", "minimum": 0, "maximum": 10},
                    "note": {"type": "string", "minLength": 2, "maxLength": 8},
                    "flag": {"type": "null"},
                    "anything": {"description": "no constraint"},
                },
                "required": ["name", "seqs"],
                "additionalProperties": False,
            },
        },
        "open": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
    "required": ["groups"],
    "additionalProperties": False,
}
"""A synthetic type with arrays of objects, integers inside them, an enum without a
type, numbers, null and an open object: a new schema of this shape needs nothing
but its file (the checkers and the generator are built from the tree)."""

ALL = {**SCHEMAS, "test.nested": NESTED}


# ---------------------------------------------------------------- the oracle


def _ecma_pattern(validator: Any, pattern: str, instance: object, schema: Any) -> Iterator[Any]:
    """``pattern`` as ECMA-262 reads it (``regress``); ``jsonschema``'s own uses
    Python's ``re``, whose ``$`` also matches before a final newline."""
    if not isinstance(instance, str):
        return
    # regress takes UTF-8; a lone surrogate (which no class of the subset names)
    # stands as U+FFFD.
    text = instance.encode("utf-8", "replace").decode("utf-8")
    if _regex(pattern).find(text) is None:
        yield ValidationError(f"does not match {pattern!r}")


@functools.cache
def _regex(pattern: str) -> regress.Regex:
    return regress.Regex(pattern)


def _decodes_to_more(validator: Any, limit: int, instance: object, schema: Any) -> Iterator[Any]:
    """``maxDecodedBytes``: decoded for real (a string that is no base64 is the
    pattern's business)."""
    if not isinstance(instance, str):
        return
    try:
        raw = base64.b64decode(instance, validate=True)
    except (binascii.Error, ValueError):
        return
    if len(raw) > limit:
        yield ValidationError(f"decodes to more than {limit} bytes")


Oracle = validators.extend(
    Draft202012Validator, {"pattern": _ecma_pattern, "maxDecodedBytes": _decodes_to_more}
)

PROBLEM_OF = {
    "enum": Problem.NOT_ALLOWED,
    "pattern": Problem.WRONG_FORM,
    "minLength": Problem.TOO_SHORT,
    "maxLength": Problem.TOO_LONG,
    "maxDecodedBytes": Problem.TOO_LONG,
    "minimum": Problem.TOO_SMALL,
    "maximum": Problem.TOO_LARGE,
    "minItems": Problem.TOO_FEW_ITEMS,
    "maxItems": Problem.TOO_MANY_ITEMS,
}


@functools.cache
def _oracle(schema: str) -> Any:
    return Oracle(json.loads(schema))


def _field(path: Any) -> str:
    return "payload" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def oracle_answers(schema: Mapping[str, Any], payload: object) -> set[tuple[str, str]]:
    """Every (field, problem) ``jsonschema`` finds, in the checkers' words."""
    found: set[tuple[str, str]] = set()
    for error in _oracle(json.dumps(schema)).iter_errors(payload):
        at = _field(error.absolute_path)
        if error.validator == "type":
            found.add((at, EXPECTED[error.validator_value].value))
        elif error.validator == "required":
            found |= {
                (f"{at}.{name}", Problem.REQUIRED.value)
                for name in error.validator_value
                if name not in error.instance
            }
        elif error.validator == "additionalProperties":
            extra = [k for k in error.instance if k not in error.schema.get("properties", {})]
            named = [k for k in extra if _regex(NAMEABLE_MEMBER).find(_utf8(k))]
            unknown = Problem.UNKNOWN_FIELD.value
            found |= {(f"{at}.{k}", unknown) for k in named} if named else {(at, unknown)}
        else:
            found.add((at, PROBLEM_OF[str(error.validator)].value))
    return found


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------- the SQL checker


@pytest.fixture(scope="module")
def sql(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to a database of its own, whose ``bothy.checked_event`` also
    knows ``test.nested`` (as a newer generated migration would)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        with psycopg.connect(make_conninfo(pg_url, dbname=name), autocommit=True) as conn:
            conn.execute(eventsql.function_text(ALL).encode())
            yield conn
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


UNSTORABLE = "PostgreSQL cannot store it"


def sql_answer(conn: psycopg.Connection[Any], type_: str, payload: object) -> Any:
    """``("ok", stored payload)``, ``(field, problem)``, or :data:`UNSTORABLE`."""
    try:
        row = conn.execute(
            "SELECT bothy.checked_event(%s, %s::jsonb)::text", (type_, json.dumps(payload))
        ).fetchone()
    except psycopg.errors.InvalidParameterValue as exc:  # 22023: the check's refusal
        message = exc.diag.message_primary or ""
        field, _, problem = message.removeprefix("bothy: ").rpartition(": ")
        return field, problem
    except psycopg.errors.DataError:  # 22P02, 22P05: jsonb cannot hold a value
        return UNSTORABLE
    assert row is not None
    return "ok", json.loads(row[0])


# ---------------------------------------------------------------- payloads


def valid(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """What ``schema`` allows, from hypothesis-jsonschema. Objects are built here from
    their properties (every required one, any optional ones): hypothesis-jsonschema
    0.23.1's object strategy uses a Hypothesis internal (``many.more``) that
    Hypothesis 6.170 no longer has; every other node is the library's."""
    if schema.get("type") == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        return st.fixed_dictionaries(
            {k: valid(props[k]) for k in required},
            optional={k: valid(v) for k, v in props.items() if k not in required},
        )
    if "type" not in schema and "enum" not in schema:  # anything: objects too
        return JSON_VALUES
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, dict) and _has_object(items):
        low = schema.get("minItems", 0)
        return st.lists(valid(items), min_size=low, max_size=min(schema.get("maxItems", 5), 5))
    return from_schema(dict(schema))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Any JSON value jsonb can hold, for a node without a type."""


def _has_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" or (
        isinstance(schema.get("items"), dict) and _has_object(schema["items"])
    )


def _nest(depth: int, leaf: object, as_list: bool) -> object:
    value = leaf
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


JUNK: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    1.0,
    -0.0,
    1e300,
    2**53 + 1,
    2**64,
    -(2**63) - 1,
    10**300,
    "",
    "x",
    "é",
    "a\x00b",
    "\ud800",
    "ok\n",
    [],
    [1, "a"],
    {},
    {"a": 1},
    _nest(200, 1, as_list=True),
    _nest(200, "x", as_list=False),
]
"""Values of every JSON type and the edges of each: a wrong type anywhere."""

MEMBER_NAMES = ["extra", "x", "_", "Extra", "é", "a" * 41, "a\x00", "\ud800", "", "seq", "e-x"]
"""Unknown member names: nameable ones and ones that may be values."""


def surgery(schema: Mapping[str, Any], value: Any) -> list[object]:
    """``value`` (an object or an array) with members or items taken away or added."""
    options: list[object] = []
    if isinstance(value, dict):
        for name in schema.get("properties", {}):
            if name in value:
                options.append({k: v for k, v in value.items() if k != name})
        options += [{**value, name: 1} for name in MEMBER_NAMES]
        options.append({**value, "zz": 1, "Zz": 2, "aa": 3})
        options.append({k: v for k, v in list(value.items())[1:]} | {"extra": None})
    if isinstance(value, list):
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        options += [value[: max(low - 1, 0)], [], [*value, *JUNK[:3]]]
        if high is not None and value:
            options += [(value * (high + 1))[: high + 1], (value * high)[:high]]
    return options


def replacements(schema: Mapping[str, Any], value: Any) -> list[object]:
    """Values made for the node: its bounds and just inside them, its pattern off by
    one character, its enum's neighbours."""
    options: list[object] = []
    kind = schema.get("type")
    if kind == "string" or "enum" in schema:
        text = value if isinstance(value, str) else ""
        options += [text + "\n", " " + text, text.upper(), text + "\x00", text + "\ud800"]
        options += [text[:-1], text + "é", "\n" + text, text * 2]
        options += ["a" * n for n in (0, 1, 63, 64, 65, 127, 128, 129)]  # the patterns' bounds
        if "maxLength" in schema:
            options += ["A" * schema["maxLength"], "A" * (schema["maxLength"] + 1)]
        if "minLength" in schema:
            options += ["a" * schema["minLength"], "a" * max(schema["minLength"] - 1, 0)]
        if "maxDecodedBytes" in schema:
            most = schema["maxDecodedBytes"]
            options += [_b64(most), _b64(most + 1), _b64(most + 2), _b64(most + 3)]
    if kind in ("integer", "number"):
        for bound, step in (("minimum", -1), ("maximum", 1)):
            if bound in schema:
                edge = schema[bound]
                options += [edge, edge + step, float(edge), edge + step / 2, edge + float(step)]
        options += ["1", 2**63, -(2**63), 10**20, -(10**20), 0.5, 1e20]
    return options


def _b64(size: int) -> str:
    return base64.b64encode(bytes(size)).decode()


def mutated(schema: Mapping[str, Any], value: Any, data: st.DataObject) -> Any:
    """``value`` with one place broken or moved to an edge: somewhere inside it, by
    taking or adding members or items, or by replacing it with a value made for its
    node or (less often) one of any type."""
    props, items = schema.get("properties", {}), schema.get("items")
    inside: list[Any] = []
    if isinstance(value, dict):
        inside = [k for k in sorted(value) if k in props]
    elif isinstance(value, list) and isinstance(items, dict):
        inside = list(range(len(value)))
    actions = ["inside"] * 4 * bool(inside) + ["surgery"] * 2 * bool(surgery(schema, value))
    actions += ["junk"] + ["made"] * 4 * bool(replacements(schema, value))
    action = data.draw(st.sampled_from(actions))
    if action == "inside":
        at = data.draw(st.sampled_from(inside))
        if isinstance(value, dict):
            return {**value, at: mutated(props[at], value[at], data)}
        return [*value[:at], mutated(items, value[at], data), *value[at + 1 :]]  # type: ignore[arg-type]
    if action == "surgery":
        return data.draw(st.sampled_from(surgery(schema, value)))
    if action == "made":
        return data.draw(st.sampled_from(replacements(schema, value)))
    return data.draw(st.sampled_from(JUNK))


VALID = {name: valid(schema) for name, schema in ALL.items()}
"""Built once: hypothesis-jsonschema reads a schema when its strategy is made."""


@st.composite
def cases(draw: st.DrawFn, names: list[str]) -> tuple[str, Any]:
    name = draw(st.sampled_from(names))
    payload = draw(VALID[name])
    data = draw(st.data())
    for _ in range(draw(st.integers(1, 2))):
        payload = mutated(ALL[name], payload, data)
    return name, payload


def integral(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with every number where ``schema`` wants an integer as the ``int`` its
    JSON text says (``1e300`` is 10**300): what the SQL check hands on to be stored."""
    if schema.get("type") == "integer" and isinstance(value, float):
        return int(Decimal(json.dumps(value)))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: integral(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(schema.get("items", {}), v) for v in value]
    return value


def same_json(schema: Mapping[str, Any], stored: Any, expected: Any) -> bool:
    """Equal as JSON values (numbers by their decimal value: jsonb writes ``1e20`` out
    in full), and every integer field of ``stored`` an ``int`` (written without a
    fraction)."""
    if isinstance(expected, dict):
        props = schema.get("properties", {})
        return (
            isinstance(stored, dict)
            and stored.keys() == expected.keys()
            and all(same_json(props.get(k, {}), stored[k], v) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(expected)
            and all(
                same_json(schema.get("items", {}), a, b)
                for a, b in zip(stored, expected, strict=True)
            )
        )
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(stored) is type(expected) and stored == expected
    if schema.get("type") == "integer" and type(stored) is not int:
        return False
    return (
        isinstance(stored, (int, float))
        and not isinstance(stored, bool)
        and (Decimal(json.dumps(stored)) == Decimal(json.dumps(expected)))
    )


def storable(value: Any) -> bool:
    """Whether jsonb can hold ``value``: no NUL and no lone surrogate, in any string."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return "\x00" not in value
    if isinstance(value, dict):
        return all(storable(k) and storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(storable(v) for v in value)
    return True


# ---------------------------------------------------------------- the proof

CHECKS = {name: compile_schema(schema) for name, schema in ALL.items()}


def agree(conn: psycopg.Connection[Any], name: str, payload: Any) -> Refusal | None:
    """Assert that the oracle, the Python checker and the SQL checker agree; the
    Python checker's answer."""
    schema = ALL[name]
    oracle = oracle_answers(schema, payload)
    refusal = CHECKS[name](payload)
    if refusal is None:
        assert not oracle, f"{name}: Python accepts what jsonschema refuses: {sorted(oracle)}"
    else:
        answer = (refusal.field(), refusal.problem.value)
        assert oracle, f"{name}: Python refuses {answer} what jsonschema accepts"
        assert answer in oracle, f"{name}: Python says {answer}, jsonschema {sorted(oracle)}"
    stored = sql_answer(conn, name, payload)
    if not storable(payload):
        assert stored == UNSTORABLE
        if name in SCHEMAS:  # the product's types: every string has a pattern or an enum
            assert refusal is not None, f"{name}: the schema allows what jsonb cannot hold"
    elif refusal is None:
        assert stored[0] == "ok", f"{name}: SQL refuses {stored} what Python accepts"
        assert same_json(schema, stored[1], integral(schema, payload)), (name, stored[1])
    else:
        assert stored == (refusal.field(), refusal.problem.value)
    return refusal


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases(sorted(ALL)))
def test_the_checkers_agree_with_the_schemas_and_each_other(
    sql: psycopg.Connection[Any], case: tuple[str, Any]
) -> None:
    refusal = agree(sql, *case)
    event(refusal.problem.value if refusal is not None else "valid")


@settings(
    max_examples=max(EXAMPLES // 10, 20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_type_accepts_what_hypothesis_jsonschema_generates(
    sql: psycopg.Connection[Any], data: st.DataObject
) -> None:
    for name in sorted(ALL):
        assert agree(sql, name, data.draw(VALID[name], label=name)) is None


@pytest.mark.parametrize(
    ("name", "payload", "answer"),
    [
        # Two problems at once: the fixed order decides which is named, alike in both.
        ("message.created", {"thread_id": "t 1"}, ("payload.message_id", "required")),
        (
            "message.created",
            {"thread_id": "t", "message_id": "m", "thread_seq": 1, "author_id": "a", "Zed": 1},
            ("payload", "unknown field"),
        ),
        (
            "member.added",
            {"user_id": "a", "scope_id": "s", "zz": 1, "Aa": 2, "bb": 3},
            ("payload.bb", "unknown field"),
        ),
        (
            "message.created",
            {"thread_id": "t", "message_id": "m", "thread_seq": 0, "author_id": "a b"},
            ("payload.thread_seq", "too small"),
        ),
        (
            "hint.requested",
            {"recipients": ["a", "b c"], "actor_id": "x y", "category": "c", "kind": "k"},
            ("payload.recipients[1]", "does not have the required form"),
        ),
        (
            "thread.read",
            {"user_id": "a", "thread_id": "t\n", "seq": 1},
            ("payload.thread_id", "does not have the required form"),
        ),
        (
            "thread.read",
            {"user_id": "a", "thread_id": "t", "seq": 2**64},
            ("payload.seq", "too large"),
        ),
        ("thread.read", {"user_id": "a", "thread_id": "t", "seq": 4.0}, None),
        (
            "user.upserted",
            {"user_id": "a", "kind": "human", "active": 1},
            ("payload.active", "expected a boolean"),
        ),
        (
            "hint.requested",
            {"recipients": [], "category": "c", "kind": "a:b"},
            ("payload.recipients", "too few items"),
        ),
        (
            "message.created",
            {"thread_id": "t", "message_id": "m", "thread_seq": 1, "author_id": "a"}
            | {"mentions": ["u"] * 1001},
            ("payload.mentions", "too many items"),
        ),
        (
            "thread.upserted",
            {"thread_id": "t", "unread_floor_seq": 2**53},
            ("payload.unread_floor_seq", "too large"),
        ),
        (
            "envelope.published",
            {"topic": "AAECAwQFBgcICQoLDA0ODxA=", "kind": "commit", "should_push": False}
            | {"data": _b64(65_537)},
            ("payload.data", "too long"),
        ),
        (
            "envelope.published",
            {"topic": "AAECAwQFBgcICQoLDA0ODxA=", "kind": "commit", "should_push": False}
            | {"data": _b64(65_536)},
            None,
        ),
        (
            "test.nested",
            {"groups": [{"name": "here", "seqs": [1], "note": "a"}]},
            ("payload.groups[0].note", "too short"),
        ),
        ("test.nested", {"groups": [{"name": "all", "seqs": [1, 2.0, 3]}]}, None),
        (
            "test.nested",
            {"groups": [{"name": "all", "seqs": [1, 2.5]}]},
            ("payload.groups[0].seqs[1]", "expected an integer"),
        ),
        (
            "test.nested",
            {"groups": [{"name": 1, "seqs": []}]},
            ("payload.groups[0].name", "not one of the allowed values"),
        ),
    ],
)
def test_cases_worth_naming(
    sql: psycopg.Connection[Any], name: str, payload: Any, answer: tuple[str, str] | None
) -> None:
    refusal = agree(sql, name, payload)
    if answer is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert (refusal.field(), refusal.problem.value) == answer


def test_an_integer_field_is_stored_without_its_fraction(sql: psycopg.Connection[Any]) -> None:
    stored = sql_answer(sql, "test.nested", {"groups": [{"name": "here", "seqs": [7.0, -0.0]}]})
    assert stored == ("ok", {"groups": [{"name": "here", "seqs": [7, 0]}]})
    (text,) = sql.execute(
        "SELECT bothy.checked_event('thread.read', %s::jsonb)::text",
        ('{"user_id": "a", "thread_id": "t", "seq": 8487.000}',),
    ).fetchone() or ("",)
    assert text == '{"seq": 8487, "user_id": "a", "thread_id": "t"}'


def test_the_api_names_the_field_under_its_event(sql: psycopg.Connection[Any]) -> None:
    with pytest.raises(EventRejected) as refused:
        EventValidator().check(
            "thread.read", {"user_id": "a", "thread_id": "t", "seq": -1}, where="events[2]."
        )
    assert (refused.value.field, refused.value.problem) == ("events[2].payload.seq", "too small")
    with pytest.raises(EventRejected) as unknown:
        EventValidator().check("no.such", {}, where="events[0].")
    assert (unknown.value.field, unknown.value.problem) == ("events[0].type", "unknown event type")
    assert sql_answer(sql, "no.such", {}) == ("type", "unknown event type")


def test_a_refusal_never_echoes_a_value(sql: psycopg.Connection[Any]) -> None:
    secret = "tok_4f9a8b7c6d5e"
    payload = {"user_id": "a", "scope_id": "s", secret: secret.upper()}
    refusal = CHECKS["member.added"](payload)
    assert refusal is not None and secret not in refusal.field()
    assert sql_answer(sql, "member.added", payload) == ("payload", "unknown field")
    bad_value = {"user_id": secret + " x", "scope_id": "s"}
    assert sql_answer(sql, "member.added", bad_value) == (
        "payload.user_id",
        "does not have the required form",
    )


# ---------------------------------------------------------------- the generated migration


def test_the_newest_generated_migration_is_what_the_schemas_give_now() -> None:
    latest = eventsql.latest_generated()
    assert latest is not None
    assert latest[1] == eventsql.migration_text(), (
        f"{latest[0]} is stale: run `make schemas` (it writes a new generated migration)"
    )


def test_the_generated_migration_runs_again_and_migrate_twice_applies_nothing(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        assert migrate(conn).applied == ()
        with conn.transaction():  # what a later generated migration does: replace it all
            conn.execute(eventsql.migration_text().encode())
        conn.execute(
            'SELECT bothy.append_event(\'member.added\', \'{"user_id": "a", "scope_id": "s"}\')'
        )
        names = {
            row[0]
            for row in conn.execute(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'bothy'::regnamespace"
            )
        }
        assert {"checked_event", "append_event"} <= names
        assert not names & {"validate_json", "integral_json"}
        assert conn.execute("SELECT to_regclass('bothy.event_types')").fetchone() == (None,)


def test_migrations_apply_in_order_on_an_empty_database(pg_url: str) -> None:
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(make_conninfo(pg_url, dbname=name)) as conn:
            first = migrate(conn)
            assert list(first.applied) == sorted(first.applied)
            assert "0023_event_checks" in first.applied
            assert migrate(conn).applied == ()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ---------------------------------------------------------------- the subset


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "email"},
        {"type": ["string", "null"]},
        {"type": "integer", "minimum": 0.5},
        {"type": "string", "minimum": 1},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"Bad-Name": {}}},
        {"enum": [1, True]},
        {"type": "string", "pattern": "^a.b$"},
        {"type": "string", "pattern": "^\\d+$"},
        {"type": "string", "pattern": "^(?=a)"},
        {"type": "string", "pattern": "^a{1,256}$"},
        {"type": "string", "pattern": "^[]a]$"},
    ],
)
def test_a_schema_outside_the_subset_is_refused_when_read(schema: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedSchema):
        read(schema)
    with pytest.raises(UnsupportedSchema):
        eventsql.function_text({"x.y": schema})


def test_every_pattern_of_the_files_is_in_the_subset_and_anchors_at_the_very_end() -> None:
    assert python_pattern("^[a-z$]{1,3}$") == "^[a-z$]{1,3}\\Z"
    assert python_pattern("^a\\$|b$") == "^a\\$|b\\Z"
    for schema in SCHEMAS.values():
        for prop in schema["properties"].values():
            for pattern in (prop.get("pattern"), prop.get("items", {}).get("pattern")):
                if pattern is not None:
                    assert check_pattern(pattern) == pattern
    ids = compile_schema({"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"})
    assert ids("ok") is None
    refused = ids("ok\n")
    assert refused is not None and refused.problem is Problem.WRONG_FORM


def test_every_event_type_has_a_branch_in_the_sql() -> None:
    text = eventsql.function_text(SCHEMAS)
    for name in SCHEMAS:
        assert f"WHEN '{name}' THEN" in text
