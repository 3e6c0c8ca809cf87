"""The embedded PostgreSQL stopped for 10 s under load and started again.

The daemon stays up (same process), answers 503 on endpoints that need the
database and on ``/readyz`` meanwhile (``/healthz`` stays 200), and resumes on
its own when the database is back: every event decided, every expected push
recorded, the daemon ready.
"""

from __future__ import annotations

import httpx
import psycopg
import pytest
import trio

from tests.faults.conftest import DaemonFactory
from tests.faults.world import (
    World,
    append,
    closing_count,
    count_pushes,
    register_phone,
    wait_settled,
)
from tests.harness import device_token
from tests.procs import PgCluster

pytestmark = pytest.mark.slow

OUTAGE = 10.0
MESSAGES = 400
RATE = 40.0
CONCURRENCY = 64
"""``jobs.concurrency``: the sends that may be in flight when the database goes."""


async def produce_through_outage(url: str, world: World, count: int) -> int:
    """Append ``count`` messages at ``RATE``/s; a batch that fails (the database is
    down) is retried until it commits, as an app backend would. Returns the retries."""
    retries = 0
    n = 0
    while n < count:
        batch = [world.message(n)]
        try:
            await append(url, batch)
        except psycopg.OperationalError:
            world.sent.pop()
            retries += 1
            await trio.sleep(0.2)
            continue
        n += 1
        await trio.sleep(1 / RATE)
    return retries


async def test_the_daemon_rides_out_a_database_outage(
    daemons: DaemonFactory, fault_db: str, pg_cluster: PgCluster
) -> None:
    world = World(people=[f"person-{i}" for i in range(3)], threads=["thread-0", "thread-1"])
    node = await daemons(
        "a", jobs={"lease": "2s", "concurrency": CONCURRENCY}, notify={"coalesce_window": "0s"}
    )
    await append(fault_db, world.setup_events())
    tokens = set()
    async with httpx.AsyncClient(timeout=10) as http:
        for person in world.people:
            await register_phone(http, node.api, person)
            tokens.add(f"phone-token-{person}")
        device = {"authorization": "Bearer " + device_token("person-0", "phone-person-0", "ios")}
        pid = node.pid

        async with trio.open_nursery() as nursery:
            done = trio.Event()
            retries: list[int] = []

            async def producer() -> None:
                retries.append(await produce_through_outage(fault_db, world, MESSAGES))
                done.set()

            nursery.start_soon(producer)
            await trio.sleep(2)
            await trio.to_thread.run_sync(pg_cluster.stop)
            outage_ends = trio.current_time() + OUTAGE
            seen_unready = seen_unavailable = False
            while trio.current_time() < outage_ends:
                ready = await http.get(f"{node.api_url}/readyz")
                if ready.status_code == 503 and ready.json()["checks"]["database"] is False:
                    seen_unready = True
                listed = await http.get(f"{node.api_url}/v1/registrations", headers=device)
                if listed.status_code == 503:
                    assert listed.json()["error"]["code"] == "unavailable"
                    seen_unavailable = True
                else:
                    assert listed.status_code != 500, listed.text
                assert (await http.get(f"{node.api_url}/healthz")).status_code == 200
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.5)
            await trio.to_thread.run_sync(pg_cluster.start)
            assert seen_unready, "/readyz never said the database was down"
            assert seen_unavailable, "a device endpoint never answered 503 during the outage"

            with trio.fail_after(60):
                while (await http.get(f"{node.api_url}/readyz")).status_code != 200:
                    await trio.sleep(0.2)
            await done.wait()
            nursery.cancel_scope.cancel()

        await wait_settled(fault_db)
        assert node.starts == 1
    assert retries and retries[0] > 0, "the outage never reached the producer"
    expected = {(m, t) for m in world.sent for t in tokens}
    pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
    print(f"outage={OUTAGE}s producer_retries={retries[0]}")
    # A send whose result could not be recorded when the database went runs again
    # after its lease: at most the jobs in flight at that moment.
    await closing_count(fault_db, node, pushes, pid=pid, duplicates_at_most=CONCURRENCY)
