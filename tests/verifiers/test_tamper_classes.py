"""The tamper suite of issue 14, class by class: each forgery is rewritten consistently
(``rewrite.Rewrite``: every hash, record, manifest entry, the tarball and SHA256SUMS), so the
bundle's integrity holds and only recomputation, the cross-checks and the parse-level guards
can catch it. Expectations come from the forgery itself, never from the verifier's code.

Classes (issue 14): 1 labels versus bytes, 2 skip policy, 3 the test set by lineage, 4 exact
numbers, 5 what a report's reader sees, 6 serving, 7 environment, 8 ``--expect``, 9 hostile
input. Most cases verify in-process (fast); the exit codes, output formats and hostile inputs
run the real command (``nscas verify``) as a subprocess and forbid a traceback.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import Demo, Verdict, honest, nscas_verify, verify_here
from .rewrite import Rewrite, null_kind_in_store, object_id, rechain, sums_digest

HUGE = "1" + "0" * 399
"""A 400-digit integer."""
DEEP = "[" * 900 + "]" * 900
"""A JSON value nested 900 deep."""
LONG = "x" * 300
"""A path segment longer than any file system allows (255 bytes)."""


def short(oid: str) -> str:
    return oid[7:15]


def label(recipe: str, oid: str) -> str:
    """A receipt's check prefix, ``<recipe>.<8 hex digits>``."""
    return f"{recipe}.{short(oid)}"


def rewrite(demo: Demo, tmp_path: Path, *, light: bool = False,
            part: str | None = None) -> Rewrite:
    """A rewriter on a copy of the report's bundle (``light``: without weights) or of the
    bundle of one step's receipt (``part``); the original must verify first."""
    source = demo.parts[part] if part else demo.light if light else demo.bundle
    honest(source)
    return Rewrite(source, tmp_path / "forged")


def receipt_id(r: Rewrite, path: str) -> str:
    return r.objects[path]["id"] if path in r.objects else r.target


def integrity_holds(v: Verdict) -> None:
    """The forgery is consistent: no integrity or bundle-file check failed."""
    bad = sorted(n for n in v.failed() if n.startswith(("integrity.", "bundle.")))
    assert not bad, bad


def caught(v: Verdict, *prefixes: str, code: int = 1) -> set[str]:
    """Verification failed with ``code``, a failed check under each prefix."""
    failed = v.failed()
    assert v.code == code, (v.code, sorted(failed))
    for prefix in prefixes:
        assert any(n.startswith(prefix) for n in failed), (prefix, sorted(failed))
    return failed


def only_legal_skips(v: Verdict) -> None:
    assert v.report is not None
    for c in v.report["checks"]:
        if c["status"] == "skipped":
            assert c["needs"] in ("weights", "model"), c


def path_of_receipt(r: Rewrite, recipe: str, *, arm: str | None = None) -> str:
    """The receipt file of ``recipe`` (for evaluate: of the arm's evaluation)."""
    if arm is not None:
        return r.find("receipts/baseline.json") if arm == "seed" else r.find(
            f"receipts/{recipe}.{arm}.json")
    found = [p for p in r.records("receipt/1")
             if r.json(r.path_of(r.json(p)["action"]))["recipe"].startswith(f"{recipe}@")]
    return found[0]


def set_claim(name: str, value: Any) -> Any:
    def edit(record: dict[str, Any]) -> None:
        record["claims"][name]["value"] = value(record["claims"][name]["value"]) if callable(
            value) else value
    return edit


def raw_replace(r: Rewrite, path: str, pattern: str, replacement: str, *,
                count: int = 1) -> str:
    """Replace a regular expression in the file's text without re-serialising anything (for
    bytes no serialiser writes); everything above is relinked."""
    text = r.bytes(path).decode()
    new, n = re.subn(pattern, replacement, text, count=count)
    assert n == count, (path, pattern)
    return r.replace(path, new.encode(), opaque=True)


@pytest.mark.parametrize("step", ["serve", "train-single", "evaluate-seed", "evaluate-single"])
def test_an_honest_export_of_any_receipt_verifies(demo: Demo, step: str) -> None:
    """docs/format.md §8.2: every export verifies offline, not only the report's."""
    v = verify_here(demo.parts[step])
    assert v.code == 0, sorted(v.failed())


# ================================================================== 1. labels versus bytes

def test_a_receipt_labelled_a_blob_in_the_manifest_is_verified_by_its_bytes(
        demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, "evaluate", arm="seed")
    r.edit_record(path, set_claim("correct", lambda v: v + 1))
    forged = r.objects[path]["id"]
    r.relabel(path, None)
    v = verify_here(r.seal())
    failed = caught(v, f"{label('evaluate', forged)}.claims.correct")
    assert len(failed) >= 2, failed  # the claim, and the label that disagrees with the bytes


def test_an_honest_receipt_labelled_a_blob_is_checked_and_the_label_is_a_finding(
        demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, "serve")
    oid = r.objects[path]["id"]
    r.relabel(path, None)
    v = verify_here(r.seal())
    assert v.code == 1
    statuses = v.statuses()
    claims = [n for n in statuses if n.startswith(f"{label('serve', oid)}.claims.")]
    assert len(claims) >= 10 and all(statuses[n] == "passed" for n in claims), claims
    assert v.failed(), "a label that disagrees with the bytes is a finding"


def test_the_target_labelled_a_blob_is_still_verified_as_a_receipt(
        demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    path = r.path_of(r.target)
    r.relabel(path, None)
    v = verify_here(r.seal())
    assert v.code == 1
    assert v.report is not None and v.report["target"] == demo.report
    assert f"{label('report', demo.report)}.claims.correct.seed" in v.statuses()


@pytest.mark.parametrize("kind", ["tasks/1", "tree/1"])
def test_a_receipt_labelled_another_kind_is_a_finding(demo: Demo, tmp_path: Path,
                                                     kind: str) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, "evaluate", arm="clean-single")
    oid = r.objects[path]["id"]
    r.relabel(path, kind)
    v = verify_here(r.seal())
    assert v.code == 1
    assert f"{label('evaluate', oid)}.claims.correct" in v.statuses()


def test_a_blob_labelled_a_receipt_is_a_finding(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    r.relabel(r.find("report/report.json"), "receipt/1")
    v = verify_here(r.seal())
    assert v.code == 1 and v.failed()


def test_a_null_kind_in_the_store_does_not_hide_a_receipt(demo: Demo, tmp_path: Path) -> None:
    store = demo.copy_store(tmp_path)
    seed = demo.receipt("evaluate-seed")
    null_kind_in_store(store, seed)
    v = verify_here(demo.report, store=store)
    assert v.code == 1, sorted(v.failed())
    assert v.statuses().get(f"{label('evaluate', seed)}.claims.correct") == "passed"
    # The target itself with a NULL kind: still verified as the receipt its bytes are.
    null_kind_in_store(store, demo.report)
    v = verify_here(demo.report, store=store)
    assert v.code == 1
    assert v.statuses().get(f"{label('report', demo.report)}.claims.correct.seed") == "passed"


def test_an_output_ref_verifies_the_receipt_that_produced_it(demo: Demo) -> None:
    v = nscas_verify("experiments/coop/report", store=demo.store_dir)
    assert v.code == 0, sorted(v.failed())
    assert v.report is not None
    assert v.report["target"] == demo.report
    # ``named``: what TARGET named (the ref, or the output it resolves to), not the receipt.
    assert v.report["named"] in ("experiments/coop/report",
                                 demo.output("report", "report")), v.report["named"]
    receipt_checks = [n for n in v.statuses() if n.startswith(label("report", demo.report))]
    assert len(receipt_checks) >= 20
    text = nscas_verify("experiments/coop/report", store=demo.store_dir, as_json=False)
    assert text.code == 0
    first = text.stdout.splitlines()[0]
    assert first.startswith(f"target {demo.report}"), first


def test_an_output_id_verifies_the_receipt_that_produced_it(demo: Demo) -> None:
    output = demo.output("evaluate-seed", "generations")
    v = verify_here(output, store=demo.store_dir)
    assert v.code == 0, sorted(v.failed())
    assert v.report is not None and v.report["target"] == demo.receipt("evaluate-seed")


@pytest.mark.parametrize("what", ["action", "environment"])
def test_an_object_no_receipt_produced_cannot_be_verified(demo: Demo, what: str) -> None:
    oid = demo.record(demo.receipt("evaluate-seed"))[what]
    v = nscas_verify(oid, store=demo.store_dir)
    assert v.code == 3, (v.code, v.stdout[-500:], v.stderr)


# ================================================================== 2. skip policy

@pytest.mark.parametrize(("pattern", "recipe"), [
    ("^evaluations/seed/generations.jsonl", "evaluate"),
    ("^evaluations/.*/retention.jsonl", "evaluate"),
    ("^evaluations/.*/checks.jsonl", "evaluate"),
    ("^serving/requests.jsonl", "serve"),
    ("^training/clean-pair/rank-1.journal.jsonl", "train"),
])
def test_a_non_json_line_in_evidence_fails(demo: Demo, tmp_path: Path, pattern: str,
                                          recipe: str) -> None:
    r = rewrite(demo, tmp_path)
    path = r.paths(pattern)[0]
    r.edit_text(path, lambda text: text.replace("\n", "\nnot json at all\n", 1))
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v)
    assert any(n.startswith(f"{recipe}.") for n in v.failed()), sorted(v.failed())
    only_legal_skips(v)


@pytest.mark.parametrize(("suffix", "reason"), [
    ("/seed/retention.jsonl", "weights"),
    ("serving/requests.jsonl", "weights"),
    ("report/report.json", "weights"),
    ("tasks/test.jsonl", "privacy"),
])
def test_omitted_is_only_for_weights(demo: Demo, tmp_path: Path, suffix: str,
                                     reason: str) -> None:
    r = rewrite(demo, tmp_path, light=True)
    oid = r.omit(r.find(suffix), reason)
    v = verify_here(r.seal())
    assert v.code in (1, 3) and v.report is not None and not v.report["ok"]
    assert any(oid in (c["message"] or "") or oid in json.dumps(c["claimed"])
               for c in v.report["checks"] if c["status"] == "failed"), sorted(v.failed())


@pytest.mark.parametrize(("recipe", "claim"), [
    ("evaluate", "correct"), ("serve", "throughput_ratio"), ("report", "correct.seed")])
def test_a_claim_naming_an_unknown_verifier_fails(demo: Demo, tmp_path: Path, recipe: str,
                                                 claim: str) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, recipe, arm="seed" if recipe == "evaluate" else None)

    def edit(record: dict[str, Any]) -> None:
        record["claims"][claim]["verifier"] = "nobody-knows-me"

    r.edit_record(path, edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{recipe}.{short(receipt_id(r, path))}")
    only_legal_skips(v)


@pytest.mark.parametrize(("recipe", "verifier"), [
    ("evaluate", "answers"), ("serve", "throughput"), ("report", "report"),
    ("train", "journals")])
def test_a_claim_no_check_recomputes_fails(demo: Demo, tmp_path: Path, recipe: str,
                                          verifier: str) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, recipe, arm="seed" if recipe == "evaluate" else None)

    def edit(record: dict[str, Any]) -> None:
        known = {c["verifier"] for c in record["claims"].values()}
        record["claims"]["unheard_of"] = {"value": 1, "verifier": sorted(known)[0]
                                          if verifier not in known else verifier}

    r.edit_record(path, edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{recipe}.{short(receipt_id(r, path))}")


def test_the_honest_bundle_passes_strict(demo: Demo) -> None:
    v = nscas_verify(demo.bundle, "--strict")
    assert v.code == 0, sorted(v.failed())
    assert v.report is not None and v.report["ok"] is True and v.report["strict"] is True
    assert v.report["not_rechecked"]["weights"] == []
    assert v.report["not_rechecked"]["model"], "retention losses need a model run"
    only_legal_skips(v)


def test_a_bundle_without_weights_passes_but_not_strict(demo: Demo) -> None:
    plain = nscas_verify(demo.light)
    assert plain.code == 0, sorted(plain.failed())
    assert plain.report is not None and plain.report["not_rechecked"]["weights"]
    only_legal_skips(plain)
    strict = nscas_verify(demo.light, "--strict")
    assert strict.code == 1
    assert strict.report is not None and strict.report["ok"] is False
    # What fails it is exactly what needs the omitted weights.
    skipped = {c["name"] for c in strict.report["checks"]
               if c["status"] == "skipped" and c["needs"] == "weights"}
    assert skipped == set(strict.report["not_rechecked"]["weights"])


def test_the_honest_store_passes_strict(demo: Demo) -> None:
    v = verify_here(demo.report, store=demo.store_dir, strict=True)
    assert v.code == 0, sorted(v.failed())
    only_legal_skips(v)


# ================================================================== 3. the test set by lineage

def _test_set(r: Rewrite) -> str:
    return r.path_of(r.json(path_of_receipt(r, "prepare"))["outputs"]["test"])


def _uncommitted(r: Rewrite, arm: str, tasks: str | None = None) -> str:
    """The arm's evaluation without its commitment (and on ``tasks`` if given); its receipt
    path."""
    path = path_of_receipt(r, "evaluate", arm=arm)

    def edit(action: dict[str, Any]) -> None:
        action["inputs"].pop("commitment")
        if tasks is not None:
            action["inputs"]["tasks"] = tasks

    r.edit_record(r.path_of(r.json(path)["action"]), edit)
    return path


@pytest.mark.parametrize("role", ["dev", "holdout", "Test", "test "])
def test_a_relabelled_test_set_still_needs_the_commitment(demo: Demo, tmp_path: Path,
                                                          role: str) -> None:
    r = rewrite(demo, tmp_path)
    copy = {**r.json(_test_set(r)), "role": role}
    path = _uncommitted(r, "clean-single", r.add_record(copy))
    v = verify_here(r.seal())
    integrity_holds(v)
    failed = caught(v)
    evaluation = label("evaluate", receipt_id(r, path))
    assert any(n.startswith(f"{evaluation}.ordering") for n in failed), sorted(failed)


def test_the_prepared_test_set_relabelled_in_place_still_needs_the_commitment(
        demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    r.edit_record(_test_set(r), lambda t: t.update(role="dev"))
    path = _uncommitted(r, "seed")
    v = verify_here(r.seal())
    integrity_holds(v)
    failed = caught(v)
    evaluation = label("evaluate", receipt_id(r, path))
    assert any(n.startswith(f"{evaluation}.ordering") for n in failed), sorted(failed)


def test_a_subset_sharing_test_ids_is_test_set_scoring(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    test = r.json(_test_set(r))
    records = r.bytes(r.path_of(test["records"])).decode().splitlines(keepends=True)[:8]
    blob = "".join(records).encode()
    r.add(f"blobs/{object_id(blob)[7:]}", blob, kind=None)
    subset = {**test, "role": "dev", "count": 8, "ids": test["ids"][:8],
              "records": object_id(blob)}
    path = _uncommitted(r, "clean-pair", r.add_record(subset))
    v = verify_here(r.seal())
    integrity_holds(v)
    failed = caught(v)
    evaluation = label("evaluate", receipt_id(r, path))
    assert any(n.startswith(f"{evaluation}.ordering") for n in failed), sorted(failed)


# ================================================================== 4. exact numbers

@pytest.mark.parametrize(("recipe", "claim", "change"), [
    ("evaluate", "correct", lambda v: v + 1e-12),
    ("evaluate", "documents", lambda v: v + 1e-12),
    ("evaluate", "wins", lambda v: v + 1e-12),
    ("serve", "failure_retries", lambda v: v + 1e-12),
    ("serve", "cache_hits", lambda v: v + 1e-12),
    ("train", "updates", lambda v: v + 1e-12),
    ("report", "correct.seed", lambda v: v + 1e-12),
    ("report", "documents", lambda v: v - 1e-12),
])
def test_a_count_off_by_a_fraction_fails(demo: Demo, tmp_path: Path, recipe: str,
                                         claim: str, change: Any) -> None:
    r = rewrite(demo, tmp_path)
    arm = "clean-single" if recipe == "evaluate" else None
    path = path_of_receipt(r, recipe, arm=arm)
    r.edit_record(path, set_claim(claim, change))
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label(recipe, receipt_id(r, path))}.claims.{claim}")


@pytest.mark.parametrize(("recipe", "claim", "value"), [
    ("evaluate", "exact_one_sided_p", lambda v: 1e-12),
    ("evaluate", "exact_one_sided_p", lambda v: math.nextafter(v, 0.0)),
    ("report", "p.clean-single", lambda v: 1e-12),
    ("report", "p.clean-pair", lambda v: math.nextafter(v, 0.0)),
])
def test_a_p_value_must_be_the_rounded_exact_value(demo: Demo, tmp_path: Path, recipe: str,
                                                   claim: str, value: Any) -> None:
    r = rewrite(demo, tmp_path)
    arm = "clean-single" if recipe == "evaluate" else None
    path = path_of_receipt(r, recipe, arm=arm)
    r.edit_record(path, set_claim(claim, value))
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label(recipe, receipt_id(r, path))}.claims.{claim}")


def test_a_journal_count_off_by_a_fraction_fails(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)

    def edit(lines: list[dict[str, Any]]) -> None:
        step = next(x for x in lines if "tokens" in x)
        step["tokens"] += 1e-12

    r.edit_lines(r.find("training/clean-single/rank-0.journal.jsonl"), edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, "train.")


# ================================================================== 5. what a reader sees

PAGE = "report/generations.html"


@pytest.mark.parametrize("edit", [
    pytest.param(lambda s: s.replace("<td>0 / 16</td>", "<td>1 / 16</td>", 1), id="count"),
    pytest.param(lambda s: s.replace("<td>0.00%</td>", "<td>6.25%</td>", 1), id="percent"),
    pytest.param(lambda s: s.replace(
        '<tr class="wrong" data-arm="clean-pair" data-outcome="wrong"><th>clean-pair</th>'
        '<td class="verdict">&#10007; invalid_json_object</td>',
        '<tr class="correct" data-arm="clean-pair" data-outcome="correct"><th>clean-pair</th>'
        '<td class="verdict">&#10003; correct</td>', 1), id="verdict"),
    pytest.param(lambda s: s.replace("0 valid JSON objects", "3 valid JSON objects", 1),
                 id="valid"),
])
def test_an_edited_answer_page_fails(demo: Demo, tmp_path: Path, edit: Any) -> None:
    r = rewrite(demo, tmp_path)
    path = r.find(PAGE)
    before = r.bytes(path).decode()
    assert edit(before) != before, "the page no longer has what this test edits"
    r.edit_text(path, edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label('report', r.target)}.")


def _tree_with(r: Rewrite, name: str) -> str:
    (tree,) = [p for p in r.records("tree/1") if name in r.json(p)["entries"]]
    return tree


@pytest.mark.parametrize("ext", ["svg", "png", "pdf"])
@pytest.mark.parametrize("other", ["comparison", "training"])
def test_a_swapped_figure_fails(demo: Demo, tmp_path: Path, ext: str, other: str) -> None:
    r = rewrite(demo, tmp_path)
    a, b = r.find(f"report/accuracy.{ext}"), r.find(f"report/{other}.{ext}")
    # The two files change places: every object is still one file, only the tree differs.
    data_a, data_b = r.bytes(a), r.bytes(b)
    (r.root / a).write_bytes(data_b)
    (r.root / b).write_bytes(data_a)
    r.objects[a], r.objects[b] = r.objects[b], r.objects[a]

    def swap(tree: dict[str, Any]) -> None:
        e = tree["entries"]
        e[f"accuracy.{ext}"], e[f"{other}.{ext}"] = e[f"{other}.{ext}"], e[f"accuracy.{ext}"]

    r.edit_record(_tree_with(r, f"accuracy.{ext}"), swap)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label('report', r.target)}.")


@pytest.mark.parametrize("edit", [
    pytest.param(lambda d: d.update(notes="prose nobody recomputes"), id="top-level"),
    pytest.param(lambda d: d["learning"]["arms"]["seed"].update(remark="best arm"),
                 id="nested"),
    pytest.param(lambda d: d["serving"].update(headline="2x faster"), id="serving"),
])
def test_an_extra_member_in_report_json_fails(demo: Demo, tmp_path: Path, edit: Any) -> None:
    r = rewrite(demo, tmp_path)
    r.edit_json(r.find("report/report.json"), edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label('report', r.target)}.")


def test_an_extra_file_in_the_report_fails(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    note = b"The pair arm is the best.\n"
    oid = r.add("report/report/notes.txt", note, kind=None)
    entry = {"id": oid, "size": len(note), "sha256": r.objects["report/report/notes.txt"][
        "sha256"]}
    r.edit_record(_tree_with(r, "report.json"), lambda t: t["entries"].update(
        {"notes.txt": entry}))
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label('report', r.target)}.")


# ================================================================== 6. serving

REQUESTS = "serving/requests.jsonl"


def _serve_edit(demo: Demo, tmp_path: Path, edit: Any) -> Verdict:
    r = rewrite(demo, tmp_path, part="serve")
    r.edit_lines(r.find(REQUESTS), edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v, f"{label('serve', receipt_id(r, path_of_receipt(r, 'serve')))}.")
    return v


def test_a_request_for_a_test_task_fails(demo: Demo, tmp_path: Path) -> None:
    test_ids = demo.record(demo.output("prepare", "test"))["ids"]

    def edit(lines: list[dict[str, Any]]) -> None:
        lines[0]["task_id"] = test_ids[0]

    _serve_edit(demo, tmp_path, edit)


def test_requests_for_unknown_tasks_fail(demo: Demo, tmp_path: Path) -> None:
    def edit(lines: list[dict[str, Any]]) -> None:
        for line in lines:
            if line["phase"] == "pair":
                line["task_id"] = "0" * 64

    _serve_edit(demo, tmp_path, edit)


def test_a_pair_phase_served_by_one_endpoint_fails(demo: Demo, tmp_path: Path) -> None:
    def edit(lines: list[dict[str, Any]]) -> None:
        pair = [x for x in lines if x["phase"] == "pair"]
        assert len({x["endpoint"] for x in pair}) == 2
        for line in pair:
            line["endpoint"] = pair[0]["endpoint"]

    _serve_edit(demo, tmp_path, edit)


def test_a_single_phase_on_two_endpoints_fails(demo: Demo, tmp_path: Path) -> None:
    def edit(lines: list[dict[str, Any]]) -> None:
        endpoints = sorted({x["endpoint"] for x in lines})
        single = [x for x in lines if x["phase"] == "single"]
        (used,) = {x["endpoint"] for x in single}
        single[-1]["endpoint"] = next(e for e in endpoints if e != used)

    _serve_edit(demo, tmp_path, edit)


def test_failure_retries_to_the_dead_replica_fail(demo: Demo, tmp_path: Path) -> None:
    def edit(lines: list[dict[str, Any]]) -> None:
        failed = [x for x in lines if x["phase"] == "failure" and not x["ok"]]
        assert failed
        dead = failed[0]["endpoint"]
        retries = [x for x in lines if x["phase"] == "failure" and x["attempt"] > 1]
        assert retries
        for line in retries:
            line["endpoint"] = dead

    _serve_edit(demo, tmp_path, edit)


# ================================================================== 7. environment

PART = {"train": "train-single", "evaluate": None, "serve": "serve"}


def _environment_edit(demo: Demo, tmp_path: Path, recipe: str, edit: Any) -> Verdict:
    r = rewrite(demo, tmp_path, part=PART[recipe])
    receipt = r.json(path_of_receipt(r, recipe, arm="seed" if recipe == "evaluate" else None))
    params = r.json(r.path_of(receipt["action"]))["params"]
    if "device" in params:
        assert params["device"] == "cpu"
    r.edit_record(r.path_of(receipt["environment"]), edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    caught(v)
    return v


CUDA = {"type": "cuda", "name": "NVIDIA H200", "count": 1, "memory_bytes": 150_000_000_000}


@pytest.mark.parametrize("recipe", ["train", "evaluate", "serve"])
def test_cuda_devices_beside_a_cpu_build_fail(demo: Demo, tmp_path: Path, recipe: str) -> None:
    def edit(env: dict[str, Any]) -> None:
        env["devices"] = [*env["devices"], CUDA]

    _environment_edit(demo, tmp_path, recipe, edit)


def test_a_cuda_torch_for_a_cpu_run_fails(demo: Demo, tmp_path: Path) -> None:
    def edit(env: dict[str, Any]) -> None:
        env["torch"]["cuda"] = "12.8"
        env["devices"] = [CUDA]

    _environment_edit(demo, tmp_path, "train", edit)


def test_a_torch_version_unlike_its_package_fails(demo: Demo, tmp_path: Path) -> None:
    def edit(env: dict[str, Any]) -> None:
        env["torch"]["version"] = env["torch"]["version"].replace("+cpu", "") + "+cu128"

    _environment_edit(demo, tmp_path, "train", edit)


# ================================================================== 8. --expect

def test_expect_the_full_id_or_the_sums_digest_of_the_honest_bundle(demo: Demo) -> None:
    for expect in (demo.report, sums_digest(demo.bundle)):
        v = nscas_verify(demo.bundle, "--expect", expect)
        assert v.code == 0, (expect, sorted(v.failed()))
        assert v.report is not None and v.report["target"] == demo.report
    text = nscas_verify(demo.bundle, "--expect", demo.report, as_json=False)
    assert text.code == 0
    assert text.stdout.splitlines()[0].startswith(f"target {demo.report}")


def test_the_json_report_has_the_documented_shape(demo: Demo) -> None:
    v = nscas_verify(demo.bundle)
    assert v.report is not None
    assert list(v.report) == ["target", "named", "ok", "strict", "summary", "not_rechecked",
                              "self_reported", "signers", "checks"]
    assert v.report["target"] == demo.report
    assert set(v.report["not_rechecked"]) == {"weights", "model"}
    reported = " ".join(v.report["self_reported"])
    for field in ("seconds", "started", "finished", "wall_start"):
        assert field in reported, field
    assert "self-reported" in nscas_verify(demo.bundle, as_json=False).stdout


def _self_reported_forgery(demo: Demo, tmp_path: Path) -> Path:
    """A forgery confined to self-reported timings: the receipts' ``finished``."""
    r = rewrite(demo, tmp_path)
    def later(receipt: dict[str, Any]) -> None:
        end = receipt["finished"]  # ...T10:13:37.188234+00:00: one microsecond moved
        receipt["finished"] = end[:-7] + ("1" if end[-7] == "0" else "0") + end[-6:]

    r.edit_record(r.path_of(r.target), later)
    assert r.target != demo.report
    return r.seal()


def test_a_consistent_forgery_fails_the_genuine_expect(demo: Demo, tmp_path: Path) -> None:
    forged = _self_reported_forgery(demo, tmp_path)
    plain = nscas_verify(forged)
    assert plain.code == 0, sorted(plain.failed())  # self-reported: only the pin can tell
    assert plain.report is not None and plain.report["target"] != demo.report
    for expect in (demo.report, sums_digest(demo.bundle)):
        v = nscas_verify(forged, "--expect", expect)
        assert v.code == 1, (expect, v.code, v.stderr)
    assert nscas_verify(forged, "--expect", sums_digest(forged)).code == 0


@pytest.mark.parametrize("expect", ["blake3:" + "0" * 64, "0" * 64])
def test_expect_of_something_else_fails(demo: Demo, expect: str) -> None:
    assert nscas_verify(demo.bundle, "--expect", expect).code == 1


@pytest.mark.parametrize("expect", ["blake3:" + "a" * 12, "not-an-id", "blake3:" + "A" * 64])
def test_expect_must_be_a_full_id(demo: Demo, expect: str) -> None:
    v = nscas_verify(demo.bundle, "--expect", expect)
    assert v.code == 2, (v.code, v.stderr)


# ================================================================== 9. hostile input

def _hostile(v: Verdict) -> None:
    """A finding (exit 1) or one line of refusal (exit 2); never a traceback or an "ok"."""
    assert v.code in (1, 2), (v.code, v.stdout[-1000:], v.stderr)


@pytest.mark.parametrize(("suffix", "pattern", "replacement"), [
    ("receipts/baseline.json", r'("correct":\{"value":)0', r"\g<1>" + HUGE),
    ("receipts/serve.json", r'("cache_hits":\{"value":)0', r"\g<1>" + HUGE),
    ("training/clean-single/rank-0.journal.jsonl", r'("loss":)[-0-9.e]+', r"\g<1>" + HUGE),
    ("training/clean-pair/rank-1.journal.jsonl", r'("tokens":)[0-9]+', r"\g<1>" + HUGE),
    (REQUESTS, r'("start":)[-0-9.e]+', r"\g<1>" + HUGE),
    (REQUESTS, r'("attempt":)[0-9]+', r"\g<1>" + HUGE),
    ("evaluations/seed/timings.jsonl", r'("seconds":)[-0-9.e]+', r"\g<1>" + HUGE),
    ("evaluations/seed/generations.jsonl", r'("output_ids":\[)[0-9]+', r"\g<1>" + HUGE),
    ("/seed/retention.jsonl", r'("loss":)[-0-9.e]+', r"\g<1>" + HUGE),
    ("report/report.json", r'("correct": )[0-9]+', r"\g<1>" + HUGE),
])
def test_a_400_digit_integer_is_a_finding(demo: Demo, tmp_path: Path, suffix: str,
                                          pattern: str, replacement: str) -> None:
    r = rewrite(demo, tmp_path)
    raw_replace(r, r.find(suffix), pattern, replacement)
    _hostile(nscas_verify(r.seal()))


@pytest.mark.parametrize(("suffix", "pattern"), [
    ("receipts/baseline.json", r'(?<="correct":\{"value":)0'),
    (REQUESTS, r'(?<="output_ids":)\[[0-9,]*\]'),
    ("/checks.jsonl", r'(?<="correct":)(true|false)'),
    ("report/report.json", r'(?<="title": )"[^"]*"'),
    ("report/resources.json", r"(?<=: )[0-9]+"),
])
def test_a_value_nested_900_deep_is_a_finding(demo: Demo, tmp_path: Path, suffix: str,
                                             pattern: str) -> None:
    r = rewrite(demo, tmp_path)
    raw_replace(r, r.find(suffix), pattern, DEEP.replace("\\", "\\\\"))
    _hostile(nscas_verify(r.seal()))


def test_a_journal_line_nested_900_deep_is_a_finding(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    path = r.find("training/clean-single/rank-0.journal.jsonl")
    text = r.bytes(path).decode().splitlines(keepends=True)
    text[1] = text[1].replace('{"bytes_communicated":', '{"deep":' + DEEP + ',"bytes_communicated":',
                              1)
    r.replace(path, "".join(text).encode(), opaque=True)
    _hostile(nscas_verify(r.seal()))


@pytest.mark.parametrize("edit", [
    pytest.param(lambda m: m["objects"][next(iter(m["objects"]))].update(size="12"),
                 id="size-string"),
    pytest.param(lambda m: m["objects"][next(iter(m["objects"]))].update(kind=7), id="kind-int"),
    pytest.param(lambda m: m["objects"][next(iter(m["objects"]))].update(sha256=None),
                 id="sha-null"),
    pytest.param(lambda m: m.update(objects=list(m["objects"])), id="objects-list"),
    pytest.param(lambda m: m.update(target=5), id="target-int"),
    pytest.param(lambda m: m.update(derived="none"), id="derived-string"),
    pytest.param(lambda m: m.update(omitted=[]), id="omitted-list"),
    pytest.param(lambda m: m.update(format=["nscas-bundle/1"]), id="format-list"),
    pytest.param(lambda m: m["objects"][next(iter(m["objects"]))].update(size=int(HUGE)),
                 id="size-huge"),
    pytest.param(lambda m: m.update(extra=json.loads(DEEP)), id="deep"),
])
def test_a_manifest_member_of_the_wrong_type_is_refused(demo: Demo, tmp_path: Path,
                                                        edit: Any) -> None:
    r = rewrite(demo, tmp_path)
    r.outer_edit = edit
    _hostile(nscas_verify(r.seal()))


def test_a_deep_manifest_is_refused(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    bundle = r.seal()
    text = (bundle / "manifest.json").read_text()
    (bundle / "manifest.json").write_text(text[:-1] + ',"zz":' + DEEP + "}")
    _hostile(nscas_verify(bundle))


def test_an_over_long_path_segment_in_the_manifest_is_refused(demo: Demo,
                                                               tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)

    def edit(m: dict[str, Any]) -> None:
        m["objects"][f"report/report/{LONG}.json"] = m["objects"].pop(
            "report/report/resources.json")

    r.outer_edit = edit  # the file stays where it is: no file system takes that name
    _hostile(nscas_verify(r.seal(check=False)))


def test_an_over_long_name_in_a_tree_is_a_finding(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)

    def edit(tree: dict[str, Any]) -> None:
        tree["entries"][f"{LONG}.json"] = tree["entries"].pop("resources.json")

    r.edit_record(_tree_with(r, "resources.json"), edit)
    _hostile(nscas_verify(r.seal()))


def test_an_over_long_target_argument_is_refused(demo: Demo, tmp_path: Path) -> None:
    v = nscas_verify(tmp_path / LONG / "bundle")
    assert v.code == 2, (v.code, v.stderr)


def test_a_journal_chain_rewritten_with_a_huge_step_is_a_finding(demo: Demo,
                                                                 tmp_path: Path) -> None:
    """The careful tamperer re-chains the journal around a 400-digit integer (rfc8785 cannot
    write one, so the line is hand-written; its hash is over what the verifier would parse)."""
    r = rewrite(demo, tmp_path)
    path = r.find("training/clean-single/rank-0.journal.jsonl")
    lines = rechain(r.lines(path))
    text = "".join(json.dumps(x, separators=(",", ":"), sort_keys=True) + "\n" for x in lines)
    text = re.sub(r'("step":)1,', r"\g<1>" + HUGE + ",", text, count=1)
    r.replace(path, text.encode(), opaque=True)
    _hostile(nscas_verify(r.seal()))


@pytest.mark.parametrize("variant", ["", "../up", "a/b", "x" * 101, 3, None])
def test_a_receipt_variant_that_names_no_variant_fails(demo: Demo, tmp_path: Path,
                                                       variant: Any) -> None:
    r = rewrite(demo, tmp_path)
    path = path_of_receipt(r, "train")

    def edit(record: dict[str, Any]) -> None:
        record["variant"] = variant

    r.edit_record(path, edit)
    v = verify_here(r.seal())
    assert v.code == 1 and v.report is not None and not v.report["ok"]
    assert any("/variant" in (c["message"] or "")
               for c in v.report["checks"] if c["status"] == "failed"), [
        (c["name"], c["message"]) for c in v.report["checks"] if c["status"] == "failed"][:8]


def test_a_consistent_rewrite_of_a_valid_variant_is_a_self_reported_label(
        demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path)
    r.edit_record(path_of_receipt(r, "train"),
                  lambda record: record.__setitem__("variant", "train.lr-3e-4"))
    v = verify_here(r.seal())
    assert v.report is not None and "variant" in " ".join(v.report["self_reported"])
    assert not any(n.endswith(".schema") for n in v.failed()), sorted(v.failed())
