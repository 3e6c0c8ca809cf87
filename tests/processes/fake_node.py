"""A stand-in for a node process that speaks the parent's control channel with the
daemon's own child end (:func:`bothy_notify.processes.control.supervised_child`).

Usage: ``python tests/processes/fake_node.py BEHAVIOUR RECORD_FILE``. Every event
is appended to RECORD_FILE as ``<ordinal> <event>`` (``spec``, ``drain``, ``stop``,
``exit``; the end of the channel counts as ``drain``), one line each, so a test
can read what each child saw.

Behaviours:

- ``serve``: ``ready``, then exits 0 on ``drain``, ``stop`` or the end of the channel.
- ``stubborn``: ``ready``, ignores ``drain``; exits 0 on ``stop``.
- ``deaf``: ``ready``, ignores ``drain`` and ``stop`` (it has to be killed).
- ``fail:N``: exits with status N without saying ``ready``.
- ``fail-first:N``: like ``fail:N`` for ordinal 1's first start (RECORD_FILE has no
  ``1 spec`` line before this one), ``serve`` otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from bothy_notify.processes.control import ParentChannel, supervised_child


def record(path: Path, ordinal: int, event: str) -> None:
    with path.open("a", encoding="ascii") as out:
        out.write(f"{ordinal} {event}\n")


async def serve(channel: ParentChannel, behaviour: str, path: Path) -> None:
    ordinal = channel.spec.ordinal
    await channel.ready()
    done = trio.Event()
    stops = 0

    def drain() -> None:
        record(path, ordinal, "drain")
        if behaviour == "serve":
            done.set()

    def stop() -> None:
        nonlocal stops
        stops += 1
        record(path, ordinal, "stop")
        if behaviour != "deaf":
            done.set()

    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await channel.watch(drain=drain, stop=stop)

        nursery.start_soon(watch)
        await done.wait()
        nursery.cancel_scope.cancel()


def main() -> int:
    behaviour, path = sys.argv[1], Path(sys.argv[2])
    channel = supervised_child()
    assert channel is not None, "started without a control channel"
    ordinal = channel.spec.ordinal
    earlier = path.read_text(encoding="ascii").splitlines() if path.exists() else []
    record(path, ordinal, "spec")
    if behaviour.startswith("fail-first:"):
        first = ordinal == 1 and "1 spec" not in earlier
        behaviour = f"fail:{behaviour.split(':')[1]}" if first else "serve"
    if behaviour.startswith("fail:"):
        record(path, ordinal, "exit")
        return int(behaviour.split(":")[1])
    trio.run(serve, channel, behaviour, path)
    record(path, ordinal, "exit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
