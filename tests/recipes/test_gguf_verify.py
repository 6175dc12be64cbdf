"""``nscas verify`` on a ``convert-gguf`` receipt: what its record and receipt say (the GGUF
link, the dtype param, the file's SHA-256 and counts, the end-of-turn token) is rechecked, and
each tampering, re-put consistently through the store API, fails the check that catches it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nscas import Store, init_store
from nscas.objects.digests import Digest
from nscas.verifiers.core.results import Report
from nscas.verifiers.training.gguf import GgufError, read_header
from nscas.verifiers.verify import exit_code, verify
from tests.recipes.test_gguf_fixtures import parameters, write_gguf
from tests.recipes.test_gguf_import import nscas


@dataclass(frozen=True, slots=True, kw_only=True)
class Converted:
    store: Store
    store_dir: Path
    receipt: str
    other_gguf: str
    """Another tiny GGUF file, stored: what a tamperer would swap in."""

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))

    def reput(self, receipt: str, **changes: Any) -> str:
        return str(self.store.put_record({**self.record(receipt), **changes}))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Converted]:
    root = tmp_path_factory.mktemp("gguf-verify")
    store = init_store(root / "project")
    ran = nscas(store.root, "import-gguf", str(write_gguf(root / "a.gguf")), "--json")
    assert ran.code == 0, ran.stderr
    other = store.put_file(write_gguf(root / "b.gguf", seed=1))
    yield Converted(store=store, store_dir=store.root, receipt=ran.json()["receipt"],
                    other_gguf=str(other))
    store.close()


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def label(receipt: str) -> str:
    return f"convert-gguf.{receipt[7:15]}"


def test_the_honest_receipt_passes_strict(converted: Converted) -> None:
    report = verify(converted.receipt, store=converted.store_dir, strict=True)
    assert exit_code(report) == 0, failed(report)
    skipped = {c.name for c in report.checks if c.status == "skipped"}
    assert skipped == {f"{label(converted.receipt)}.gguf.weights"}


def _with_claim(c: Converted, claim: str, value: Any) -> str:
    claims = dict(c.record(c.receipt)["claims"])
    claims[claim] = {**claims[claim], "value": value}
    return c.reput(c.receipt, claims=claims)


@pytest.mark.parametrize(("claim", "value"), [
    ("gguf_sha256", "0" * 64),
    ("gguf_parameters", parameters() + 1),
    ("gguf_tensors", 19),
    ("end_of_turn", {"token": "<|im_start|>", "id": 261}),
    ("parameters", parameters() - 64),
])
def test_an_edited_claim_fails(converted: Converted, claim: str, value: Any) -> None:
    tampered = _with_claim(converted, claim, value)
    report = verify(tampered, store=converted.store_dir)
    assert exit_code(report) == 1
    assert f"{label(tampered)}.claims.{claim}" in failed(report)


def _with_checkpoint(c: Converted, **changes: Any) -> str:
    receipt = c.record(c.receipt)
    checkpoint = {**c.record(receipt["outputs"]["checkpoint"]), **changes}
    new = str(c.store.put_record(checkpoint))
    return c.reput(c.receipt, outputs={**receipt["outputs"], "checkpoint": new})


def test_a_checkpoint_linking_another_gguf_file_fails(converted: Converted) -> None:
    tampered = _with_checkpoint(converted, gguf=converted.other_gguf)
    report = verify(tampered, store=converted.store_dir)
    assert f"{label(tampered)}.checkpoint" in failed(report)


def test_a_gguf_link_to_a_record_fails_the_typed_link(converted: Converted) -> None:
    checkpoint = converted.record(converted.record(converted.receipt)["outputs"]["checkpoint"])
    tampered = _with_checkpoint(converted, gguf=checkpoint["params"])
    bad = failed(verify(tampered, store=converted.store_dir))
    assert {"integrity.kinds", f"{label(tampered)}.checkpoint"} <= bad, bad


@pytest.mark.parametrize("changes", [{"source": "import-hf"}, {"step": 3}])
def test_a_checkpoint_that_is_no_plain_conversion_fails(converted: Converted,
                                                        changes: dict[str, Any]) -> None:
    tampered = _with_checkpoint(converted, **changes)
    assert f"{label(tampered)}.checkpoint" in failed(verify(tampered, store=converted.store_dir))


def test_a_consistent_swap_of_the_input_file_fails_on_its_sha256(converted: Converted) -> None:
    # The tamperer says the weights came from the other file: the action's input and the
    # checkpoint's link agree, but the SHA-256 claim is the real file's.
    receipt = converted.record(converted.receipt)
    action = converted.record(receipt["action"])
    new_action = converted.store.put_record(
        {**action, "inputs": {"gguf": converted.other_gguf}})
    checkpoint = {**converted.record(receipt["outputs"]["checkpoint"]),
                  "gguf": converted.other_gguf}
    new_checkpoint = str(converted.store.put_record(checkpoint))
    tampered = converted.reput(converted.receipt, action=str(new_action),
                               outputs={"checkpoint": new_checkpoint})
    bad = failed(verify(tampered, store=converted.store_dir))
    assert f"{label(tampered)}.claims.gguf_sha256" in bad
    assert f"{label(tampered)}.checkpoint" not in bad


@pytest.mark.parametrize("params", [{"dtype": "bfloat16"}, {"dtype": "float32", "extra": 1}])
def test_impossible_params_fail(converted: Converted, params: dict[str, Any]) -> None:
    receipt = converted.record(converted.receipt)
    action = converted.record(receipt["action"])
    new_action = converted.store.put_record({**action, "params": params})
    tampered = converted.reput(converted.receipt, action=str(new_action))
    assert f"{label(tampered)}.params" in failed(verify(tampered, store=converted.store_dir))


def test_the_header_reader_refuses_what_is_not_gguf(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    with path.open("rb") as f:
        tensors, elements = read_header(f, len(data)).counts()
    assert (tensors, elements) == (20, parameters())
    for bad in (b"GGUF", b"GGML" + data[4:], data[:4] + b"\x09\x00\x00\x00" + data[8:],
                data[:200]):
        cut = tmp_path / "bad.gguf"
        cut.write_bytes(bad)
        with cut.open("rb") as f, pytest.raises(GgufError):
            read_header(f, len(bad))
