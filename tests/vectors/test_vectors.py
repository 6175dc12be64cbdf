"""Spec vectors: golden inputs and results (tests/vectors/*.json), checked against the product
(nscas core and recipes) and the verifiers alike, so that a drift between the two sides, or of
either from docs/format.md, fails here by name rather than in an end-to-end verify.

The vectors were written once from the product and are pinned: a change of format changes
them by hand, in the commit that changes docs/format.md."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.errors import NscasError
from nscas.objects import canonical
from nscas.objects.digests import Digest, sha256_hex
from nscas.recipes.common.checker import check
from nscas.recipes.report import index as product_index
from nscas.recipes.report import templates as product_templates
from nscas.recipes.train.journal import Journal, loss_claims
from nscas.signing import signatures as product_signatures
from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.objects import digests, object_id
from nscas.verifiers.records.reading import check_record
from nscas.verifiers.records.sources import ObjectMeta
from nscas.verifiers.report import index as verifier_index
from nscas.verifiers.report import templates as verifier_templates
from nscas.verifiers.signatures import checks as verifier_signatures
from nscas.verifiers.tasks.checker import check_answer
from nscas.verifiers.training.journals import loss_values
from nscas.verifiers.training.schedule import check_journal, read_journal

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def vector(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


RECORDS = vector("records.json")
CHECKER = vector("checker.json")
JOURNAL = vector("journal.json")
LOSSES = vector("losses.json")
INDEX = vector("report-index.json")
SIGNATURE = vector("signatures.json")


# --- objects and records (docs/format.md §1, §2) -----------------------------------------

@pytest.mark.parametrize("blob", RECORDS["blobs"], ids=lambda b: b["id"][7:15])
def test_a_blob_has_its_id_and_sha256_on_both_sides(blob: dict[str, Any]) -> None:
    data = bytes.fromhex(blob["hex"])
    assert (str(Digest.of(data)), sha256_hex(data)) == (blob["id"], blob["sha256"])
    mine = digests(data)
    assert (mine.id, mine.sha256, object_id(data)) == (blob["id"], blob["sha256"], blob["id"])


@pytest.mark.parametrize("record", RECORDS["records"], ids=lambda r: r["id"][7:15])
def test_a_record_encodes_to_its_canonical_bytes_and_id_on_both_sides(
        record: dict[str, Any]) -> None:
    data = record["canonical"].encode("utf-8")
    assert canonical.encode(record["value"]) == data
    assert canonical.decode(data) == record["value"]
    assert str(Digest.of(data)) == record["id"]
    failed = [c for c in check_record(data, expected_id=record["id"]) if c.status != "passed"]
    assert failed == []


@pytest.mark.parametrize("bad", RECORDS["refused"], ids=lambda b: b["why"])
def test_bytes_that_are_no_canonical_record_are_refused_by_both_sides(bad: dict[str, Any]) -> None:
    data = bad["text"].encode("utf-8")
    with pytest.raises(NscasError):
        canonical.decode(data)
    assert any(c.status == "failed" for c in check_record(data))


# --- the strict answer checker (docs/experiment.md §1.8) ---------------------------------

@pytest.mark.parametrize("case", CHECKER["cases"], ids=lambda c: repr(c["answer"])[:30])
def test_the_strict_checker_gives_the_same_verdict_on_both_sides(case: dict[str, Any]) -> None:
    want = {k: case[k] for k in ("correct", "valid_json_object", "reason")}
    assert check(case["answer"], json.dumps(case["target"])).to_dict() == want
    assert check_answer(case["answer"], case["target"]).to_dict() == want


# --- journals and loss claims (docs/experiment.md §3.8, docs/format.md §3.10) ------------

def test_a_journal_is_written_and_read_as_the_vector_says(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl") as journal:
        for entry in JOURNAL["entries"]:
            journal.append(entry)
        head = journal.head
    data = (tmp_path / "j.jsonl").read_bytes()
    want = "".join(line + "\n" for line in JOURNAL["lines"]).encode("utf-8")
    assert (data, head) == (want, JOURNAL["head"])
    assert [c.status for c in check_journal(want, head=JOURNAL["head"])] == ["passed"] * 3
    read = read_journal(want)
    assert [{k: v for k, v in e.items() if k not in ("prev", "hash")} for e in read] == \
        JOURNAL["entries"]


def test_a_journal_line_changed_is_refused_by_the_verifiers() -> None:
    lines = list(JOURNAL["lines"])
    lines[1] = lines[1].replace('"checkpoint"', '"checkpoinT"')
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    assert "failed" in [c.status for c in check_journal(data, head=JOURNAL["head"])]


@pytest.mark.parametrize("case", LOSSES["cases"], ids=lambda c: str(len(c["losses"])))
def test_loss_claims_are_the_same_to_the_bit_on_both_sides(case: dict[str, Any]) -> None:
    want = {k: case[k] for k in ("first_loss", "last_loss", "mean_loss")}
    assert loss_claims(case["losses"]) == want
    steps = [{"step": i + 1, "loss": loss} for i, loss in enumerate(case["losses"])]
    values, why = loss_values(steps)
    assert why is None and {k: v.value for k, v in values.items()} == want


# --- the report's pages (docs/format.md §6.11) --------------------------------------------

@pytest.mark.parametrize("case", INDEX["cases"], ids=lambda c: c["name"])
def test_the_summary_page_is_the_same_bytes_on_both_sides(case: dict[str, Any]) -> None:
    for render in (product_index.render_index, verifier_index.render_index):
        page = render(json.loads(json.dumps(case["report"]))).encode("utf-8")
        assert (hashlib.sha256(page).hexdigest(), len(page)) == (case["sha256"], case["bytes"])


def test_every_template_is_pinned_alike_by_format_md_the_recipe_and_the_verifiers() -> None:
    table = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|",
                            (ROOT / "docs" / "format.md").read_text(encoding="utf-8"), re.M))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in (ROOT / "docs" / "spec").iterdir() if p.suffix != ".py" and p.is_file()}
    assert table == files
    assert files == product_templates.PINNED
    assert files == verifier_templates.SHA256


def test_a_template_that_is_not_the_pinned_one_is_refused_by_both_sides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nscas.verifiers.core.errors import VerifierError

    monkeypatch.setitem(product_templates.PINNED, "report-index.html.jinja", "0" * 64)
    monkeypatch.setitem(verifier_templates.SHA256, "report-index.html.jinja", "0" * 64)
    report = INDEX["cases"][0]["report"]
    with pytest.raises(NscasError, match="SHA-256"):
        product_index.render_index(report)
    with pytest.raises(VerifierError, match="SHA-256"):
        verifier_index.render_index(report)


# --- signatures (docs/format.md §3.11) ----------------------------------------------------

class _Memory:
    """A verifier ``Source`` over objects held in memory."""

    label = "memory"

    def __init__(self, objects: dict[str, tuple[bytes, str | None]]) -> None:
        self.objects = objects

    def meta(self, oid: str) -> ObjectMeta | None:
        if oid not in self.objects:
            return None
        data, kind = self.objects[oid]
        return ObjectMeta(id=oid, size=len(data), sha256=sha256_hex(data), kind=kind,
                          where=f"memory {oid[7:15]}")

    def omitted(self, oid: str) -> str | None:
        return None

    def chunks(self, oid: str) -> Iterator[bytes]:
        yield self.objects[oid][0]

    def file_path(self, oid: str) -> Path | None:
        return None

    def resolve(self, text: str) -> str:
        return text

    def parents(self, oid: str) -> list[str] | None:
        return None

    def created(self, oid: str) -> float | None:
        return None


def test_a_receipt_signature_is_made_by_the_product_and_verified_by_the_verifiers(
        tmp_path: Path) -> None:
    key_file = tmp_path / "test.key"
    key_file.write_text(SIGNATURE["private_key_pem"])
    key_file.chmod(0o600)
    key = product_signatures.load_key(key_file)
    receipt = SIGNATURE["receipt"].encode("utf-8")
    made = canonical.encode(product_signatures.signature_record(
        key, Digest.parse(SIGNATURE["receipt_id"]), receipt))
    assert (made.decode(), key.keyid) == (SIGNATURE["record"], SIGNATURE["keyid"])
    assert str(Digest.of(made)) == SIGNATURE["record_id"]
    source = _Memory({SIGNATURE["receipt_id"]: (receipt, "tree/1"),
                      SIGNATURE["record_id"]: (made, "signature/1")})
    good, problem = verifier_signatures._check_one(Objects(source), SIGNATURE["record_id"],
                                                   SIGNATURE["receipt_id"])
    assert (good, problem) == ([SIGNATURE["keyid"]], None)


def test_a_signature_over_other_bytes_is_refused_by_the_verifiers() -> None:
    record = json.loads(SIGNATURE["record"])
    other = canonical.encode({"nscas": "tree/1", "entries": {}, "x": 1})
    record["receipt"] = str(Digest.of(other))
    forged = canonical.encode(record)
    source = _Memory({record["receipt"]: (other, "tree/1"),
                      str(Digest.of(forged)): (forged, "signature/1")})
    good, problem = verifier_signatures._check_one(Objects(source), str(Digest.of(forged)),
                                                   record["receipt"])
    assert good == [] and problem is not None
