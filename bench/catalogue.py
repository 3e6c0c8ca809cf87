"""Benchmark: what following ``notify.kinds_dir`` costs per refresh.

Builds a kinds directory of P publishers x A apps x F files (K kinds each) in a
temporary directory and times, per call:

- ``refresh`` with nothing changed and every file settled (older than the racy
  window): what each ``GET /v1/catalogue``, consumer round and flush batch pays
  in the steady state (directory listings and stats, no file read);
- ``refresh`` right after every file was written (inside the racy window):
  every app is read and hashed again, nothing parsed when the bytes are equal;
- ``refresh`` after one file's content changed: one app read and parsed, the
  catalogue rebuilt;
- a full read of every file with parsing and a new catalogue: what "read per
  request" without stamps would cost;
- ``current()``: what a caller pays between refreshes.

No database. Usage: .venv/bin/python bench/catalogue.py [--publishers P] [--apps A]
[--files F] [--kinds K] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, report
from bothy_notify.config import structure_config
from bothy_notify.notify.catalogue import Catalogue, base_entries, categories_of
from bothy_notify.notify.kinds_dir import LiveCatalogue, read_app, scan

SETTLED_NS = 1_000_000_000
"""An mtime (2001) far outside the racy window, so files count as settled."""


def build(root: Path, publishers: int, apps: int, files: int, kinds: int) -> list[Path]:
    written: list[Path] = []
    for p in range(publishers):
        for a in range(apps):
            app = root / f"pub{p}" / f"app{a}"
            app.mkdir(parents=True)
            for f in range(files):
                lines = []
                for k in range(kinds):
                    lines.append(
                        f'["kind{f}_{k}"]\ncategory = "social"\n'
                        f'template = "{{count}} things {k}"\nlink = "app://x/{{target_id}}"\n'
                    )
                path = app / f"kinds{f}.toml"
                path.write_text("".join(lines), encoding="utf-8")
                written.append(path)
    return written


def per_call_us(fn: Callable[[], object], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--apps", type=int, default=2)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--kinds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bothy-bench-kinds-") as tmp:
        root = Path(tmp)
        files = build(root, args.publishers, args.apps, args.files, args.kinds)
        config = structure_config(
            {"notify": {"categories": ["social"], "kinds_dir": str(root)}}, env={}
        )
        notify = config.notify

        live = LiveCatalogue(notify)
        racy_us = per_call_us(live.refresh, max(1, args.rounds // 10))

        for path in files:
            os.utime(path, ns=(SETTLED_NS, SETTLED_NS))
        live = LiveCatalogue(notify)
        unchanged_us = per_call_us(live.refresh, args.rounds)
        current_ns = per_call_us(live.current, args.rounds * 50) * 1000

        one = files[0]
        original = one.read_text(encoding="utf-8")
        flip = [original.replace("things", "thingz"), original]
        stamp = [SETTLED_NS]

        def change_one_and_refresh() -> None:
            one.write_text(flip[0], encoding="utf-8")
            flip.reverse()
            stamp[0] += 1
            os.utime(one, ns=(stamp[0], stamp[0]))
            live.refresh()

        changed_us = per_call_us(change_one_and_refresh, max(1, args.rounds // 10))

        categories = categories_of(notify)
        base = base_entries(notify)

        def full_read() -> None:
            entries = dict(base)
            for namespace, stamps in scan(root).apps.items():
                read = read_app(root, namespace, stamps, categories)
                entries.update((e.kind, e) for e in read.entries)
            Catalogue.of(entries.values())

        full_us = per_call_us(full_read, max(1, args.rounds // 10))
        kinds_total = len(live.current().entries)

    print(
        f"{args.publishers * args.apps} apps, {len(files)} files, {kinds_total} kinds:\n"
        f"  refresh, nothing changed (settled):   {unchanged_us:10.1f} us\n"
        f"  refresh, every file inside racy window: {racy_us:8.1f} us\n"
        f"  refresh after one file changed:         {changed_us:8.1f} us\n"
        f"  full read + parse of every file:        {full_us:8.1f} us\n"
        f"  current():                              {current_ns:8.1f} ns"
    )
    report(
        "catalogue",
        apps=args.publishers * args.apps,
        files=len(files),
        kinds=kinds_total,
        refresh_unchanged_us=round(unchanged_us, 1),
        refresh_racy_us=round(racy_us, 1),
        refresh_one_changed_us=round(changed_us, 1),
        full_read_us=round(full_us, 1),
        current_ns=round(current_ns, 1),
        machine=machine(),
    )


if __name__ == "__main__":
    main()
