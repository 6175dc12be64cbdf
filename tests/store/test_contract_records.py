"""Contract: records and links (docs/format.md §2, 3). Canonical bytes in, refusals named, closure kept."""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

import pytest
import rfc8785

from nscas.errors import ClosureError, InvalidInput, RecordError
from nscas.objects.digests import Digest
from nscas.store.writer import Link, Store
from tests.store.helpers import b3, build_records, row_counts

ENV = {"nscas": "environment/1", "python": "3.11", "platform": "linux", "packages": {},
       "torch": None, "devices": [], "determinism": {}}


class TestRecordsContract:
    def test_every_kind_round_trips_canonically(self, any_store: Store) -> None:
        built = build_records(any_store)
        assert sorted(built) == ["action/1", "checkpoint/1", "commitment/1", "environment/1",
                                 "journal/1", "params/1", "receipt/1", "tasks/1", "tree/1"]
        for kind, (oid, value) in built.items():
            data = rfc8785.dumps(value)
            assert str(oid) == b3(data), kind
            assert any_store.get_bytes(oid) == data
            assert any_store.get_record(oid) == value
            assert any_store.info(oid).kind == kind

    def test_canonical_encoding_exact_bytes(self, any_store: Store) -> None:
        value = {"platform": "l\u00e9\u2028", "python": "3.11", "nscas": "environment/1",
                 "packages": {"b": "2", "a": "1"}, "torch": None, "devices": [1e21, 0.5, -0.0, 3.0],
                 "determinism": {"z": True, "\u00e4": False}}
        oid = any_store.put_record(value)
        expected = ('{"determinism":{"z":true,"\u00e4":false},"devices":[1e+21,0.5,0,3],'
                    '"nscas":"environment/1","packages":{"a":"1","b":"2"},'
                    '"platform":"l\u00e9\u2028","python":"3.11","torch":null}').encode()
        assert any_store.get_bytes(oid) == expected
        assert str(oid) == b3(expected)
        assert any_store.put_record(expected) == oid  # the same record handed in as bytes

    def test_refusals(self, any_store: Store) -> None:
        canonical = rfc8785.dumps(ENV)
        cases: list[tuple[dict[str, Any] | bytes, str]] = [
            ({**ENV, "devices": [float("nan")]}, "NaN"),
            ({**ENV, "devices": [float("inf")]}, "NaN and Infinity"),
            (canonical.replace(b"]", b"NaN]", 1), "NaN is not allowed"),
            (canonical.replace(b'"devices":[]', b'"devices":[],"devices":[]'), "duplicate key"),
            (json.dumps(ENV, indent=1).encode(), "not the RFC 8785 canonical"),
            (json.dumps(ENV, sort_keys=True).encode(), "not the RFC 8785 canonical"),
            (canonical + b"\n", "not the RFC 8785 canonical"),
            (b"\xff" + canonical, "UTF-8"),
            (b"[1,2]", "JSON object"),
            ({**ENV, "nscas": "environment/2"}, "unknown record kind or version"),
            ({**ENV, "nscas": "dataset/1"}, "unknown record kind or version"),
            ({**ENV, "nscas": "environment"}, "'<kind>/<version>'"),
            ({k: v for k, v in ENV.items() if k != "nscas"}, "'<kind>/<version>'"),
            ({**ENV, "devices": [2**60]}, "cannot canonicalise"),
        ]
        before = row_counts(any_store)
        for value, message in cases:
            with pytest.raises(RecordError, match=message):
                any_store.put_record(value)
        assert row_counts(any_store) == before

    SCHEMA_VIOLATIONS: ClassVar = [
        ("tree/1", lambda r: r["entries"].update({"../x": r["entries"]["a/b.txt"]}),
         "$.entries['../x']"),
        ("tree/1", lambda r: r["entries"]["a/b.txt"].update(sha256="XYZ"), "$.entries['a/b.txt'].sha256"),
        ("tree/1", lambda r: r["entries"]["a/b.txt"].update(nscas="tree/1"), "$.entries['a/b.txt']"),
        ("params/1", lambda r: r.update(extra=1), "$"),
        ("params/1", lambda r: r["tensors"]["w"].update(dtype="float32"), "$.tensors['w'].dtype"),
        ("checkpoint/1", lambda r: r.update(step=-1), "$.step"),
        ("checkpoint/1", lambda r: r.update(parent="blake3:00"), "$.parent"),
        ("tasks/1", lambda r: r.update(count=3), "$.count"),
        ("tasks/1", lambda r: r.update(ids=["t1", "t1"]), "$.ids"),
        ("action/1", lambda r: r.update(recipe="train"), "$.recipe"),
        ("action/1", lambda r: r.update(inputs={"bad name": r["code"]}), "$.inputs.bad name"),
        ("environment/1", lambda r: r.pop("devices"), "$"),
        ("journal/1", lambda r: r.update(rank=1), "$.rank"),
        ("journal/1", lambda r: r.update(head="short"), "$.head"),
        ("commitment/1", lambda r: r.update(subjects={}), "$.subjects"),
        ("receipt/1", lambda r: r["claims"]["loss"].pop("verifier"), "$.claims['loss']"),
        ("receipt/1", lambda r: r.update(status="done"), "$.status"),
        ("receipt/1", lambda r: r.update(status="failed"), "$.error"),
    ]

    @pytest.mark.parametrize(("kind", "mutate", "path"), SCHEMA_VIOLATIONS,
                             ids=[f"{k}:{p}" for k, _, p in SCHEMA_VIOLATIONS])
    def test_schema_violations(self, any_store: Store, kind: str, mutate: Any, path: str) -> None:
        _, value = build_records(any_store)[kind]
        bad = copy.deepcopy(value)
        mutate(bad)
        before = row_counts(any_store)
        with pytest.raises(RecordError) as err:
            any_store.put_record(bad)
        assert (err.value.kind, err.value.path) == (kind, path)
        assert row_counts(any_store) == before

    def test_closure_invariant(self, any_store: Store) -> None:
        present = any_store.put_bytes(b"present")
        absent = Digest.parse(b3(b"absent"))
        record = {"nscas": "action/1", "recipe": "r@1", "code": str(present), "inputs": {},
                  "params": {"deep": [{"x": str(absent)}], "fine": str(present)}}
        before = row_counts(any_store)
        with pytest.raises(ClosureError) as err:
            any_store.put_record(record)
        assert err.value.missing == [str(absent)]
        assert row_counts(any_store) == before
        assert not any_store.has(Digest.parse(b3(rfc8785.dumps(record))))
        any_store.put_bytes(b"absent")
        oid = any_store.put_record(record)
        assert any_store.closure([oid]) == {oid, present, absent}

    def test_links_both_directions(self, any_store: Store) -> None:
        built = build_records(any_store)
        receipt, value = built["receipt/1"]
        action, env = Digest.parse(value["action"]), Digest.parse(value["environment"])
        ckpt, journal = Digest.parse(value["outputs"]["checkpoint"]), Digest.parse(value["journals"][0])
        assert any_store.links_from(receipt) == [
            Link(parent=receipt, path="$.action", child=action),
            Link(parent=receipt, path="$.environment", child=env),
            Link(parent=receipt, path="$.journals[0]", child=journal),
            Link(parent=receipt, path="$.outputs.checkpoint", child=ckpt),
        ]
        commitment = built["commitment/1"][0]
        assert any_store.links_to(ckpt) == sorted(
            [Link(parent=built["action/1"][0], path="$.inputs.base", child=ckpt),
             Link(parent=commitment, path="$.subjects.candidate", child=ckpt),
             Link(parent=receipt, path="$.outputs.checkpoint", child=ckpt)],
            key=lambda lk: (lk.parent.hex, lk.path))
        blob = Digest.parse(b3(b"hello world"))
        assert {lk.parent for lk in any_store.links_to(blob)} == {
            built[k][0] for k in ("tree/1", "tasks/1", "journal/1")}
        assert any_store.links_from(blob) == []  # a blob links nowhere
        # A path with a key that is not an identifier is quoted.
        odd = any_store.put_record({**ENV, "packages": {"a b": str(blob)}})
        assert any_store.links_from(odd) == [Link(parent=odd, path='$.packages["a b"]', child=blob)]

    def test_get_record_of_a_blob(self, any_store: Store) -> None:
        blob = any_store.put_bytes(rfc8785.dumps(ENV))  # record-shaped bytes stored as a blob
        with pytest.raises(InvalidInput, match="blob, not a record"):
            any_store.get_record(blob)

    def test_put_records_is_one_all_or_nothing_batch(self, any_store: Store) -> None:
        blob = any_store.put_bytes(b"payload")
        first = {"nscas": "commitment/1", "subjects": {"x": str(blob)}, "purpose": "one",
                 "previous": None}
        first_id = b3(rfc8785.dumps(first))
        second = {**first, "purpose": "two", "previous": first_id}  # links into the same batch
        ids = any_store.put_records([first, rfc8785.dumps(second)])
        assert [str(i) for i in ids] == [first_id, b3(rfc8785.dumps(second))]
        assert any_store.links_from(ids[1])[0] == Link(parent=ids[1], path="$.previous", child=ids[0])
        before = row_counts(any_store)
        third = {**first, "purpose": "three"}
        absent = {**first, "purpose": "four", "previous": b3(b"absent")}
        with pytest.raises(ClosureError):
            any_store.put_records([third, absent])
        with pytest.raises(RecordError):
            any_store.put_records([third, {**first, "purpose": ""}])
        assert row_counts(any_store) == before  # nothing of a refused batch is stored
        assert any_store.put_records([]) == []
