"""Frozen dataclasses that are cheap to build, for values made once per recipient.

A frozen dataclass's generated ``__init__`` stores every field through
``object.__setattr__`` (its own ``__setattr__`` refuses), which costs several
times a store through the slots' own descriptors. The consumer round builds a few
such values per recipient (facts, routes, a delivery), so that difference showed
in the round's profile (``bench/decide.py``).

:func:`fast_init` gives a ``frozen=True, slots=True`` dataclass an ``__init__``
that stores each field through its slot descriptor. Everything else stays the
dataclass's own: assignment still raises ``FrozenInstanceError``, equality,
hashing, ``repr``, ``dataclasses.replace`` and ``fields`` are unchanged, and the
signature (names, order, defaults) is the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of the frozen, slotted dataclass ``cls``.

    Apply it above ``@dataclass(frozen=True, slots=True)``. Fields must be plain
    (no ``default_factory``, ``init=False`` or ``kw_only``) and the class must have
    no ``__post_init__``; anything else raises ``TypeError`` at import.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError("fast_init needs a dataclass with frozen=True and slots=True")
    if hasattr(cls, "__post_init__"):
        raise TypeError("fast_init does not run __post_init__")
    namespace: dict[str, Any] = {}
    arguments: list[str] = []
    stores: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"fast_init: field {f.name} is not a plain field")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            arguments.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            arguments.append(f"{f.name}=_default_{f.name}")
        stores.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(arguments)}):\n" + "\n".join(stores or ["    pass"])
    exec(source, namespace)  # noqa: S102 - the source is built from field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    type.__setattr__(cls, "__init__", init)
    return cls
