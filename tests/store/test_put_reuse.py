"""A second checkpoint costs what is new in it: stored tensors are hashed once and looked up.

BLAKE3 names a piece, so it comes first; SHA-256, compression and the durable write happen
only for bytes the store does not hold yet. These tests count the SHA-256 work a put does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nscas.objects import chunks
from nscas.objects.digests import Digest
from nscas.store import putting
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import b3, chunk_files, sha256, small_chunks, write_safetensors


class _Counting:
    """Stands in for ``hashlib`` and ``sha256_hex`` in the put pipeline and the chunk writer:
    counts SHA-256 bytes."""

    def __init__(self) -> None:
        self.bytes = 0

    def sha256(self, data: bytes = b"") -> Any:
        counter = self

        class Hash:
            def __init__(self) -> None:
                self._h = hashlib.sha256()
                self.update(data)

            def update(self, chunk: Any) -> None:
                counter.bytes += len(chunk)
                self._h.update(chunk)

            def hexdigest(self) -> str:
                return self._h.hexdigest()

        return Hash()

    def sha256_hex(self, data: Any) -> str:
        self.bytes += len(data)
        return hashlib.sha256(data).hexdigest()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> _Counting:
    c = _Counting()
    monkeypatch.setattr(putting, "hashlib", c)
    monkeypatch.setattr(putting, "sha256_hex", c.sha256_hex)
    monkeypatch.setattr(chunks, "_new_sha256", c.sha256)  # a new leaf's, from the re-read
    return c


def _u8(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _put(store: Store, path: Path, tensors: dict[str, np.ndarray]) -> tuple[Digest, bytes]:
    data = write_safetensors(path, tensors)
    oid = store.put_file(path)
    assert str(oid) == b3(data)
    # The file's SHA-256 is recorded at the add; every object's SHA-256 (a tensor's computed on
    # first use) and size are right, whichever way they were obtained.
    assert store.info(oid).sha256 == sha256(data)
    for arr in (*tensors.values(), data):
        raw = arr if isinstance(arr, bytes) else arr.tobytes()
        d = Digest.parse(b3(raw))
        assert (store.sha256(d), store.info(d).size) == (sha256(raw), len(raw))
    return oid, data


def test_an_add_computes_the_sha256_of_the_file_alone(store: Store, tmp_path: Path,
                                                       counting: _Counting) -> None:
    """docs/format.md §1.2: tensors get their SHA-256 lazily; unchanged ones are not written."""
    with small_chunks(tensor_split=6000):  # "big" (20,000 bytes) is stored as four pieces
        first = {"big": _u8(20_000, 1), "small": _u8(4000, 2), "other": _u8(4000, 3)}
        _, data = _put(store, tmp_path / "one.safetensors", first)
        header = 8 + int.from_bytes(data[:8], "little")  # inline: hashed on every put (tiny)
        # The file and the header; no tensor, no piece.
        assert counting.bytes == len(data) + header

        counting.bytes = 0
        files = chunk_files(store)
        second = {**first, "small": _u8(4000, 4)}
        _, data2 = _put(store, tmp_path / "two.safetensors", second)
        # The file and its header: the new tensor's SHA-256 is left for later too.
        assert counting.bytes == len(data2) + header
        new = b3(second["small"].tobytes())[7:]
        assert set(chunk_files(store)) - set(files) == {f"{new[:2]}/{new[2:]}"}  # one write

        # Only the last piece of "big" changes: one new chunk file, still no tensor SHA-256.
        counting.bytes = 0
        files = chunk_files(store)
        big = first["big"].copy()
        big[-10:] += 1
        _put(store, tmp_path / "three.safetensors", {**second, "big": big})
        assert counting.bytes == len(data2) + header
        assert len(set(chunk_files(store)) - set(files)) == 1
        assert fsck(store, full=True).findings == ()


def test_a_tensor_whose_first_piece_is_stored_elsewhere(store: Store, tmp_path: Path) -> None:
    """The first piece of a new large tensor may equal a piece stored before (here: a tensor of
    its own in another file): the tensor is new all the same, and its SHA-256 must be right."""
    with small_chunks(tensor_split=6000):
        piece = _u8(6000, 5)
        _put(store, tmp_path / "a.safetensors", {"w": piece})
        grown = np.concatenate([piece, _u8(9000, 6)])
        _put(store, tmp_path / "b.safetensors", {"w": grown})
        assert [o for o, _ in store.part_ids(Digest.parse(b3(grown.tobytes())))] == [0, 6000, 12000]
        assert fsck(store, full=True).findings == ()
