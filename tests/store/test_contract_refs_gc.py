"""Contract: refs (compare-and-swap, immutable tags, append-only log), gc and fsck (docs/format.md §5)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from nscas.errors import InvalidInput, NotFound, RefConflict, TagImmutable
from nscas.objects.digests import Digest
from nscas.store.writer import RefEntry, Store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import (
    b3,
    build_records,
    chunk_files,
    chunk_path,
    random_bytes,
    raw_update,
    stray,
    write_safetensors,
)

HOUR = 3600.0


def _age(store: Store, oids: list[Digest], seconds: float) -> None:
    """Make objects' rows look ``seconds`` older than they are (their chunk files' ages, which
    an S3 service sets itself, are aged by passing gc a later ``now``)."""
    for oid in oids:
        raw_update(store, "UPDATE objects SET created = created - ? WHERE id = ?", (seconds, oid.hex))


def _reported(path: object) -> Path:
    """How gc names a temporary file: its path, or an S3 key as a path."""
    return getattr(path, "reported", path)  # type: ignore[return-value]


def _log(store: Store, name: str) -> list[tuple[Digest | None, Digest]]:
    return [(e.old, e.new) for e in reversed(store.ref_log(name))]


class TestRefsContract:
    def test_compare_and_swap(self, any_store: Store) -> None:
        a, b, c = (any_store.put_bytes(x) for x in (b"a", b"b", b"c"))
        name = "experiments/coop/clean-single"
        assert any_store.ref_get(name) is None
        any_store.ref_set(name, a, expect=None)  # expect "unset": creates
        with pytest.raises(RefConflict) as err:
            any_store.ref_set(name, b, expect=None)
        assert (err.value.expected, err.value.actual) == (None, str(a))
        any_store.ref_set(name, b, expect=a)  # match: moves
        with pytest.raises(RefConflict) as err:
            any_store.ref_set(name, c, expect=a)  # a stale expectation never overwrites
        assert (err.value.expected, err.value.actual) == (str(a), str(b))
        assert any_store.ref_get(name) == b
        any_store.ref_set(name, c)  # no expectation: unconditional
        assert any_store.ref_get(name) == c
        assert _log(any_store, name) == [(None, a), (a, b), (b, c)]
        with pytest.raises(RefConflict):
            any_store.ref_set("experiments/other", a, expect=b)  # expecting a value of an unset ref
        assert any_store.ref_get("experiments/other") is None

    def test_ref_to_absent_object_and_bad_names(self, any_store: Store) -> None:
        with pytest.raises(NotFound):
            any_store.ref_set("x", Digest.parse(b3(b"absent")))
        oid = any_store.put_bytes(b"x")
        for bad in ("", "/a", "a/", "a//b", "a/../b", "-a", "a b", "deadbeef", "blake3:deadbeef00"):
            with pytest.raises(InvalidInput):
                any_store.ref_set(bad, oid)
        assert any_store.ref_list() == []

    def test_tags_never_move(self, any_store: Store) -> None:
        a, b = any_store.put_bytes(b"a"), any_store.put_bytes(b"b")
        any_store.ref_set("tags/v1", a)
        any_store.ref_set("tags/v1", a)  # setting the same value again is no move
        for expect in (None, a):
            with pytest.raises((TagImmutable, RefConflict)):
                any_store.ref_set("tags/v1", b, expect=expect)
        with pytest.raises(TagImmutable) as err:
            any_store.ref_set("tags/v1", b)
        assert err.value.current == str(a)
        assert any_store.ref_get("tags/v1") == a
        assert _log(any_store, "tags/v1") == [(None, a)]

    def test_ref_log_is_append_only_history(self, any_store: Store) -> None:
        ids = [any_store.put_bytes(b"%d" % i) for i in range(5)]
        for i, oid in enumerate(ids):
            any_store.ref_set("r", oid, message=f"step {i}")
        any_store.ref_set("s", ids[0])
        log = any_store.ref_log()
        assert [(e.name, e.message) for e in log[:2]] == [("s", ""), ("r", "step 4")]
        assert any_store.ref_log("r", limit=2) == [
            RefEntry(name="r", old=ids[3], new=ids[4], at=log[1].at, message="step 4"),
            RefEntry(name="r", old=ids[2], new=ids[3], at=log[2].at, message="step 3")]
        assert _log(any_store, "r") == list(zip([None, *ids[:-1]], ids, strict=True))
        assert any_store.ref_list() == [("r", ids[4]), ("s", ids[0])]
        assert any_store.ref_list("s") == [("s", ids[0])]

    def test_resolve(self, any_store: Store) -> None:
        oid = any_store.put_bytes(b"resolve me")
        any_store.ref_set("runs/x", oid)
        assert any_store.resolve(str(oid)) == oid
        assert any_store.resolve("runs/x") == oid
        assert any_store.resolve(oid.hex[:8]) == oid
        with pytest.raises(NotFound):
            any_store.resolve("runs/y")


class TestMaintenanceContract:
    def test_fsck_clean_on_a_good_store(self, any_store: Store, tmp_path: Path) -> None:
        built = build_records(any_store)
        write_safetensors(tmp_path / "m.safetensors",
                          {"w": np.ones((64, 64), np.float32), "b": np.arange(5000, dtype=np.float32)})
        any_store.put_file(tmp_path / "m.safetensors")
        any_store.ref_set("r", built["receipt/1"][0])
        report = fsck(any_store, deep=True)
        assert report.findings == ()
        assert report.ok and report.complete and report.mode == "deep"
        assert report.objects == any_store.counts()["objects"]
        # Every stored leaf hashed once: every object but the file, which is only its parts.
        assert report.deep_checked == report.objects - 1
        full = fsck(any_store, full=True)
        assert full.findings == () and full.mode == "full"
        # Every top-level object re-read whole: all but the file's three parts.
        assert full.deep_checked == full.objects - 3
        assert fsck(any_store).mode == "rows" and fsck(any_store).deep_checked == 0

    def test_gc_keeps_reachable_and_removes_the_rest(self, any_store: Store, tmp_path: Path) -> None:
        built = build_records(any_store)  # no ref; the receipt is a root of its own
        tensors = {"kept": np.arange(4000, dtype=np.float32), "big": np.ones(3000, np.float32)}
        write_safetensors(tmp_path / "m.safetensors", tensors)
        model = any_store.put_file(tmp_path / "m.safetensors")
        by_ref = any_store.put_record({"nscas": "commitment/1", "subjects": {"model": str(model)},
                                       "purpose": "keep", "previous": None})
        any_store.ref_set("keep/model", by_ref)
        lost_blob = any_store.put_bytes(np.random.default_rng(1).bytes(9000))
        lost_record = any_store.put_record({"nscas": "commitment/1", "subjects": {"x": str(lost_blob)},
                                            "purpose": "lost", "previous": None})
        interrupted = stray(any_store, "tmp", "interrupted.tmp")
        interrupted.write_bytes(b"half a chunk")
        orphan = stray(any_store, "data", "ff", "f" * 62)
        orphan.write_bytes(b"no row uses me")
        kept = any_store.closure([built["receipt/1"][0], by_ref], with_parts=True)
        assert len(kept) == 14  # receipt: 7 records, 2 blobs; ref: record, file, header, 2 tensors
        # The tasks and commitment records are reached from no ref and no receipt; the blob they
        # share with the receipt's closure stays.
        lost = {lost_blob, lost_record, built["tasks/1"][0], built["commitment/1"][0]}

        # Everything here was written a moment ago: with the default minimum age gc removes
        # nothing, since a put in another process could still be using any of it.
        young = gc(any_store)
        assert (young.objects, young.temporary_files, young.orphan_chunks) == ((), (), ())
        assert (young.young_objects, young.young_files) == (len(lost), 2)

        dry = gc(any_store, dry_run=True, min_age=0)
        assert set(dry.objects) == lost
        assert any_store.has(lost_blob) and orphan.exists()

        report = gc(any_store, min_age=0)
        assert set(report.objects) == lost
        assert report.temporary_files == (_reported(interrupted),)
        assert report.orphan_chunks == (Digest("f" * 64),)
        assert not any(any_store.has(oid) for oid in lost)
        assert not chunk_path(any_store, lost_blob).exists() and not orphan.exists()
        assert any_store.chunks.temporary_files() == [] and not interrupted.exists()
        for oid in kept:
            assert any_store.has(oid)
            assert str(oid) == b3(any_store.get_bytes(oid))
        assert len(chunk_files(any_store)) == 2  # the two tensors
        assert fsck(any_store, deep=True).findings == ()
        assert gc(any_store, min_age=0).objects == ()  # nothing left to collect

    def test_gc_keeps_young_orphans_and_temporary_files(self, any_store: Store) -> None:
        # A put in another process writes chunk files (through tmp/) before it inserts their rows.
        orphan = stray(any_store, "data", "ee", "e" * 62)
        orphan.write_bytes(b"a put will insert my row")
        temp = stray(any_store, "tmp", "in-progress.tmp")
        temp.write_bytes(b"a put is writing me")
        report = gc(any_store)
        assert (report.temporary_files, report.orphan_chunks, report.young_files) == ((), (), 2)
        assert temp.exists() and orphan.exists()
        # Two hours on, the orphan goes; the temporary file is written afresh, so young again.
        temp.unlink()
        report = gc(any_store, now=time.time() + 2 * HOUR)
        assert (report.temporary_files, report.orphan_chunks, report.young_files) == ((), (Digest("e" * 64),), 0)
        assert not orphan.exists()
        temp.write_bytes(b"a put is writing me")
        assert gc(any_store).young_files == 1
        later = time.time() + HOUR + 60
        assert gc(any_store, min_age=2 * HOUR, now=later).temporary_files == ()  # a longer minimum age
        report = gc(any_store, now=later)
        assert (report.temporary_files, report.young_files, report.min_age) == ((_reported(temp),), 0, HOUR)
        assert not temp.exists()

    def test_gc_keeps_young_objects_and_all_they_reach(self, any_store: Store) -> None:
        old_blob = any_store.put_bytes(random_bytes(9000, seed=7))
        _age(any_store, [old_blob], 2 * HOUR)
        # A put that just stored a record naming the old blob has not set its ref yet.
        young_record = any_store.put_record({"nscas": "commitment/1", "subjects": {"x": str(old_blob)},
                                             "purpose": "about to get a ref", "previous": None})
        lone = any_store.put_bytes(b"a young blob nobody names yet")
        report = gc(any_store)
        assert (report.objects, report.young_objects) == ((), 3)
        assert all(any_store.has(d) for d in (old_blob, young_record, lone))
        assert chunk_path(any_store, old_blob).is_file()

        stored = sum(any_store.info(d).stored_size for d in (old_blob, young_record, lone))
        report = gc(any_store, now=time.time() + 2 * HOUR)  # two hours on, all three are old
        assert set(report.objects) == {old_blob, young_record, lone}
        assert (report.bytes, report.young_objects) == (stored, 0)
        assert not any(any_store.has(d) for d in (old_blob, young_record, lone))
        assert not chunk_path(any_store, old_blob).exists()
        assert fsck(any_store, deep=True).findings == ()

    def test_gc_spares_what_gained_a_parent_after_it_looked(self, any_store: Store,
                                                           tmp_path: Path) -> None:
        """The deletion re-checks inside its transaction: a put that committed after gc computed
        what is unreachable may link to, or reuse as a part, an object gc chose to remove."""
        blob = any_store.put_bytes(random_bytes(9000, seed=8))
        tree = any_store.put_record({"nscas": "tree/1", "entries": {
            "b": {"id": str(blob), "size": 9000, "sha256": any_store.info(blob).sha256}}})
        tensors = {"a": np.arange(3000, dtype=np.float32), "b": np.ones(3000, np.float32)}
        write_safetensors(tmp_path / "m.safetensors", tensors)
        model = any_store.put_file(tmp_path / "m.safetensors")
        parts = [p for _, p in any_store.part_ids(model)]
        # gc looked before these puts: it saw the tree, the blob and the parts unreachable.
        late = any_store.put_record({"nscas": "commitment/1", "subjects": {"t": str(tree)},
                                     "purpose": "put while gc ran", "previous": None})
        assert any_store.delete_objects([tree, blob, *parts], files_before=time.time()) == []
        for oid in (tree, blob, *parts):
            assert any_store.has(oid)
        assert fsck(any_store, deep=True).findings == ()
        # Once their parents go too, they go.
        removed = any_store.delete_objects([late, tree, blob, model, *parts], files_before=time.time())
        assert set(removed) == {late, tree, blob, model, *parts}
        assert any_store.counts()["objects"] == 0 and chunk_files(any_store) == {}
