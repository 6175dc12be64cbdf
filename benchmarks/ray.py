"""Ray executor benchmark: a step's cost on a Ray cluster against a local job, side by side.

A pipeline of independent trivial steps (``prepare`` at a tiny size, one seed each) runs with
``--jobs 2`` (scheduled: ``--jobs 1`` is one step at a time in one process) into a new store
per executor, once (every step runs: the trivial step) and again
(every step cached), each executor in turn in one invocation. Printed: each step's mean time
as the scheduler saw it (start to outcome), local and Ray, and the difference, Ray's overhead
per step; and each run's wall time (Ray's includes joining the cluster once). Without
``--ray-address`` it starts a one-node cluster of its own (``ray start --head``, in a process
group it ends itself). Results go to docs/benchmarks.md by hand, with the command line.

    .venv/bin/python benchmarks/ray.py [--steps 6] [--ray-address HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ray.cluster import end_group  # noqa: E402  (the suite's way to end a node's group)

STEP = """
[[step]]
name = "p{seed}"
recipe = "prepare"
[step.params]
seed = {seed}
counts = {{ test = 2, dev = 2, train = 2 }}
replay_count = 1
retention_count = 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _head(base: Path) -> Iterator[str]:
    """A one-node Ray cluster of this benchmark's own; its address."""
    port = _free_port()
    ray = Path(sys.executable).parent / "ray"
    process = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port",
         str(port), "--num-cpus", "2", "--num-gpus", "0", "--include-dashboard=false",
         "--disable-usage-stats", "--temp-dir", str(base / "ray")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        probe = ("import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, "
                 "configure_logging=False)")
        deadline = time.monotonic() + 300
        while subprocess.run([sys.executable, "-c", probe, address],
                             capture_output=True).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit("the benchmark's Ray head did not start")
        yield address
    finally:
        end_group(process)


def _run(home: Path, file: Path, *extra: str) -> tuple[float, list[float], int]:
    """(wall time, each step's seconds, how many were cached) of one ``--jobs 2`` run."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nscas.cli", "run", str(file), "--json",
                           "--jobs", "2", *extra], cwd=home, capture_output=True, text=True)
    wall = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"nscas run {' '.join(extra)} failed:\n{done.stderr}")
    events = [json.loads(line) for line in done.stdout.splitlines()]
    ended = [e for e in events if e["event"] in ("done", "cached")]
    return wall, [float(e["seconds"]) for e in ended], sum(e["event"] == "cached" for e in ended)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--ray-address", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nscas-bench-ray-") as tmp:
        base = Path(tmp)
        file = base / "trivial.toml"
        file.write_text("".join(STEP.format(seed=s) for s in range(1, args.steps + 1)))
        with contextlib.ExitStack() as stack:
            address = args.ray_address or stack.enter_context(_head(base))
            rows = {}
            for name, extra in (("local", ("--executor", "local")),
                                ("ray", ("--executor", "ray", "--ray-address", address))):
                home = base / f"store-{name}"
                home.mkdir()
                subprocess.run([sys.executable, "-m", "nscas.cli", "init"], cwd=home,
                               check=True, capture_output=True)
                rows[name] = (_run(home, file, *extra), _run(home, file, *extra))
    print(f"machine: {len(os.sched_getaffinity(0))} CPU cores; {args.steps} independent "
          f"trivial steps, --jobs 2; Ray at {args.ray_address or 'a one-node cluster of its own'}")
    for i, what in enumerate(("trivial step (runs)", "cached step")):
        (lw, ls, lc), (rw, rs, rc) = rows["local"][i], rows["ray"][i]
        assert lc == rc == (args.steps if i else 0), "the runs did not cache as expected"
        local, ray = statistics.mean(ls), statistics.mean(rs)
        print(f"{what:<22} local {local:6.2f} s/step   ray {ray:6.2f} s/step   "
              f"ray overhead {ray - local:+6.2f} s/step   (walls: local {lw:.1f} s, "
              f"ray {rw:.1f} s)")


if __name__ == "__main__":
    main()
