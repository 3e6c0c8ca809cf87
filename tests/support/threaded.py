"""A protocol fake served by its own Trio run in a thread, for commands that run Trio
themselves (``push test``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import trio


class Servable(Protocol):
    async def serve(self, *, task_status: Any = ...) -> None: ...


F = TypeVar("F", bound=Servable)


@contextlib.contextmanager
def served_in_a_thread(make: Callable[[], F]) -> Iterator[F]:
    """``make()`` a fake inside the thread's Trio run, serve it, and yield it once it
    listens; it stops when the block ends."""
    ready, stop = threading.Event(), threading.Event()
    found: list[F] = []

    async def serve() -> None:
        fake = make()
        async with trio.open_nursery() as nursery:
            await nursery.start(fake.serve)
            found.append(fake)
            ready.set()
            while not stop.is_set():
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield found[0]
    finally:
        stop.set()
        thread.join(10)
