"""Tampering makes ``verify`` fail, naming the check that caught it.

Most tamperers here re-put everything through the store API, so every object is well formed
and integrity holds: only recomputation and the ordering rules can catch them. The last ones
damage a copy of the store on disk (integrity, missing objects: exit 3).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nscas.objects.digests import Digest
from nscas.runs.runner import run_file
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import NoEvidence, exit_code, verify

from .conftest import Pipeline


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def short(oid: str) -> str:
    return oid[7:15]


def _tampered_answer(p: Pipeline) -> tuple[str, str, list[dict], str]:
    """eval-again with the first answer's text replaced by the right answer."""
    original = p.receipt("eval-again")
    receipt = p.record(original)
    gens = p.jsonl(receipt["outputs"]["generations"])
    tasks = p.jsonl(p.record(p.output("prepare", "test"))["records"])
    gens[0]["text"] = tasks[0]["target"]
    outputs = {**receipt["outputs"], "generations": p.put_jsonl(gens)}
    return original, p.reput(original, outputs=outputs), gens, tasks[0]["target"]


def test_an_edited_answer_text_fails_the_recomputed_claims(pipeline: Pipeline) -> None:
    _, tampered, _, _ = _tampered_answer(pipeline)
    report = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    assert exit_code(report) == 1
    bad = failed(report)
    assert {f"{label}.claims.correct", f"{label}.claims.valid_json_objects",
            f"{label}.claims.wins", f"{label}.answers.checks",
            f"{label}.answers.decoded"} <= bad
    check = next(c for c in report.checks if c.name == f"{label}.claims.correct")
    assert (check.claimed, check.recomputed) == (0, 1)
    assert not any(name.startswith("integrity.") for name in bad)


def test_a_fully_consistent_rewrite_is_caught_by_decoding(pipeline: Pipeline) -> None:
    original, tampered, _, _ = _tampered_answer(pipeline)
    # The careful tamperer also rewrites the checks blob and every claim to what a re-scoring
    # of the edited text gives; only the output ids still tell the truth.
    partial = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    receipt = pipeline.record(tampered)
    claims = dict(receipt["claims"])
    for check in partial.checks:
        if check.status == "failed" and check.name.startswith(f"{label}.claims."):
            claim = check.name.removeprefix(f"{label}.claims.")
            value = check.recomputed
            claims[claim] = {**claims[claim], "value": float(value)
                             if claim in ("accuracy_gain", "exact_one_sided_p") else value}
    checks_blob = pipeline.jsonl(receipt["outputs"]["checks"])
    checks_blob[0].update(correct=True, valid_json_object=True, reason="correct")
    outputs = {**receipt["outputs"], "checks": pipeline.put_jsonl(checks_blob)}
    rewritten = pipeline.reput(tampered, outputs=outputs, claims=claims)
    report = verify(rewritten, store=pipeline.store_dir)
    assert failed(report) == {f"evaluate.{short(rewritten)}.answers.decoded"}, failed(report)
    assert original != rewritten


def test_an_edited_claim_fails(pipeline: Pipeline) -> None:
    original = pipeline.receipt("eval-again")
    claims = pipeline.record(original)["claims"]
    claims["documents"] = {**claims["documents"], "value": 17}
    claims["retention_mean_loss"] = {**claims["retention_mean_loss"],
                                     "value": claims["retention_mean_loss"]["value"] * 0.99}
    tampered = pipeline.reput(original, claims=claims)
    report = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    assert failed(report) == {f"{label}.claims.documents", f"{label}.claims.retention_mean_loss"}
    assert exit_code(report) == 1


def _other_checkpoint(p: Pipeline) -> str:
    """An init with another seed: a different checkpoint of the same architecture."""
    recipe = p.root / "init-other.toml"
    recipe.write_text(f'recipe = "init"\n[inputs]\ntokenizer = "{p.output("tokenizer", "tokenizer")}"\n'
                      "[params]\nseed = 1\n")
    (result,) = run_file(p.store, recipe)
    return str(result.outputs["checkpoint"])


def test_a_swapped_checkpoint_fails(pipeline: Pipeline) -> None:
    other = _other_checkpoint(pipeline)
    seed = pipeline.output("init", "checkpoint")
    # The init receipt now says it made the other checkpoint, with the seed's digests.
    init = pipeline.reput(pipeline.receipt("init"), outputs={"checkpoint": other})
    report = verify(init, store=pipeline.store_dir)
    label = f"init.{short(init)}"
    assert {f"{label}.claims.parameter_digest", f"{label}.claims.sha256_stream"} <= failed(report)
    # A checkpoint record whose weights are another model's than its params say.
    record = pipeline.record(seed)
    forged = pipeline.reput(seed, files=pipeline.record(other)["files"], params=record["params"])
    # A checkpoint is verified through the receipt that produced it: none did.
    with pytest.raises(NoEvidence):
        verify(forged, store=pipeline.store_dir)
    init = pipeline.reput(pipeline.receipt("init"), outputs={"checkpoint": forged})
    report = verify(init, store=pipeline.store_dir)
    assert f"checkpoint.{short(forged)}.params" in failed(report)
    # An evaluation of the other model that cites the seed's commitment.
    receipt = pipeline.record(pipeline.receipt("eval-seed"))
    action = pipeline.record(receipt["action"])
    swapped = pipeline.reput(receipt["action"], inputs={**action["inputs"], "model": other})
    tampered = pipeline.reput(pipeline.receipt("eval-seed"), action=swapped)
    report = verify(tampered, store=pipeline.store_dir)
    assert f"evaluate.{short(tampered)}.ordering.commitment" in failed(report)


def test_a_commitment_made_after_the_evaluation_fails(pipeline: Pipeline) -> None:
    recipe = pipeline.root / "late-commit.toml"
    recipe.write_text('recipe = "commit"\n[inputs]\n'
                      f'prepared = "{pipeline.output("prepare", "prepared")}"\n'
                      f'seed = "{pipeline.output("init", "checkpoint")}"\n'
                      '[params]\nexperiment = "late"\n')
    (late,) = run_file(pipeline.store, recipe)
    receipt = pipeline.record(pipeline.receipt("eval-seed"))
    action = pipeline.record(receipt["action"])
    moved = pipeline.reput(receipt["action"], inputs={**action["inputs"],
                                                      "commitment": str(late.outputs["commitment"])})
    # Same times as the real run: it "started" before the late commitment existed.
    tampered = pipeline.reput(pipeline.receipt("eval-seed"), action=moved)
    report = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    assert failed(report) == {f"{label}.ordering.time"}
    check = next(c for c in report.checks if c.name == f"{label}.ordering.time")
    assert check.claimed == receipt["started"]


def test_a_commitment_that_holds_a_test_score_fails(pipeline: Pipeline) -> None:
    leaked = str(pipeline.store.put_record({
        "nscas": "commitment/1", "purpose": "candidates", "previous": None,
        "subjects": {"seed": pipeline.output("init", "checkpoint"),
                     "peek": pipeline.receipt("eval-seed")}}))
    receipt = pipeline.record(pipeline.receipt("eval-seed"))
    action = pipeline.record(receipt["action"])
    moved = pipeline.reput(receipt["action"], inputs={**action["inputs"], "commitment": leaked})
    tampered = pipeline.reput(pipeline.receipt("eval-seed"), action=moved)
    report = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    assert f"{label}.ordering.closure" in failed(report)
    check = next(c for c in report.checks if c.name == f"{label}.ordering.closure")
    assert check.recomputed == [pipeline.receipt("eval-seed")]


def test_a_flipped_byte_in_a_chunk_file_fails_integrity(pipeline: Pipeline,
                                                        tmp_path: Path) -> None:
    store_dir = pipeline.copy(tmp_path)
    receipt = pipeline.receipt("eval-again")
    generations = pipeline.record(receipt)["outputs"]["generations"][7:]
    chunk = store_dir / "data" / generations[:2] / generations[2:]
    assert chunk.is_file()
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    report = verify(receipt, store=store_dir)
    assert "integrity.hashes" in failed(report)
    assert exit_code(report) == 1
    label = f"evaluate.{short(receipt)}"
    # What needs the damaged object fails too: unreadable evidence is never a skip.
    statuses = {c.name: c.status for c in report.checks}
    assert statuses[f"{label}.answers"] == "failed"
    assert statuses[f"{label}.claims.correct"] == "failed"


def test_a_flipped_byte_in_a_weight_chunk_fails_integrity(pipeline: Pipeline,
                                                          tmp_path: Path) -> None:
    store_dir = pipeline.copy(tmp_path)
    seed = pipeline.output("init", "checkpoint")
    # The weights' chunks are byte planes (docs/format.md §5.5.1): flipping one stored byte
    # decodes to other bytes or fails to decode, and either is an integrity finding.
    files = pipeline.record(pipeline.record(seed)["files"])
    weights = files["entries"]["model.safetensors"]["id"]
    hex_id = next(leaf.hex for leaf, _, inline, size, _ in pipeline.store.leaves(Digest.parse(weights))
                  if inline is None and size > 100000)
    chunk = store_dir / "data" / hex_id[:2] / hex_id[2:]
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0x80
    chunk.write_bytes(bytes(data))
    report = verify(seed, store=store_dir)
    assert "integrity.hashes" in failed(report)
    assert f"blake3:{hex_id}" in next(c.message for c in report.checks
                                      if c.name == "integrity.hashes")


def test_a_missing_object_means_cannot_verify(pipeline: Pipeline, tmp_path: Path) -> None:
    store_dir = pipeline.copy(tmp_path)
    receipt = pipeline.receipt("eval-again")
    retention = pipeline.record(receipt)["outputs"]["retention"][7:]
    db = sqlite3.connect(store_dir / "nscas.db")
    with db:  # the gc session row lets the insert-only triggers allow one delete
        db.execute("INSERT INTO gc_session (token) VALUES (1)")
        db.execute("DELETE FROM objects WHERE id = ?", (retention,))
        db.execute("DELETE FROM gc_session")
    db.close()
    report = verify(receipt, store=store_dir)
    assert "integrity.missing" in failed(report)
    assert exit_code(report) == 3
    check = next(c for c in report.checks if c.name == "integrity.missing")
    assert f"blake3:{retention}" in check.message


def test_a_missing_chunk_file_means_cannot_verify(pipeline: Pipeline, tmp_path: Path) -> None:
    store_dir = pipeline.copy(tmp_path)
    receipt = pipeline.receipt("eval-again")
    generations = pipeline.record(receipt)["outputs"]["generations"][7:]
    (store_dir / "data" / generations[:2] / generations[2:]).unlink()
    report = verify(receipt, store=store_dir)
    assert exit_code(report) == 3
    assert "integrity.missing" in failed(report)


def test_every_finding_is_reported_not_the_first(pipeline: Pipeline) -> None:
    original = pipeline.receipt("eval-again")
    claims = pipeline.record(original)["claims"]
    for name in ("documents", "correct", "wins"):
        claims[name] = {**claims[name], "value": claims[name]["value"] + 3}
    tampered = pipeline.reput(original, claims=claims)
    label = f"evaluate.{short(tampered)}"
    assert failed(verify(tampered, store=pipeline.store_dir)) == {
        f"{label}.claims.documents", f"{label}.claims.correct", f"{label}.claims.wins"}
    assert Digest.parse(tampered) != Digest.parse(original)


def test_edited_tasks_fail_regeneration(pipeline: Pipeline) -> None:
    from nscas.verifiers.tasks.checker import task_identity

    test_set = pipeline.output("prepare", "test")
    record = pipeline.record(test_set)
    lines = pipeline.jsonl(record["records"])
    lines[0]["target"] = lines[0]["target"].replace("null", "0", 1) if "null" in lines[0][
        "target"] else lines[0]["target"][:-1] + ',"x":1}'
    # A careful edit of a case: the identity recomputed so the id still matches its content.
    lines[1]["task"]["rows"][0]["units"] += 1
    lines[1]["id"] = task_identity(lines[1]["task"], lines[1]["prompt"])
    ids = [line["id"] for line in lines]
    edited = pipeline.reput(test_set, records=pipeline.put_jsonl(lines), ids=ids)
    prepare = pipeline.record(pipeline.receipt("prepare"))
    tampered = pipeline.reput(pipeline.receipt("prepare"),
                              outputs={**prepare["outputs"], "test": edited})
    report = verify(tampered, store=pipeline.store_dir)
    label = f"tasks.test.{short(edited)}"
    assert {f"{label}.targets", f"{label}.regenerated",
            f"prepare.{short(tampered)}.task_sets"} <= failed(report)
    message = next(c.message for c in report.checks if c.name == f"{label}.regenerated")
    assert message.startswith("1 problem(s): line 2: case, id")


def test_a_malformed_wording_object_is_a_finding(pipeline: Pipeline) -> None:
    test_set = pipeline.output("prepare", "test")
    bad = str(pipeline.store.put_bytes(b'{"header": 1}'))
    edited = pipeline.reput(test_set, wordings=bad)
    with pytest.raises(NoEvidence):  # a task set no receipt produced has no evidence
        verify(edited, store=pipeline.store_dir)
    receipt = pipeline.record(pipeline.receipt("prepare"))
    prepare = pipeline.reput(pipeline.receipt("prepare"),
                             outputs={**receipt["outputs"], "test": edited})
    report = verify(prepare, store=pipeline.store_dir)
    assert f"tasks.test.{short(edited)}.regenerated" in failed(report)


def test_a_receipt_without_its_outputs_is_a_finding(pipeline: Pipeline) -> None:
    receipt = pipeline.record(pipeline.receipt("eval-again"))
    outputs = {k: v for k, v in receipt["outputs"].items() if k != "checks"}
    tampered = pipeline.reput(pipeline.receipt("eval-again"), outputs=outputs)
    report = verify(tampered, store=pipeline.store_dir)
    label = f"evaluate.{short(tampered)}"
    assert failed(report) == {f"{label}.answers"}
    message = next(c.message for c in report.checks if c.name == f"{label}.answers")
    assert "'checks'" in message
