"""The documented example runs against a daemon, and the document shows it whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from bothy_notify.client import Status, example
from tests.harness import Launch
from tests.support.repo import ROOT as PROJECT_ROOT
from tests.topics.helpers import DEVICE


def test_the_topics_guide_shows_the_example_verbatim() -> None:
    guide = (PROJECT_ROOT / "docs" / "topics.md").read_text(encoding="utf-8")
    code = Path(example.__file__).read_text(encoding="utf-8")
    assert f"```python\n{code}```" in guide


async def test_the_example_enables_and_subscribes_a_bot(
    launch: Launch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = await launch()
    state = await example.main(node.api, DEVICE, str(tmp_path / "bot.db"))

    assert state.status is Status.ENABLED
    assert state.recipient is not None and state.recipient.topic_count == 2
    out = capsys.readouterr().out
    assert "enabled: enabled" in out and "subscribed topics: 2" in out
    assert f"expires unless renewed: {state.recipient.expires_at.isoformat()}" in out
    rows = await node.sql("SELECT count(*) FROM bothy.topic_subscriptions")
    assert rows == [(2,)]

    again = await example.main(node.api, DEVICE, str(tmp_path / "bot.db"))
    assert again.recipient is not None and again.recipient.topic_count == 2
    assert await node.sql("SELECT count(*) FROM bothy.topic_recipients") == [(1,)]
