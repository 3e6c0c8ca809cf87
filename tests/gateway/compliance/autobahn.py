"""Run the Autobahn testsuite's fuzzing client against :mod:`tests.gateway.compliance.echo`.

``make autobahn`` runs this. The testsuite (``wstest``) is Python 2.7 only:
it is installed once, pinned (``autobahn-requirements.txt``), into a
virtualenv at ``.autobahn/py2`` made with the ``virtualenv`` tool (the
standard library's ``venv`` cannot make a Python 2 environment). Python 2.7 is
found as ``$AUTOBAHN_PYTHON2``, ``python2.7`` on ``PATH``, or pyenv's
``~/.pyenv/versions/2.7*``; without one the run stops and says so.

The echo server runs in its own process (the gateway's transport and frame
code, nothing else); the cases are Autobahn's sections 1 to 7 (framing,
pings and pongs, reserved bits, opcodes, fragmentation, UTF-8, closing).
Every case must end ``OK``, except those in :data:`EXPECTED`, whose result is
written there with the reason. The report is written to
``.autobahn/reports/index.html``; the last line printed is one JSON object
with the counts.

Usage: .venv/bin/python -m tests.gateway.compliance.autobahn [--cases 1.* 6.4.*]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
WORK = ROOT / ".autobahn"
PY2 = WORK / "py2"
REQUIREMENTS = Path(__file__).with_name("autobahn-requirements.txt")

SECTIONS = ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*"]
"""Framing, pings/pongs, reserved bits, opcodes, fragmentation, UTF-8, closing."""

EXPECTED: dict[str, tuple[str, str]] = {
    "6.4.3": (
        "NON-STRICT",
        "invalid UTF-8 inside one frame that arrives in pieces: the gateway reads a data "
        "frame whole before it judges it, so it closes with 1007 once the frame is "
        "complete, not at the first bad byte (fail-fast is a SHOULD; a frame is at most "
        "sync.max_frame_bytes)",
    ),
    "6.4.4": ("NON-STRICT", "as 6.4.3, the bad bytes in the frame's second piece"),
    "7.1.6": (
        "INFORMATIONAL",
        "a large message then a close: informational in Autobahn itself (whether the "
        "close overtakes the echo)",
    ),
    "7.13.1": ("INFORMATIONAL", "close code 5000: Autobahn only records it; the gateway: 1002"),
    "7.13.2": ("INFORMATIONAL", "close code 65535: as 7.13.1"),
}
"""Cases whose result is not ``OK``, on purpose or by Autobahn's own design."""

TIMEOUT = 900.0
"""Seconds the whole run may take (about 15 s here)."""


def find_python2() -> str:
    """A Python 2.7 interpreter, or :class:`SystemExit` saying why there is none."""
    candidates = [os.environ.get("AUTOBAHN_PYTHON2", ""), shutil.which("python2.7") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/2.7*/bin/python2.7")))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (2, 7))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "True":
            return candidate
    raise SystemExit(
        "autobahn: the Autobahn testsuite needs Python 2.7 and none was found "
        "(set AUTOBAHN_PYTHON2, or install 2.7 with pyenv)"
    )


def install() -> Path:
    """``wstest`` in ``.autobahn/py2``, installed from the pinned list when it changed."""
    stamp = PY2 / ".installed"
    wanted = REQUIREMENTS.read_text(encoding="utf-8")
    wstest = PY2 / "bin" / "wstest"
    if wstest.exists() and stamp.exists() and stamp.read_text(encoding="utf-8") == wanted:
        return wstest
    python2 = find_python2()
    tool = WORK / "tool"
    if not (tool / "bin" / "virtualenv").exists():
        subprocess.run([sys.executable, "-m", "venv", str(tool)], check=True)
        pip = [str(tool / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        # The last virtualenv that still makes Python 2.7 environments.
        subprocess.run([*pip, "virtualenv<20.22"], check=True)
    shutil.rmtree(PY2, ignore_errors=True)
    subprocess.run([str(tool / "bin" / "virtualenv"), "-q", "-p", python2, str(PY2)], check=True)
    subprocess.run(
        [str(PY2 / "bin" / "pip"), "install", "--quiet", "--no-deps", "-r", str(REQUIREMENTS)],
        check=True,
    )
    stamp.write_text(wanted, encoding="utf-8")
    return wstest


def judge(results: dict[str, dict[str, Any]]) -> list[str]:
    """The cases whose result is neither ``OK`` nor the one :data:`EXPECTED` gives."""
    wrong = []
    for case, result in results.items():
        behaviour, close = result["behavior"], result["behaviorClose"]
        expected, _ = EXPECTED.get(case, ("OK", ""))
        fine = {"OK", expected}
        closing = {"OK", "INFORMATIONAL"} if expected == "INFORMATIONAL" else {"OK"}
        if behaviour not in fine or close not in closing:
            wrong.append(
                f"{case}: {behaviour} / close {close} "
                f"(code {result.get('remoteCloseCode')}, expected {expected})"
            )
    return wrong


def _order(case: str) -> list[int]:
    return [int(part) for part in case.split(".")]


def run(cases: list[str]) -> int:
    wstest = install()
    reports = WORK / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.gateway.compliance.echo", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        address = server.stdout.readline().strip()
        if not address:
            raise SystemExit("autobahn: the echo server did not start")
        spec = {
            "options": {"failByDrop": True},
            "outdir": str(reports),
            "servers": [{"agent": "bothy-gateway", "url": f"ws://{address}/"}],
            "cases": cases,
            "exclude-cases": [],
            "exclude-agent-cases": {},
        }
        spec_file = WORK / "fuzzingclient.json"
        spec_file.write_text(json.dumps(spec, indent=2), encoding="utf-8")
        subprocess.run(
            [str(wstest), "-m", "fuzzingclient", "-s", str(spec_file)],
            cwd=WORK,
            check=True,
            timeout=TIMEOUT,
            stdout=subprocess.DEVNULL,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    index = json.loads((reports / "index.json").read_text(encoding="utf-8"))
    results: dict[str, dict[str, Any]] = index["bothy-gateway"]
    counts = collections.Counter(r["behavior"] for r in results.values())
    for case in sorted(EXPECTED, key=_order):
        if case in results:
            expected, why = EXPECTED[case]
            print(f"{case}: {results[case]['behavior']} (expected {expected}: {why})")
    wrong = judge(results)
    for line in sorted(wrong, key=lambda w: _order(w.partition(":")[0])):
        print("UNEXPECTED", line)
    print(f"autobahn: {len(results)} cases, {dict(counts)}; report {reports / 'index.html'}")
    print(json.dumps({"autobahn": dict(counts), "cases": len(results), "unexpected": len(wrong)}))
    return 1 if wrong or not results else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=SECTIONS, help="Autobahn case patterns")
    args = parser.parse_args()
    sys.exit(run(args.cases))


if __name__ == "__main__":
    main()
