"""The one-shot commands: ``migrate``, ``dev-token``, ``secret set``, ``vapid generate``,
``push test``, ``events dead-letters``, ``events retry``.

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
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify.lifecycle import TokenLifecycle, apply_now, what_to_check
from bothy_notify.push import providers as provider_table
from bothy_notify.push.port import Outcome, OutcomeKind, PushMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.store import registrations as regs
from bothy_notify.store import secrets as secret_store
from bothy_notify.store.db import (
    Conn,
    StoreConflict,
    StoreUnavailable,
    connect_dedicated,
    translate_errors,
)
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
    if not args.scope and (args.device is None or args.platform is None):
        raise CommandError(
            "dev-token: a device token needs --device and --platform"
            ' (or give --scope, e.g. "admin:read", for a token without a device)'
        )
    claims: dict[str, object] = {"sub": args.user, "kind": args.kind}
    if args.device is not None:
        claims["did"] = args.device
    if args.platform is not None:
        claims["plat"] = args.platform
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
    """``bothy-notify secret set NAME``: store the value read from ``stdin`` as ``NAME``.

    There is deliberately no way to pass the value as an argument (argv ends up
    in shell history and process lists). Prints only the length and the last
    four characters (none for values shorter than 8). Setting a name again
    retires the previous value (kept in the table, so a mistyped paste can be
    undone by an operator).
    """
    if not secret_store.NAME_PATTERN.fullmatch(name):
        raise CommandError("a secret name is 1 to 128 characters of A-Z a-z 0-9 . _ -")
    value = _read_secret(stdin, out)
    if not value.strip():
        raise CommandError("no value on standard input; nothing stored")
    if len(value.encode()) > secret_store.MAX_VALUE_BYTES:
        raise CommandError("the value is larger than 64 KiB; nothing stored")
    stored = _store_secret(config, name, value, out)
    shown = stored.last_four.encode("unicode_escape").decode()
    tail = f", ending in ...{shown}" if stored.last_four else ""
    again = " (the previous value was retired)" if stored.retired_previous else ""
    print(f"stored secret {name}: {stored.length} characters{tail}{again}", file=out)
    return 0


def vapid_generate_command(config: Config, name: str, out: TextIO) -> int:
    """``bothy-notify vapid generate [--name vapid]``: a new VAPID key pair (P-256) for
    Web Push. The private key goes to the secret store as ``name`` (its PKCS#8 PEM;
    ``[push.webpush] vapid_private_key = "secret:<name>"`` uses it); the public key
    is printed in base64url, the page's ``applicationServerKey`` (``GET
    /v1/webpush/key`` serves it once the daemon runs with it). Generating again
    under the same name retires the previous key: browsers subscribed with the old
    public key must subscribe again (docs/operations.md, "VAPID keys").
    """
    from bothy_notify.push.webpush import generate_vapid_key

    if not secret_store.NAME_PATTERN.fullmatch(name):
        raise CommandError("a secret name is 1 to 128 characters of A-Z a-z 0-9 . _ -")
    pem, public = generate_vapid_key()
    stored = _store_secret(config, name, pem, out)
    again = (
        "; the previous key was retired: browsers subscribed with it must subscribe again"
        if stored.retired_previous
        else ""
    )
    print(f"stored the VAPID private key as secret {name}{again}", file=out)
    print(f'use it with [push.webpush] vapid_private_key = "secret:{name}"', file=out)
    print("public key (the page's applicationServerKey):", file=out)
    print(public, file=out)
    return 0


def _store_secret(config: Config, name: str, value: str, out: TextIO) -> secret_store.StoredSecret:
    with database_url(config, out) as url:
        conn = connect_dedicated(url, autocommit=False)
        try:
            migrate(conn)
            try:
                with translate_errors(), conn.transaction():
                    stored = secret_store.put(conn, name, value)
            except StoreConflict:
                raise CommandError(
                    "another `secret set` for this name ran at the same time; nothing stored,"
                    " try again"
                ) from None
        finally:
            conn.close()
    return stored


def _read_secret(stdin: TextIO, out: TextIO) -> str:
    """Read the whole of ``stdin``; on a terminal, without echoing what is typed."""
    if stdin.isatty():
        print("paste the value, then press Ctrl-D on an empty line:", file=out, flush=True)
        try:
            import termios

            fd = stdin.fileno()
            saved = termios.tcgetattr(fd)
        except (ImportError, OSError, ValueError):
            value = stdin.read()
        else:
            quiet = list(saved)
            quiet[3] &= ~termios.ECHO
            termios.tcsetattr(fd, termios.TCSADRAIN, quiet)
            try:
                value = stdin.read()
            finally:
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    else:
        value = stdin.read()
    value = value.replace("\r\n", "\n")
    if value.endswith("\n") and "\n" not in value.rstrip("\n"):
        value = value.rstrip("\n")  # a single-line paste keeps no newline; PEM/JSON stay intact
    return value


_OUTCOME_TEXT = {
    OutcomeKind.DEAD: (
        "the provider says this token is gone (app uninstalled or URL gone);"
        " the registration is retired"
    ),
    OutcomeKind.MISMATCH: "the token belongs to another app or environment",
    OutcomeKind.REJECTED: "the provider refused this message; the registration is kept",
    OutcomeKind.TRANSIENT: "the provider could not take it now; the daemon would retry it later",
}


def describe_outcome(provider: str, outcome: Outcome) -> str:
    """One line saying what a test send's outcome means and what to check."""
    if outcome.kind is OutcomeKind.DELIVERED:
        return "delivered"
    label = outcome.kind.value + (f" ({outcome.reason})" if outcome.reason else "")
    text = f"{label}: {_OUTCOME_TEXT[outcome.kind]}"
    if outcome.kind is OutcomeKind.MISMATCH:
        mismatch = provider_table.entry(provider).mismatch_hint
        return f"{text}; " + (mismatch or "check the app build's push settings")
    hint = what_to_check(provider, outcome)
    return f"{text}; {hint}" if hint else text


def push_test_command(config: Config, user_id: str, out: TextIO) -> int:
    """``bothy-notify push test --user ID``: send a test hint to every active registration
    of that person and print, per registration, what really happened.

    Refuses when no provider is configured, and says "no device registered"
    instead of reporting success for zero sends. The token lifecycle
    (:mod:`bothy_notify.notify.lifecycle`) applies as for the first attempt of a
    real send: delivered refreshes, dead retires, mismatch, rejected and
    transient record the error (a test send never counts a strike). Exit status
    0 only when every send was delivered.
    """
    from bothy_notify.config import resolve_store_secrets, store_secret_names

    configured = provider_table.configured(config.push)
    if not configured:
        blocks = ", ".join(f"[push.{name}]" for name in provider_table.PROVIDER_NAMES)
        raise CommandError(f"no push provider is configured ({blocks}); nothing to test")
    with database_url(config, out) as url:
        conn = connect_dedicated(url, autocommit=False)
        try:
            migrate(conn)
            with conn.transaction():
                if store_secret_names(config):
                    config = resolve_store_secrets(config, lambda n: secret_store.get(conn, n))
                every = regs.list_for(conn, user_id)
                found = [r for r in every if r.invalidated_at is None]
                loaded = regs.load(conn, [r.id for r in found])
                platforms = {reg_id: platform for reg_id, (_r, platform) in loaded.items()}
            if not found:
                retired = len(every)
                extra = f" ({retired} retired registration(s) kept as evidence)" if retired else ""
                print(f"no device registered for this person{extra}: nothing was sent", file=out)
                return 1
            providers = Providers(
                provider_table.build(config.push, dev=False),
                max_in_flight=config.push.max_in_flight,
            )
            print(
                f"sending a test hint to {len(found)} registration(s)"
                f" (providers: {', '.join(configured)}) ...",
                file=out,
                flush=True,
            )
            results = trio.run(_send_tests, providers, found, platforms, config.push.max_attempts)
            now = SystemClock().now()
            # The same lifecycle as the daemon's; its counters go to a registry nobody reads.
            lifecycle = TokenLifecycle(config=config.push, metrics=Metrics())
            delivered = 0
            per_app: dict[str, list[int]] = {}
            with conn.transaction():
                for registration, outcome in results:
                    env = f", {registration.environment}" if registration.environment else ""
                    app = _app_of(providers, registration)
                    if app:
                        env += f", app {app}"
                    tally = per_app.setdefault(
                        f"{registration.provider} {app or 'default'}", [0, 0]
                    )
                    tally[0] += outcome.kind is OutcomeKind.DELIVERED
                    tally[1] += 1
                    if registration.provider not in providers.names:
                        detail = (
                            f"not sent: provider {registration.provider} is not configured"
                            " on this node"
                        )
                    else:
                        detail = describe_outcome(registration.provider, outcome)
                        effect = lifecycle.effect(
                            registration.id, registration.provider, outcome, last_attempt=False
                        )
                        apply_now(conn, effect, now)
                    delivered += outcome.kind is OutcomeKind.DELIVERED
                    print(
                        f"registration {registration.id} ({registration.provider}{env}): {detail}",
                        file=out,
                    )
        finally:
            conn.close()
    if any(providers.apps(name) for name in providers.names):
        for label, (ok, sent) in sorted(per_app.items()):
            provider, app = label.split(" ", 1)
            print(f"{provider} app {app}: {ok} of {sent} delivered", file=out)
    print(f"{delivered} of {len(results)} delivered", file=out)
    return 0 if delivered == len(results) else 1


MATRIX_TEST_EVENT = "$bothy-push-test"
"""The event id of ``push test --matrix-app``'s push (the app fetches nothing for it)."""


def push_test_matrix_command(
    config: Config, matrix_app: str, pushkey: str, data: dict[str, object] | None, out: TextIO
) -> int:
    """``bothy-notify push test --matrix-app APP --pushkey KEY [--data JSON]``: send one
    content-free test push to a pushkey the way the Matrix push gateway would
    (``[matrix_gateway] apps``' route for ``APP``; ``data`` as the pusher's, for a
    Web Push app's keys) and say what happened, and whether the gateway's answer
    would list the pushkey in ``rejected``. Writes nothing: the gateway's
    registration of the pushkey, if any, is left as it is. Exit status 0 only
    when delivered.
    """
    from bothy_notify.config import resolve_store_secrets, store_secret_names
    from bothy_notify.matrix import apps as matrix_apps
    from bothy_notify.push.port import MatrixMessage, Refusal

    if config.matrix_gateway is None:
        raise CommandError("[matrix_gateway] is not configured; no Matrix app to test")
    if store_secret_names(config):
        with database_url(config, out) as url:
            conn = connect_dedicated(url, autocommit=False)
            try:
                migrate(conn)
                with conn.transaction():
                    config = resolve_store_secrets(config, lambda n: secret_store.get(conn, n))
            finally:
                conn.close()
    routes = matrix_apps.routes(config)
    route = routes.get(matrix_app)
    if route is None:
        known = ", ".join(sorted(routes)) or "none"
        raise CommandError(f"not an app of [matrix_gateway] apps (configured: {known})")
    entry = provider_table.entry(route.provider)
    assert entry.pushkey is not None  # routes() checked it
    found = entry.pushkey(pushkey, data, route.environment)
    if isinstance(found, Refusal):
        print(
            f"app {matrix_app} ({route.provider}): the pushkey can never be valid"
            f" ({found.field}: {found.problem}); the gateway lists it in rejected",
            file=out,
        )
        return 1
    providers = Providers(
        provider_table.build(config.push, dev=False), max_in_flight=config.push.max_in_flight
    )
    target = Target(
        registration_id="push-test",
        user_id=route.owner,
        provider=route.provider,
        token=found.token,
        platform="web",
        environment=found.environment,
        app_id=route.app_id,
        signing_key=found.secret,
        max_attempts=config.push.max_attempts,
        expires_at=found.expires_at,
    )
    message = MatrixMessage(MATRIX_TEST_EVENT, None, unread=None, urgency="normal")

    async def send() -> Outcome:
        try:
            return await providers.send(target, message)
        finally:
            with trio.CancelScope(shield=True):
                await providers.aclose()

    outcome = trio.run(send)
    app = f", app {route.app_id}" if route.app_id else ""
    print(
        f"app {matrix_app} ({route.provider}{app}): {describe_outcome(route.provider, outcome)}",
        file=out,
    )
    listed = "yes" if outcome.kind is OutcomeKind.DEAD else "no"
    print(f"the gateway would list this pushkey in rejected: {listed}", file=out)
    return 0 if outcome.kind is OutcomeKind.DELIVERED else 1


def _app_of(providers: Providers, registration: regs.Registration) -> str:
    """The configured app a registration's sends go to ("" for a provider without apps;
    a registration naming no configured app says so without echoing its app_id)."""
    apps = providers.apps(registration.provider)
    if not apps:
        return ""
    return registration.app_id if registration.app_id in apps else "(none configured)"


async def _send_tests(
    providers: Providers,
    found: list[regs.Registration],
    platforms: dict[str, str],
    max_attempts: int,
) -> list[tuple[regs.Registration, Outcome]]:
    outcomes: list[Outcome | None] = [None] * len(found)
    message = PushMessage(nid=new_id(), kind="test", count=1, quiet=True)

    async def one(index: int, registration: regs.Registration) -> None:
        target = Target(
            registration_id=registration.id,
            user_id=registration.user_id,
            provider=registration.provider,
            token=registration.token,
            platform=platforms.get(registration.id, "web"),
            environment=registration.environment,
            app_id=registration.app_id,
            signing_key=registration.signing_key,
            # One attempt of a send that could retry: a single 404 is not "every attempt".
            attempt=1,
            max_attempts=max_attempts,
            last_error=registration.error_since_delivery,
            failure_count=registration.failure_count,
            expires_at=registration.expires_at,
        )
        outcomes[index] = await providers.send(target, message)

    try:
        async with trio.open_nursery() as nursery:
            for index, registration in enumerate(found):
                nursery.start_soon(one, index, registration)
    finally:
        with trio.CancelScope(shield=True):
            await providers.aclose()
    return [
        (registration, outcome)
        for registration, outcome in zip(found, outcomes, strict=True)
        if outcome is not None
    ]


def dead_letters_command(config: Config, out: TextIO) -> int:
    """``bothy-notify events dead-letters``: the events the round set aside, as a table
    (seq, type, error type and where it arose, when, retries), or a line saying
    there are none."""
    from bothy_notify.store import deadletters

    with database_url(config, out) as url, _migrated(url) as conn, translate_errors():
        found = deadletters.list_all(conn)
    if not found:
        print("no dead letters: the round applied and decided every event", file=out)
        return 0
    rows = [
        (
            str(d.seq),
            d.type,
            d.error_type,
            d.dead_lettered_at.isoformat(timespec="seconds"),
            str(d.retries),
            d.error_where,
        )
        for d in found
    ]
    header = ("SEQ", "TYPE", "ERROR", "WHEN", "RETRIES", "WHERE")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
    print(
        f"{len(found)} dead letter(s); replay them once fixed:"
        " bothy-notify events retry --seq N | --all",
        file=out,
    )
    return 0


def retry_command(config: Config, seqs: list[int] | None, out: TextIO) -> int:
    """``bothy-notify events retry --seq N | --all``: replay dead letters in log order.

    Each replay is decided with today's facts, in the log position of now (see
    :mod:`bothy_notify.notify.replay`); a replay that commits removes its dead
    letter, one that fails again keeps it with its retry counted. Prints one
    line per dead letter and exits 0 only when every one was replayed.
    """
    from bothy_notify.notify.replay import replay
    from bothy_notify.store import deadletters

    with database_url(config, out) as url, _migrated(url) as conn:
        with translate_errors():
            found = deadletters.list_all(conn, seqs)
        missing = sorted(set(seqs or ()) - {d.seq for d in found})
        for seq in missing:
            print(f"seq {seq}: not a dead letter (never set aside, or replayed already)", file=out)
        if not found:
            if not missing:
                print("no dead letters: nothing to replay", file=out)
            return 0 if not missing else 1
        print(
            f"replaying {len(found)} dead letter(s) in log order, decided with today's facts"
            " (no presence here: devices are reached by push) ...",
            file=out,
            flush=True,
        )
        now = SystemClock().now()
        replayed = 0
        for letter in found:
            try:
                result = replay(conn, letter.seq, config=config, now=now)
            except StoreUnavailable:
                raise CommandError(
                    f"the database became unreachable at seq {letter.seq}; the dead letters"
                    " not reported as replayed are kept"
                ) from None
            label = f"seq {letter.seq} ({letter.type})"
            if result.replayed:
                replayed += 1
                outcome = result.outcome
                assert outcome is not None
                skips = sum(outcome.skips.values())
                print(
                    f"{label}: replayed; {sum(outcome.hints.values())} hint(s),"
                    f" {outcome.jobs} job(s), {skips} skip(s)",
                    file=out,
                )
            elif result.gone:
                print(f"{label}: gone (replayed meanwhile, or its event was removed)", file=out)
            else:
                at = f" at {result.error_where}" if result.error_where else ""
                print(f"{label}: failed again: {result.error_type}{at}; kept", file=out)
    print(f"{replayed} of {len(found)} replayed", file=out)
    return 0 if replayed == len(found) and not missing else 1


@contextlib.contextmanager
def _migrated(url: str) -> Iterator[Conn]:
    """A dedicated autocommit connection to a migrated database."""
    try:
        conn = connect_dedicated(url, autocommit=False)
    except StoreUnavailable:
        raise CommandError("the database cannot be reached") from None
    try:
        with translate_errors():
            migrate(conn)
        conn.autocommit = True
        yield conn
    finally:
        conn.close()
