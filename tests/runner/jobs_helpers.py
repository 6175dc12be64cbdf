"""For the scheduler tests: the probe recipe registered where every process finds it (an
entry point on PYTHONPATH), ``nscas`` run as a real process, and process-liveness checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nscas.store.workarea import process_start
from tests.waiting import run_to_end

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = """\
[nscas.recipes]
probe = tests.runner.probe_recipe:RECIPE

[nscas.resources]
probe = tests.runner.probe_recipe:needs
"""
GONE_WITHIN_S = 30.0


def probe_site(directory: Path) -> Path:
    """A directory that, on ``sys.path``, registers the probe recipe and its needs."""
    info = directory / "nscas_probe-1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nscas-probe\nVersion: 1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return directory


def environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
            "COLUMNS": "200"}


def start_nscas(home: Path, site: Path, *args: object) -> subprocess.Popen[str]:
    """``nscas ARGS`` as a process of its own, in ``home`` (whose .nscas it uses)."""
    return subprocess.Popen([sys.executable, "-m", "nscas.cli", *map(str, args)], cwd=home,
                            env=environment(site), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def nscas_process(home: Path, site: Path, *args: object) -> subprocess.CompletedProcess[str]:
    """``nscas ARGS`` run to its end, in ``home``: however long it takes while it works (a
    real recipe on a loaded machine), failed once it is stuck (tests.waiting.run_to_end)."""
    return run_to_end([sys.executable, "-m", "nscas.cli", *map(str, args)],
                      f"nscas {' '.join(map(str, args))}", cwd=home, env=environment(site),
                      text=True)


def facts(hold: Path, label: str) -> list[dict[str, Any]]:
    """What each execution of the probe labelled ``label`` wrote (one per execution)."""
    path = hold / f"{label}.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def release_fifo(hold: Path, label: str) -> Path:
    path = hold / f"{label}.release"
    os.mkfifo(path)
    return path


def wait_running(fifo: Path) -> int:
    """Open the writing end of a probe's release FIFO: returns once the probe has opened it
    (so it is running); closing the descriptor lets it finish."""
    return os.open(fifo, os.O_WRONLY)


def gone(pid: int) -> bool:
    return process_start(pid) is None


def wait_gone(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``GONE_WITHIN_S``: a process killed with
    its parent is reaped by init, whose timing no event tells."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found
