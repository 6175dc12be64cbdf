"""A team store under load and faults, with real processes: four writers on two "hosts" (two
working directories, each with its own store.toml naming one PostgreSQL + S3 store), a writer
killed mid-put, and the database restarted during a run."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nscas.objects.digests import Digest
from nscas.store.config import render_config
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import b3, random_bytes
from tests.store.services import TeamServices
from tests.team.cli import nscas

_WRITER = """
import sys
from pathlib import Path
import pytest

from nscas.objects.digests import Digest
from nscas.errors import RefConflict
from nscas.store.opening import open_store

root, me, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open_store(root) as s:
    for i in range(rounds):
        shared = s.put_bytes(b"shared %d " % i * 600)      # every writer puts the same bytes
        own = s.put_bytes(f"{me} {i} ".encode() * 700)      # and bytes of its own
        s.ref_set(f"own/{me}", own)
        while True:                                          # one shared ref, moved by CAS
            old = s.ref_get("shared/last")
            try:
                s.ref_set("shared/last", own, expect=old, message=f"{me} {i}")
                break
            except RefConflict:
                continue
        assert s.get_bytes(shared) == b"shared %d " % i * 600
"""


def _errors(store_dir: Path) -> tuple[object, ...]:
    with open_store(store_dir, readonly=True) as s:
        return fsck(s, deep=True).errors


def _hosts(services: TeamServices, tmp_path: Path, n: int = 2) -> list[Path]:
    """``n`` working directories whose stores are one team store."""
    config = services.config()
    init_store(tmp_path / "host0", config).close()
    dirs = [tmp_path / f"host{i}" / ".nscas" for i in range(n)]
    for d in dirs[1:]:
        d.mkdir(parents=True)
        (d / "store.toml").write_text(render_config(config))
    return dirs


def test_four_writers_on_two_hosts(team_services: TeamServices, tmp_path: Path) -> None:
    hosts = _hosts(team_services, tmp_path)
    rounds = 15
    names = [f"w{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(hosts[i % 2]), me, str(rounds)],
                              cwd=hosts[i % 2].parent, stderr=subprocess.PIPE, text=True)
             for i, me in enumerate(names)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errs
    with open_store(hosts[1], readonly=True) as s:
        log = list(reversed(s.ref_log("shared/last")))
        assert len(log) == 4 * rounds  # no update lost
        assert all(a.new == b.old for a, b in itertools.pairwise(log))  # one chain
        assert log[-1].new == s.ref_get("shared/last")
        assert sorted(e.message for e in log) == sorted(f"{m} {i}" for m in names
                                                        for i in range(rounds))
        for me in names:
            assert s.get_bytes(s.ref_get(f"own/{me}")) == f"{me} {rounds - 1} ".encode() * 700
        assert s.counts()["objects"] == rounds * 5  # 15 shared + 4 × 15 own, each once
    assert _errors(hosts[0]) == ()


def test_a_writer_killed_mid_put(team_services: TeamServices, tmp_path: Path) -> None:
    (host,) = _hosts(team_services, tmp_path, 1)
    big = tmp_path / "big.bin"
    env = {**os.environ, "NSCAS_STORE": str(host)}
    for attempt in range(5):
        # A fresh file each time: the add may commit before its first chunk is seen (a fast
        # machine); then the kill did not land mid-put, and the case is tried again.
        big.write_bytes(random_bytes(40 << 20, seed=5 + attempt))  # three 16 MiB chunks
        oid = Digest.parse(b3(big.read_bytes()))
        proc = subprocess.Popen([sys.executable, "-m", "nscas.cli", "add", str(big)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open_store(host, readonly=True) as s:
            seen = len(list(s.chunks.iter_ids()))
            deadline = time.monotonic() + 120
            # Until a chunk of the add appears, or the add has ended (it committed before one
            # was seen: tried again at once, not after the deadline).
            while proc.poll() is None and not s.chunks.temporary_files() \
                    and len(list(s.chunks.iter_ids())) == seen and time.monotonic() < deadline:
                time.sleep(0.01)
            proc.send_signal(signal.SIGSTOP)  # it can commit nothing from here on
            mid_put = not s.has(oid)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if mid_put:
                assert not s.has(oid)  # no row of the file: not visible
                break
    else:
        pytest.fail("in 5 tries, every add committed before the kill could land mid-put")
    assert _errors(host) == ()
    ran = nscas("add", str(big), "--json", store=host)
    assert ran.code == 0, ran.err
    with open_store(host, readonly=True) as s:
        oid = Digest.parse(b3(big.read_bytes()))
        assert s.get_bytes(oid) == big.read_bytes()
    assert _errors(host) == ()


def test_database_restarted_during_a_run(team_services: TeamServices, tmp_path: Path) -> None:
    (host,) = _hosts(team_services, tmp_path, 1)
    d = tmp_path / "many"
    d.mkdir()
    for i in range(200):
        (d / f"f{i:03d}").write_bytes(random_bytes(6000, seed=1000 + i))
    env = {**os.environ, "NSCAS_STORE": str(host)}
    proc = subprocess.Popen([sys.executable, "-m", "nscas.cli", "add", str(d), "--ref", "data/d"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open_store(host, readonly=True) as s:
        deadline = time.monotonic() + 120
        while s.counts()["objects"] < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
    team_services.postgres.stop()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        team_services.postgres.start()
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "database" in err, err
    with open_store(host, readonly=True) as s:
        assert s.ref_get("data/d") is None and 20 <= s.counts()["objects"] < 201
    assert _errors(host) == ()
    ran = nscas("add", str(d), "--ref", "data/d", store=host)
    assert ran.code == 0, ran.err
    with open_store(host, readonly=True) as s:
        assert s.counts()["objects"] == 201
    assert _errors(host) == ()
