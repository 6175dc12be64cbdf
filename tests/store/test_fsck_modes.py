"""fsck's depths: --deep hashes every stored leaf once; --full also re-reads whole objects.

The flipped-byte property test (test_properties.py) shows that --deep finds any change to
stored bytes; these tests pin down how much each mode reads and what only --full can see.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nscas.objects.codecs import Base
from nscas.objects.digests import Digest
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import b3, random_f32, raw_update, write_safetensors

N = 2048  # floats per tensor: 8 KiB, above the inline limit, so each tensor is a chunk file


def _two_checkpoints(store: Store, tmp_path: Path) -> tuple[list[bytes], list[str], int]:
    """Two safetensors files sharing two of three tensors: (file bytes, tensor IDs, header size)."""
    first = {f"t{i}": random_f32(N, seed=i) for i in range(3)}
    second = {**first, "t2": random_f32(N, seed=9)}
    files = [write_safetensors(tmp_path / "a.safetensors", first),
             write_safetensors(tmp_path / "b.safetensors", second)]
    for name in ("a", "b"):
        store.put_file(tmp_path / f"{name}.safetensors")
    tensors = sorted({b3(a.tobytes())[7:] for a in (*first.values(), second["t2"])})
    return files, tensors, 8 + int.from_bytes(files[0][:8], "little")


def test_deep_hashes_every_stored_leaf_exactly_once(store: Store, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    files, tensors, header = _two_checkpoints(store, tmp_path)
    assert files[0][:header] == files[1][:header]  # one header object, stored inline
    verified: list[str] = []
    real_verify = store.chunks.verify

    def spy(oid: Digest, codec: str, size: int, *, base: Base | None = None
            ) -> tuple[Digest, int]:
        verified.append(oid.hex)
        return real_verify(oid, codec, size, base=base)

    monkeypatch.setattr(store.chunks, "verify", spy)
    report = fsck(store, deep=True)
    assert report.findings == ()
    assert sorted(verified) == tensors  # four chunk files, each read once (two are shared)
    # Leaves: the shared header and the four tensors; the two files are only their parts.
    assert (report.objects, report.deep_checked, report.deep_bytes) == (7, 5, header + 4 * 4 * N)

    verified.clear()
    full = fsck(store, full=True)
    assert full.findings == () and verified == []  # --full reads leaves through the objects
    # Both files re-read whole: the shared tensors twice.
    assert (full.deep_checked, full.deep_bytes) == (2, len(files[0]) + len(files[1]))


def _model(store: Store, tmp_path: Path) -> tuple[Digest, list[tuple[int, Digest]]]:
    tensors = {"a": random_f32(N, seed=1), "b": random_f32(N, seed=2)}  # equally large
    write_safetensors(tmp_path / "m.safetensors", tensors)
    oid = store.put_file(tmp_path / "m.safetensors")
    return oid, store.part_ids(oid)


def test_only_full_sees_a_parts_row_naming_another_part_of_the_same_size(
        store: Store, tmp_path: Path) -> None:
    model, parts = _model(store, tmp_path)
    _header, (_, a), (_, b) = parts
    raw_update(store, "UPDATE parts SET part_id = ? WHERE object_id = ? AND part_id = ?",
               (b.hex, model.hex, a.hex))
    # Every stored byte is intact and the parts still tile the file: rows and leaves look fine.
    assert fsck(store, deep=True).findings == ()
    full = fsck(store, full=True)
    assert [(f.object, f.problem) for f in full.errors] == [
        (str(model), "hash-mismatch"), (str(model), "sha256-mismatch")]
    # The part no row names any more is now checked as a top-level object of its own.
    assert full.deep_checked == 2


def test_only_full_checks_recorded_sha256(store: Store, tmp_path: Path) -> None:
    model, _ = _model(store, tmp_path)
    raw_update(store, "UPDATE objects SET sha256 = ? WHERE id = ?", ("0" * 64, model.hex))
    assert fsck(store, deep=True).findings == ()
    full = fsck(store, full=True)
    assert [(f.object, f.problem) for f in full.errors] == [(str(model), "sha256-mismatch")]
    assert full.errors[0].detail.startswith("recorded " + "0" * 64 + ", bytes give ")


def test_deep_finds_a_leaf_of_the_wrong_recorded_size(store: Store) -> None:
    oid = store.put_bytes(np.arange(3000, dtype=np.float32).tobytes())  # zstd chunk file
    assert store.info(oid).codec == "zstd"
    raw_update(store, "UPDATE objects SET size = size + 1 WHERE id = ?", (oid.hex,))
    report = fsck(store, deep=True)
    assert [(f.object, f.problem, f.detail) for f in report.errors] == [
        (str(oid), "size-mismatch", "recorded 12001, bytes give 12000")]


def test_max_seconds_and_sample_limit_the_deep_pass(store: Store, tmp_path: Path) -> None:
    _two_checkpoints(store, tmp_path)
    stopped = fsck(store, deep=True, max_seconds=0)
    assert (stopped.ok, stopped.complete, stopped.deep_checked) == (True, False, 0)
    assert [(f.problem, f.severity) for f in stopped.findings] == [("incomplete", "note")]
    assert stopped.findings[0].detail == "--max-seconds 0 reached after 0 of 5 objects"
    none = fsck(store, deep=True, sample=0.0)
    assert (none.complete, none.deep_checked, none.findings) == (True, 0, ())


def test_deep_report_is_the_same_on_every_run(store: Store, tmp_path: Path) -> None:
    """Two threads, one order: findings come back in the order of the objects."""
    _two_checkpoints(store, tmp_path)
    for info in store.iter_objects():
        if info.storage == "file":
            raw_update(store, "UPDATE objects SET size = size + 1 WHERE id = ?", (info.id.hex,))
    # (The files' parts lists no longer add up either: parts-layout findings, left out here.)
    reports = [json.dumps([f.object for f in fsck(store, deep=True).errors
                           if f.problem == "size-mismatch"]) for _ in range(3)]
    assert len(set(reports)) == 1 and len(json.loads(reports[0])) == 4
    files = [i.id.hex for i in store.iter_objects() if i.storage == "file"]
    assert json.loads(reports[0]) == [f"blake3:{h}" for h in files]


def test_a_file_not_named_by_an_id_is_no_chunk(store: Store) -> None:
    """Chunk files are named by IDs (ChunkBackend.iter_ids yields Digests): a file in data/
    named otherwise is left alone, neither an orphan for fsck nor removed by gc."""
    stray = store.root / "data" / "ab" / "notes.txt"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"not a chunk")
    orphan = store.root / "data" / "ff" / ("f" * 62)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"no row uses me")
    assert list(store.chunks.iter_ids()) == [Digest("f" * 64)]
    assert [f.problem for f in fsck(store).findings] == ["orphan-chunks"]
    report = gc(store, min_age=0)
    assert report.orphan_chunks == (Digest("f" * 64),)
    assert stray.exists() and not orphan.exists()
