"""The fake provider's memory: the most recent ``push.fake.keep`` sends, the record file all."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from bothy_notify.config import structure_config
from bothy_notify.push import fake
from bothy_notify.push.port import ReadMessage, Target


def target(n: int) -> Target:
    return Target(
        registration_id=f"reg-{n}", user_id="sam", provider="fake", token=f"tok-{n}", platform="ios"
    )


async def test_more_sends_than_keep_leave_the_newest_in_memory_and_all_in_the_record(
    tmp_path: Path,
) -> None:
    record = tmp_path / "pushes.jsonl"
    config = structure_config(
        {"push": {"fake": {"record_file": str(record), "keep": 3}}}, env={}, base_dir=str(tmp_path)
    )
    assert config.push.fake is not None
    provider = fake.build(config.push.fake, dev=False, stdout=None)
    with trio.fail_after(10):
        for n in range(5):
            await provider.send(target(n), ReadMessage(thread_id="t1", seq=n))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert (
        [s.registration_id for s in provider.sends],
        [line["registration_id"] for line in lines],
    ) == (["reg-2", "reg-3", "reg-4"], [f"reg-{n}" for n in range(5)])
