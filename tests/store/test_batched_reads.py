"""The batched reads lineage and log use answer as the one-object reads do, and lineage's
statements grow with the graph's depth, not its width (each is a round trip on PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nscas.errors import IntegrityError, InvalidInput, NotFound
from nscas.objects.digests import Digest
from nscas.store.lineage import lineage
from nscas.store.opening import open_store
from nscas.store.provenance import producers, producers_of
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import raw_insert, raw_update


def _runs(store: Store, n: int) -> dict[str, Any]:
    """``n`` receipts sharing one environment, each producing a checkpoint of its own."""
    env = store.put_record({"nscas": "environment/1", "python": "3.11", "platform": "linux",
                            "packages": {}, "torch": None, "devices": [], "determinism": {}})
    blob = store.put_bytes(b"weights")
    tree = store.put_record({"nscas": "tree/1", "entries": {"w": {
        "id": str(blob), "size": 7, "sha256": store.sha256(blob)}}})
    receipts, ckpts = [], []
    for i in range(n):
        action = store.put_record({"nscas": "action/1", "recipe": "train@1", "code": str(tree),
                                   "inputs": {}, "params": {"run": i}})
        params = store.put_record({"nscas": "params/1", "tensors": {}})
        ckpt = store.put_record({"nscas": "checkpoint/1", "files": str(tree), "params": str(params),
                                 "step": i, "parent": None})
        receipts.append(store.put_record({
            "nscas": "receipt/1", "action": str(action), "environment": str(env),
            "outputs": {"checkpoint": str(ckpt)}, "journals": [], "claims": {},
            "started": f"2025-01-01T00:{i:02d}:00Z", "finished": "2025-01-01T01:00:00Z",
            "status": "succeeded"}))
        ckpts.append(ckpt)
    return {"env": env, "blob": blob, "receipts": receipts, "ckpts": ckpts}


def check_linked(r: Any, ids: list[Digest]) -> dict[Any, Any]:
    """``linked`` answers as the separate reads do, every way, with and without records;
    returns its answers (to compare across engines)."""
    got: dict[Any, Any] = {}
    for way, limit, plain in (("from", None, r.links_from_each(ids)),
                              ("to", None, r.links_to_each(ids)),
                              ("to", 3, r.links_to_each(ids, 3)),
                              ("outputs", None, r.output_links_to(ids))):
        ends = {lk.child if way == "from" else lk.parent
                for found in plain.values() for lk in found}
        kinds = r.kinds_of(ends)
        for record_kinds in ((), ("receipt/1",), ("receipt/1", "action/1", "environment/1")):
            linked = r.linked(ids, way, record_kinds, limit=limit)
            assert linked.links == plain
            assert linked.kinds == kinds
            assert linked.records == r.get_records(e for e in ends if kinds[e] in record_kinds)
            got[way, limit, record_kinds] = linked
    return got


def test_batched_reads_equal_single_reads(store: Store) -> None:
    built = _runs(store, 7)
    ids = [built["env"], *built["receipts"], *built["ckpts"]]
    with open_store(store.root, readonly=True) as r:
        assert r.get_records(ids) == {i: r.get_record(i) for i in ids}
        assert r.links_from_each(ids) == {i: r.links_from(i) for i in ids}
        for limit in (None, 1, 3):
            assert r.links_to_each(ids, limit) == {i: r.links_to(i, limit) for i in ids}
        assert len(r.links_to(built["env"])) == 7
        assert [lk.parent for lk in r.links_to(built["env"], 3)] == sorted(built["receipts"])[:3]
        outputs = r.output_links_to(built["ckpts"])
        assert {c: [lk.parent for lk in found] for c, found in outputs.items()} == {
            c: [rc] for c, rc in zip(built["ckpts"], built["receipts"], strict=True)}
        assert r.output_links_to([built["env"]]) == {built["env"]: []}  # inputs are not outputs
        linked = check_linked(r, ids)
        assert len(linked["to", None, ()].links[built["env"]]) == 7  # not empty answers
        assert linked["from", None, ("receipt/1",)].kinds[built["env"]] == "environment/1"
        assert set(linked["outputs", None, ("receipt/1",)].records) == set(built["receipts"])
        made = producers_of(r, [built["env"], *built["ckpts"]])
        assert made == {i: producers(r, i) for i in made}
        assert made[built["ckpts"][2]].first == built["receipts"][2]
        absent = Digest.of(b"never stored")
        kinds, labelled = r.kinds_and_records([*ids, built["blob"], absent], ("receipt/1",))
        assert kinds == {**r.kinds_of(ids), built["blob"]: None}  # the absent ID left out
        assert labelled == {i: r.get_record(i) for i in built["receipts"]}
        assert r.kinds_and_records(ids, ()) == (r.kinds_of(ids), {})
        with pytest.raises(InvalidInput):
            r.get_records([built["blob"]])
        with pytest.raises(NotFound):
            r.get_records([Digest.of(b"never stored")])


def test_lineage_statements_do_not_grow_with_width(store: Store) -> None:
    def statements(n: int) -> tuple[int, int]:
        built = _runs(store, n)
        with open_store(store.root, readonly=True) as r:
            count = 0
            connect = r._pool._connect

            class Counting:
                def __init__(self) -> None:
                    self.c = connect()

                def execute(self, *a: Any) -> Any:
                    nonlocal count
                    count += 1
                    return self.c.execute(*a)

                def __getattr__(self, name: str) -> Any:
                    return getattr(self.c, name)

            r._pool._connect = Counting  # type: ignore[assignment]
            down = lineage(r, built["env"], direction="down")
            assert len(down.children) == n and all(c.recipe == "train@1" for c in down.children)
            down_count, count = count, 0
            up = lineage(r, built["receipts"][-1])
            assert up.status == "succeeded"
            return down_count, count

    small, large = statements(3), statements(60)
    assert large[0] == small[0]  # 60 receipts under the environment: as few reads as 3
    assert large[1] <= small[1] + 2


def test_reads_check_the_id_and_fsck_the_canonical_form(store: Store) -> None:
    """A record whose bytes are not canonical but are its ID's (written behind the store's
    back): reads parse it (its BLAKE3 is its ID), ``fsck`` names it; bytes that are not the
    ID's fail the read."""
    value = {"nscas": "params/1", "tensors": {}}
    loose = json.dumps(value, indent=1).encode()
    oid = Digest.of(loose)
    raw_insert(store, oid, loose, kind="params/1")
    with open_store(store.root, readonly=True) as r:
        assert r.get_records([oid]) == {oid: value}
        assert r.kinds_and_records([oid], ("params/1",))[1] == {oid: value}
        report = fsck(r)
    assert [(f.object, f.problem) for f in report.findings] == [(str(oid), "invalid-record")]
    assert "canonical" in report.findings[0].detail
    raw_update(store, "UPDATE objects SET data = ? WHERE id = ?", (loose + b" ", oid.hex))
    with open_store(store.root, readonly=True) as r, pytest.raises(IntegrityError):
        r.get_records([oid])
