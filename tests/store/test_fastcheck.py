"""The compiled yes/no check of each event schema answers as ``jsonschema`` does,
for payloads near the schema (valid ones, each field broken in turn, junk)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bothy_notify.store.events import EventValidator, _Validator
from bothy_notify.store.fastcheck import compile_check
from bothy_notify.store.migrate import load_event_schemas

SCHEMAS = load_event_schemas()

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def valid(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema allows (mostly: a pattern's newline or a long text may not be)."""
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        return st.fixed_dictionaries(
            {k: near(props[k]) for k in required},
            optional={k: near(v) for k, v in props.items() if k not in required},
        )
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(near(schema.get("items", {})), min_size=low, max_size=low + 2)
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"])
        return st.text(max_size=schema.get("maxLength", 40))
    if kind == "integer":
        low, high = schema.get("minimum", -(2**53)), schema.get("maximum", 2**53)
        return st.integers(min_value=low, max_value=high) | st.sampled_from(
            [float(low), float(high)]
        )
    if kind == "boolean":
        return st.booleans()
    return JUNK


def off(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values just off the schema: out of range, extra or missing fields, junk."""
    options: list[st.SearchStrategy[Any]] = [JUNK]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        options.append(st.fixed_dictionaries({k: valid(props[k]) for k in required[1:]}))
        options.append(
            st.fixed_dictionaries({k: valid(props[k]) for k in required}, optional={"x": JUNK})
        )
    elif kind == "string":
        options.append(st.text(max_size=schema.get("maxLength", 130) + 2))
    elif kind == "integer":
        low, high = schema.get("minimum", -(2**53)), schema.get("maximum", 2**53)
        options.append(st.sampled_from([low - 1, high + 1, low - 0.5, high + 1.0, True]))
    return st.one_of(options)


def near(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly valid values (nine in ten), some just off."""
    good = valid(schema)
    return st.one_of(*[good] * 9, off(schema))


CASES = st.sampled_from(sorted(SCHEMAS)).flatmap(lambda n: st.tuples(st.just(n), near(SCHEMAS[n])))


@settings(max_examples=600, deadline=None)
@given(CASES)
def test_the_compiled_check_agrees_with_jsonschema(case: tuple[str, Any]) -> None:
    name, payload = case
    check = compile_check(SCHEMAS[name], _Validator.TYPE_CHECKER)
    assert check is not None, f"{name} is not compiled"
    expected = next(iter(_Validator(SCHEMAS[name]).iter_errors(payload)), None) is None
    assert check(payload) is expected


def test_a_valid_payload_passes_and_a_bad_one_still_names_its_field() -> None:
    validator = EventValidator()
    good = {"thread_id": "t1", "message_id": "m1", "thread_seq": 3, "author_id": "a"}
    validator.check("message.created", good)
    for bad, field in [
        ({**good, "thread_seq": 0}, "payload.thread_seq"),
        ({**good, "thread_id": "t 1"}, "payload.thread_id"),
        ({**good, "mentions": ["ok", "no way"]}, "payload.mentions[1]"),
        ({k: v for k, v in good.items() if k != "author_id"}, "payload.author_id"),
    ]:
        try:
            validator.check("message.created", bad)
        except Exception as exc:  # EventRejected
            assert getattr(exc, "field", None) == field
        else:
            raise AssertionError(f"{field}: accepted")


def test_a_schema_with_a_keyword_the_compiler_does_not_know_is_left_to_jsonschema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}
    assert compile_check(schema, _Validator.TYPE_CHECKER) is None
    assert compile_check({"enum": [1, True]}, _Validator.TYPE_CHECKER) is None
