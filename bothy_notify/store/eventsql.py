"""The event schemas written as SQL: the check of ``bothy.append_event``, in a migration.

Producers may append in their own transaction with ``SELECT
bothy.append_event(type, payload)`` (the outbox path): no Python runs there, so
the database checks the payload itself. This module writes that check from the
same tree as the Python one (:mod:`bothy_notify.store.eventschema`): one
PL/pgSQL function, ``bothy.checked_event(type, payload)``, with one branch per
event type and straight-line code per field, which raises SQLSTATE 22023 with
``bothy: <field>: <problem>`` (the Python checker's words, never a value) or
returns the payload with every integer field written without a fraction
(``8487.0`` is stored as ``8487``).

The function lives in a migration, generated, never edited by hand:
``python -m bothy_notify.store.eventsql`` (``make schemas``) writes a new
``NNNN_event_checks.sql`` with the next free number when the newest one differs
from what the schemas give now, and ``tests/store/test_event_checks.py`` fails
until it has been run. Migrations only move forward, so a node running older code
never takes a newer type's check away (each ``migrate`` used to write every
schema into ``bothy.event_types`` again, so an older node's start undid a newer
schema until the next newer node's start).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bothy_notify import resources
from bothy_notify.store.eventschema import (
    EXPECTED,
    NAMEABLE_MEMBER,
    Node,
    Problem,
    read,
)
from bothy_notify.store.migrate import migration_files

SUFFIX: Final = "_event_checks.sql"
"""The name of a generated migration ends so: ``0023_event_checks.sql``."""

MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
"""Where ``main`` writes (the source tree: a developer's command)."""


def literal(text: str) -> str:
    """``text`` as an SQL string constant, read alike whatever
    ``standard_conforming_strings`` is."""
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot hold NUL")
    quoted = text.replace("'", "''")
    if "\\" in quoted:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return f"'{quoted}'"


@dataclass(frozen=True, slots=True)
class _Field:
    """Where a value is: its key and index steps from the payload (an index is the
    loop variable ``i<depth>``, an ``int`` here)."""

    steps: tuple[str | int, ...] = ()

    def key(self, name: str) -> _Field:
        return _Field((*self.steps, name))

    def index(self, depth: int) -> _Field:
        return _Field((*self.steps, depth))

    def message(self, problem: Problem, member: str | None = None) -> str:
        """The SQL expression of ``bothy: <field>: <problem>``; ``member``: an SQL
        expression for one more key step (an unknown member's name)."""
        parts: list[str] = []
        text = "bothy: payload"
        for step in self.steps:
            if isinstance(step, int):
                parts += [literal(text + "["), f"i{step}"]
                text = "]"
            else:
                text += f".{step}"
        if member is not None:
            parts += [literal(text + "."), member]
            text = ""
        parts.append(literal(f"{text}: {problem.value}"))
        return " || ".join(parts)

    def array(self) -> str:
        """The path as ``jsonb_set`` takes it."""
        items = [f"i{s}::text" if isinstance(s, int) else literal(s) for s in self.steps]
        return f"ARRAY[{', '.join(items)}]"


def _raise(field: _Field, problem: Problem, member: str | None = None) -> str:
    return f"RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = {field.message(problem, member)};"


class _Writer:
    """PL/pgSQL lines for a node, the value in variable ``v<depth>``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0  # the deepest v<depth> used
        self.loops = 0  # the deepest i<depth> used

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def check(self, indent: int, node: Node, value: str, depth: int, field: _Field) -> None:
        self.depth = max(self.depth, depth)
        kind = node.type
        if kind is not None:
            json_type = "number" if kind == "integer" else kind
            self.emit(indent, f"IF jsonb_typeof({value}) IS DISTINCT FROM '{json_type}' THEN")
            self.emit(indent + 1, _raise(field, EXPECTED[kind]))
            self.emit(indent, "END IF;")
        if kind == "object":
            self._object(indent, node, value, depth, field)
        elif kind == "array":
            self._array(indent, node, value, depth, field)
        elif kind == "string" or (kind is None and node.enum is not None):
            self._string(indent, node, value, field)
        elif kind in ("integer", "number"):
            self._number(indent, node, value, field)

    def _object(self, indent: int, node: Node, value: str, depth: int, field: _Field) -> None:
        for name in node.required:
            self.emit(indent, f"IF NOT {value} ? {literal(name)} THEN")
            self.emit(indent + 1, _raise(field.key(name), Problem.REQUIRED))
            self.emit(indent, "END IF;")
        if node.closed:
            names = ", ".join(literal(name) for name, _ in node.properties)
            rest = f"({value} - ARRAY[{names}]::text[])"
            self.emit(indent, f"IF {rest} <> '{{}}'::jsonb THEN")
            self.emit(
                indent + 1,
                f'SELECT min(m COLLATE "C") FILTER (WHERE m ~ {literal(NAMEABLE_MEMBER)})'
                f" INTO k FROM jsonb_object_keys{rest} AS m;",
            )
            self.emit(indent + 1, "IF k IS NULL THEN")
            self.emit(indent + 2, _raise(field, Problem.UNKNOWN_FIELD))
            self.emit(indent + 1, "END IF;")
            self.emit(indent + 1, _raise(field, Problem.UNKNOWN_FIELD, member="k"))
            self.emit(indent, "END IF;")
        for name, sub in node.properties:
            if not sub.judges:
                continue
            inner = f"v{depth + 1}"
            if name in node.required:  # present: checked above
                self.emit(indent, f"{inner} := {value} -> {literal(name)};")
                self.check(indent, sub, inner, depth + 1, field.key(name))
                continue
            self.emit(indent, f"IF {value} ? {literal(name)} THEN")
            self.emit(indent + 1, f"{inner} := {value} -> {literal(name)};")
            self.check(indent + 1, sub, inner, depth + 1, field.key(name))
            self.emit(indent, "END IF;")

    def _array(self, indent: int, node: Node, value: str, depth: int, field: _Field) -> None:
        if node.min_items is not None:
            self.emit(indent, f"IF jsonb_array_length({value}) < {node.min_items} THEN")
            self.emit(indent + 1, _raise(field, Problem.TOO_FEW_ITEMS))
            self.emit(indent, "END IF;")
        if node.max_items is not None:
            self.emit(indent, f"IF jsonb_array_length({value}) > {node.max_items} THEN")
            self.emit(indent + 1, _raise(field, Problem.TOO_MANY_ITEMS))
            self.emit(indent, "END IF;")
        if node.items is not None and node.items.judges:
            inner, counter = f"v{depth + 1}", f"i{depth + 1}"
            self.loops = max(self.loops, depth + 1)
            self.emit(indent, f"{counter} := 0;")
            self.emit(indent, f"FOR {inner} IN SELECT jsonb_array_elements({value}) LOOP")
            self.check(indent + 1, node.items, inner, depth + 1, field.index(depth + 1))
            self.emit(indent + 1, f"{counter} := {counter} + 1;")
            self.emit(indent, "END LOOP;")

    def _string(self, indent: int, node: Node, value: str, field: _Field) -> None:
        if node.type is None:  # an enum alone: a value of another type is not allowed
            self.emit(indent, f"IF jsonb_typeof({value}) IS DISTINCT FROM 'string' THEN")
            self.emit(indent + 1, _raise(field, Problem.NOT_ALLOWED))
            self.emit(indent, "END IF;")
        self.emit(indent, f"t := {value} #>> '{{}}';")
        tests: list[tuple[str, Problem]] = []
        if node.enum is not None:
            options = ", ".join(literal(option) for option in node.enum)
            tests.append((f"t NOT IN ({options})", Problem.NOT_ALLOWED))
        if node.min_length is not None:
            tests.append((f"length(t) < {node.min_length}", Problem.TOO_SHORT))
        if node.max_length is not None:
            tests.append((f"length(t) > {node.max_length}", Problem.TOO_LONG))
        if node.pattern is not None:
            tests.append((_pattern_test(node.pattern), Problem.WRONG_FORM))
        if node.max_decoded_bytes is not None:
            # Standard base64 (its form checked by the pattern): 3 bytes per 4
            # characters, less one per trailing '='.
            tests.append(
                (
                    "length(t) / 4 * 3 - (length(t) - length(rtrim(t, '=')))"
                    f" > {node.max_decoded_bytes}",
                    Problem.TOO_LONG,
                )
            )
        for condition, problem in tests:
            self.emit(indent, f"IF {condition} THEN")
            self.emit(indent + 1, _raise(field, problem))
            self.emit(indent, "END IF;")

    def _number(self, indent: int, node: Node, value: str, field: _Field) -> None:
        self.emit(indent, f"n := {value}::numeric;")
        if node.type == "integer":
            self.emit(indent, "IF n <> trunc(n) THEN")
            self.emit(indent + 1, _raise(field, Problem.EXPECTED_INTEGER))
            self.emit(indent, "END IF;")
        if node.minimum is not None:
            self.emit(indent, f"IF n < {node.minimum} THEN")
            self.emit(indent + 1, _raise(field, Problem.TOO_SMALL))
            self.emit(indent, "END IF;")
        if node.maximum is not None:
            self.emit(indent, f"IF n > {node.maximum} THEN")
            self.emit(indent + 1, _raise(field, Problem.TOO_LARGE))
            self.emit(indent, "END IF;")
        if node.type == "integer":
            # jsonb keeps the text's scale (8487.0); the stored integer has none.
            self.emit(indent, "IF scale(n) > 0 THEN")
            if field.steps:
                self.emit(indent + 1, f"p_payload := jsonb_set(p_payload, {field.array()},")
                self.emit(indent + 1, "                       to_jsonb(trunc(n)));")
            else:
                self.emit(indent + 1, "p_payload := to_jsonb(trunc(n));")
            self.emit(indent, "END IF;")


_ATOM: Final = r"(?:\[(?:[^\]\\]|\\.)+\]|\\.|[^\\\[\](){}|*+?^$.])"
"""One character of a pattern: a class, an escaped character or a plain one."""
_ATOMS_THEN_REPEAT: Final = re.compile(rf"\^({_ATOM}*)({_ATOM})\{{(\d+),(\d+)\}}\$")
"""``^ABC{m,n}$``: single characters, then one repeated m to n times (an ID's form)."""


def _pattern_test(pattern: str) -> str:
    """The SQL condition under which ``t`` fails ``pattern``.

    PostgreSQL expands a bounded repeat into as many copies of its automaton:
    matching ``^[A-Za-z0-9._:-]{1,128}$`` costs several times
    ``^[A-Za-z0-9._:-]*$``. A pattern of k single characters and then one
    repeated m to n times is the same test as a length from k + m to k + n and
    the last one repeated any number of times.
    """
    whole = _ATOMS_THEN_REPEAT.fullmatch(pattern)
    if whole is None:
        return f"t !~ {literal(pattern)}"
    prefix, atom, low, high = whole[1], whole[2], int(whole[3]), int(whole[4])
    k = len(re.findall(_ATOM, prefix))
    relaxed = literal(f"^{prefix}{atom}*$")
    return f"(length(t) NOT BETWEEN {k + low} AND {k + high} OR t !~ {relaxed})"


def function_text(schemas: Mapping[str, Mapping[str, Any]]) -> str:
    """``CREATE OR REPLACE FUNCTION bothy.checked_event`` for ``schemas`` (by type name)."""
    writer = _Writer()
    writer.emit(1, "CASE p_type")
    for name in sorted(schemas):
        writer.emit(1, f"WHEN {literal(name)} THEN")
        writer.emit(2, "v0 := p_payload;")
        writer.check(2, read(schemas[name]), "v0", 0, _Field())
    writer.emit(1, "ELSE")
    writer.emit(
        2, "RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'bothy: type: unknown event type';"
    )
    writer.emit(1, "END CASE;")
    writer.emit(1, "RETURN p_payload;")
    declare = [f"    v{d} jsonb;" for d in range(writer.depth + 1)]
    declare += [f"    i{d} integer;" for d in range(1, writer.loops + 1)]
    declare += ["    t text;", "    n numeric;", "    k text;"]
    return "\n".join(
        [
            "CREATE OR REPLACE FUNCTION bothy.checked_event(p_type text, p_payload jsonb)"
            " RETURNS jsonb",
            "LANGUAGE plpgsql IMMUTABLE AS $check$",
            "DECLARE",
            *declare,
            "BEGIN",
            *writer.lines,
            "END",
            "$check$;",
        ]
    )


_HEADER: Final = """\
-- GENERATED by `python -m bothy_notify.store.eventsql` (`make schemas`) from
-- schemas/events/*.json: do not edit. A schema change is a new generated
-- migration; tests/store/test_event_checks.py fails until it is written.
--
-- bothy.checked_event(type, payload): the payload checked against its type's
-- schema, in the order the Python checker uses (bothy_notify/store/eventschema.py),
-- raising SQLSTATE 22023 with 'bothy: <field>: <problem>' (never a value); else
-- the payload with every integer field written without a fraction (8487.0 -> 8487).
"""

_APPEND: Final = """\
-- The producer's way in (outbox): call it inside your own transaction. Checks
-- the payload (bothy.checked_event), inserts, and wakes the consumer round at
-- commit. Raises SQLSTATE 22023 with 'bothy: ...' for a refused event.
CREATE OR REPLACE FUNCTION bothy.append_event(p_type text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $append$
DECLARE
    new_seq bigint;
BEGIN
    INSERT INTO bothy.events (type, payload) VALUES (p_type, bothy.checked_event(p_type, p_payload))
        RETURNING seq INTO new_seq;
    PERFORM pg_notify('bothy_events', '');
    RETURN new_seq;
END
$append$;
"""

_RETIRED: Final = """\
-- What checked events before 0023: a schema interpreter reading bothy.event_types.
DROP FUNCTION IF EXISTS bothy.validate_json(jsonb, jsonb, text);
DROP FUNCTION IF EXISTS bothy.integral_json(jsonb, jsonb);
DROP TABLE IF EXISTS bothy.event_types;
"""


def migration_text(schemas: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The whole generated migration for ``schemas`` (by default ``schemas/events``)."""
    schemas = resources.event_schemas() if schemas is None else schemas
    types = ", ".join(sorted(schemas))
    listed = "\n".join(f"-- {line}" for line in _wrap(f"Event types: {types}."))
    return f"{_HEADER}{listed}\n\n{function_text(schemas)}\n\n{_APPEND}\n{_RETIRED}"


def _wrap(text: str, width: int = 80) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


_NUMBERED: Final = re.compile(r"(\d{4})_.*\.sql")


def latest_generated() -> tuple[str, str] | None:
    """The newest generated migration as (file name, text), or ``None``."""
    generated = [item for item in migration_files() if item.name.endswith(SUFFIX)]
    if not generated:
        return None
    newest = generated[-1]
    return newest.name, newest.read_text(encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bothy_notify.store.eventsql [--check]``: write a new generated
    migration (the next free number) when the newest one is stale; ``--check`` only
    says so, with exit status 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = migration_text()
    latest = latest_generated()
    if latest is not None and latest[1] == text:
        print(f"{latest[0]} is current")
        return 0
    if "--check" in args:
        print("the event checks are stale: run `make schemas`")
        return 1
    numbers = [int(m[1]) for p in MIGRATIONS_DIR.iterdir() if (m := _NUMBERED.fullmatch(p.name))]
    path = MIGRATIONS_DIR / f"{max(numbers, default=0) + 1:04d}{SUFFIX}"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
