"""Chunk codec vectors (tests/vectors/codecs, docs/format.md §5.5.1), read by the verifiers'
decoder and by the store alike: every case decodes to the bytes of its ID, or is refused.

The vectors were written from the spec's text by ``codecs/make_vectors.py`` (numpy, zstandard,
blake3; no code of either side). A case is read in a store holding its row and, transitively,
the rows of the bases it names, and nothing else. The verifiers must refuse with the class
the vector names; the store must refuse (any ``NscasError``), whichever words it uses.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import blake3
import pytest

from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.codecs import ChunkRow, CodecRefused, decode_leaf
from nscas.verifiers.records.store import StoreSource

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "codecs"
MANIFEST = json.loads((HERE / "manifest.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = MANIFEST["cases"]
BY_NAME = {c["name"]: c for c in CASES}


def world(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case and the cases it names as bases, transitively, each once."""
    found = [case]
    while found[-1]["base"] is not None and BY_NAME[found[-1]["base"]] not in found:
        found.append(BY_NAME[found[-1]["base"]])
    return found


def stored(case: dict[str, Any]) -> bytes:
    return (HERE / case["file"]).read_bytes()


def hex_of(oid: str | None) -> str | None:
    return None if oid is None else oid.removeprefix("blake3:")


class _Files:
    """The verifiers' ``ChunkFiles`` over one case's world, held in memory."""

    has_bases = True

    def __init__(self, case: dict[str, Any]) -> None:
        self.cases = {hex_of(c["id"]): c for c in world(case)}

    def chunk_row(self, hex_id: str) -> ChunkRow | None:
        case = self.cases.get(hex_id)
        if case is None:
            return None
        return ChunkRow(id=hex_id, size=case["size"], storage="file", codec=case["codec"],
                        base=hex_of(case["base_id"]))

    def chunk_head(self, hex_id: str, n: int) -> bytes:
        return stored(self.cases[hex_id])[:n]

    def chunk_bytes(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        case = self.cases[hex_id]
        return stored(case)[:limit + 1], f"vector {case['file']}"


def outcome(read: bytes, case: dict[str, Any]) -> str:
    good = ("blake3:" + blake3.blake3(read).hexdigest(), hashlib.sha256(read).hexdigest())
    return "ok" if good == (case["id"], case["sha256"]) else "wrong-bytes"


def test_the_vectors_cover_every_codec_width_and_refusal() -> None:
    codecs = {c["codec"] for c in CASES if c["expect"] == "ok"}
    assert codecs == {"raw", "zstd", "planes2", "planes4", "planes8", "xor1", "xor2", "xor4",
                      "xor8", "sub2", "sub4", "sub8"}
    assert {c["expect"] for c in CASES} >= {
        "ok", "unknown-codec", "no-header", "base-mismatch", "missing-base", "base-size",
        "chain-too-deep", "cycle", "bomb", "short", "wrong-bytes", "stored-too-large"}
    deltas = [sum(c["codec"].startswith(("xor", "sub")) for c in world(BY_NAME[f"chain-{d}"]))
              for d in (8, 9)]
    assert deltas == [MANIFEST["depth"], MANIFEST["depth"] + 1]
    assert sum((HERE / c["file"]).stat().st_size for c in CASES) < 200 << 10
    for case in CASES:
        assert stored(case) and len(stored(case)) == case["stored_size"], case["name"]
        ids = [c["id"] for c in world(case)]
        assert len(set(ids)) == len(ids), case["name"]


# --- the verifiers -------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_the_verifiers_decode_or_refuse_each_case_as_the_vector_says(case: dict[str, Any]) -> None:
    files = _Files(case)
    row = files.chunk_row(hex_of(case["id"]) or "")
    assert row is not None
    try:
        got = outcome(decode_leaf(files, row), case)
    except CodecRefused as exc:
        assert exc.object_id == case["id"] and exc.message.startswith(f"object {case['id']}: ")
        assert "\n" not in exc.message
        got = exc.problem
    assert got == case["expect"]


def _table(db: Path, *, bases: bool) -> sqlite3.Connection:
    """An objects table with the columns docs/format.md §5 names (0006's ``base`` if
    ``bases``)."""
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE objects (seq INTEGER PRIMARY KEY, id CHAR(64) UNIQUE, size INT, "
                "sha256 CHAR(64), kind TEXT, storage TEXT, codec TEXT, stored_size INT, "
                "data BLOB, created REAL" + (", base CHAR(64))" if bases else ")"))
    return con


def _put(root: Path, con: sqlite3.Connection, case: dict[str, Any], *, bases: bool) -> None:
    hex_id = hex_of(case["id"]) or ""
    path = root / "data" / hex_id[:2] / hex_id[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(stored(case))
    values = [hex_id, case["size"], case["sha256"], None, "file", case["codec"],
              case["stored_size"], None, time.time()]
    con.execute(f"INSERT INTO objects (id, size, sha256, kind, storage, codec, stored_size, "
                f"data, created{', base' if bases else ''}) VALUES "
                f"({', '.join('?' * (len(values) + bases))})",
                [*values, hex_of(case["base_id"])] if bases else values)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_the_verifiers_store_reader_finds_each_refusal(tmp_path: Path,
                                                       case: dict[str, Any]) -> None:
    """Through ``StoreSource`` and the integrity check: a finding naming the case, or none."""
    con = _table(tmp_path / "nscas.db", bases=True)
    with con:
        for link in world(case):
            _put(tmp_path, con, link, bases=True)
    con.close()
    source = StoreSource(tmp_path)
    try:
        state = Objects(source).state(case["id"])
    finally:
        source.close()
    if case["expect"] == "ok":
        assert state.problem is None and state.size == case["size"]
    else:
        assert state.problem, case["name"]
        assert state.missing == (case["expect"] == "missing-base")


def test_a_delta_in_a_store_without_the_base_column_is_a_finding(tmp_path: Path) -> None:
    """Before migration 0006 there are no deltas: a delta row there is forged."""
    con = _table(tmp_path / "nscas.db", bases=False)
    with con:
        for link in world(BY_NAME["xor4"]):
            _put(tmp_path, con, link, bases=False)
    con.close()
    source = StoreSource(tmp_path)
    try:
        assert not source.has_bases
        state = Objects(source).state(BY_NAME["xor4"]["id"])
        assert state.problem is not None and "0006_chunk_bases" in state.problem
        assert Objects(source).state(BY_NAME["planes4"]["id"]).problem is None
    finally:
        source.close()


# --- the store ------------------------------------------------------------------------------

HAS_BASES = (ROOT / "migrations" / "versions" / "0006_chunk_bases.py").is_file()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nscas.store.writer import init_store

    root = tmp_path_factory.mktemp("codec-store")
    init_store(root).close()
    return root


@pytest.mark.skipif(not HAS_BASES, reason="the store's codecs arrive with migration "
                                          "0006_chunk_bases")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_the_store_reads_or_refuses_each_case_as_the_vector_says(
        empty_store: Path, tmp_path: Path, case: dict[str, Any]) -> None:
    from nscas.errors import NscasError
    from nscas.objects.digests import Digest
    from nscas.store.writer import Store

    root = tmp_path / "store"
    shutil.copytree(empty_store, root)
    store_dir = root / ".nscas"
    con = sqlite3.connect(store_dir / "nscas.db")
    with con:
        for link in world(case):
            _put(store_dir, con, link, bases=True)
    con.close()
    store = Store(store_dir)
    try:
        if case["expect"] == "ok":
            assert outcome(store.get_bytes(Digest.parse(case["id"])), case) == "ok"
        else:
            with pytest.raises(NscasError):
                store.get_bytes(Digest.parse(case["id"]))
    finally:
        store.close()
