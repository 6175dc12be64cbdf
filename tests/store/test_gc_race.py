"""gc and puts at once: a put in progress or one that reuses stored objects is never broken."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nscas.objects.digests import Digest
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import b3, chunk_path, random_bytes, random_f32, write_safetensors

REPO = Path(__file__).resolve().parents[2]


def _gc_between_lookup_and_insert(store: Store, monkeypatch: pytest.MonkeyPatch,
                                  doomed: list[Digest]) -> list[list[bool]]:
    """Make a gc commit right before the put's first insert (after its lookups); returns, per
    insert attempt, which leaves the put reused."""
    real_insert = store._insert
    attempts: list[list[bool]] = []

    def insert(leaves: list[Any], *args: Any, **kwargs: Any) -> None:
        attempts.append([leaf.reused for leaf in leaves])
        if len(attempts) == 1:
            assert set(store.delete_objects(doomed)) == set(doomed)
        real_insert(leaves, *args, **kwargs)

    monkeypatch.setattr(store, "_insert", insert)
    return attempts


def test_put_bytes_stores_again_what_gc_removed_under_it(store: Store,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = random_bytes(9000, seed=11)
    oid = store.put_bytes(data)  # stored and unreachable: gc may remove it
    attempts = _gc_between_lookup_and_insert(store, monkeypatch, [oid])
    assert store.put_bytes(data) == oid
    # The first attempt reused the stored leaf and found it gone at insert; the second wrote it.
    assert attempts == [[True], [False]]
    assert store.get_bytes(oid) == data and chunk_path(store, oid).is_file()
    assert fsck(store, deep=True).findings == ()


def test_put_file_stores_again_what_gc_removed_under_it(store: Store, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = {"a": random_f32(3000, seed=1), "b": random_f32(3000, seed=2)}
    write_safetensors(tmp_path / "one.safetensors", tensors)
    first = store.put_file(tmp_path / "one.safetensors")
    old = [first, *(p for _, p in store.part_ids(first))]
    write_safetensors(tmp_path / "two.safetensors", {**tensors, "b": random_f32(3000, seed=3)})
    attempts = _gc_between_lookup_and_insert(store, monkeypatch, old)
    second = store.put_file(tmp_path / "two.safetensors")
    assert str(second) == b3((tmp_path / "two.safetensors").read_bytes())
    # Tensor "a" was reused, then removed by the gc: the retry wrote it again. (The header is
    # inline: its row carries its bytes, so inserting it again is always complete.)
    assert [sum(a) for a in attempts] == [1, 0]
    assert chunk_path(store, Digest.parse(b3(tensors["a"].tobytes()))).is_file()
    assert store.get_bytes(second) == (tmp_path / "two.safetensors").read_bytes()
    assert fsck(store, deep=True).findings == ()


def test_gc_in_a_loop_never_breaks_a_put_in_another_process(store: Store, tmp_path: Path) -> None:
    """A real put (64 MiB: four chunk files written before any row) while gc runs again and
    again with its default minimum age: the put completes and the store stays clean."""
    data = np.random.default_rng(5).bytes(64 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-m", "tests.store.workers", "add", str(store.root),
                             str(tmp_path / "big.bin")], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    rounds = 0
    while proc.poll() is None:
        gc(store)
        rounds += 1
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    oid = Digest.parse(json.loads(out)["id"])
    assert rounds > 1
    assert store.get_bytes(oid) == data
    assert fsck(store, deep=True).findings == ()


def test_gc_through_a_reader_is_a_dry_run_only(store: Store) -> None:
    # gc takes a reader for a dry run (nscas gc --dry-run opens one); a real collection through
    # it is refused before anything is removed.
    from nscas.store.opening import open_store

    doomed = store.put_bytes(b"nothing reaches this")
    reader = open_store(store.root, readonly=True)
    try:
        report = gc(reader, dry_run=True, min_age=0)
        assert report.objects == (doomed,)
        with pytest.raises(TypeError, match="dry run only"):
            gc(reader, min_age=0)
    finally:
        reader.close()
    assert store.has(doomed)
