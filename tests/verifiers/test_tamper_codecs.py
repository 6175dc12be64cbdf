"""Codec-level forgeries (issue 41, docs/format.md §5.5.1) against ``verify`` of a train
receipt whose checkpoint tensors are stored as deltas (``xor4`` and ``sub4``, every other
tensor) of the seed checkpoint's.

The store is built once per module: a tiny train run, then every tensor leaf of the trained
checkpoint that has a chunk file re-encoded in place as a delta of the seed's tensor of the
same name, shape and dtype (its chunk file and row rewritten, as a writer of §5.5.2 would store
it). The honest store verifies; each forgery, on a copy, changes one delta's chunk file or row
and must be a failed integrity check naming the leaf, never ``ok`` and never a traceback.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import pytest
import zstandard

from nscas.objects.digests import Digest
from nscas.store.writer import Store
from tests.pipelines import init_step, prepare_step, run_pipeline, step, tokenizer_step
from tests.sharing import built_once
from tests.vectors.codecs.make_vectors import differences, frame, planes, xor

from .conftest import Verdict, nscas_verify, verify_here

PIPELINE = (prepare_step(test=4, dev=4, train=8, replay=4) + tokenizer_step() + init_step()
            + step("train", "train", inputs={"base": "step.init.checkpoint",
                                              "documents": "step.prepare.train",
                                              "replay": "step.prepare.replay"},
                   params={"steps": 2, "checkpoint_steps": [2], "lr": 1e-3}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta:
    """One tensor leaf of the trained checkpoint stored as a delta of the seed's."""

    leaf: str
    """64 hex digits, as in the objects table."""
    base: str
    size: int
    plain: bytes
    base_plain: bytes
    codec: str
    """``xor4`` or ``sub4``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Coded:
    receipt: str
    deltas: list[Delta]
    seeds: list[tuple[str, int]]
    """(hex ID, size) of the seed's chunk-file tensor leaves."""


def _tensor_leaves(store: Store, checkpoint: str) -> dict[str, tuple[str, str, list[int]]]:
    params = store.get_record(Digest.parse(store.get_record(Digest.parse(checkpoint))["params"]))
    return {name: (t["data"], t["dtype"], t["shape"]) for name, t in params["tensors"].items()}


def _with_bases(db: sqlite3.Connection) -> None:
    """The ``base`` column of migration 0006, on a store made before it."""
    if not any(r[1] == "base" for r in db.execute("PRAGMA table_info(objects)")):
        db.execute("ALTER TABLE objects ADD COLUMN base CHAR(64)")


def _write_chunk(store_dir: Path, hex_id: str, data: bytes) -> None:
    path = store_dir / "data" / hex_id[:2] / hex_id[2:]
    path.chmod(0o644)
    path.write_bytes(data)


def _set_row(store_dir: Path, hex_id: str, **columns: object) -> None:
    """Change a row of the insert-only objects table (allowed while a gc session row
    exists)."""
    db = sqlite3.connect(store_dir / "nscas.db")
    try:
        with db:
            db.execute("INSERT INTO gc_session (token) VALUES (1)")
            sets = ", ".join(f"{k} = ?" for k in columns)
            n = db.execute(f"UPDATE objects SET {sets} WHERE id = ?",
                           (*columns.values(), hex_id)).rowcount
            db.execute("DELETE FROM gc_session")
        assert n == 1, hex_id
    finally:
        db.close()


def _residual(d: Delta, plain: bytes, base_plain: bytes) -> bytes:
    """The residual of ``plain`` against ``base_plain`` in the codec of ``d``."""
    return differences(plain, base_plain, 4) if d.codec == "sub4" else xor(plain, base_plain)


def _encoded(d: Delta, *, header: str | None = None, residual: bytes | None = None) -> bytes:
    res = _residual(d, d.plain, d.base_plain) if residual is None else residual
    return bytes.fromhex(header or d.base) + frame(planes(res, 4))


def _first(coded: Coded, codec: str) -> Delta:
    return next(d for d in coded.deltas if d.codec == codec)


def _build(root: Path) -> Coded:
    import torch

    torch.set_num_threads(1)
    store, steps = run_pipeline(root, PIPELINE)
    try:
        child = _tensor_leaves(store, str(steps["train"].outputs["checkpoint"]))
        seed = _tensor_leaves(store, str(steps["init"].outputs["checkpoint"]))
        db = sqlite3.connect(root / ".nscas" / "nscas.db")
        rows = {r[0]: r[1:] for r in db.execute("SELECT id, size, storage, codec FROM objects")}
        db.close()
        deltas: list[Delta] = []
        for name, (leaf, dtype, shape) in child.items():
            base = seed.get(name)
            lhex = leaf[7:]
            if base is None or base[1:] != (dtype, shape) or dtype != "F32" or base[0] == leaf \
                    or rows[lhex][1] != "file":
                continue
            deltas.append(Delta(leaf=lhex, base=base[0][7:], size=rows[lhex][0],
                                plain=store.get_bytes(Digest.parse(leaf)),
                                base_plain=store.get_bytes(Digest.parse(base[0])),
                                codec="sub4" if len(deltas) % 2 else "xor4"))
        seeds = [(leaf[7:], rows[leaf[7:]][0]) for leaf, _, _ in seed.values()
                 if rows[leaf[7:]][1] == "file"]
    finally:
        store.close()
    store_dir = root / ".nscas"
    db = sqlite3.connect(store_dir / "nscas.db")
    with db:
        _with_bases(db)
    db.close()
    for d in deltas:
        data = _encoded(d)
        _write_chunk(store_dir, d.leaf, data)
        _set_row(store_dir, d.leaf, codec=d.codec, base=d.base, stored_size=len(data))
    return Coded(receipt=str(steps["train"].receipt), deltas=deltas, seeds=seeds)


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    root: Path
    coded: Coded

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.root / ".nscas", dest / ".nscas")
        return dest / ".nscas"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    root, coded = built_once(tmp_path_factory, "tamper-codecs", _build, copy=False)
    yield Built(root=root, coded=coded)


def integrity_failure(v: Verdict, leaf: str, *words: str, check: str = "integrity.hashes",
                      code: int = 1) -> str:
    """Verification failed with ``code``, ``check`` failed naming the leaf (and ``words``)."""
    assert v.code == code, (v.code, sorted(v.failed()))
    message = v.check(check)["message"]
    assert v.check(check)["status"] == "failed" and f"blake3:{leaf}" in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def test_a_delta_coded_checkpoint_verifies(built: Built) -> None:
    coded = built.coded
    assert len(coded.deltas) >= 4
    db = sqlite3.connect(built.root / ".nscas" / "nscas.db")
    deltas = dict(db.execute("SELECT codec, count(*) FROM objects WHERE base IS NOT NULL "
                             "GROUP BY codec").fetchall())
    db.close()
    assert deltas == {"xor4": (len(coded.deltas) + 1) // 2, "sub4": len(coded.deltas) // 2}
    v = verify_here(coded.receipt, store=built.root / ".nscas")
    assert v.code == 0, sorted(v.failed())
    train = [n for n, s in v.statuses().items() if n.startswith("train.") and s == "passed"]
    assert train, v.statuses()


def test_a_delta_whose_base_is_not_in_the_store_cannot_be_verified(built: Built,
                                                                   tmp_path: Path) -> None:
    store_dir = built.copy(tmp_path)
    d = built.coded.deltas[0]
    ghost = blake3.blake3(b"no such leaf").hexdigest()
    _write_chunk(store_dir, d.leaf, _encoded(d, header=ghost))
    _set_row(store_dir, d.leaf, base=ghost)
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf,
                      check="integrity.missing", code=3)


def test_a_delta_whose_base_has_another_size_is_a_finding(built: Built, tmp_path: Path) -> None:
    store_dir = built.copy(tmp_path)
    d = built.coded.deltas[0]
    other, size = next((h, s) for h, s in built.coded.seeds if s != d.size)
    _write_chunk(store_dir, d.leaf, _encoded(d, header=other))
    _set_row(store_dir, d.leaf, base=other)
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf, other,
                      f"records {size} bytes")


def test_a_delta_whose_header_names_another_base_than_its_row_is_a_finding(
        built: Built, tmp_path: Path) -> None:
    store_dir = built.copy(tmp_path)
    d, e = built.coded.deltas[:2]
    _write_chunk(store_dir, d.leaf, _encoded(d, header=e.base))
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf, "header",
                      e.base, d.base)


@pytest.mark.parametrize("cycle", ["itself", "each other"])
def test_a_cycle_of_deltas_is_a_finding(built: Built, tmp_path: Path, cycle: str) -> None:
    store_dir = built.copy(tmp_path)
    if cycle == "itself":
        d = built.coded.deltas[0]
        _write_chunk(store_dir, d.leaf, _encoded(d, header=d.leaf))
        _set_row(store_dir, d.leaf, base=d.leaf)
        integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf, "itself")
        return
    d, e = next((d, e) for d in built.coded.deltas for e in built.coded.deltas
                if d.leaf < e.leaf and d.size == e.size)
    for one, two in ((d, e), (e, d)):
        _write_chunk(store_dir, one.leaf, _encoded(one, header=two.leaf,
                                                   residual=_residual(one, one.plain,
                                                                      two.plain)))
        _set_row(store_dir, one.leaf, base=two.leaf)
    message = integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf,
                                "cycle")
    assert f"blake3:{e.leaf}" in message


@pytest.mark.parametrize("codec", ["xor4", "sub4"])
def test_a_delta_that_inflates_past_its_record_is_a_finding(built: Built, tmp_path: Path,
                                                            codec: str) -> None:
    """A bomb: after the residual, a frame of 1 MiB of zeros with no content size; read by the
    real command, which must stop at the record's size."""
    store_dir = built.copy(tmp_path)
    d = _first(built.coded, codec)
    cobj = zstandard.ZstdCompressor(level=19).compressobj()
    bomb = b"".join(cobj.compress(bytes(1 << 16)) for _ in range(16)) + cobj.flush()
    _write_chunk(store_dir, d.leaf, _encoded(d) + bomb)
    v = nscas_verify(built.coded.receipt, store=store_dir)
    integrity_failure(v, d.leaf, f"at most {d.size} bytes")


@pytest.mark.parametrize("codec", ["xor4", "sub4"])
def test_a_delta_that_decodes_to_other_bytes_is_a_finding(built: Built, tmp_path: Path,
                                                          codec: str) -> None:
    store_dir = built.copy(tmp_path)
    d = _first(built.coded, codec)
    other = bytearray(d.plain)
    other[len(other) // 2] ^= 0x04
    _write_chunk(store_dir, d.leaf, _encoded(d, residual=_residual(d, bytes(other),
                                                                   d.base_plain)))
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf, "hash to")


def test_a_sub_delta_over_a_base_of_other_bytes_is_a_finding(built: Built,
                                                             tmp_path: Path) -> None:
    """The base's chunk file decodes to other bytes than its ID: named, not the delta's."""
    store_dir = built.copy(tmp_path)
    d = _first(built.coded, "sub4")
    db = sqlite3.connect(store_dir / "nscas.db")
    codec = db.execute("SELECT codec FROM objects WHERE id = ?", (d.base,)).fetchone()[0]
    db.close()
    wrong = bytearray(d.base_plain)
    wrong[5] ^= 0x01
    data = (frame(planes(bytes(wrong), 4)) if codec == "planes4"
            else zstandard.ZstdCompressor().compress(bytes(wrong)))
    _write_chunk(store_dir, d.base, data)
    _set_row(store_dir, d.base, codec="planes4" if codec == "planes4" else "zstd",
             stored_size=len(data))
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf, d.base)


@pytest.mark.parametrize(("delta", "codec"), [("xor4", "xor2"), ("xor4", "xor8"),
                                              ("xor4", "xor1"), ("xor4", "planes4"),
                                              ("xor4", "sub4"), ("sub4", "sub2"),
                                              ("sub4", "sub8"), ("sub4", "xor4")])
def test_a_delta_s_codec_forged_to_another_width_is_a_finding(built: Built, tmp_path: Path,
                                                              delta: str, codec: str) -> None:
    store_dir = built.copy(tmp_path)
    d = _first(built.coded, delta)
    _set_row(store_dir, d.leaf, codec=codec, **({"base": None} if codec == "planes4" else {}))
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf)


def test_a_chain_of_more_than_eight_deltas_is_a_finding(built: Built, tmp_path: Path) -> None:
    """Nine deltas: the leaf over eight fresh links over the seed's tensor, each link a
    well-formed delta of the one below (other bytes of the same size, stored as new leaves)."""
    store_dir = built.copy(tmp_path)
    d = built.coded.deltas[0]
    below, below_plain = d.base, d.base_plain
    db = sqlite3.connect(store_dir / "nscas.db")
    created = db.execute("SELECT created FROM objects WHERE id = ?", (d.leaf,)).fetchone()[0]
    for k in range(8):
        plain = bytearray(d.base_plain)
        plain[k] ^= 0x01
        hex_id = blake3.blake3(bytes(plain)).hexdigest()
        data = bytes.fromhex(below) + frame(planes(xor(bytes(plain), below_plain), 4))
        (store_dir / "data" / hex_id[:2]).mkdir(exist_ok=True)
        (store_dir / "data" / hex_id[:2] / hex_id[2:]).write_bytes(data)
        with db:
            db.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, "
                       "stored_size, data, created, base) VALUES (?, ?, NULL, NULL, 'file', "
                       "'xor4', ?, NULL, ?, ?)", (hex_id, d.size, len(data), created, below))
        below, below_plain = hex_id, bytes(plain)
    db.close()
    _write_chunk(store_dir, d.leaf, bytes.fromhex(below) + frame(planes(xor(d.plain,
                                                                            below_plain), 4)))
    _set_row(store_dir, d.leaf, base=below)
    integrity_failure(verify_here(built.coded.receipt, store=store_dir), d.leaf,
                      "more than 8 deltas")
