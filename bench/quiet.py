"""Benchmark: one evaluation of a person's quiet hours, on the pure functions (issue 30).

For each schedule, the CPU of ``quiet_at`` (the yes/no the round asks per
recipient) and of ``quiet_until`` (the end, which a held push and the summary
need), against the implementation before issue 30 (kept, as the specification,
in ``testkit/quiet.py``), alternated in one run:

- ``dst14``: 14 back-to-back entries every day in Europe/Berlin (quiet all the
  time), evaluated on the day Berlin springs forward, an ordinary day and the
  night it falls back (in the repeated hour's second pass);
- ``night``: one entry 22:00-07:00 on weekdays, evaluated at 23:00 (quiet);
- ``none``: the same entry evaluated at noon (not quiet).

Prints microseconds per evaluation and the old/new ratio of each, and a last JSON
line.

Usage: .venv/bin/python bench/quiet.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from datetime import time as wall
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, report
from bothy_notify.notify.domain.quiet import (
    QuietEntry,
    QuietHours,
    quiet_at,
    quiet_until,
)
from testkit.quiet import ALL_DAY, old_quiet_until

WEEKDAYS = frozenset({"mon", "tue", "wed", "thu", "fri"})
NIGHT = QuietHours("Europe/Berlin", (QuietEntry(WEEKDAYS, wall(22), wall(7)),))
DST14 = QuietHours("Europe/Berlin", ALL_DAY)
CASES: dict[str, tuple[QuietHours, datetime]] = {
    "dst14 spring": (DST14, datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    "dst14 summer": (DST14, datetime(2026, 6, 10, 12, 0, tzinfo=UTC)),
    "dst14 fall back": (DST14, datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),
    "night": (NIGHT, datetime(2026, 6, 10, 21, 0, tzinfo=UTC)),
    "none": (NIGHT, datetime(2026, 6, 10, 10, 0, tzinfo=UTC)),
}


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    """CPU microseconds per call of ``fn``, the best of three timings of ``repeat`` calls."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, time.process_time() - started)
    return best * 1e6 / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="calls per timing (old code)")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    for name, (hours, now) in CASES.items():
        assert quiet_until(hours, now) == old_quiet_until(hours, now), name
        old = per_call_us(partial(old_quiet_until, hours, now), args.repeat)
        yes_no = per_call_us(partial(quiet_at, hours, now), args.repeat * 50)
        until = per_call_us(partial(quiet_until, hours, now), args.repeat * 5)
        figures[name] = {"old_us": old, "quiet_at_us": yes_no, "quiet_until_us": until}
        print(
            f"{name:>16}: old {old:9.1f} us | quiet_at {yes_no:6.2f} us ({old / yes_no:,.0f}x)"
            f" | quiet_until {until:7.1f} us ({old / until:,.0f}x)"
        )
    print(f"machine: {machine()}")
    report(
        "quiet",
        **{
            f"{name.replace(' ', '_')}_{key}": round(value, 2)
            for name, values in figures.items()
            for key, value in values.items()
        },
        repeat=args.repeat,
    )


if __name__ == "__main__":
    main()
