"""The one-shot commands: ``migrate``, ``dev-token``, ``secret set``, ``push test``.

Each opens the configured database (starting the embedded server when
``database.url`` is empty), does its work, and says what really happened.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import TextIO

import trio

from bothy_notify.auth import mint_token
from bothy_notify.config import Config, JwtAlgorithm
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.kernel.ids import new_id
from bothy_notify.push.factory import build_providers
from bothy_notify.push.port import Outcome, OutcomeKind, PushMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.store import registrations as regs
from bothy_notify.store import secrets as secret_store
from bothy_notify.store.db import connect_dedicated
from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.migrate import migrate


class CommandError(Exception):
    """The command could not do its work; the message says why (no secrets, no IDs)."""


@contextlib.contextmanager
def database_url(config: Config, out: TextIO) -> Iterator[str]:
    """The database URL, starting the embedded server for the duration when needed."""
    if config.database.url is not None:
        yield config.database.url.reveal()
        return
    embedded = EmbeddedPostgres(config.database.data_dir)
    print(
        f"starting the embedded PostgreSQL in {config.database.data_dir} ...", file=out, flush=True
    )
    url = embedded.start()
    try:
        yield url
    finally:
        embedded.stop()


def migrate_command(config: Config, out: TextIO) -> int:
    with database_url(config, out) as url:
        conn = connect_dedicated(url, autocommit=False)
        try:
            result = migrate(conn, lambda step: print(step, file=out, flush=True))
        finally:
            conn.close()
    print(
        f"migrations: {len(result.applied)} applied, {len(result.already)} already applied",
        file=out,
    )
    return 0


def dev_token_command(config: Config, args: argparse.Namespace, out: TextIO) -> int:
    if not config.server.dev:
        raise CommandError("dev-token works only with a dev configuration (server.dev = true)")
    keys = [k for k in config.auth.keys if k.algorithm is JwtAlgorithm.HS256]
    if not keys:
        raise CommandError("dev-token needs an HS256 key in auth.keys")
    key = keys[0]
    claims: dict[str, object] = {
        "sub": args.user,
        "did": args.device,
        "plat": args.platform,
        "kind": args.kind,
    }
    if args.scope:
        claims["scope"] = args.scope
    if config.auth.issuer:
        claims["iss"] = config.auth.issuer
    if config.auth.audience:
        claims["aud"] = config.auth.audience
    headers = {"kid": key.kid} if key.kid else None
    print(
        mint_token(key.key.reveal(), claims, lifetime=timedelta(hours=args.hours), headers=headers),
        file=out,
    )
    return 0


def secret_set_command(config: Config, name: str, stdin: TextIO, out: TextIO) -> int:
    if not secret_store.NAME_PATTERN.fullmatch(name):
        raise CommandError("a secret name is 1 to 128 characters of A-Z a-z 0-9 . _ -")
    if stdin.isatty():
        print("paste the value, then press Ctrl-D:", file=out, flush=True)
    value = stdin.read()
    if value.endswith("\n") and not value.rstrip("\n").count("\n"):
        value = value.rstrip("\n")  # a single-line paste keeps no newline; PEM/JSON stay intact
    if not value.strip():
        raise CommandError("no value on standard input; nothing stored")
    if len(value.encode()) > secret_store.MAX_VALUE_BYTES:
        raise CommandError("the value is larger than 64 KiB; nothing stored")
    with database_url(config, out) as url:
        conn = connect_dedicated(url, autocommit=False)
        try:
            migrate(conn)
            with conn.transaction():
                stored = secret_store.put(conn, name, value)
        finally:
            conn.close()
    tail = f", ending in ...{stored.last_four}" if stored.last_four else ""
    again = " (the previous value was retired)" if stored.retired_previous else ""
    print(f"stored secret {name}: {stored.length} characters{tail}{again}", file=out)
    return 0


_OUTCOME_TEXT = {
    OutcomeKind.DELIVERED: "delivered",
    OutcomeKind.DEAD: "dead: the provider says this token is gone; the registration is retired",
    OutcomeKind.MISMATCH: (
        "mismatch: the token belongs to another app or environment; check the shipped"
        " build's environment (sandbox/production) and bundle id, not the device"
    ),
    OutcomeKind.REJECTED: "rejected by the provider",
    OutcomeKind.TRANSIENT: "transient: the provider could not take it now; try again later",
}


def push_test_command(config: Config, user_id: str, out: TextIO) -> int:
    from bothy_notify.config import resolve_store_secrets, store_secret_names

    if not any(
        getattr(config.push, name) is not None for name in ("apns", "fcm", "webhook", "fake")
    ):
        raise CommandError(
            "no push provider is configured ([push.apns], [push.fcm],"
            " [push.webhook] or [push.fake]); nothing to test"
        )
    with database_url(config, out) as url:
        conn = connect_dedicated(url, autocommit=False)
        try:
            migrate(conn)
            with conn.transaction():
                if store_secret_names(config):
                    config = resolve_store_secrets(config, lambda n: secret_store.get(conn, n))
                found = regs.active_for(conn, user_id)
                loaded = regs.load(conn, [r.id for r in found])
                platforms = {reg_id: platform for reg_id, (_r, platform) in loaded.items()}
            if not found:
                print("no device registered for this person: nothing was sent", file=out)
                return 1
            providers = Providers(
                build_providers(config.push, dev=False), max_in_flight=config.push.max_in_flight
            )
            results = trio.run(_send_tests, providers, found, platforms)
            now = SystemClock().now()
            failures = 0
            with conn.transaction():
                for registration, outcome in results:
                    detail = _OUTCOME_TEXT[outcome.kind]
                    if outcome.kind is OutcomeKind.REJECTED and outcome.reason:
                        detail += f" ({outcome.reason})"
                    env = f", {registration.environment}" if registration.environment else ""
                    print(
                        f"registration {registration.id} ({registration.provider}{env}): {detail}",
                        file=out,
                    )
                    if outcome.kind is OutcomeKind.DELIVERED:
                        regs.mark_delivered(conn, registration.id, now)
                    else:
                        failures += 1
                        if outcome.kind is OutcomeKind.DEAD:
                            regs.mark_dead(conn, registration.id, outcome.reason or "dead", now)
                        elif outcome.kind is not OutcomeKind.TRANSIENT:
                            regs.mark_error(conn, registration.id, outcome.reason or "error", now)
        finally:
            conn.close()
    print(f"{len(results) - failures} of {len(results)} delivered", file=out)
    return 0 if failures == 0 else 1


async def _send_tests(
    providers: Providers, found: list[regs.Registration], platforms: dict[str, str]
) -> list[tuple[regs.Registration, Outcome]]:
    results: list[tuple[regs.Registration, Outcome]] = []
    message = PushMessage(nid=new_id(), kind="test", count=1, quiet=True)
    try:
        for registration in found:
            target = Target(
                registration_id=registration.id,
                user_id=registration.user_id,
                provider=registration.provider,
                token=registration.token,
                platform=platforms.get(registration.id, "web"),
                environment=registration.environment,
                app_id=registration.app_id,
                signing_key=registration.signing_key,
            )
            results.append((registration, await providers.send(target, message)))
    finally:
        await providers.aclose()
    return results
