"""Two real processes writing one store at once: nothing lost, no CAS update overwritten."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from nscas.objects.digests import Digest
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import b3, random_bytes

REPO = Path(__file__).resolve().parents[2]
TIMES = 200  # increments per process


@pytest.mark.slow
def test_two_processes_share_a_store(store: Store, tmp_path: Path) -> None:
    shared = tmp_path / "shared.bin"
    data = random_bytes((16 << 20) + 5000, seed=3)  # two chunks, written by both processes
    shared.write_bytes(data)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.store.workers", "counter", str(store.root),
                               "counters/n", str(TIMES), tag, str(shared), str(tmp_path / "go")],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in ("left", "right")]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    (tmp_path / "go").touch()  # both are past start-up: from here on they race
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))

    # The counter reached exactly 2 x TIMES: no increment was lost to a concurrent one.
    final = store.ref_get("counters/n")
    assert final is not None and store.get_bytes(final) == b"%d" % (2 * TIMES)
    # The ref log is one chain: each entry moves from the previous entry's value, 1, 2, 3, ...
    log = list(reversed(store.ref_log("counters/n")))
    assert len(log) == 2 * TIMES
    assert log[0].old is None
    for prev, entry in pairwise(log):
        assert entry.old == prev.new
    assert [store.get_bytes(e.new) for e in log] == [b"%d" % (i + 1) for i in range(2 * TIMES)]
    # Every object either process added is present and intact.
    for r in results:
        for oid in r["own"]:
            assert store.has(Digest.parse(oid))
    for i in range(TIMES):
        assert store.has(Digest.parse(b3(b"shared object %d" % i)))
    assert store.get_bytes(Digest.parse(b3(data))) == data
    assert fsck(store, deep=True).findings == ()
    # The processes really did contend (retries happen only when the other one won a race).
    assert sum(r["retries"] for r in results) > 0
