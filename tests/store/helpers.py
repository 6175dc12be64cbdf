"""Test helpers for the store tests: independent hashing, files on disk, raw database access.

Hashes here come straight from ``blake3`` and ``hashlib`` (never from nscas) so that a test
compares the store against the definition of an ID, not against itself.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from safetensors.numpy import save_file

from nscas.objects import segments
from nscas.objects.digests import Digest
from nscas.store import putting
from nscas.store.s3 import S3Chunks
from nscas.store.writer import DB_NAME, Store

EMPTY_BLAKE3 = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def b3(data: bytes) -> str:
    """The object ID of ``data`` as ``b3sum`` names it, with the ``blake3:`` prefix."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).bytes(n)


def random_f32(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> bytes:
    """Write ``tensors`` with the safetensors library and return the file's bytes."""
    save_file(tensors, str(path))
    return path.read_bytes()


class S3Key:
    """A chunk object on S3 read and written behind the store's back, with the few methods of
    ``Path`` the tests use on chunk files."""

    def __init__(self, chunks: S3Chunks, key: str) -> None:
        self._s3, self._c, self.key = chunks, chunks._client, key

    def read_bytes(self) -> bytes:
        return self._c.get_object(Bucket=self._s3.bucket, Key=self.key)["Body"].read()

    def write_bytes(self, data: bytes) -> None:
        self._c.put_object(Bucket=self._s3.bucket, Key=self.key, Body=data)

    def unlink(self) -> None:
        self._c.delete_object(Bucket=self._s3.bucket, Key=self.key)

    def exists(self) -> bool:
        return self._s3._modified(self.key) is not None

    is_file = exists

    def stat(self) -> Any:
        size = self._c.head_object(Bucket=self._s3.bucket, Key=self.key)["ContentLength"]
        return type("Stat", (), {"st_size": size})()


def chunk_files(store: Store) -> dict[str, tuple[Any, Any]]:
    """{relative path: (inode, mtime_ns)} of every chunk file of the store (on S3: key, ETag
    and time)."""
    if isinstance(store.chunks, S3Chunks):
        c, base = store.chunks._client, store.chunks._key("data") + "/"
        out = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=store.chunks.bucket,
                                                                 Prefix=base):
            for item in page.get("Contents", []):
                out[item["Key"][len(base):]] = (item["ETag"], item["LastModified"])
        return out
    data = store.root / "data"
    return {p.relative_to(data).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(data.rglob("*")) if p.is_file()}


def chunk_path(store: Store, oid: Digest) -> Any:
    if isinstance(store.chunks, S3Chunks):
        return S3Key(store.chunks, store.chunks.key(oid))
    return store.root / "data" / oid.hex[:2] / oid.hex[2:]


def stray(store: Store, *parts: str) -> Any:
    """A file (or S3 key) under the store's object location that no put wrote: ``("tmp", name)``
    or ``("data", "ff", 62 hex)``; ``.reported`` is how gc names it in ``temporary_files``."""
    if isinstance(store.chunks, S3Chunks):
        key = S3Key(store.chunks, store.chunks._key(*parts))
        key.reported = Path(key.key)  # type: ignore[attr-defined]
        return key
    path = store.root.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    """Corrupt one byte of a file in place (as bit rot would)."""
    if isinstance(path, S3Key):
        data = bytearray(path.read_bytes())
        data[offset] ^= mask
        path.write_bytes(bytes(data))
        return
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def raw_db(store: Store) -> sqlite3.Connection:
    """A plain connection to the store's database, outside the store's code (a team store's:
    psycopg, in autocommit mode, taking ``?`` placeholders)."""
    if store.config is not None:
        return _PgRaw(store.config.database)  # type: ignore[return-value]
    return sqlite3.connect(store.root / DB_NAME, isolation_level=None)


class _PgRaw:
    def __init__(self, url: str) -> None:
        import psycopg

        self._c = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        sql = "BEGIN" if sql == "BEGIN IMMEDIATE" else sql
        return self._c.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self._c.close()


def rewrite_inline(store: Store, oid: Digest, data: bytes) -> None:
    """Replace an object's inline bytes behind the store's back (simulated corruption).

    The insert-only triggers let changes through only while ``gc_session`` holds a row, so the
    corruption is done inside one such transaction.
    """
    raw_update(store, "UPDATE objects SET data = ? WHERE id = ?", (data, oid.hex))


def raw_insert(store: Store, oid: Digest, data: bytes, *, kind: str | None) -> None:
    """An inline object row written behind the store's back (its writer's checks skipped)."""
    con = raw_db(store)
    try:
        con.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, stored_size, "
                    "data, created) VALUES (?, ?, ?, ?, 'inline', 'raw', ?, ?, ?)",
                    (oid.hex, len(data), hashlib.sha256(data).hexdigest(), kind, len(data),
                     data, time.time()))
    finally:
        con.close()


def raw_update(store: Store, sql: str, params: tuple[Any, ...]) -> None:
    """Change rows behind the store's back (simulated corruption, or a clock set back), inside
    one ``gc_session`` transaction so that the insert-only triggers let it through."""
    con = raw_db(store)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO gc_session (token) VALUES (1)")
        con.execute(sql, params)
        con.execute("DELETE FROM gc_session")
        con.execute("COMMIT")
    finally:
        con.close()


def row_counts(store: Store) -> dict[str, int]:
    con = raw_db(store)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("objects", "parts", "links", "refs", "ref_log")}
    finally:
        con.close()


def build_records(store: Store) -> dict[str, tuple[Digest, dict[str, Any]]]:
    """One valid record of every v1 kind, stored in dependency order: {kind: (ID, value)}."""
    text = b"hello world"
    blob = store.put_bytes(text)
    weights = store.put_bytes(np.arange(2, dtype="<f4").tobytes())
    out: dict[str, tuple[Digest, dict[str, Any]]] = {}

    def put(value: dict[str, Any]) -> str:
        oid = store.put_record(value)
        out[value["nscas"]] = (oid, value)
        return str(oid)

    tree = put({"nscas": "tree/1",
                "entries": {"a/b.txt": {"id": str(blob), "size": len(text), "sha256": sha256(text)}}})
    params = put({"nscas": "params/1",
                  "tensors": {"w": {"dtype": "F32", "shape": [2], "data": str(weights)}}})
    ckpt = put({"nscas": "checkpoint/1", "files": tree, "params": params, "step": 3, "parent": None})
    put({"nscas": "tasks/1", "role": "eval", "records": str(blob), "count": 2, "ids": ["t1", "t2"]})
    action = put({"nscas": "action/1", "recipe": "train@1", "code": tree, "inputs": {"base": ckpt},
                  "params": {"steps": 3, "lr": 0.5}})
    env = put({"nscas": "environment/1", "python": "3.11.9", "platform": "linux-x86_64",
               "packages": {"torch": "2.13.0"}, "torch": None, "devices": ["cpu"],
               "determinism": {"deterministic_algorithms": True}})
    journal = put({"nscas": "journal/1", "rank": 0, "world": 1, "entries": str(blob), "head": None})
    put({"nscas": "commitment/1", "subjects": {"candidate": ckpt}, "purpose": "fix the candidate",
         "previous": None})
    put({"nscas": "receipt/1", "action": action, "environment": env, "outputs": {"checkpoint": ckpt},
         "journals": [journal], "claims": {"loss": {"value": 1.5, "verifier": "train-loss"}},
         "started": "2025-01-01T00:00:00Z", "finished": "2025-01-01T00:01:00Z",
         "status": "succeeded"})
    return out


@contextmanager
def small_chunks(size: int = 5000, tensor_split: int = 6000) -> Iterator[None]:
    """Shrink the chunking constants so that a few kilobytes already make several parts."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(segments, "CHUNK_SIZE", size)
        mp.setattr(segments, "SINGLE_MAX", size)
        mp.setattr(segments, "TENSOR_SPLIT", tensor_split)
        mp.setattr(putting, "INLINE_MAX", 256)
        yield
