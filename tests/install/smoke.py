"""The install check (``make install-check``, part of ``make test``): a real install.

What a new operator does, from a clean state, proven end to end:

1. build the sdist from the git-tracked files, and the wheel from that sdist
   (``python -m build``), in a temporary directory; the wheel holds the
   product's packages only (not the kit of tests and benchmarks, ``testkit``);
2. install the wheel **without extras** into a fresh virtualenv (no system site
   packages; pip's cache is reused, nothing beyond the package registry);
3. from another directory (never the repository): ``import bothy_notify.cli,
   bothy_notify.commands`` comes from the venv, the packaged schemas and example
   equal the repository's, ``bothy-notify --help``, ``--version`` and
   ``check-config`` work;
4. ``bothy-notify run`` on the embedded PostgreSQL (``database.url = ""``, a
   ``data_dir`` relative to the configuration file), started by the kit's
   launcher (``testkit/daemon.py``: ready once its ``--ready-file`` appears),
   a producer token from ``dev-token``, one event appended with ``urllib``
   from the venv's Python;
5. SIGTERM: the daemon exits 0 within ``server.drain_period``, the embedded
   server is stopped and the ready file removed;
6. ``bothy-notify demo`` (its own throwaway embedded server) succeeds.

Every wait is bounded; progress is printed; the temporary directory, the daemon
and every embedded PostgreSQL started here are stopped and removed even when a
step fails (or on Ctrl-C). Exit status 0 when everything held, 1 otherwise.

Run with the development virtualenv's Python (it has ``build``):
``.venv/bin/python tests/install/smoke.py [--keep]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the kit, when run as a script (the installed venv never sees it)

from testkit.daemon import DaemonFailed, DaemonProcess, DaemonStuck  # noqa: E402

# Bounds of each wait, in seconds: generous for a shared, loaded machine, yet
# each one ends the check instead of hanging it.
BUILD_TIMEOUT = 300.0  # sdist + wheel, with an isolated build environment
INSTALL_TIMEOUT = 600.0  # resolving and installing every dependency (cached wheels)
COMMAND_TIMEOUT = 60.0  # a one-shot command (check-config, dev-token, --help)
STARTUP_TIMEOUT = 120.0  # initdb, the embedded server's start, migrations
REQUEST_TIMEOUT = 30.0  # the HTTP client script
DEMO_TIMEOUT = 180.0  # the demo's whole scenario, its throwaway server included
STOP_TIMEOUT = 15.0  # cleanup: a process asked to stop before it is killed

DRAIN_PERIOD = 10.0
"""``server.drain_period`` of the check's configuration: SIGTERM must end the
daemon, embedded server included, within it."""

DEV_KEY = "install-check-only-hs256-key-0123456789abcdef"

DAEMON_CONFIG = f"""\
# Written by tests/install/smoke.py: the daemon on the embedded PostgreSQL.
[server]
api_listen = "127.0.0.1:0"
gateway_listen = "127.0.0.1:0"
drain_period = "{DRAIN_PERIOD:g}s"
dev = true

[database]
url = ""
data_dir = "state/postgres"

[[auth.keys]]
algorithm = "HS256"
key = "{DEV_KEY}"

[push.fake]
record_file = "state/pushes.jsonl"

[log]
format = "text"
level = "info"
"""

CHECK_CONFIG = """\
[server]
role = "worker"
"""

# Runs in the installed venv: where the package comes from and what it carries.
INSPECT = """
import hashlib, json, sys
import bothy_notify, bothy_notify.cli, bothy_notify.commands, gateway.service
from bothy_notify import resources
from bothy_notify.store.migrate import migration_files
print(json.dumps({
    "package": bothy_notify.__file__,
    "events": resources.event_schemas(),
    "config_schema": resources.config_schema(),
    "example": resources.example_config_text(),
    "openapi": hashlib.sha256((resources.schemas() / "openapi.yaml").read_bytes()).hexdigest(),
    "migrations": [m.name for m in migration_files()],
}))
"""

# Runs in the installed venv: the producer's first append, with the standard library.
APPEND = """
import json, sys, urllib.error, urllib.request
api, token = sys.argv[1], sys.argv[2]
with urllib.request.urlopen(f"http://{api}/healthz", timeout=10) as answer:
    health = answer.status
# The status page's files are package data: served from the installed wheel.
with urllib.request.urlopen(f"http://{api}/admin/admin.js", timeout=10) as answer:
    page = answer.status if b"/v1/admin/status" in answer.read() else 0
body = json.dumps({"events": [{"type": "user.upserted",
    "payload": {"user_id": "install-check", "kind": "human", "active": True}}]}).encode()
request = urllib.request.Request(f"http://{api}/v1/events", data=body, method="POST",
    headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        status, answered = answer.status, json.load(answer)
except urllib.error.HTTPError as error:  # a 4xx/5xx: report it, the check fails on it
    status, answered = error.code, {"error": error.read().decode(errors="replace")}
print(json.dumps({"health": health, "page": page, "status": status, "body": answered}))
"""


class CheckFailed(Exception):
    """A step did not behave as a real install must; the message says which."""


class Progress:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[install-check {elapsed:5.1f}s] {message}", flush=True)


def run(
    args: Sequence[str | Path],
    *,
    timeout: float,
    cwd: Path,
    env: dict[str, str],
    what: str,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (bounded), failing with its output when it fails."""
    try:
        done = subprocess.run(
            [str(a) for a in args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{what}: no answer within {timeout:g}s\n{_text(exc)}") from None
    if done.returncode != 0:
        raise CheckFailed(
            f"{what}: exit status {done.returncode}\n--- stdout\n{done.stdout}"
            f"--- stderr\n{done.stderr}"
        )
    return done


def _text(exc: subprocess.TimeoutExpired) -> str:
    parts = []
    for stream in (exc.stdout, exc.stderr):
        if stream:
            parts.append(stream.decode(errors="replace") if isinstance(stream, bytes) else stream)
    return "".join(parts)


def tracked_tree(destination: Path) -> None:
    """Copy the files git knows (tracked, or new and not ignored) to ``destination``.

    Building from a copy keeps the checkout clean (no ``build/`` or egg-info, no
    stale files from an earlier build in the wheel) and builds what a fresh clone
    would. Symbolic links stay links (the sdist must resolve them itself).
    """
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    if listed.returncode != 0:
        raise CheckFailed("the install check builds from a git checkout (git ls-files failed)")
    for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
        source = ROOT / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet committed
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def clean_env(tmp: Path, venv: Path) -> dict[str, str]:
    """The environment of a user who just installed the wheel: nothing of the
    development checkout (no virtualenv, no PYTHONPATH, no config variable)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "BOTHY_NOTIFY_CONFIG"}
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Anything that falls back to a per-user or temporary directory stays in tmp,
    # so cleanup finds it (the demo's throwaway PostgreSQL included).
    env["XDG_DATA_HOME"] = str(tmp / "xdg-data")
    env["TMPDIR"] = str(tmp / "tmp")
    (tmp / "tmp").mkdir(exist_ok=True)
    return env


def stop_embedded_servers(tmp: Path, progress: Progress) -> None:
    """Stop every PostgreSQL whose data directory is under ``tmp`` (left by a
    daemon or a demo that was killed): SIGINT is PostgreSQL's fast shutdown."""
    for pid_file in tmp.rglob("postmaster.pid"):
        try:
            pid = int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            continue
        if not _alive(pid):
            continue
        progress.say(f"cleanup: stopping the PostgreSQL left in {pid_file.parent}")
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check(tmp: Path, progress: Progress) -> None:
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    etc, work = tmp / "etc", tmp / "work"
    for directory in (src, etc, work):
        directory.mkdir()
    env = clean_env(tmp, venv)
    py = venv / "bin" / "python"
    cli = str(venv / "bin" / "bothy-notify")

    progress.say("building the sdist from the git-tracked files, and the wheel from it")
    tracked_tree(src)
    run(
        [sys.executable, "-m", "build", "--outdir", dist, src],
        timeout=BUILD_TIMEOUT,
        cwd=tmp,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        what="python -m build",
    )
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(f"expected one wheel and one sdist, found {wheels + sdists}")
    with tarfile.open(sdists[0]) as sdist:
        links = [m.name for m in sdist.getmembers() if m.issym() or m.islnk()]
    if links:
        raise CheckFailed(f"the sdist holds links instead of files: {links}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        top = {name.split("/")[0] for name in wheel.namelist()}
    if {t for t in top if not t.endswith(".dist-info")} != {"bothy_notify", "gateway"}:
        raise CheckFailed(f"the wheel holds more than the product's packages: {sorted(top)}")
    progress.say(f"built {sdists[0].name} and {wheels[0].name}")

    progress.say("installing the wheel without extras into a fresh virtualenv")
    run(
        [sys.executable, "-m", "venv", "--without-pip", venv],
        timeout=COMMAND_TIMEOUT,
        cwd=tmp,
        env=env,
        what="python -m venv",
    )
    run(
        [sys.executable, "-m", "pip", "--python", py, "install", "--quiet", wheels[0]],
        timeout=INSTALL_TIMEOUT,
        cwd=tmp,
        env=env,
        what="pip install (the wheel, no extras)",
    )

    progress.say("importing from another directory; comparing the packaged files")
    inspected = json.loads(
        run([py, "-c", INSPECT], timeout=COMMAND_TIMEOUT, cwd=work, env=env, what="import").stdout
    )
    _compare_package_data(inspected, venv)
    run([cli, "--help"], timeout=COMMAND_TIMEOUT, cwd=work, env=env, what="bothy-notify --help")
    version = run(
        [cli, "--version"],
        timeout=COMMAND_TIMEOUT,
        cwd=work,
        env=env,
        what="bothy-notify --version",
    )
    if not re.fullmatch(r"bothy-notify \d+\.\d+\.\d+\S*\n", version.stdout):
        raise CheckFailed(f"--version did not name the version: {version.stdout!r}")

    progress.say("bothy-notify check-config")
    (work / "check.toml").write_text(CHECK_CONFIG)
    (etc / "bothy.toml").write_text(DAEMON_CONFIG)
    for config in ("check.toml", "../etc/bothy.toml"):
        answer = run(
            [cli, "check-config", "--config", config],
            timeout=COMMAND_TIMEOUT,
            cwd=work,
            env=env,
            what=f"bothy-notify check-config --config {config}",
        )
        if "configuration OK" not in answer.stdout:
            raise CheckFailed(f"check-config did not say OK: {answer.stdout!r}")

    token = run(
        [
            *(cli, "dev-token", "--config", "../etc/bothy.toml", "--user", "backend"),
            *("--device", "install-check", "--platform", "linux", "--kind", "app"),
            *("--scope", "events:write"),
        ],
        timeout=COMMAND_TIMEOUT,
        cwd=work,
        env=env,
        what="bothy-notify dev-token",
    ).stdout.strip()

    progress.say('bothy-notify run on the embedded PostgreSQL (database.url = "")')
    daemon = DaemonProcess(
        config_file=Path("../etc/bothy.toml"),
        log_file=tmp / "daemon.log",  # never in the working directory: it must stay clean
        command=(cli,),
        cwd=work,
        environ=env,
    )
    try:
        try:
            daemon.start_sync(timeout=STARTUP_TIMEOUT)
        except DaemonFailed as exc:
            raise CheckFailed(str(exc)) from None
        if (daemon.ready["role"], daemon.ready["processes"]) != ("all", 1) or not daemon.gateway:
            raise CheckFailed(f"the ready file does not describe the node: {daemon.ready}")
        api = daemon.api
        progress.say(f"daemon serving on {api}; appending one event over HTTP (urllib)")
        answer = json.loads(
            run(
                [py, "-c", APPEND, api, token],
                timeout=REQUEST_TIMEOUT,
                cwd=work,
                env=env,
                what="POST /v1/events",
            ).stdout
        )
        seqs = answer["body"].get("seqs")
        if (
            answer["health"] != 200
            or answer["page"] != 200
            or answer["status"] != 200
            or not _one_seq(seqs)
        ):
            raise CheckFailed(f"unexpected answer to the append: {answer}")
        progress.say(f"appended: seq {seqs[0]}; SIGTERM")
        stopped_at = time.monotonic()
        try:
            code = daemon.stop_sync(timeout=DRAIN_PERIOD)
        except DaemonStuck:
            raise CheckFailed(
                f"the daemon did not exit within the drain period ({DRAIN_PERIOD:g}s)"
            ) from None
        took = time.monotonic() - stopped_at
        if code != 0:
            raise CheckFailed(f"the daemon exited with {code} after SIGTERM")
        progress.say(f"daemon exited 0 in {took:.1f}s")
    except Exception:
        print(f"--- daemon output\n{daemon.log_text()}---", flush=True)
        raise
    finally:
        with contextlib.suppress(DaemonStuck):
            daemon.stop_sync(timeout=STOP_TIMEOUT)
    if daemon.ready_file is not None and daemon.ready_file.exists():
        raise CheckFailed("the ready file is still there after the daemon exited")

    data_dir = etc / "state" / "postgres"
    if not (data_dir / "PG_VERSION").is_file():
        raise CheckFailed("the embedded data directory is not next to the configuration file")
    if (data_dir / "postmaster.pid").exists():
        raise CheckFailed("the embedded PostgreSQL still runs after the daemon exited")
    if sorted(p.name for p in work.iterdir()) != ["check.toml"]:
        raise CheckFailed(f"files appeared in the working directory: {list(work.iterdir())}")

    progress.say("bothy-notify demo (its own throwaway embedded PostgreSQL)")
    demo = run(
        [cli, "demo", "--delay", "1s"],
        timeout=DEMO_TIMEOUT,
        cwd=work,
        env=env,
        what="bothy-notify demo",
    )
    if "All seven cases behaved as planned" not in demo.stdout:
        raise CheckFailed(f"the demo did not succeed:\n{demo.stdout}")


def _one_seq(seqs: object) -> bool:
    return isinstance(seqs, list) and len(seqs) == 1 and isinstance(seqs[0], int)


def _compare_package_data(inspected: dict[str, object], venv: Path) -> None:
    """The installed package is the venv's, and carries the repository's files."""
    package = Path(str(inspected["package"])).resolve()
    if venv.resolve() not in package.parents:
        raise CheckFailed(f"bothy_notify was imported from {package}, not from the venv")
    events = {
        p.name.removesuffix(".json"): json.loads(p.read_text(encoding="utf-8"))
        for p in (ROOT / "schemas" / "events").glob("*.json")
    }
    expected = {
        "events": events,
        "config_schema": json.loads((ROOT / "schemas" / "config.schema.json").read_text()),
        "example": (ROOT / "config" / "bothy-notify.example.toml").read_text(encoding="utf-8"),
        "openapi": hashlib.sha256((ROOT / "schemas" / "openapi.yaml").read_bytes()).hexdigest(),
        "migrations": sorted(
            p.name for p in (ROOT / "bothy_notify" / "store" / "migrations").glob("*.sql")
        ),
    }
    for key, value in expected.items():
        if inspected[key] != value:
            raise CheckFailed(f"the wheel's {key} differ from the repository's")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    progress = Progress()
    tmp = Path(tempfile.mkdtemp(prefix="bothy-install-check-"))
    progress.say(f"working in {tmp}")
    try:
        check(tmp, progress)
    except CheckFailed as exc:
        progress.say(f"FAILED: {exc}")
        return 1
    finally:
        stop_embedded_servers(tmp, progress)
        if args.keep:
            progress.say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    progress.say("passed: the wheel installs, runs, takes an event and stops cleanly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
