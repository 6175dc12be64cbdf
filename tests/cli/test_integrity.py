"""Corrupt bytes on disk: cat refuses them (exit 1, nothing on stdout) and fsck names the object."""

from __future__ import annotations

import json
import os
from pathlib import Path

import blake3

from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from tests.store.helpers import raw_update

from .conftest import Nscas, assert_user_error, run_process


def _chunk_file(store: Path, oid: Digest) -> Path:
    path = store / "data" / oid.hex[:2] / oid.hex[2:]
    assert path.is_file(), "the object should be stored as a chunk file"
    return path


def _flip(path: Path, offset: int) -> bytes:
    """Flip one bit at ``offset``; returns the new contents."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    return bytes(data)


def _add_random_file(nscas: Nscas, tmp_path: Path) -> tuple[Digest, bytes]:
    # Random bytes do not compress, so the chunk file holds them raw and a flip stays a flip.
    data = os.urandom(64 << 10)
    (tmp_path / "random.bin").write_bytes(data)
    r = nscas("add", str(tmp_path / "random.bin"), "--ref", "data/random", "--json")
    return Digest.parse(r.json()[0]["id"]), data


def test_cat_refuses_a_corrupt_chunk(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    oid, _ = _add_random_file(nscas, tmp_path)
    corrupt = _flip(_chunk_file(store, oid), 1000)
    actual = "blake3:" + blake3.blake3(corrupt).hexdigest()
    r = nscas("cat", "data/random")
    line = assert_user_error(r, code=1)
    assert line == f"nscas: error: corrupt data in object {oid}: expected {oid}, got {actual}"


def test_fsck_names_the_corrupt_object(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    oid, _ = _add_random_file(nscas, tmp_path)
    assert nscas("fsck", "--deep").exit_code == 0
    _flip(_chunk_file(store, oid), 7)
    # The row checks see a chunk file of the right size; only re-hashing finds the flip.
    assert nscas("fsck").exit_code == 0
    r = nscas("fsck", "--deep")
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"error: hash-mismatch: {oid}: corrupt data in object {oid}")
    assert lines[-1].startswith("FAILED: ")
    assert "1 error(s)" in lines[-1]
    report = nscas("fsck", "--deep", "--json")
    assert report.exit_code == 1
    body = report.json()
    assert (body["ok"], body["errors"]) == (False, 1)
    assert [(f["object"], f["problem"], f["severity"]) for f in body["findings"]] == [
        (str(oid), "hash-mismatch", "error")]


def test_fsck_finds_a_truncated_chunk_without_deep(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    oid, _ = _add_random_file(nscas, tmp_path)
    chunk = _chunk_file(store, oid)
    chunk.chmod(0o644)
    chunk.write_bytes(chunk.read_bytes()[:-1])
    r = nscas("fsck", "--json")
    assert r.exit_code == 1
    assert [(f["object"], f["problem"]) for f in r.json()["findings"]] == [(str(oid), "chunk-size")]


def test_cat_of_a_multipart_file_prints_nothing_when_one_part_is_corrupt(
        nscas: Nscas, store: Path, checkpoint: Path) -> None:
    tree = nscas("add", str(checkpoint), "--ref", "ckpt", "--json").json()[0]["id"]
    with open_store(store, readonly=True) as s:
        weights = Digest.parse(s.get_record(Digest.parse(tree))["entries"]["model.safetensors"]["id"])
        parts = [p for _, p in s.part_ids(weights)]
        chunked = [p for p in parts if s.info(p).storage == "file"]
    assert len(parts) == 3 and len(chunked) == 1  # header, big tensor (chunk file), small tensor
    _flip(_chunk_file(store, chunked[0]), 100)
    line = assert_user_error(nscas("cat", str(weights)), code=1)
    assert f"corrupt data in object {chunked[0]}: expected {chunked[0]}, got blake3:" in line
    r = nscas("get", "ckpt", str(checkpoint.parent / "restored"))
    assert_user_error(r, f"expected {chunked[0]}", code=1)
    assert not (checkpoint.parent / "restored").exists()


def test_corrupt_cat_as_a_real_process(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    oid, _ = _add_random_file(nscas, tmp_path)
    _flip(_chunk_file(store, oid), 0)
    r = run_process("cat", str(oid), cwd=tmp_path, env={"NSCAS_STORE": str(store)})
    line = assert_user_error(r, code=1)
    assert line.startswith(f"nscas: error: corrupt data in object {oid}: expected {oid}, got blake3:")
    r = run_process("fsck", "--deep", "--json", cwd=tmp_path, env={"NSCAS_STORE": str(store)})
    assert r.exit_code == 1
    assert json.loads(r.stdout)["findings"][0]["object"] == str(oid)


def test_fsck_full_checks_what_deep_does_not(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    oid, _ = _add_random_file(nscas, tmp_path)
    with open_store(store) as s:
        raw_update(s, "UPDATE objects SET sha256 = ? WHERE id = ?", ("f" * 64, oid.hex))
    deep = nscas("fsck", "--deep")
    assert deep.exit_code == 0
    assert deep.stdout.splitlines()[-1].startswith(
        "ok: 1 objects checked, 1 leaves re-hashed (65536 bytes); 0 error(s), 0 note(s)")
    full = nscas("fsck", "--full", "--json")
    assert full.exit_code == 1
    body = full.json()
    assert (body["mode"], body["deep_checked"], body["deep_bytes"]) == ("full", 1, 65536)
    assert [(f["object"], f["problem"]) for f in body["findings"]] == [(str(oid), "sha256-mismatch")]
