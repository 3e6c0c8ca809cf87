"""The running configuration of one node, behind one handle.

A node loads its configuration at start; a reload (SIGHUP) loads it again and
applies the keys that can change while the node runs (:data:`RELOADABLE`).
There is one :class:`LiveConfig` per node (``Daemon.live``), and every
component that reads a reloadable key (the HTTP API, the consumer round and
its planner, the flush job, the admin replay) holds that handle and reads
:attr:`LiveConfig.current` when it uses a value, never a copy taken at start:
one assignment in :meth:`LiveConfig.swap` reaches all of them at once. A
component reading only keys that need a restart may keep its section, since
the handle never changes those while the node runs.

:func:`plan_reload` says what a reload does, as a value: the configuration to
run (the running one with the reloadable keys of the new one), the reloadable
keys that changed, and every other key that differs from the running
configuration, which takes effect at the next start (``restart_needed``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bothy_notify.config.keys import Config
from bothy_notify.config.load import changed_keys

RELOADABLE: tuple[str, ...] = ("log.level", "notify.kinds", "notify.categories")
"""The keys a reload applies (with every key under them, as ``notify.kinds.CODE.template``).
Adding one: the components that read it must read it through :class:`LiveConfig`
(or be told by ``Daemon.reload``, as the catalogue and the log level are)."""


def is_reloadable(key: str) -> bool:
    """Whether a reload applies ``key`` (a key path of :func:`changed_keys`)."""
    return any(key == r or key.startswith((r + ".", r + "[")) for r in RELOADABLE)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What a reload does.

    Attributes:
        config: the configuration to run: the running one with the reloadable keys
            of the new one.
        applied: the reloadable keys whose values change, in key order.
        restart_needed: every other key whose value differs between the running
            configuration and the new one, in key order; they take effect at the
            next start.
    """

    config: Config
    applied: tuple[str, ...]
    restart_needed: tuple[str, ...]


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    """Compare the running configuration with the one loaded again (pure).

    A secret compares by its reference (``env:NAME``, ``secret:NAME``), so a
    reference resolved at start and the same reference not resolved yet are
    equal.
    """
    changed = changed_keys(running, new)
    config = running
    for key in RELOADABLE:
        config = _with_key(config, new, key.split("."))
    return ReloadPlan(
        config=config,
        applied=tuple(k for k in changed if is_reloadable(k)),
        restart_needed=tuple(k for k in changed if not is_reloadable(k)),
    )


def _with_key(running: Any, new: Any, path: list[str]) -> Any:
    """``running`` with the value of ``new`` at ``path`` (sections are dataclasses)."""
    head, rest = path[0], path[1:]
    value = (
        getattr(new, head)
        if not rest
        else _with_key(getattr(running, head), getattr(new, head), rest)
    )
    return replace(running, **{head: value})


class LiveConfig:
    """The node's running configuration; :attr:`current` is read at each use.

    Thread-safe: :meth:`swap` is one attribute assignment, so a reader in any
    thread sees the configuration before or after it, never a mix. A reader that
    needs several values to agree (a round's batch) reads :attr:`current` once
    and keeps that value for the batch.
    """

    __slots__ = ("_current",)

    def __init__(self, config: Config) -> None:
        self._current = config

    def __repr__(self) -> str:
        return f"LiveConfig(role={self._current.server.role.value!r})"

    @property
    def current(self) -> Config:
        """The configuration in use now."""
        return self._current

    def swap(self, config: Config) -> Config:
        """Put ``config`` in use (the start's resolved secrets, a reload's
        :attr:`ReloadPlan.config`); returns the one it replaces."""
        before, self._current = self._current, config
        return before
