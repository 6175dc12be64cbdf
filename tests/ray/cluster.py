"""A real two-node Ray cluster on 127.0.0.1 for the Ray executor's tests: a head and a second
node, each a ``ray start --block`` process (and its daemons) in a process group of its own,
ended by that group when the tests are done (never ``ray stop``, which ends every Ray on the
host).

Ray 2.60 does not keep such a cluster on loopback: it turns ``--node-ip-address 127.0.0.1``
into the host's own address (``services.resolve_ip_for_localhost``, since ray#1556; see
ray#59110), which its nodes and workers then advertise, and its gRPC servers listen on every
interface. The traffic stays on this host (that address is one of its own), but not on
127.0.0.1; the one switch that keeps loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``)
refuses a second node."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.runner.jobs_helpers import environment, probe_site
from tests.store.services import S3_KEYS, free_port
from tests.waiting import STARTUP, wait_until

RAY = Path(sys.executable).parent / "ray"
NODE_CPUS = 2
"""Each node's CPUs as Ray counts them (not its cores): enough for the demo's two-rank train
and its serve, which need two on one node."""
READY = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
alive = [n for n in ray.nodes() if n["Alive"]]
sys.exit(0 if len(alive) >= int(sys.argv[2]) else 1)
"""


@dataclass
class Cluster:
    address: str
    site: Path
    """Registers the probe recipe (on every node's PYTHONPATH)."""
    env: dict[str, str]
    """What ``nscas`` runs with to use this cluster's recipes."""
    processes: list[subprocess.Popen[bytes]]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(RAY), "start", "--block", "--node-ip-address", "127.0.0.1",
                                 "--num-cpus", str(NODE_CPUS), "--num-gpus", "0",
                                 "--disable-usage-stats", *args],
                                env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


ASK_S = 30.0
"""How long one look at the cluster may take (``ray.init`` waits for a head that is not up):
short, so that a head that died is seen between looks."""


def _has_nodes(address: str, count: int, env: dict[str, str]) -> bool:
    try:
        done = subprocess.run([sys.executable, "-c", READY, address, str(count)], env=env,
                              capture_output=True, timeout=ASK_S)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@contextlib.contextmanager
def local_cluster(base: Path) -> Iterator[Cluster]:
    site = probe_site(base / "site")
    env = {**environment(site), **S3_KEYS, "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    address = f"127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    # Ray's sockets live under its temp dir, and a Unix socket's path has at most 107 bytes:
    # pytest's (per xdist worker) is too deep for them.
    temp = Path(tempfile.mkdtemp(prefix="nscas-ray-", dir="/tmp"))
    try:
        processes.append(_start(["--head", "--port", str(port), "--include-dashboard=false",
                                 "--temp-dir", str(temp),
                                 "--object-store-memory", str(100 << 20)],
                                env, base / "head.log"))
        wait_until(lambda: processes[0].poll() is not None or _has_nodes(address, 1, env),
                   "the Ray head to start", limit=STARTUP, every=0.5)
        assert processes[0].poll() is None, (base / "head.log").read_text()
        processes.append(_start(["--address", address,
                                 "--object-store-memory", str(100 << 20)],
                                env, base / "node.log"))
        wait_until(lambda: processes[1].poll() is not None or _has_nodes(address, 2, env),
                   "the second Ray node to join", limit=STARTUP, every=0.5)
        assert processes[1].poll() is None, (base / "node.log").read_text()
        yield Cluster(address=address, site=site, env=env, processes=processes)
    finally:
        for process in reversed(processes):
            end_group(process)
        shutil.rmtree(temp, ignore_errors=True)


def end_group(process: subprocess.Popen[bytes]) -> None:
    """End a node: SIGTERM to its process group (``ray start --block`` then ends its daemons),
    SIGKILL to what is left of the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
