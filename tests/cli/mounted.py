"""Run nscas inside a mount namespace of its own (``unshare -m``), as root: a store on a
read-only bind mount or a tiny tmpfs is then real, not a permission bit root would ignore.

Invoked as ``unshare -m python -m tests.cli.mounted STEPS_JSON``; each step is one of
``{"mount": [args]}``, ``{"sh": "command"}`` or ``{"nscas": [args], "cwd": dir}``; prints a JSON
list of ``{"args", "exit_code", "stdout", "stderr"}``, one per nscas step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def usable() -> bool:
    """Whether this machine lets a test mount inside a namespace of its own."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d "
                            "&& mount -o remount,ro $d && ! touch $d/x 2>/dev/null"],
                           capture_output=True, timeout=30, check=False)
    return probe.returncode == 0


def run(steps: list[dict[str, Any]], *, timeout: float = 300) -> list[dict[str, Any]]:
    """Run ``steps`` in a new mount namespace; the results of the nscas steps."""
    env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    p = subprocess.run(["unshare", "-m", sys.executable, "-m", "tests.cli.mounted",
                        json.dumps(steps)], cwd=Path(__file__).resolve().parents[2], env=env,
                       capture_output=True, timeout=timeout, check=False)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout)


def _main(steps: list[dict[str, Any]]) -> None:
    # Mounts made here stay private to this namespace (systemd makes / shared by default).
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    out = []
    for step in steps:
        if "mount" in step:
            subprocess.run(["mount", *step["mount"]], check=True)
        elif "sh" in step:
            subprocess.run(step["sh"], shell=True, check=True)
        else:
            p = subprocess.run([sys.executable, "-m", "nscas.cli.main", *step["nscas"]],
                               cwd=step.get("cwd"), capture_output=True, timeout=120,
                               check=False)
            out.append({"args": step["nscas"], "exit_code": p.returncode,
                        "stdout": p.stdout.decode(errors="replace"),
                        "stderr": p.stderr.decode(errors="replace")})
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
