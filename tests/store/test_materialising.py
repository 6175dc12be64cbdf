"""get and open of an object of many leaves: leaves decode ahead on threads, in order, each
checked; a bad leaf anywhere fails the read and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nscas.errors import IntegrityError
from nscas.objects.digests import Digest
from nscas.store.materialising import decoded_leaves
from nscas.store.writer import Store
from tests.store.helpers import write_safetensors


def _family(tmp_path: Path, n: int = 12) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    parent = {f"t{i:02d}": (rng.standard_normal(70_000) * 0.02).astype(np.float32)
              for i in range(n)}
    child = {k: v + (rng.standard_normal(v.shape) * 1e-5).astype(np.float32)
             for k, v in parent.items()}
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_safetensors(a, parent)
    write_safetensors(b, child)
    return a, b


def _count_leaf_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[Digest]:
    """The leaves the store reads from now on, in order (its read_leaf wrapped to note them)."""
    read: list[Digest] = []
    real = type(store).read_leaf

    def counting(self: Store, leaf: Digest, *rest: object) -> bytes:
        read.append(leaf)
        return real(self, leaf, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store), "read_leaf", counting)
    return read


def test_a_delta_coded_file_of_many_leaves_reads_back_by_get_and_open(
        store: Store, tmp_path: Path) -> None:
    a, b = _family(tmp_path)
    child = store.put_file(b, base=store.put_file(a))
    codecs_seen = {store.info(leaf).codec for leaf, *_ in store.leaves(child)}
    assert "sub4" in codecs_seen and len(list(store.leaves(child))) > 5
    store.materialise(child, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b.read_bytes()
    with store.open(child) as f:
        assert f.read() == b.read_bytes()


def test_reading_the_first_leaf_decodes_no_other(store: Store, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = _family(tmp_path)
    oid = store.put_file(a)
    read = _count_leaf_reads(store, monkeypatch)
    with store.open(oid) as f:
        assert f.read(8) == a.read_bytes()[:8]
    assert len(read) == 1


def test_a_bad_leaf_in_the_middle_fails_get_and_leaves_nothing(store: Store,
                                                               tmp_path: Path) -> None:
    a, b = _family(tmp_path)
    child = store.put_file(b, base=store.put_file(a))
    leaves = [leaf for leaf, _, inline, _, _ in store.leaves(child) if inline is None]
    victim = store.chunks.path(leaves[len(leaves) // 2])  # type: ignore[attr-defined]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError):
        store.materialise(child, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".nscas-get-")] == []
    with pytest.raises(IntegrityError), store.open(child) as f:
        f.read()


def test_no_more_leaves_than_ahead_decode_before_they_are_read(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = _family(tmp_path)
    oid = store.put_file(a)
    leaves = list(store.leaves(oid))
    read = _count_leaf_reads(store, monkeypatch)
    it = decoded_leaves(store, leaves, ahead=3)
    first, second = next(it), next(it)
    assert len(read) <= 2 + 3  # the two read, and at most 3 decoding ahead
    assert first + second + b"".join(it) == a.read_bytes()
    it.close()
