"""The put pipeline (nscas.store.putting): what is checked after writing, what holds up reading, and
what happens when a step fails part-way through a large file."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nscas.errors import IntegrityError
from nscas.objects import chunks
from nscas.objects.digests import Digest
from nscas.store import putting
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import b3, random_f32, row_counts, sha256, small_chunks, write_safetensors
from tests.waiting import GENEROUS


def _tensors(n: int, seed: int = 0) -> dict[str, Any]:
    return {f"t{i}": random_f32(2000, seed=seed + i) for i in range(n)}  # 8,000 bytes each


def _temporary_files(store: Store) -> list[Path]:
    return sorted((store.root / "tmp").iterdir())


def test_bytes_that_reach_the_disk_wrong_are_refused(store: Store, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk file is read back and hashed after it is written: a write that loses or
    changes a byte fails the put, and leaves neither a chunk file nor a row."""
    real = chunks._write_all

    def flip_one_byte(fd: int, data: bytes | memoryview) -> None:
        wrong = bytearray(data)
        wrong[len(wrong) // 2] ^= 1
        real(fd, wrong)

    monkeypatch.setattr(chunks, "_write_all", flip_one_byte)
    before = row_counts(store)
    write_safetensors(tmp_path / "m.safetensors", _tensors(3))
    with pytest.raises(IntegrityError):
        store.put_file(tmp_path / "m.safetensors")
    with pytest.raises(IntegrityError):
        store.put_bytes(os.urandom(10_000))
    assert row_counts(store) == before
    assert not [p for p in (store.root / "data").rglob("*") if p.is_file()]
    assert _temporary_files(store) == []


def test_new_pieces_get_the_sha256_of_what_was_written(store: Store, tmp_path: Path) -> None:
    """A tensor's SHA-256 is left out at the add and computed on first use: it must be the
    SHA-256 of the piece, compressed or not; the file's is recorded at the add."""
    tensors = {"random": np.random.default_rng(1).integers(0, 256, 16000, dtype=np.uint8),
               "zeros": random_f32(4000, seed=2) * 0}
    data = write_safetensors(tmp_path / "m.safetensors", tensors)
    oid = store.put_file(tmp_path / "m.safetensors")
    assert str(oid) == b3(data)
    codecs = set()
    for arr in tensors.values():
        tid = Digest.parse(b3(arr.tobytes()))
        info = store.info(tid)
        assert info.sha256 is None
        assert (store.sha256(tid), info.size) == (sha256(arr.tobytes()), arr.nbytes)
        assert store.info(tid).sha256 == sha256(arr.tobytes())  # recorded on first use
        codecs.add(info.codec)
    assert codecs == {"raw", "planes4"}  # random bytes stay raw; an F32 tensor gets planes
    assert store.info(oid).sha256 == sha256(data)


def test_fsync_does_not_hold_up_reading(store: Store, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece's read buffer goes back as soon as its bytes are in the temporary file: while
    every fsync waits, reading still goes on past the number of buffers."""
    reads = 0
    enough = threading.Event()
    real_read = putting._read_exactly

    def counting_read(f: Any, buf: memoryview) -> int:
        nonlocal reads
        reads += 1
        if reads > putting.WINDOW + 1:
            enough.set()
        return real_read(f, buf)

    real_fsync = os.fsync
    waited_in_vain: list[int] = []

    def slow_fsync(fd: int) -> None:
        if not enough.wait(timeout=GENEROUS):  # reads on other threads: slow on a loaded box
            waited_in_vain.append(fd)
            enough.set()  # failed already: let the put finish
        real_fsync(fd)

    monkeypatch.setattr(putting, "_read_exactly", counting_read)
    monkeypatch.setattr(chunks.os, "fsync", slow_fsync)
    data = write_safetensors(tmp_path / "m.safetensors", _tensors(2 * putting.WINDOW + 2))
    assert str(store.put_file(tmp_path / "m.safetensors")) == b3(data)
    assert waited_in_vain == []
    assert fsck(store, deep=True).findings == ()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail_at", [1, 3, 9])
def test_a_failing_step_fails_the_put_and_stores_nothing(store: Store, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         fail_at: int) -> None:
    """A lookup that fails part-way through (first piece, a middle one, the last) fails the
    put with that error, without hanging; no row is inserted, no temporary file is left (chunk
    files already in place are orphans, a note for fsck, removed by gc)."""
    calls = 0
    real = store._stored_leaf

    def lookup(hex_id: str) -> Any:
        nonlocal calls
        calls += 1
        if calls == fail_at:
            raise OSError("disk on fire")
        return real(hex_id)

    monkeypatch.setattr(store, "_stored_leaf", lookup)
    before = row_counts(store)
    write_safetensors(tmp_path / "m.safetensors", _tensors(9))
    with pytest.raises(OSError, match="disk on fire"):
        store.put_file(tmp_path / "m.safetensors")
    assert row_counts(store) == before
    assert _temporary_files(store) == []
    assert fsck(store, deep=True).ok


def test_large_tensors_split_into_pieces_through_the_pipeline(store: Store, tmp_path: Path) -> None:
    """Pieces of split tensors go through the same buffers, chains and workers: many of them,
    more than there are buffers, some new and some stored, still assemble to the right file."""
    with small_chunks(tensor_split=3000):
        first = _tensors(5, seed=10)  # each tensor: three pieces of at most 3,000 bytes
        data1 = write_safetensors(tmp_path / "a.safetensors", first)
        assert str(store.put_file(tmp_path / "a.safetensors")) == b3(data1)
        second = {**first, "t2": random_f32(2000, seed=99)}
        data2 = write_safetensors(tmp_path / "b.safetensors", second)
        oid = store.put_file(tmp_path / "b.safetensors")
    assert str(oid) == b3(data2)
    assert store.get_bytes(oid) == data2
    for arr in second.values():
        tid = Digest.parse(b3(arr.tobytes()))
        assert store.info(tid).storage == "parts" and store.sha256(tid) == sha256(arr.tobytes())
    assert fsck(store, full=True).findings == ()
