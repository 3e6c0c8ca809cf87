"""Giving the C allocator's free memory back (``kernel/memtrim.py``)."""

from __future__ import annotations

import platform

import pytest
import trio
import trio.testing

from bothy_notify.kernel import memtrim


@pytest.mark.parametrize(
    ("value", "wanted"),
    [(None, True), ("", True), ("on", True), ("off", False), ("0", False), (" NO ", False)],
)
def test_the_variable_turns_trimming_off(value: str | None, wanted: bool) -> None:
    environ = {} if value is None else {memtrim.ENV: value}
    assert memtrim.wanted(environ) is wanted


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_trims_its_free_pages() -> None:
    trim = memtrim.malloc_trim()
    assert trim is not None
    blocks = [bytearray(100_000) for _ in range(500)]  # below the mmap threshold: heap
    del blocks[::2]
    assert trim() in (0, 1)  # 1: memory was given back, 0: there was none to give


async def test_it_trims_once_a_period(autojump_clock: trio.testing.MockClock) -> None:
    # The trim runs in a worker thread: the clock jumps only once the loop has been idle
    # a moment, so a jump never overtakes a trim in progress.
    autojump_clock.autojump_threshold = 0.05
    calls: list[float] = []

    def trim() -> int:
        calls.append(0.0)
        return 0

    async with trio.open_nursery() as nursery:
        # Virtual time under the session's 60 s deadline: a period of 10 s stands for any.
        await nursery.start(memtrim.trim_periodically, trim, 10.0)
        await trio.sleep(10.0 * 3 + 1)
        nursery.cancel_scope.cancel()
    assert len(calls) == 3
