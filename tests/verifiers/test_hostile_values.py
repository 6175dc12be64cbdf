"""Hostile numbers and shapes are findings, never crashes; what an object is comes from its
bytes; paths a filesystem cannot hold are refused before they are opened."""

from __future__ import annotations

import pytest
import rfc8785

from nscas.verifiers.bundle.source import safe_relative
from nscas.verifiers.core.errors import RecordParseError
from nscas.verifiers.records.closure import BLOB, declared_kind, expected_kind
from nscas.verifiers.records.reading import parse_json


@pytest.mark.parametrize("text", [
    "1" + "0" * 400,                      # beyond any double
    "-" + "9" * 400,
    "9" * 5000,                           # beyond CPython's int() digit limit
    "[1e400]",
    '{"a":' * 900 + "1" + "}" * 900,      # nested 900 deep
    "[" * 900 + "]" * 900,
    "[" * 70 + "]" * 70,                  # past the verifiers' depth limit
])
@pytest.mark.parametrize("jcs", [True, False])
def test_hostile_json_is_a_parse_error(text: str, jcs: bool) -> None:
    with pytest.raises(RecordParseError):
        parse_json(text, jcs=jcs)


def test_plain_json_integers_stop_at_two_to_the_53() -> None:
    assert parse_json(str(2**53 - 1)) == 2**53 - 1
    with pytest.raises(RecordParseError, match="beyond"):
        parse_json(str(2**53))
    # RFC 8785 text: an integral double beyond 2**53 is how a canonical writer prints 1e20.
    assert parse_json("100000000000000000000", jcs=True) == 1e20


def test_honest_nesting_is_kept() -> None:
    value = {"a": [{"b": [[1, 2], {"c": None}]}]}
    assert parse_json(rfc8785.dumps(value), jcs=True) == value
    assert parse_json("[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize("data,kind", [
    (rfc8785.dumps({"nscas": "receipt/1", "x": 1}), "receipt/1"),
    (rfc8785.dumps({"nscas": "made-up/9"}), "made-up/9"),   # declared: then held to the rules
    (b'{"nscas": "receipt/1"}', "receipt/1"),                # not canonical, still declared
    (rfc8785.dumps({"format": "nscas-report/1"}), None),
    (rfc8785.dumps({"nscas": 1}), None),
    (b'{"nscas":"receipt/1"}\n{"nscas":"receipt/1"}\n', None),  # JSONL: a blob
    (b"\x08\x00\x00\x00\x00\x00\x00\x00{}", None),
    (b'{"nscas":"receipt/1",' + b'"a":[' * 100 + b"]" * 100 + b"}", None),
])
def test_declared_kind_reads_only_the_bytes(data: bytes, kind: str | None) -> None:
    assert declared_kind(data) == kind


@pytest.mark.parametrize("parent,pointer,kind", [
    ("receipt/1", "/action", "action/1"),
    ("receipt/1", "/environment", "environment/1"),
    ("receipt/1", "/journals/0", "journal/1"),
    ("receipt/1", "/journals/rank-1", "journal/1"),
    ("receipt/1", "/outputs/report", None),
    ("action/1", "/code", "tree/1"),
    ("action/1", "/inputs/baseline", None),
    ("checkpoint/1", "/files", "tree/1"),
    ("checkpoint/1", "/params", "params/1"),
    ("checkpoint/1", "/parent", "checkpoint/1"),
    ("params/1", "/tensors/lm_head.weight/data", BLOB),
    ("tasks/1", "/records", BLOB),
    ("journal/1", "/entries", BLOB),
    ("commitment/1", "/subjects/seed", None),
    ("commitment/1", "/previous", "commitment/1"),
    ("tree/1", "/entries/config.json/id", None),
])
def test_members_say_what_they_link(parent: str, pointer: str, kind: str | None) -> None:
    assert expected_kind(parent, pointer) == kind


@pytest.mark.parametrize("path", ["a/" + "x" * 256, "x" * 256, "a/" * 600 + "b",
                                  "é" * 128 + "/f"])
def test_paths_a_filesystem_cannot_hold_are_unsafe(path: str) -> None:
    assert safe_relative(path) is not None


def test_ordinary_paths_are_safe() -> None:
    assert safe_relative("models/clean-pair/model.safetensors") is None
    assert safe_relative("x" * 255) is None
