"""Crash safety (docs/format.md §5): a put killed with SIGKILL at any moment leaves a consistent store."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import numpy as np
import pytest

from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from nscas.upkeep.fsck import fsck, gc
from tests.waiting import GENEROUS

REPO = Path(__file__).resolve().parents[2]
SIZE = 300 << 20


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Digest]:
    """300 MB of random bytes (incompressible: every chunk is written in full)."""
    path = tmp_path_factory.mktemp("crash") / "big.bin"
    rng = np.random.default_rng(42)
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with path.open("wb") as f:
        for _ in range(SIZE // (30 << 20)):
            block = rng.bytes(30 << 20)
            h.update(block)
            f.write(block)
    return path, Digest(h.hexdigest())


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], limit: float = GENEROUS) -> None:
    end = time.monotonic() + limit
    while not condition() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.001)


# Kill points: fixed delays after the put starts, and two moments caught by watching the disk
# (a chunk being written to tmp/; several chunks in place but no database row yet).
MOMENTS = ["0.2s", "0.5s", "1.0s", "temp-file", "three-chunks"]


@pytest.mark.parametrize("moment", MOMENTS)
def test_put_killed_at_any_moment(tmp_path: Path, big_file: tuple[Path, Digest], moment: str) -> None:
    path, oid = big_file
    root = init_store(tmp_path).root
    proc = subprocess.Popen([sys.executable, "-m", "tests.store.workers", "add", str(root), str(path)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    timed = moment[0].isdigit()
    if timed:
        time.sleep(float(moment[:-1]))
    elif moment == "temp-file":
        _wait_for(lambda: any((root / "tmp").iterdir()), proc)
    else:
        _wait_for(lambda: sum(1 for p in (root / "data").rglob("*") if p.is_file()) >= 3, proc)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    finished = proc.returncode == 0
    if not timed:
        assert not finished, "the watched moment came only after the put had finished"
    if finished:  # the put beat the kill on this machine: then it must be complete
        assert json.loads(out)["id"] == str(oid)

    with open_store(root) as s:
        report = fsck(s, deep=True)
        # Temporary files and chunk files without a row are notes; nothing is an error.
        assert report.errors == ()
        assert {f.problem for f in report.findings} <= {"temporary-file", "orphan-chunks"}
        if s.has(oid):  # all or nothing: a present object is complete (the deep check re-hashed it)
            assert s.info(oid).size == SIZE
        else:
            assert not finished
        # A second put of the same file succeeds and yields the same, complete object.
        assert s.put_file(path) == oid
        assert s.info(oid).size == SIZE
        s.ref_set("crash/file", oid)  # reachable, so gc keeps it and removes only the debris
        gc(s, min_age=0)  # nothing else writes to this store now
        report = fsck(s, deep=True)
        assert report.findings == ()
        assert report.deep_bytes == SIZE
