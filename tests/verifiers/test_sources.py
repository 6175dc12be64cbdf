"""The read-only store and bundle readers: same bytes as the store, strict target resolution,
unsafe bundle paths refused."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import rfc8785

from nscas.objects.digests import Digest
from nscas.verifiers.bundle.source import BundleSource, safe_relative
from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.sources import BadTarget, SourceError, read_all
from nscas.verifiers.records.store import StoreSource, find_store_dir
from tests.store.services import TeamServices

from .conftest import Pipeline


def test_the_store_reader_gives_the_store_s_bytes(pipeline: Pipeline) -> None:
    source = StoreSource(pipeline.store_dir)
    try:
        rows = source._db.execute("SELECT id, storage, codec FROM objects").fetchall()
        kinds = {(storage, codec) for _, storage, codec in rows}
        # The pipeline exercises every way of storing bytes: inline, a chunk file (zstd, and the
        # byte planes its float tensors get), an object of parts.
        assert {("inline", "raw"), ("file", "zstd"), ("parts", "raw")} <= kinds
        assert any(storage == "file" and codec.startswith("planes") for storage, codec in kinds)
        for hex_id, _, _ in rows:
            oid = "blake3:" + hex_id
            assert read_all(source, oid) == pipeline.store.get_bytes(Digest.parse(oid))
            meta = source.meta(oid)
            info = pipeline.store.info(Digest.parse(oid))
            assert (meta.size, meta.sha256, meta.kind) == (info.size, info.sha256, info.kind)
    finally:
        source.close()


def test_store_targets_resolve_strictly(pipeline: Pipeline) -> None:
    receipt = pipeline.receipt("prepare")
    pipeline.store.ref_set("experiments/sources/prepared", Digest.parse(receipt))
    source = StoreSource(pipeline.store_dir)
    try:
        assert source.resolve(receipt) == receipt
        assert source.resolve(receipt[7:15]) == receipt
        assert source.resolve("experiments/sources/prepared") == receipt
        for bad in (receipt[7:14], "BLAKE3:" + receipt[7:], "../etc", ""):
            with pytest.raises(BadTarget):
                source.resolve(bad)
        assert source.parents(pipeline.output("prepare", "test")) is not None
        assert receipt in source.parents(pipeline.output("prepare", "test"))
    finally:
        source.close()


def test_the_store_is_found_like_git_finds_its_directory(pipeline: Pipeline,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    assert find_store_dir(pipeline.root) == pipeline.store_dir
    assert find_store_dir(pipeline.store_dir) == pipeline.store_dir
    deeper = pipeline.root / "a" / "b"
    deeper.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(deeper)
    assert find_store_dir(None).resolve() == pipeline.store_dir.resolve()
    monkeypatch.setenv("NSCAS_STORE", str(pipeline.root))
    assert find_store_dir(None) == pipeline.store_dir
    with pytest.raises(SourceError):
        find_store_dir(deeper)


def test_the_search_for_a_store_stops_at_a_ceiling(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """As the product's (§5.1): a ceiling directory is searched, its parents never."""
    (tmp_path / ".nscas").mkdir()
    (tmp_path / ".nscas" / "nscas.db").write_bytes(b"")  # the search only asks whether it is there
    deeper = tmp_path / "a" / "b"
    deeper.mkdir(parents=True)
    monkeypatch.chdir(deeper)
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    for ceiling in (str(tmp_path), f"relative:{tmp_path}", ""):
        monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", ceiling)
        assert find_store_dir(None).resolve() == (tmp_path / ".nscas").resolve()
    for stop in (tmp_path / "a", deeper):
        monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", f"{stop}:{tmp_path}")
        with pytest.raises(SourceError, match=re.escape(f"up to {stop.resolve()}")):
            find_store_dir(None)


@pytest.mark.parametrize(("path", "safe"), [
    ("tasks/test.jsonl", True), ("a/b/c", True), ("/etc/passwd", False), ("../x", False),
    ("a/../b", False), ("a//b", False), ("./a", False), ("a\\b", False), ("", False),
])
def test_bundle_paths_must_be_plain_relative_paths(path: str, safe: bool) -> None:
    assert (safe_relative(path) is None) is safe


def _manifest(root: Path, objects: dict[str, dict], **extra: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    body = {"format": "nscas-bundle/1", "target": next(iter(objects.values()))["id"],
            "objects": objects, "derived": {}, "omitted": {}, **extra}
    (root / "manifest.json").write_bytes(rfc8785.dumps(body))


def test_a_bundle_resolves_prefixes_and_refuses_ambiguity(tmp_path: Path) -> None:
    a, b = "blake3:aaaaaaaa1" + "0" * 55, "blake3:aaaaaaaa2" + "0" * 55
    entry = {"size": 1, "sha256": "0" * 64, "kind": None}
    _manifest(tmp_path / "b", {"blobs/a": {**entry, "id": a}, "blobs/b": {**entry, "id": b}})
    bundle = BundleSource(tmp_path / "b")
    assert bundle.resolve("aaaaaaaa1") == a
    with pytest.raises(BadTarget, match="ambiguous"):
        bundle.resolve("aaaaaaaa")


def test_a_bundle_reads_derived_ranges_and_finds_parents(tmp_path: Path) -> None:
    import blake3

    whole = b"0123456789abcdef"
    part = whole[4:10]
    whole_id = "blake3:" + blake3.blake3(whole).hexdigest()
    part_id = "blake3:" + blake3.blake3(part).hexdigest()
    sha = hashlib.sha256
    record = rfc8785.dumps({"nscas": "tree/1", "entries": {"w": {
        "id": whole_id, "size": len(whole), "sha256": sha(whole).hexdigest()}}})
    record_id = "blake3:" + blake3.blake3(record).hexdigest()
    root = tmp_path / "b"
    (root / "blobs").mkdir(parents=True)
    (root / "records").mkdir()
    (root / "blobs" / "w").write_bytes(whole)
    (root / "records" / "t.json").write_bytes(record)
    _manifest(root, {
        "records/t.json": {"id": record_id, "size": len(record),
                           "sha256": sha(record).hexdigest(), "kind": "tree/1"},
        "blobs/w": {"id": whole_id, "size": len(whole), "sha256": sha(whole).hexdigest(),
                    "kind": None}},
        derived={part_id: {"from": whole_id, "offset": 4, "size": 6,
                           "sha256": sha(part).hexdigest()}})
    bundle = BundleSource(root)
    objects = Objects(bundle)
    assert objects.bytes(part_id) == part
    assert bundle.parents(whole_id) == [record_id]
    assert bundle.parents(part_id) == []
    # A range that runs past its source is a finding, not a crash.
    body = json.loads((root / "manifest.json").read_text())
    body["derived"][part_id]["offset"] = 14
    (root / "manifest.json").write_bytes(rfc8785.dumps(body))
    state = Objects(BundleSource(root)).state(part_id)
    assert state.problem is not None and "past the end" in state.problem


@pytest.mark.parametrize("frame", ["bomb", "huge-window"])
def test_the_store_reader_never_inflates_a_chunk_past_its_record(tmp_path: Path, frame: str) -> None:
    """docs/format.md §5.5: a chunk decodes to at most its recorded size, with a zstd window of
    at most 32 MiB; the verifiers' reader applies the same bounds as the store."""
    import zstandard

    from nscas.store.writer import init_store
    from nscas.verifiers.records.sources import Unreadable

    store = init_store(tmp_path)
    oid = store.put_bytes(bytes(range(16)) * 4096)
    assert store.info(oid).codec == "zstd"
    chunk = store.chunks.path(oid)  # type: ignore[attr-defined]
    store.close()
    if frame == "bomb":
        cobj = zstandard.ZstdCompressor().compressobj()
        stored = b"".join(cobj.compress(bytes(1 << 20)) for _ in range(256)) + cobj.flush()
    else:
        params = zstandard.ZstdCompressionParameters(window_log=27, enable_ldm=True)
        cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
        stored = cobj.compress(bytes(range(16)) * 4096) + cobj.flush()
    chunk.chmod(0o644)
    chunk.write_bytes(stored)
    source = StoreSource(tmp_path / ".nscas")
    try:
        with pytest.raises(Unreadable):
            read_all(source, str(oid))
    finally:
        source.close()


def test_the_team_store_reader_decodes_and_refuses_deltas(team_services: TeamServices,
                                                          tmp_path: Path) -> None:
    """docs/format.md §5.5.1 in a PostgreSQL + S3 store: rows with their ``base`` column read
    through psycopg, chunk objects by byte ranges through boto3 (codec vectors, one store)."""
    import boto3
    import psycopg

    from nscas.store.writer import init_store
    from nscas.verifiers.records.store import TeamStoreSource
    from tests.vectors.test_codec_vectors import BY_NAME, stored, world

    config = team_services.config()
    init_store(tmp_path, config).close()
    s3 = boto3.client("s3", endpoint_url=team_services.moto.endpoint)
    bucket, _, prefix = config.objects[5:].partition("/")
    chain = BY_NAME["chain-9"]
    empty = "0" * 64  # a delta whose chunk object is empty: no header (no byte range at all)
    rows = {c["id"][7:]: c for name in ("chain-9", "zstd-bomb-1mib", "missing-base")
            for c in world(BY_NAME[name])}
    with psycopg.connect(config.database, autocommit=True) as pg:
        if pg.execute("SELECT 1 FROM information_schema.columns WHERE table_name = 'objects' "
                      "AND column_name = 'base'").fetchone() is None:
            pg.execute("ALTER TABLE objects ADD COLUMN base CHAR(64)")  # migration 0006
        for hex_id, case in [*rows.items(), (empty, {**chain, "name": "empty"})]:
            body = b"" if hex_id == empty else stored(case)
            s3.put_object(Bucket=bucket, Key=f"{prefix}/data/{hex_id[:2]}/{hex_id[2:]}",
                          Body=body)
            pg.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, "
                       "stored_size, data, created, base) VALUES (%s, %s, %s, NULL, 'file', "
                       "%s, %s, NULL, 0, %s)",
                       (hex_id, case["size"], case["sha256"], case["codec"], len(body),
                        case["base_id"] and case["base_id"][7:]))
    source = TeamStoreSource(tmp_path / ".nscas")
    try:
        assert source.has_bases
        objects = Objects(source)
        assert objects.state(BY_NAME["chain-8"]["id"]).problem is None
        problems = {name: objects.state(BY_NAME[name]["id"]) for name in
                    ("chain-9", "zstd-bomb-1mib", "missing-base")}
        assert "more than 8 deltas" in (problems["chain-9"].problem or "")
        assert "at most 4099 bytes" in (problems["zstd-bomb-1mib"].problem or "")
        assert problems["missing-base"].missing
        assert "holds 0 bytes" in (objects.state(f"blake3:{empty}").problem or "")
    finally:
        source.close()


def test_a_delta_over_an_inline_leaf_and_an_inline_leaf_in_a_codec_are_findings(
        tmp_path: Path) -> None:
    """docs/format.md §5.5.1: inline leaves are always raw, and a base is a leaf in a chunk
    file; a row saying otherwise is forged, whatever its bytes."""
    from tests.vectors.test_codec_vectors import BY_NAME, _put, _table, stored

    delta, base = BY_NAME["xor1"], BY_NAME["raw"]
    con = _table(tmp_path / "nscas.db", bases=True)
    with con:
        _put(tmp_path, con, delta, bases=True)
        for hex_id, codec, data in ((base["id"][7:], "raw", stored(base)),
                                    ("ab" * 32, "zstd", b"inline")):
            con.execute("INSERT INTO objects (id, size, sha256, storage, codec, stored_size, "
                        "data, created) VALUES (?, ?, ?, 'inline', ?, ?, ?, 0)",
                        (hex_id, len(data), hashlib.sha256(data).hexdigest(), codec,
                         len(data), data))
    con.close()
    source = StoreSource(tmp_path)
    try:
        objects = Objects(source)
        assert objects.state(base["id"]).problem is None  # as a leaf of its own, fine
        over = objects.state(delta["id"]).problem or ""
        assert "chunk file" in over and "'inline'" in over, over
        assert "always raw" in (objects.state("blake3:" + "ab" * 32).problem or "")
    finally:
        source.close()
