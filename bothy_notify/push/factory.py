"""Build the configured providers: a provider exists exactly when its block does."""

from __future__ import annotations

from typing import TextIO

from bothy_notify.config import ConfigError, PushConfig
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.port import PushProvider


def build_providers(
    config: PushConfig, *, dev: bool, stdout: TextIO | None = None
) -> dict[str, PushProvider]:
    """One provider per configured block. Raises :class:`ConfigError` naming the key
    when a block cannot be used."""
    providers: dict[str, PushProvider] = {}
    if config.fake is not None:
        providers["fake"] = FakeProvider(
            record_file=config.fake.record_file, echo=dev, stream=stdout
        )
    for name in ("apns", "fcm", "webhook"):
        if getattr(config, name) is not None:
            raise ConfigError(f"push.{name}: this provider is not available in this build")
    return providers
