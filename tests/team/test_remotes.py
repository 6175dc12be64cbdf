"""nscas remote / push / pull, as real processes: between two SQLite stores, between SQLite and a
PostgreSQL + S3 store; a push killed half-way and resumed; two pushers at once; ref conflicts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nscas.objects.digests import Digest
from nscas.remotes.transfer import _closure
from nscas.signing.signatures import KeySigner, load_key, new_key
from nscas.store.opening import open_store
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import build_records, random_bytes, write_safetensors
from tests.store.services import TeamServices
from tests.team.cli import nscas, team_store


def _fill(store: Store, tmp: Path) -> dict[str, Digest]:
    """A signed receipt, a checkpoint file of parts, and a directory of chunk files, each
    under a ref."""
    receipt = build_records(store)["receipt/1"][0]
    signer = KeySigner(load_key(new_key(tmp / "keys" / "k").private))
    signature = signer.sign(store, receipt)
    write_safetensors(tmp / "m.safetensors", {"a": np.arange(6000, dtype=np.float32),
                                              "b": np.ones(5000, np.float32)})
    model = store.put_file(tmp / "m.safetensors")
    (tmp / "d").mkdir()
    for i in range(3):
        (tmp / "d" / f"f{i}").write_bytes(random_bytes(20000, seed=i))
    tree = store.put_tree(tmp / "d")
    for name, oid in (("runs/r", receipt), ("models/m", model), ("data/d", tree)):
        store.ref_set(name, oid)
    return {"receipt": receipt, "signature": signature, "model": model, "tree": tree}


def _json(ran: object) -> dict:  # type: ignore[type-arg]
    assert ran.code == 0, ran.err  # type: ignore[attr-defined]
    return json.loads(ran.out)  # type: ignore[attr-defined]


def _clean(where: Path, *, notes: bool = False) -> Store:
    """The store at ``where``, after ``fsck --deep`` found nothing wrong (``notes``: what a
    killed writer leaves, a temporary key or a chunk without its row, for gc, is allowed)."""
    s = open_store(where)
    report = fsck(s, deep=True)
    assert (report.errors if notes else report.findings) == ()
    return s


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[str, Digest], set[Digest]]:
    s = init_store(tmp_path / "a")
    ids = _fill(s, tmp_path)
    wanted = set().union(*(_closure(s, [ids[k]]) for k in ("receipt", "model", "tree")))
    s.close()
    return tmp_path / "a" / ".nscas", ids, wanted


def test_push_and_pull_between_sqlite_stores(filled: tuple[Path, dict[str, Digest], set[Digest]],
                                             tmp_path: Path) -> None:
    a, ids, wanted = filled
    init_store(tmp_path / "b").close()
    b = tmp_path / "b" / ".nscas"
    assert nscas("remote", "add", "origin", str(tmp_path / "b"), store=a).code == 0
    listed = _json(nscas("remote", "list", "--json", store=a))
    assert listed == [{"name": "origin", "url": str(tmp_path / "b")}]
    sent = 0
    for ref in ("runs/r", "models/m", "data/d"):
        out = _json(nscas("push", ref, "--json", store=a))
        assert out["ref"] == ref and out["ref_moved"]
        sent += out["sent"]
    assert sent == len(wanted)  # exactly the closures, each object once
    with _clean(b) as s:
        assert {i.id for i in s.iter_objects()} == wanted
        assert s.ref_get("runs/r") == ids["receipt"] and s.has(ids["signature"])
        assert s.part_ids(ids["model"]) != []  # the checkpoint stays cut at its tensors
    again = _json(nscas("push", "models/m", "--json", store=a))
    assert (again["sent"], again["ref_moved"]) == (0, False)
    # Pull into a third store from the second.
    init_store(tmp_path / "c").close()
    c = tmp_path / "c" / ".nscas"
    assert nscas("remote", "add", "b", str(b), store=c).code == 0
    out = _json(nscas("pull", "runs/r", "--from", "b", "--json", store=c))
    assert out["ref_moved"]
    with _clean(c) as s:
        assert s.ref_get("runs/r") == ids["receipt"] and s.has(ids["signature"])
        assert not s.has(ids["model"])
    assert nscas("remote", "remove", "b", store=c).code == 0
    for args in (("push", "runs/r"), ("remote", "remove", "b"), ("remote", "add", "x", str(tmp_path)),
                 ("remote", "add", "bad name", str(b)), ("pull", "nothing/here", "--from", "b")):
        ran = nscas(*args, store=c)
        assert ran.code == 2 and len(ran.err.strip().splitlines()) == 1, (args, ran.err)


def test_an_output_travels_with_the_receipt_that_produced_it(tmp_path: Path) -> None:
    """Pulling a run's output brings its evidence too (as export does): the receipt, and its
    signatures, so the other side can verify what it pulled."""
    s = init_store(tmp_path / "a")
    ids = _fill(s, tmp_path)
    output = Digest.parse(s.get_record(ids["receipt"])["outputs"]["checkpoint"])
    s.ref_set("runs/out", output)
    s.close()
    init_store(tmp_path / "c").close()
    c = tmp_path / "c" / ".nscas"
    assert nscas("remote", "add", "a", str(tmp_path / "a"), store=c).code == 0
    out = _json(nscas("pull", "runs/out", "--json", store=c))
    assert (out["target"], out["producer"]) == (str(output), str(ids["receipt"]))
    with _clean(c) as got:
        assert got.ref_get("runs/out") == output
        assert got.has(ids["receipt"]) and got.has(ids["signature"])
    text = nscas("pull", "runs/out", store=c)
    assert text.code == 0 and f"with the receipt that produced it, {ids['receipt']}" in text.out
    # A blob no receipt produced goes alone.
    alone = _json(nscas("pull", "models/m", "--json", store=c))
    assert alone["producer"] is None


def test_push_to_and_pull_from_a_team_store(filled: tuple[Path, dict[str, Digest], set[Digest]],
                                            team_services: TeamServices, tmp_path: Path) -> None:
    a, ids, wanted = filled
    toml = team_store(team_services, tmp_path / "team")
    assert nscas("remote", "add", "lab", str(toml), store=a).code == 0
    for ref in ("runs/r", "models/m", "data/d"):
        assert nscas("push", ref, "--to", "lab", store=a).code == 0
    with _clean(toml.parent) as s:
        assert {i.id for i in s.iter_objects()} == wanted
        assert s.ref_get("models/m") == ids["model"]
    # The team store pulls nothing it has; a fresh SQLite store pulls from it.
    init_store(tmp_path / "laptop").close()
    laptop = tmp_path / "laptop" / ".nscas"
    assert nscas("remote", "add", "lab", str(toml), store=laptop).code == 0
    out = _json(nscas("pull", "models/m", "--json", store=laptop))  # the only remote
    # The model's chunks travel in their stored codec (byte planes pay on this float data): more
    # than nothing, less than the raw file.
    assert 0 < out["bytes_sent"] < (tmp_path / "m.safetensors").stat().st_size
    with _clean(laptop) as s:
        assert s.get_bytes(ids["model"]) == (tmp_path / "m.safetensors").read_bytes()


def test_ref_moves_only_from_a_value_it_held_here(tmp_path: Path) -> None:
    a, b = init_store(tmp_path / "a"), init_store(tmp_path / "b")
    v1, v2, other = (a.put_bytes(x) for x in (b"one", b"two", b"other"))
    a.ref_set("best", v1)
    b.ref_set("best", b.put_bytes(b"other"))
    for s in (a, b):
        s.close()
    sa, sb = tmp_path / "a" / ".nscas", tmp_path / "b" / ".nscas"
    assert nscas("remote", "add", "b", str(sb), store=sa).code == 0
    ran = nscas("push", "best", store=sa)
    assert ran.code == 2 and len(ran.err.strip().splitlines()) == 1 and "diverged" in ran.err
    with open_store(sb, readonly=True) as s:
        assert s.ref_get("best") == other and s.has(v1)  # the objects went; the ref did not
    with open_store(sb) as s:
        s.ref_set("best", v1)
    with open_store(sa) as s:
        s.ref_set("best", v2)  # moves on from v1
    assert nscas("push", "best", store=sa).code == 0
    with open_store(sb, readonly=True) as s:
        assert s.ref_get("best") == v2
    assert nscas("push", "tags/none", store=sa).code == 2


_PUSH = [sys.executable, "-m", "nscas.cli", "push", "data/big", "--json"]


def _many_files(tmp_path: Path, n: int) -> tuple[Path, Digest]:
    s = init_store(tmp_path / "a")
    d = tmp_path / "big"
    d.mkdir()
    for i in range(n):
        (d / f"f{i:03d}").write_bytes(random_bytes(8000, seed=100 + i))
    tree = s.put_tree(d)
    s.ref_set("data/big", tree)
    s.close()
    return tmp_path / "a" / ".nscas", tree


def test_push_killed_midway_resumes(team_services: TeamServices, tmp_path: Path) -> None:
    a, tree = _many_files(tmp_path, 120)
    toml = team_store(team_services, tmp_path / "team")
    assert nscas("remote", "add", "lab", str(toml), store=a).code == 0
    env = {**os.environ, "NSCAS_STORE": str(a)}
    proc = subprocess.Popen(_PUSH, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    with open_store(toml, readonly=True) as team:
        while team.counts()["objects"] < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        part = team.counts()["objects"]
        assert 10 <= part < 121 and team.ref_get("data/big") is None
    with _clean(toml.parent, notes=True):
        pass  # what arrived is a closed set: every link and part of it is there
    out = _json(nscas("push", "data/big", "--json", store=a))
    assert out["sent"] <= 121 - part + 1 and out["objects"] == 121 and out["ref_moved"]
    with _clean(toml.parent, notes=True) as s:
        assert s.counts()["objects"] == 121 and s.ref_get("data/big") == tree


def test_two_pushers_at_once(team_services: TeamServices, tmp_path: Path) -> None:
    a, tree = _many_files(tmp_path, 60)
    toml = team_store(team_services, tmp_path / "team")
    assert nscas("remote", "add", "lab", str(toml), store=a).code == 0
    env = {**os.environ, "NSCAS_STORE": str(a)}
    procs = [subprocess.Popen(_PUSH, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    reports = [json.loads(out) for out, _ in outs]
    assert sum(r["ref_moved"] for r in reports) >= 1
    assert all(r["sent"] <= 61 for r in reports)
    with _clean(toml.parent) as s:
        assert s.counts()["objects"] == 61 and s.ref_get("data/big") == tree
