"""Strict record reading, links and the v1 kind schemas, with every finding reported."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import blake3
import pytest
import rfc8785

from nscas.verifiers.core.errors import RecordParseError
from nscas.verifiers.records.objects import digests, file_digests
from nscas.verifiers.records.reading import (
    KINDS,
    check_record,
    extract_links,
    is_object_id,
    object_id,
    parse_json,
    parse_record,
    schema_problems,
    sha256_hex,
)


def oid(n: int) -> str:
    return "blake3:" + blake3.blake3(str(n).encode()).hexdigest()


H = hashlib.sha256(b"x").hexdigest()

VALID: dict[str, dict[str, Any]] = {
    "tree/1": {"entries": {"config.json": {"id": oid(1), "size": 10, "sha256": H},
                           "sub/model.safetensors": {"id": oid(2), "size": 0, "sha256": H}}},
    "params/1": {"tensors": {"w": {"dtype": "F32", "shape": [2, 3], "data": oid(3)},
                             "s": {"dtype": "BF16", "shape": [], "data": oid(4)}}},
    "checkpoint/1": {"files": oid(5), "params": oid(6), "step": 64, "parent": None},
    "tasks/1": {"role": "dev", "records": oid(7), "count": 2, "ids": [H, "b" * 64]},
    "action/1": {"recipe": "train@1", "code": oid(8), "inputs": {"base": oid(9)},
                 "params": {"steps": 128, "lr": 3e-5}},
    "environment/1": {"python": "3.11.7", "platform": "Linux-x86_64",
                      "packages": {"torch": "2.13.0"}, "devices": []},
    "journal/1": {"rank": 0, "world": 2, "entries": oid(10), "head": H},
    "commitment/1": {"subjects": {"clean-single": oid(11)}, "purpose": "candidates",
                     "previous": None},
    "receipt/1": {"action": oid(12), "environment": oid(13), "outputs": {"checkpoint": oid(14)},
                  "journals": [oid(15)], "claims": {"steps": {"value": 128,
                                                              "verifier": "journal"}},
                  "started": "2026-09-13T10:00:00Z", "finished": "2026-09-13T11:00:00Z",
                  "status": "succeeded"},
    "signature/1": {"receipt": oid(16), "public_key": "-----BEGIN PUBLIC KEY-----\n",
                    "envelope": {"payloadType": "application/vnd.in-toto+json",
                                 "payload": "e30=", "signatures": [{"keyid": H, "sig": "AA=="}]}},
}


def record(kind: str, **changes: Any) -> dict[str, Any]:
    """The valid example of ``kind`` with ``changes`` applied; a change to ``...`` removes."""
    value = {"nscas": kind, **VALID[kind], **changes}
    return {k: v for k, v in value.items() if v is not ...}


def statuses(checks) -> dict[str, str]:
    return {c.name.split(".", 1)[1]: c.status for c in checks}


def test_every_kind_has_a_valid_example() -> None:
    assert set(VALID) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_records_pass(kind: str) -> None:
    data = rfc8785.dumps(record(kind))
    checks = check_record(data, expected_id=object_id(data), expected_kind=kind)
    assert all(c.status == "passed" for c in checks), [c for c in checks if c.status != "passed"]
    parsed = parse_record(data)
    assert parsed.kind == kind and parsed.size == len(data)
    assert parsed.sha256 == hashlib.sha256(data).hexdigest() == sha256_hex(data)
    assert parsed.id == "blake3:" + blake3.blake3(data).hexdigest()


def test_non_canonical_bytes_are_reported() -> None:
    value = record("checkpoint/1")
    data = json.dumps(value).encode()  # spaces and insertion order: not RFC 8785
    assert statuses(check_record(data)) == {"size": "passed", "json": "passed",
                                            "canonical": "failed", "kind": "passed",
                                            "schema": "passed"}
    with pytest.raises(RecordParseError, match="canonical"):
        parse_record(data)


def test_duplicate_keys_and_nan_are_reported() -> None:
    dup = b'{"nscas":"checkpoint/1","step":1,"step":2}'
    result = statuses(check_record(dup))
    assert result["json"] == "failed"
    assert result["canonical"] == result["kind"] == result["schema"] == "failed"
    for bad in (b'{"nscas":"x/1","v":NaN}', b'{"nscas":"x/1","v":-Infinity}', b"\xff{}"):
        assert statuses(check_record(bad))["json"] == "failed"
        with pytest.raises(RecordParseError):
            parse_record(bad)


def test_wrong_kind_is_reported() -> None:
    other = rfc8785.dumps(dict(record("checkpoint/1"), nscas="checkpoint/2"))
    result = statuses(check_record(other))
    assert (result["kind"], result["schema"]) == ("failed", "failed")
    data = rfc8785.dumps(record("checkpoint/1"))
    checks = check_record(data, expected_kind="receipt/1")
    assert statuses(checks)["kind"] == "failed"
    assert not any(c.status == "failed" for c in checks if c.name != "record.kind")
    assert statuses(check_record(rfc8785.dumps([1])))["kind"] == "failed"


def test_wrong_id_is_reported() -> None:
    data = rfc8785.dumps(record("checkpoint/1"))
    checks = check_record(data, expected_id=oid(99), name="obj")
    assert checks[0].name == "obj.id" and checks[0].status == "failed"
    assert checks[0].recomputed == object_id(data)


def test_schema_reports_every_problem() -> None:
    bad = record("receipt/1", claims={"a": {"value": 1}, "b": {"value": 2, "verifier": "x",
                                                                "note": "?"}},
                 status="done", environment="blake3:ABC", journals=...)
    problems = schema_problems(bad)
    assert problems == [
        "/environment: expected an object ID, found \"blake3:ABC\"",
        "/journals: required member is missing",
        "/claims/a/verifier: required member is missing",
        "/claims/b: unexpected member(s) ['note']; allowed exactly ['value', 'verifier']",
        "/status: expected one of ['succeeded', 'failed'], found \"done\"",
    ]
    checks = check_record(rfc8785.dumps(bad))
    assert statuses(checks)["schema"] == "failed"


@pytest.mark.parametrize("kind,changes,fragment", [
    ("params/1", {"extra": 1}, "unexpected member(s) ['extra']"),
    ("params/1", {"tensors": {"w": {"dtype": "F32", "shape": [2], "data": oid(1), "x": 0}}},
     "/tensors/w: unexpected"),
    ("params/1", {"tensors": {"w": {"dtype": "float32", "shape": [2], "data": oid(1)}}},
     "/tensors/w/dtype"),
    ("params/1", {"tensors": {"w": {"dtype": "F32", "shape": [-1], "data": oid(1)}}},
     "/tensors/w/shape/0"),
    ("tree/1", {"entries": {"../x": {"id": oid(1), "size": 1, "sha256": H}}}, "/entries/..~1x"),
    ("tree/1", {"entries": {"a": {"id": oid(1), "size": -1, "sha256": H}}}, "/entries/a/size"),
    ("checkpoint/1", {"step": 1.5}, "/step"),
    ("checkpoint/1", {"parent": "none"}, "/parent"),
    ("tasks/1", {"count": 3}, "holds 2 ids but count is 3"),
    ("tasks/1", {"ids": [H, H], "count": 2}, "task ids repeat"),
    ("action/1", {"recipe": "train"}, "/recipe"),
    ("action/1", {"inputs": {"base": "experiments/coop/seed"}}, "/inputs/base"),
    ("journal/1", {"rank": 2, "world": 2}, "rank 2 is not below world 2"),
    ("journal/1", {"head": "abc"}, "/head"),
    ("commitment/1", {"purpose": ""}, "/purpose"),
    ("environment/1", {"python": ...}, "/python: required"),
    ("receipt/1", {"claims": {"a": {"value": 1, "verifier": ""}}}, "/claims/a/verifier"),
])
def test_schema_violations(kind: str, changes: dict, fragment: str) -> None:
    problems = schema_problems(record(kind, **changes))
    assert any(fragment in p for p in problems), problems


def test_links_with_json_pointers() -> None:
    value = {"nscas": "receipt/1", "a/b": {"x~y": [oid(1), "blake3:" + "A" * 64, oid(2)]},
             oid(3): "key is a name, not a link", "n": 5, "s": oid(1)}
    links = extract_links(value)
    assert [(link.path, link.target) for link in links] == [
        ("/a~1b/x~0y/0", oid(1)), ("/a~1b/x~0y/2", oid(2)), ("/s", oid(1))]


def test_parse_json_rejects_overflow_and_trailing_text() -> None:
    with pytest.raises(RecordParseError):
        parse_json("[1e400]")
    with pytest.raises(RecordParseError):
        parse_json('{"a":1} x')
    assert parse_json(' {"a": [1, 2.5, null, true]} \n') == {"a": [1, 2.5, None, True]}


def test_file_digests_stream_a_file(tmp_path) -> None:
    data = bytes(range(256)) * 9000  # > 2 read chunks
    path = tmp_path / "blob"
    path.write_bytes(data)
    found = file_digests(path)
    assert found == digests(data)
    assert (found.id, found.sha256, found.size) == (
        "blake3:" + blake3.blake3(data).hexdigest(), hashlib.sha256(data).hexdigest(), len(data))
    assert is_object_id(found.id) and not is_object_id(found.id.upper())
    assert not is_object_id("blake3:" + "0" * 63) and not is_object_id(None)


def test_size_limit() -> None:
    big = rfc8785.dumps(record("environment/1", padding="x" * (16 * 1024 * 1024)))
    assert statuses(check_record(big))["size"] == "failed"


def test_large_integral_numbers_are_the_doubles_they_denote() -> None:
    """A canonical writer prints the double 1e20 as 21 digits; reading them back must give a
    value whose canonical form is those same bytes."""
    import rfc8785

    from nscas.verifiers.records.reading import parse_json

    data = rfc8785.dumps({"big": 1e20, "small": 3})
    value = parse_json(data, jcs=True)
    assert rfc8785.dumps(value) == data
    assert value["small"] == 3 and isinstance(value["small"], int)
