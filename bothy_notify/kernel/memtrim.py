"""Giving the C allocator's free memory back to the system, once a minute.

Objects of CPython's own small-object pools come and go in arenas it frees
itself, but larger blocks, and everything libpq, OpenSSL and the other C
libraries allocate, come from the C library's ``malloc``. glibc keeps memory
freed in the middle of a heap (one heap per arena, and worker threads get
arenas of their own) instead of returning it, so a node that runs for days
drifts up in RSS while what is alive stays the same. ``malloc_trim(0)`` hands
the free pages of every arena back (``MADV_DONTNEED``). A node calls it every
:data:`TRIM_EVERY` seconds, in a worker thread: it takes each arena's lock for
a moment and never the GIL (ctypes releases it).

Where the C library has no ``malloc_trim`` (musl, macOS) nothing is done.
``BOTHY_NOTIFY_MALLOC_TRIM=off`` turns it off (a diagnostic, to compare;
``docs/operations.md``, "Memory diagnostics").
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping

import trio

ENV = "BOTHY_NOTIFY_MALLOC_TRIM"
TRIM_EVERY = 60.0
"""Seconds between two trims: often enough that freed memory does not pile up for
long, rare enough that the arena locks it takes are never felt."""


def malloc_trim() -> Callable[[], int] | None:
    """The C library's ``malloc_trim(0)`` as a call, or ``None`` where there is none."""
    try:
        libc = ctypes.CDLL(None)  # the C library this process already uses
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def call() -> int:
        return int(trim(0))

    return call


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``BOTHY_NOTIFY_MALLOC_TRIM`` says ``off`` (or ``0``, ``false``, ``no``)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    return value not in ("off", "0", "false", "no")


async def trim_periodically(
    trim: Callable[[], int], every: float = TRIM_EVERY, *, task_status: trio.TaskStatus[None]
) -> None:
    """Call ``trim`` every ``every`` seconds in a worker thread, until cancelled
    (cancellation waits for a trim in progress: it takes milliseconds)."""
    task_status.started()
    while True:
        await trio.sleep(every)
        await trio.to_thread.run_sync(trim)
