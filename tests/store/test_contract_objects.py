"""Contract: objects (docs/format.md §1, 5). Blobs in, the same bytes and IDs out, stored once, never wrong."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from nscas.errors import DestinationExists, IntegrityError, InvalidInput, NotFound
from nscas.models.checkpoints import file_params_digest, put_checkpoint
from nscas.objects.chunks import INLINE_MAX
from nscas.objects.digests import Digest
from nscas.objects.segments import CHUNK_SIZE, SINGLE_MAX, TENSOR_SPLIT
from nscas.store.writer import Store
from tests.store.helpers import (
    EMPTY_BLAKE3,
    EMPTY_SHA256,
    b3,
    chunk_files,
    chunk_path,
    flip_byte,
    random_bytes,
    random_f32,
    row_counts,
    sha256,
    write_safetensors,
)


def _check_object(store: Store, oid: Digest, data: bytes, *, lazy: bool = False) -> None:
    """The ID is b3sum's, the SHA-256 (recorded at put, or with ``lazy`` on first use) and
    size are hashlib's, every read path agrees."""
    assert str(oid) == b3(data)
    info = store.info(oid)
    assert info.size == len(data)
    if lazy and info.sha256 is None:
        assert store.sha256(oid) == sha256(data)
        assert store.info(oid).sha256 == sha256(data)  # recorded now
    assert store.info(oid).sha256 == sha256(data)
    assert store.sha256(oid) == sha256(data)
    assert info.kind is None
    assert store.has(oid)
    assert store.get_bytes(oid) == data
    with store.open(oid) as f:
        assert f.read() == data


class TestObjectsContract:
    def test_empty_object(self, any_store: Store) -> None:
        oid = any_store.put_bytes(b"")
        assert oid.hex == EMPTY_BLAKE3
        assert any_store.info(oid).sha256 == EMPTY_SHA256
        _check_object(any_store, oid, b"")

    def test_small_object_is_inline(self, any_store: Store) -> None:
        data = b"x" * 100
        oid = any_store.put_bytes(data)
        _check_object(any_store, oid, data)
        assert any_store.info(oid).storage == "inline"
        assert chunk_files(any_store) == {}

    def test_file_above_inline_limit_is_one_chunk_file(self, any_store: Store, tmp_path: Path) -> None:
        data = random_bytes(INLINE_MAX + 1000)
        (tmp_path / "f.bin").write_bytes(data)
        oid = any_store.put_file(tmp_path / "f.bin")
        _check_object(any_store, oid, data)
        info = any_store.info(oid)
        assert (info.storage, info.codec, info.stored_size) == ("file", "raw", len(data))
        assert chunk_path(any_store, oid).read_bytes() == data

    def test_large_file_is_cut_into_fixed_chunks(self, any_store: Store, tmp_path: Path) -> None:
        assert SINGLE_MAX == CHUNK_SIZE == 16 << 20
        data = random_bytes(CHUNK_SIZE + 12345, seed=1)
        (tmp_path / "big.bin").write_bytes(data)
        oid = any_store.put_file(tmp_path / "big.bin")
        _check_object(any_store, oid, data)
        assert any_store.info(oid).storage == "parts"
        parts = any_store.part_ids(oid)
        assert parts == [(0, Digest.parse(b3(data[:CHUNK_SIZE]))),
                         (CHUNK_SIZE, Digest.parse(b3(data[CHUNK_SIZE:])))]
        for off, part in parts:
            _check_object(any_store, part, data[off:off + CHUNK_SIZE])

    def test_safetensors_tensor_per_object(self, any_store: Store, tmp_path: Path) -> None:
        big = TENSOR_SPLIT // 4 + 1_000_000  # F32 elements: a tensor of > 32 MiB
        tensors = {
            "big": random_f32(big, seed=1),
            "empty": np.zeros((0, 3), dtype=np.float32),
            "mid": random_f32(3000, seed=2),  # 12 kB: its own chunk file
            "tiny": random_f32(10, seed=3),  # 40 B: inline
        }
        data = write_safetensors(tmp_path / "model.safetensors", tensors)
        oid = any_store.put_file(tmp_path / "model.safetensors")
        _check_object(any_store, oid, data)
        parts = dict(any_store.part_ids(oid))
        base = 8 + int.from_bytes(data[:8], "little")
        assert parts[0] == Digest.parse(b3(data[:base]))
        # One part per non-empty tensor, at the tensor's offset, whose ID is its raw bytes' ID.
        for name in ("big", "mid", "tiny"):
            raw = tensors[name].tobytes()
            start = data.index(raw)
            assert parts[start] == Digest.parse(b3(raw)), name
            # A tensor stored in a chunk file or as parts gets its SHA-256 on first use.
            assert (any_store.info(parts[start]).sha256 is None) == (name != "tiny"), name
            _check_object(any_store, parts[start], raw, lazy=True)
        assert len(parts) == 4  # the zero-size tensor has no bytes, hence no part
        big_id = Digest.parse(b3(tensors["big"].tobytes()))
        assert any_store.info(big_id).storage == "parts"
        raw = tensors["big"].tobytes()
        assert any_store.part_ids(big_id) == [(0, Digest.parse(b3(raw[:TENSOR_SPLIT]))),
                                             (TENSOR_SPLIT, Digest.parse(b3(raw[TENSOR_SPLIT:])))]
        assert any_store.info(parts[data.index(tensors["tiny"].tobytes())]).storage == "inline"

    def test_puts_are_idempotent(self, any_store: Store, tmp_path: Path) -> None:
        data = random_bytes(CHUNK_SIZE + 5000, seed=4)
        (tmp_path / "a.bin").write_bytes(data)
        first = any_store.put_file(tmp_path / "a.bin")
        small = any_store.put_bytes(b"small")
        rows, files = row_counts(any_store), chunk_files(any_store)
        assert any_store.put_file(tmp_path / "a.bin") == first
        assert any_store.put_bytes(data) == first  # same bytes by another path: same ID
        assert any_store.put_bytes(b"small") == small
        assert row_counts(any_store) == rows
        assert chunk_files(any_store) == files  # not even rewritten: same inodes and mtimes

    def test_identical_tensors_are_stored_once(self, any_store: Store, tmp_path: Path) -> None:
        shared = {"a": random_f32(300_000, seed=5), "b": random_f32(200_000, seed=6)}
        one = {**shared, "c": random_f32(50_000, seed=7)}
        two = {**shared, "c": random_f32(50_000, seed=8)}
        write_safetensors(tmp_path / "one.safetensors", one)
        write_safetensors(tmp_path / "two.safetensors", two)
        any_store.put_file(tmp_path / "one.safetensors")
        files_one, objects_one = len(chunk_files(any_store)), any_store.counts()["objects"]
        assert files_one == 3  # a, b, c (the header is small enough to live inline)
        any_store.put_file(tmp_path / "two.safetensors")
        assert len(chunk_files(any_store)) == files_one + 1  # only the new c
        # Same names, dtypes and shapes give a byte-identical header: new are only c and the file.
        assert any_store.counts()["objects"] == objects_one + 2

    def test_compression_only_when_it_saves_space(self, any_store: Store, tmp_path: Path) -> None:
        text = b"".join(b"line %d of a very repetitive log file\n" % (i % 50) for i in range(5000))
        noise = random_bytes(len(text), seed=9)
        (tmp_path / "log.txt").write_bytes(text)
        (tmp_path / "noise.bin").write_bytes(noise)
        packed = any_store.info(any_store.put_file(tmp_path / "log.txt"))
        plain = any_store.info(any_store.put_file(tmp_path / "noise.bin"))
        assert packed.codec == "zstd" and packed.stored_size < len(text) // 10
        assert plain.codec == "raw" and plain.stored_size == len(noise)
        assert chunk_path(any_store, packed.id).stat().st_size == packed.stored_size
        assert chunk_path(any_store, plain.id).read_bytes() == noise
        assert any_store.get_bytes(packed.id) == text

    def test_absent_objects_are_not_found(self, any_store: Store) -> None:
        absent = Digest.parse(b3(b"never stored"))
        assert not any_store.has(absent)
        for call in (any_store.info, any_store.get_bytes, any_store.open):
            with pytest.raises(NotFound):
                call(absent)

    def test_put_file_refuses_what_is_not_a_file(self, any_store: Store, tmp_path: Path) -> None:
        with pytest.raises(InvalidInput, match="no such file"):
            any_store.put_file(tmp_path / "missing")
        with pytest.raises(InvalidInput, match="directory"):
            any_store.put_file(tmp_path)


class TestCorruptionContract:
    """A corrupted chunk is an IntegrityError naming both digests; wrong bytes never come out."""

    def test_corrupt_chunk_on_every_read_path(self, any_store: Store, tmp_path: Path) -> None:
        data = random_bytes(10_000, seed=10)
        oid = any_store.put_bytes(data)
        flip_byte(chunk_path(any_store, oid), 1234)
        bad = bytearray(data)
        bad[1234] ^= 1
        for read in (any_store.get_bytes, lambda o: any_store.open(o).read()):
            with pytest.raises(IntegrityError) as err:
                read(oid)
            assert err.value.expected == str(oid)
            assert err.value.actual == b3(bytes(bad))
            assert str(oid) in str(err.value) and b3(bytes(bad)) in str(err.value)
        with pytest.raises(IntegrityError):
            any_store.materialise(oid, tmp_path / "out" / "f.bin")
        assert os.listdir(tmp_path / "out") == []  # no partial file, no temp directory

    def test_corrupt_later_chunk_of_large_file(self, any_store: Store, tmp_path: Path) -> None:
        data = random_bytes(CHUNK_SIZE + 4 * INLINE_MAX, seed=11)
        (tmp_path / "big.bin").write_bytes(data)
        oid = any_store.put_file(tmp_path / "big.bin")
        (_, _), (_, second) = any_store.part_ids(oid)
        flip_byte(chunk_path(any_store, second), 7)
        with pytest.raises(IntegrityError) as err:
            any_store.get_bytes(oid)
        assert err.value.expected == str(second)
        with pytest.raises(IntegrityError), any_store.open(oid) as f:
            f.read()
        with pytest.raises(IntegrityError):
            any_store.materialise(oid, tmp_path / "out.bin")
        assert not (tmp_path / "out.bin").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".nscas-get")] == []

    def test_corrupt_compressed_chunk(self, any_store: Store) -> None:
        data = b"abcdefgh" * 4096
        oid = any_store.put_bytes(data)
        assert any_store.info(oid).codec == "zstd"
        path = chunk_path(any_store, oid)
        flip_byte(path, path.stat().st_size // 2, 0xFF)
        with pytest.raises(IntegrityError) as err:
            any_store.get_bytes(oid)
        assert err.value.expected == str(oid)

    def test_corrupt_zstd_header_is_an_integrity_error(self, any_store: Store) -> None:
        # Byte 4 of a zstd frame says how wide its content-size field is; a flipped top bit turns
        # the next bytes into a claimed size of petabytes. Reading must not try to allocate it.
        oid = any_store.put_bytes(b"".join(b"line %d\n" % (i % 37) for i in range(4000)))
        path = chunk_path(any_store, oid)
        assert path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # the zstd magic number
        flip_byte(path, 4, 0x80)
        with pytest.raises(IntegrityError) as err:
            any_store.get_bytes(oid)
        assert err.value.expected == str(oid)

    def test_missing_chunk_file(self, any_store: Store) -> None:
        oid = any_store.put_bytes(random_bytes(5000, seed=12))
        chunk_path(any_store, oid).unlink()
        with pytest.raises(IntegrityError) as err:
            any_store.get_bytes(oid)
        assert err.value.expected == str(oid)


class TestMaterialiseContract:
    def test_blob_and_tree_round_trip(self, any_store: Store, tmp_path: Path) -> None:
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        files = {"a.txt": b"alpha", "sub/b.bin": random_bytes(20_000, seed=13), "sub/empty": b""}
        for rel, data in files.items():
            (src / rel).write_bytes(data)
        tree = any_store.put_tree(src)
        record = any_store.get_record(tree)
        assert record == {"nscas": "tree/1", "entries": {
            rel: {"id": b3(data), "size": len(data), "sha256": sha256(data)}
            for rel, data in files.items()}}
        any_store.materialise(tree, tmp_path / "copy")
        got = {p.relative_to(tmp_path / "copy").as_posix(): p.read_bytes()
               for p in (tmp_path / "copy").rglob("*") if p.is_file()}
        assert got == files
        blob = Digest.parse(b3(files["sub/b.bin"]))
        any_store.materialise(blob, tmp_path / "one.bin")
        assert (tmp_path / "one.bin").read_bytes() == files["sub/b.bin"]

    def test_refuses_to_overwrite(self, any_store: Store, tmp_path: Path) -> None:
        oid = any_store.put_bytes(b"new")
        (tmp_path / "file").write_bytes(b"old")
        (tmp_path / "dir").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "nowhere")
        for name in ("file", "dir", "link"):
            with pytest.raises(DestinationExists):
                any_store.materialise(oid, tmp_path / name)
        assert (tmp_path / "file").read_bytes() == b"old"
        assert os.listdir(tmp_path / "dir") == []

    def test_put_tree_refuses_links(self, any_store: Store, tmp_path: Path) -> None:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "l").symlink_to(tmp_path / "d")
        with pytest.raises(InvalidInput, match=r"link|regular"):
            any_store.put_tree(tmp_path / "d")


class TestCheckpointsContract:
    """put_checkpoint: an HF directory becomes checkpoint/1 + params/1 (docs/format.md §3, 4)."""

    def _model_dir(self, path: Path, tensors: dict[str, np.ndarray]) -> Path:
        path.mkdir()
        write_safetensors(path / "model.safetensors", tensors)
        (path / "config.json").write_text('{"model_type": "llama"}\n')
        return path

    def test_two_checkpoints_share_their_unchanged_tensors(self, any_store: Store,
                                                           tmp_path: Path) -> None:
        shared = {"embed": random_f32(3000, seed=20).reshape(100, 30),
                  "norm": np.ones(16, dtype=np.float32),
                  "empty": np.zeros((0, 4), dtype=np.float32)}
        one = self._model_dir(tmp_path / "one", {**shared, "head": random_f32(2000, seed=21)})
        two = self._model_dir(tmp_path / "two", {**shared, "head": random_f32(2000, seed=22)})
        first = put_checkpoint(any_store, one, step=0, parent=None)
        files_after_one = len(chunk_files(any_store))
        second = put_checkpoint(any_store, two, step=10, parent=first, extra={"note": "fine-tuned"})
        assert len(chunk_files(any_store)) == files_after_one + 1  # only the new head

        rec = any_store.get_record(second)
        assert {k: rec[k] for k in ("nscas", "step", "parent", "note")} == {
            "nscas": "checkpoint/1", "step": 10, "parent": str(first), "note": "fine-tuned"}
        assert any_store.get_record(first)["parent"] is None
        tree = any_store.get_record(Digest.parse(rec["files"]))
        weights = (two / "model.safetensors").read_bytes()
        assert tree["entries"]["model.safetensors"] == {
            "id": b3(weights), "size": len(weights), "sha256": sha256(weights)}
        params = [any_store.get_record(Digest.parse(any_store.get_record(c)["params"]))
                  for c in (first, second)]
        expected_two = {"nscas": "params/1", "tensors": {
            "embed": {"dtype": "F32", "shape": [100, 30], "data": b3(shared["embed"].tobytes())},
            "norm": {"dtype": "F32", "shape": [16], "data": b3(shared["norm"].tobytes())},
            "empty": {"dtype": "F32", "shape": [0, 4], "data": "blake3:" + EMPTY_BLAKE3},
            "head": {"dtype": "F32", "shape": [2000],
                     "data": b3(random_f32(2000, seed=22).tobytes())}}}
        assert params[1] == expected_two
        assert params[0]["tensors"]["embed"] == params[1]["tensors"]["embed"]
        assert params[0]["tensors"]["head"] != params[1]["tensors"]["head"]

    def test_the_params_digest_of_files_on_disk_is_the_stored_one(self, any_store: Store,
                                                                  tmp_path: Path) -> None:
        model = self._model_dir(tmp_path / "m", {
            "embed": random_f32(TENSOR_SPLIT // 4 + 1000, seed=23),  # cut into its own part
            "norm": np.ones(16, dtype=np.float32), "empty": np.zeros((0, 4), dtype=np.float32)})
        write_safetensors(model / "model-2.safetensors", {"head": random_f32(300, seed=24)})
        checkpoint = any_store.get_record(put_checkpoint(any_store, model, step=0, parent=None))
        weights = sorted(model.glob("*.safetensors"))
        assert file_params_digest(weights) == Digest.parse(checkpoint["params"])
        (model / "model-2.safetensors").write_bytes((model / "model-2.safetensors").read_bytes()[:-1])
        with pytest.raises(InvalidInput, match="before the slice"):
            file_params_digest(weights)

    def test_refusals(self, any_store: Store, tmp_path: Path) -> None:
        (tmp_path / "empty").mkdir()
        with pytest.raises(InvalidInput, match=r"no \*\.safetensors"):
            put_checkpoint(any_store, tmp_path / "empty", step=0, parent=None)
        model = self._model_dir(tmp_path / "m", {"w": np.ones(4, np.float32)})
        with pytest.raises(InvalidInput, match="'step' is set by nscas"):
            put_checkpoint(any_store, model, step=0, parent=None, extra={"step": 5})


class TestCodecContract:
    """Byte planes and deltas (docs/format.md §5.5.1) on every implementation: the chunk backend
    (a directory, S3) writes and reads them, the engine (SQLite, PostgreSQL) keeps their base."""

    def test_a_delta_to_a_base_round_trips_and_gc_keeps_the_base(self, any_store: Store,
                                                                 tmp_path: Path) -> None:
        from nscas.upkeep.fsck import fsck, gc

        rng = np.random.default_rng(7)
        parent = rng.standard_normal(70_001, dtype=np.float32)
        child = (parent + rng.standard_normal(parent.size, dtype=np.float32) * 1e-4)
        a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
        write_safetensors(a, {"w": parent})
        data = write_safetensors(b, {"w": child.astype(np.float32)})
        base = any_store.put_file(a)
        oid = any_store.put_file(b, base=base)
        leaf = any_store.info(any_store.part_ids(oid)[-1][1])
        assert leaf.codec == "sub4" and leaf.base == any_store.part_ids(base)[-1][1]
        any_store.ref_set("child", oid)
        gc(any_store, min_age=0, now=time.time() + 3600)
        assert not any_store.has(base) and any_store.has(leaf.base)
        assert any_store.get_bytes(oid) == data
        assert fsck(any_store, deep=True).errors == ()
