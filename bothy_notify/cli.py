"""The ``bothy-notify`` command line.

Commands: ``run``, ``migrate``, ``check-config [--print]``, ``dev-token``,
``secret set``, ``vapid generate``, ``push test``, ``events dead-letters``,
``events retry``, ``demo``; ``--version``. Every command takes ``--config FILE``
(default: the ``BOTHY_NOTIFY_CONFIG`` environment variable, else built-in
defaults), and ``BOTHY_NOTIFY__<SECTION>__<KEY>`` variables override the file
(:mod:`bothy_notify.config`).
Exit codes: 0 success, 1 the command failed, 2 bad usage or configuration.

``run`` under systemd (``Type=notify``) tells the service manager when it
serves, drains and reloads (:mod:`bothy_notify.kernel.sdnotify`); SIGHUP
reloads what :meth:`bothy_notify.wiring.Daemon.reload` names.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from functools import partial
from typing import TYPE_CHECKING, NoReturn, TextIO

import trio

from bothy_notify import __version__
from bothy_notify.config import Config, ConfigError, Role, ServerConfig, load, load_config
from bothy_notify.kernel import memtrace
from bothy_notify.kernel.readyfile import ReadyFile
from bothy_notify.kernel.sdnotify import Notifier
from bothy_notify.logs import setup_logging

if TYPE_CHECKING:
    from bothy_notify.processes.control import ParentChannel
    from bothy_notify.wiring import GatewayFactory

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("bothy.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bothy-notify", description="Bothy Notify: a self-hosted notification daemon."
    )
    parser.add_argument("--version", action="version", version=f"bothy-notify {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="the TOML configuration file")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run the daemon")
    run.add_argument("--role", choices=[r.value for r in Role], help="override server.role")
    run.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="override server.processes: run N node processes sharing the ports",
    )
    run.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once serving, write the bound addresses to PATH as JSON"
        ' ({"api", "gateway", "role", "processes", "pid", "version"}; written atomically,'
        " removed at exit): for supervisors and scripts (docs/operations.md)",
    )
    sub.add_parser("migrate", parents=[common], help="apply database migrations")
    check = sub.add_parser(
        "check-config", parents=[common], help="load and check the configuration"
    )
    check.add_argument(
        "--print",
        action="store_true",
        dest="print_config",
        help="print the effective configuration (secrets redacted) with each value's source",
    )

    dev = sub.add_parser(
        "dev-token",
        parents=[common],
        help="mint a device, producer or operator JWT for trying things (dev only)",
    )
    dev.add_argument("--user", required=True)
    dev.add_argument("--device", help="the device (a device token; not needed with --scope)")
    dev.add_argument(
        "--platform",
        choices=["ios", "android", "macos", "windows", "linux", "web"],
        help="the platform (a device token; not needed with --scope)",
    )
    dev.add_argument("--kind", default="user", choices=["user", "agent", "app"])
    dev.add_argument(
        "--scope",
        default="",
        help='add a scope claim: "events:write" (a producer), "admin:read admin:write" (the'
        " status page)",
    )
    dev.add_argument("--hours", type=float, default=12.0, help="lifetime in hours")

    secret = sub.add_parser("secret", help="manage the secret store")
    secret_sub = secret.add_subparsers(dest="secret_command", required=True, metavar="ACTION")
    secret_set = secret_sub.add_parser(
        "set", parents=[common], help="store a secret read from standard input"
    )
    secret_set.add_argument("name", help="the secret's name (used as secret:NAME)")

    vapid = sub.add_parser("vapid", help="Web Push VAPID keys")
    vapid_sub = vapid.add_subparsers(dest="vapid_command", required=True, metavar="ACTION")
    vapid_generate = vapid_sub.add_parser(
        "generate",
        parents=[common],
        help="make a VAPID key pair: the private key into the secret store, the public one printed",
    )
    vapid_generate.add_argument(
        "--name", default="vapid", help="the secret's name (default vapid: secret:vapid)"
    )

    push = sub.add_parser("push", help="push provider tools")
    push_sub = push.add_subparsers(dest="push_command", required=True, metavar="ACTION")
    push_test = push_sub.add_parser(
        "test",
        parents=[common],
        help="send a test hint to every device of a person, or a test push to a Matrix pushkey",
    )
    whom = push_test.add_mutually_exclusive_group(required=True)
    whom.add_argument("--user", help="every active registration of this person")
    whom.add_argument(
        "--matrix-app", help="a Matrix app id of [matrix_gateway] apps (with --pushkey)"
    )
    push_test.add_argument("--pushkey", help="the pusher's pushkey (with --matrix-app)")
    push_test.add_argument(
        "--data", help="the pusher's data as JSON (a Web Push app's keys; with --matrix-app)"
    )

    events = sub.add_parser("events", help="the event log: dead letters")
    events_sub = events.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    events_sub.add_parser(
        "dead-letters", parents=[common], help="list the events the round set aside"
    )
    retry = events_sub.add_parser(
        "retry",
        parents=[common],
        help="replay dead letters once their cause is fixed (decided with today's facts)",
    )
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--seq", type=int, action="append", metavar="N", help="the dead letter's seq (repeatable)"
    )
    which.add_argument("--all", action="store_true", help="every dead letter, in log order")

    demo = sub.add_parser(
        "demo", parents=[common], help="a guided scenario on the embedded database"
    )
    demo.add_argument("--delay", default="3s", help="the desktop delay used by the demo")
    return parser


def _config_path(args: argparse.Namespace) -> str | None:
    return getattr(args, "config", None) or os.environ.get("BOTHY_NOTIFY_CONFIG") or None


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    args = _parser().parse_args(argv)
    path = _config_path(args)
    try:
        loaded = load(path)
    except ConfigError as exc:
        print(f"bothy-notify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = loaded.config
    child: ParentChannel | None = None
    if args.command == "run":
        problem = _check_processes(args.processes)
        if problem is not None:
            print(f"bothy-notify: {problem}", file=sys.stderr)
            return EXIT_USAGE
        from bothy_notify.processes.control import ControlError, supervised_child

        try:
            child = supervised_child()
        except ControlError as exc:
            print(f"bothy-notify: {exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.command == "check-config":
        from bothy_notify.matrix import apps as matrix_apps
        from bothy_notify.notify.kinds_dir import load_catalogue
        from bothy_notify.push import providers

        try:
            skipped = providers.check(config.push)
            load_catalogue(config.notify)
        except ConfigError as exc:
            print(f"bothy-notify: {exc}", file=sys.stderr)
            return EXIT_USAGE
        processes = config.server.processes
        # With --print everything written is TOML: the report lines are comments.
        note = "# " if args.print_config else ""
        print(
            f"{note}configuration OK ({path or 'built-in defaults'}); role {config.server.role}"
            + (f", {processes} processes" if processes > 1 else ""),
            file=out,
        )
        try:
            matrix_routes = matrix_apps.routes(config)
        except ConfigError as exc:
            print(f"bothy-notify: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for name in providers.configured(config.push):
            apps = [app for app, _key, _settings in providers.entry(name).apps(config.push)]
            named = ", ".join(a for a in apps if a is not None)
            print(
                f"{note}provider {name}: " + (f"apps {named}" if named else "one app"),
                file=out,
            )
        for matrix_app, route in matrix_routes.items():
            where = route.provider + (f" app {route.app_id}" if route.app_id else "")
            where += f" ({route.environment})" if route.environment else ""
            print(f"{note}matrix gateway app {matrix_app}: {where}", file=out)
        if skipped:
            print(
                f"{note}not checked here (read from the secret store at run): "
                + ", ".join(skipped),
                file=out,
            )
        if args.print_config:
            from bothy_notify.config.schema import render_effective

            print(f"{note}sources: file, environment BOTHY_NOTIFY__..., default\n", file=out)
            out.write(render_effective(loaded))
        return EXIT_OK
    setup_logging(config.log, process=child.spec.ordinal if child is not None else None)
    from bothy_notify import commands
    from bothy_notify.store.db import StoreError

    try:
        if args.command == "run":

            def reloaded() -> Config:
                """The configuration loaded again, as this process runs it."""
                again = load_config(path)
                if child is not None:
                    return child.spec.apply(again)
                if args.role is not None:
                    return replace(again, server=replace(again.server, role=Role(args.role)))
                return again

            if child is not None:
                return _run(child.spec.apply(config), child=child, reloaded=reloaded)
            notifier = Notifier.from_environment()  # only the main process speaks to systemd
            ready = ReadyFile(args.ready_file)
            try:
                ready.clear()  # a file left by an earlier run: nothing serves yet
            except OSError as exc:
                print(
                    f"bothy-notify: --ready-file: {exc.strerror}: {exc.filename}", file=sys.stderr
                )
                return EXIT_USAGE
            if args.role is not None:
                config = replace(config, server=replace(config.server, role=Role(args.role)))
            count = args.processes or config.server.processes
            if count > 1:
                return _run_processes(config, count, path, notifier, ready)
            return _run(config, notifier=notifier, reloaded=reloaded, ready=ready)
        if args.command == "migrate":
            return commands.migrate_command(config, out)
        if args.command == "dev-token":
            return commands.dev_token_command(config, args, out)
        if args.command == "secret":
            return commands.secret_set_command(config, args.name, sys.stdin, out)
        if args.command == "push":
            if args.matrix_app is None:
                return commands.push_test_command(config, args.user, out)
            if not args.pushkey:
                print("bothy-notify: push test --matrix-app needs --pushkey", file=sys.stderr)
                return EXIT_USAGE
            data = _json_object(args.data)
            if data is None and args.data is not None:
                print("bothy-notify: --data: expected a JSON object", file=sys.stderr)
                return EXIT_USAGE
            return commands.push_test_matrix_command(
                config, args.matrix_app, args.pushkey, data, out
            )
        if args.command == "vapid":
            return commands.vapid_generate_command(config, args.name, out)
        if args.command == "events" and args.events_command == "dead-letters":
            return commands.dead_letters_command(config, out)
        if args.command == "events":
            return commands.retry_command(config, None if args.all else args.seq, out)
        if args.command == "demo":
            demo = importlib.import_module("bothy_notify.demo")
            return int(demo.run_demo(config, args.delay, out))
    except ConfigError as exc:
        print(f"bothy-notify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (commands.CommandError, StoreError) as exc:
        # StoreError: the database is unreachable or refused (a constant message, no URL).
        print(f"bothy-notify: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_USAGE


def _json_object(text: str | None) -> dict[str, object] | None:
    """``--data``'s JSON object (``None``: not given, or not an object)."""
    if text is None:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _check_processes(value: int | None) -> str | None:
    """What is wrong with ``run --processes``, if anything (the key's own range)."""
    if value is None:
        return None
    field = next(f for f in fields(ServerConfig) if f.name == "processes")
    low, high = field.metadata["min"], field.metadata["max"]
    if not low <= value <= high:
        return f"--processes: must be between {low} and {high}"
    return None


def _run_processes(
    config: Config, count: int, path: str | None, notifier: Notifier, ready: ReadyFile
) -> int:
    """``run`` as the parent of ``count`` node processes (:mod:`bothy_notify.processes`)."""
    from bothy_notify.processes.parent import ListenError, run_node_processes

    try:
        return run_node_processes(
            config, count=count, config_path=path, notifier=notifier, ready=ready
        )
    except ListenError as exc:
        print(f"bothy-notify: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BaseExceptionGroup as group:
        _raise_startup_error(group)
    finally:
        ready.remove()
        notifier.close()


def _run(
    config: Config,
    *,
    child: ParentChannel | None = None,
    notifier: Notifier | None = None,
    reloaded: Callable[[], Config] | None = None,
    ready: ReadyFile | None = None,
) -> int:
    """``run`` as one node: this process (``child``: one of the node processes of
    ``server.processes``, told what to do over its control channel). ``notifier``
    speaks to systemd; ``reloaded`` loads the configuration again (SIGHUP);
    ``ready`` is ``--ready-file``, written once the node serves."""
    from bothy_notify.wiring import Daemon, NodeAddresses

    notifier = notifier or Notifier(None)
    ready = ready or ReadyFile(None)
    failed = False
    trace_file = memtrace.requested()
    trace = memtrace.MemoryTrace(trace_file) if trace_file is not None else None
    if trace is not None:
        trace.start()  # before the daemon's objects exist, so they are traced
    daemon = Daemon(
        config,
        gateway_factory=_gateway_factory(),
        database_url=child.spec.database_url if child is not None else None,
        reuse_port=child is not None,
        migrate=child is None,
        notifier=notifier,
    )
    name = f"bothy-notify[{child.spec.ordinal}]" if child is not None else "bothy-notify"
    serving = False

    async def reload() -> None:
        """SIGHUP: load the configuration again and apply what a reload changes; a
        configuration that does not load changes nothing (the node keeps serving)."""
        if serving:
            notifier.reloading("reloading")
        try:
            if reloaded is not None:
                await daemon.reload(await trio.to_thread.run_sync(reloaded))
        except ConfigError as exc:
            print(f"{name}: reload refused, nothing changed: {exc}", file=sys.stderr, flush=True)
            log.warning("reload refused: the configuration is invalid; nothing changed")
        finally:
            if serving:
                notifier.ready(f"serving (role {config.server.role.value})")

    async def main_task() -> None:
        # Signals are taken over before anything starts, so a SIGTERM during startup
        # also ends in a graceful shutdown rather than a killed process.
        nonlocal serving, failed
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    draining = False
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            await reload()  # one at a time; signals wait meanwhile
                            continue
                        if draining:  # a second signal: stop now (cleanups still run)
                            stop_now()
                            return
                        draining = True
                        print(f"{name}: shutting down", file=sys.stderr, flush=True)
                        daemon.request_shutdown()

                def stop_now() -> None:
                    print(f"{name}: stopping now", file=sys.stderr, flush=True)
                    nursery.cancel_scope.cancel()

                async def run_daemon(*, task_status: trio.TaskStatus[NodeAddresses]) -> None:
                    await daemon.run(task_status=task_status)
                    nursery.cancel_scope.cancel()  # stopped: no more signals to wait for

                nursery.start_soon(on_signal)
                if trace is not None:
                    nursery.start_soon(trace.serve)
                # From the start: the embedded server's start and the migrations count.
                nursery.start_soon(notifier.keep_watchdog)
                if child is not None:
                    # The parent's drain and stop are its signals passed on; the end of
                    # the channel means the parent is gone: drain.
                    nursery.start_soon(
                        partial(
                            child.watch,
                            drain=daemon.request_shutdown,
                            stop=stop_now,
                            reload=partial(nursery.start_soon, reload),
                        )
                    )
                addresses = await nursery.start(run_daemon)
                serving = True
                if child is not None:
                    await child.ready()  # the parent prints the line for all of them
                    return
                try:
                    ready.write(
                        api=addresses.api,
                        gateway=addresses.gateway,
                        role=config.server.role.value,
                        processes=1,
                    )
                except OSError as exc:
                    # Whoever waits for the file would wait in vain: stop, and say why.
                    print(
                        f"{name}: --ready-file cannot be written ({exc.strerror}); stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    failed = True
                    daemon.request_shutdown()
                    return
                print(
                    f"bothy-notify running (role {config.server.role}): API http://{addresses.api}"
                    + (
                        f", gateway ws://{addresses.gateway}/v1/gateway"
                        if addresses.gateway
                        else ""
                    ),
                    file=sys.stderr,
                    flush=True,
                )

    try:
        trio.run(main_task)
    except BaseExceptionGroup as group:
        _raise_startup_error(group)
    finally:
        ready.remove()
        notifier.close()
    return EXIT_FAILED if failed else EXIT_OK


def _raise_startup_error(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """A startup error (a provider's credentials, a missing secret, an unreachable
    database) surfaces from a nursery wrapped in a group; raise it alone, so it is
    reported in one line like the same error of any other command. Anything else in
    the group is raised as it came."""
    from bothy_notify.store.db import StoreError

    reported, rest = group.split((ConfigError, StoreError))
    if reported is None or rest is not None:
        raise group
    raise _first_leaf(reported) from None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _gateway_factory() -> GatewayFactory:
    """The gateway's factory. Imported here, not at the top, so commands without a
    gateway stay light; a broken install fails loudly instead of running a node
    that silently has no gateway."""
    from gateway.service import build_gateway

    return build_gateway


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
