"""Benchmark: the store listener's wake path against the bare psycopg wait it replaced.

A producer process sends ``NOTIFY`` at ``--rate`` per second, each payload its
``time.monotonic()`` just before the statement (CLOCK_MONOTONIC is one clock for
every process of the machine). This process receives them in two ways, in
alternating phases of ``--phase`` seconds (``--rounds`` of each), only one
listening at a time:

- ``listener``: :class:`bothy_notify.store.listen.Listener` and
  ``Listening.wait_then(fn, 1.0)``, ``fn`` running in the thread that waited,
  as the consumer round does;
- ``bare``: what the round, the runner and the revocation listener each did
  before: ``trio.to_thread.run_sync`` of psycopg's ``conn.notifies(timeout=0.25,
  stop_after=1)`` on a dedicated connection behind a one-thread limiter,
  ``fn`` right after it in the same thread (the floor: psycopg's own wait).

Figures per variant: send -> ``fn`` latency (p50, p99, ms), this process's CPU
per wake (us; read from ``/proc``, the worker threads included), and, with the
producer paused for ``--idle`` seconds, CPU per second while idle (the 0.25 s
slices woke each waiting service four times a second; the listener's wait has
no slices). ``cpu_ratio`` = listener / bare CPU per wake.

Usage: .venv/bin/python bench/listen.py [--rate R] [--phase S] [--rounds N] [--idle S]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, process_cpu, report
from bothy_notify.store.db import Conn, connect_dedicated
from bothy_notify.store.listen import Listener, Listening, Notification, reconnect_backoff

CHANNEL = "bothy_bench_listen"
POLL = 1.0
"""The listener variant's ``at_most``: ``notify.poll_interval``'s default, as the round."""
OLD_SLICE = 0.25
"""The bare variant's slice: what each of the three loops waited at most per thread call."""


def produce(url: str, rate: float, ready: MpEvent, sending: MpEvent, stop: MpEvent) -> None:
    """The producer process: ``NOTIFY`` at ``rate`` per second while ``sending``."""
    with psycopg.connect(url, autocommit=True) as conn:
        ready.set()
        period = 1.0 / rate
        due = time.monotonic()
        while not stop.is_set():
            if not sending.wait(0.05):
                due = time.monotonic()
                continue
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, repr(time.monotonic())))
            due += period


class Phase:
    """What one phase measured."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.wakes = 0
        self.cpu = 0.0

    def record(self, notes: list[Notification]) -> None:
        now = time.monotonic()
        if notes:
            self.wakes += 1
        self.latencies.extend(now - float(n.payload) for n in notes)


async def listener_phase(url: str, seconds: float) -> Phase:
    phase = Phase()
    listener = Listener(url, (CHANNEL,), name="bench", reconnect=reconnect_backoff(POLL))

    def fn(_conn: Conn, notes: list[Notification]) -> None:
        phase.record(notes)

    async def serve(listening: Listening) -> None:
        await listening.listen()
        began = process_cpu()
        try:
            with trio.move_on_after(seconds):
                while True:
                    await listening.wait_then(fn, POLL)
        finally:
            phase.cpu = process_cpu() - began

    await listener.run(serve)
    return phase


async def bare_phase(url: str, seconds: float) -> Phase:
    phase = Phase()
    limiter = trio.CapacityLimiter(1)
    conn = await trio.to_thread.run_sync(connect_dedicated, url, limiter=limiter)

    def wait_and_fn() -> None:
        notes = conn.notifies(timeout=OLD_SLICE, stop_after=1)
        phase.record([Notification(n.channel, n.payload) for n in notes])

    try:
        await trio.to_thread.run_sync(conn.execute, f"LISTEN {CHANNEL}", limiter=limiter)
        began = process_cpu()
        with trio.move_on_after(seconds):
            while True:
                await trio.to_thread.run_sync(wait_and_fn, limiter=limiter)
        phase.cpu = process_cpu() - began
    finally:
        await trio.to_thread.run_sync(conn.close, limiter=limiter)
    return phase


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000 if values else 0.0


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    variants = {"listener": listener_phase, "bare": bare_phase}
    with bench_database() as url:
        ctx = multiprocessing.get_context("spawn")
        ready, sending, stop = ctx.Event(), ctx.Event(), ctx.Event()
        producer = ctx.Process(target=produce, args=(url, args.rate, ready, sending, stop))
        producer.start()
        try:
            # The first phase must not include the producer's start (imports, connection).
            await trio.to_thread.run_sync(ready.wait, 60)
            busy: dict[str, list[Phase]] = {name: [] for name in variants}
            idle: dict[str, list[Phase]] = {name: [] for name in variants}
            for n in range(args.rounds):
                order = list(variants.items())
                for name, run_phase in order if n % 2 == 0 else order[::-1]:  # ABBA...
                    sending.set()
                    busy[name].append(await run_phase(url, args.phase))
                    sending.clear()
                    await trio.sleep(0.1)  # the producer's last NOTIFY is gone
                    idle[name].append(await run_phase(url, args.idle))
        finally:
            stop.set()
            producer.join(10)
    figures: dict[str, float] = {}
    print(f"NOTIFY at {args.rate:.0f}/s, {args.rounds} alternated phases of {args.phase:.0f} s")
    for name in variants:
        lat = [x for p in busy[name] for x in p.latencies]
        wakes = sum(p.wakes for p in busy[name])
        cpu_per_wake = sum(p.cpu for p in busy[name]) / max(1, wakes) * 1e6
        idle_cpu = sum(p.cpu for p in idle[name]) / (args.idle * args.rounds) * 1000
        per_phase = [
            (round(pct(p.latencies, 0.5), 2), round(pct(p.latencies, 0.99), 1)) for p in busy[name]
        ]
        print(
            f"  {name:<8} {len(lat)} received in {wakes} wakes: p50 {pct(lat, 0.5):.3f} ms,"
            f" p99 {pct(lat, 0.99):.3f} ms (per phase p50, p99: {per_phase});"
            f" CPU {cpu_per_wake:.1f} us per wake; idle {idle_cpu:.2f} ms CPU per s"
        )
        figures[f"{name}_p50_ms"] = round(pct(lat, 0.5), 3)
        figures[f"{name}_p99_ms"] = round(pct(lat, 0.99), 3)
        figures[f"{name}_cpu_us_per_wake"] = round(cpu_per_wake, 1)
        figures[f"{name}_idle_cpu_ms_per_s"] = round(idle_cpu, 2)
    figures["cpu_ratio"] = round(
        figures["listener_cpu_us_per_wake"] / max(1e-9, figures["bare_cpu_us_per_wake"]), 3
    )
    print(f"machine: {machine()}; took {time.monotonic() - started:.0f} s")
    report("listen", rate=args.rate, **figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="NOTIFY per second")
    parser.add_argument("--phase", type=float, default=5.0, help="seconds per busy phase")
    parser.add_argument("--rounds", type=int, default=3, help="phases of each variant")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds per idle phase")
    trio.run(main, parser.parse_args())
