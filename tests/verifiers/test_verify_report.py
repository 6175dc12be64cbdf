"""``verify`` of a ``report`` receipt over a real tiny experiment (prepare .. train .. serve ..
report, CPU): the untouched report verifies with every claim recomputed; a changed claim, a
consistently re-stored report.json, page or figure fails naming exactly what was changed; an
export bundle verifies offline, and one without weights skips (never passes) the weight check.

Expectations are built here from the stored objects (JSON, the page's text, the figure files'
bytes), never with the verifiers' code."""

from __future__ import annotations

import copy
import html
import json
import math
import re
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from nscas.bundle.exporting import export_bundle
from nscas.objects.digests import Digest
from nscas.runs.runner import StepResult
from nscas.store.writer import Store
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify

from .conftest import EXPERIMENT
from .conftest import experiment as shared_experiment

ARMS = ("seed", "clean-single", "clean-pair")
CLAIMS = {
    "documents", "throughput_ratio", "failure_retries", "identical_outputs", "cache_hits",
    "update_seconds_ratio.clean-pair:clean-single",
    *(f"correct.{arm}" for arm in ARMS),
    *(f"{claim}.{arm}" for claim in ("gain", "p", "p_exact", "contract")
      for arm in ARMS[1:]),
    *(f"{claim}.{arm}" for claim in ("update_seconds", "median_update_seconds")
      for arm in ARMS[1:]),
}
FIGURES = ("comparison", "accuracy", "training", "serving")
"""The figures of report@1 (report@2 adds ``parameters``)."""
FORMATS = ("svg", "png", "pdf")
PAGE_PARTS = ("headline", "filters", "tasks", "verdicts", "answers", "exact")
INDEX_PARTS = ("head", "learning", "comparisons", "retention", "training", "serving",
               "parameters", "resources", "figures", "identity", "files", "exact")
V1_CHECKS = ("version", "inputs", "files", "json.learning", "json.training", "json.serving",
             "json.resources", "json.header", "json.figures", "json.parts",
             "resources_json", *(f"page.{p}" for p in PAGE_PARTS),
             *(f"figures.{f}.{x}" for f in FIGURES for x in FORMATS), "weights")
"""What a report@1 run is checked for (no index.html)."""
REPORT_CHECKS = (*V1_CHECKS, *(f"index.{p}" for p in INDEX_PARTS), "json.parameters",
                 *(f"figures.parameters.{x}" for x in FORMATS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Experiment:
    root: Path
    store: Store
    steps: dict[str, StepResult]

    @property
    def report(self) -> str:
        return str(self.steps["report"].receipt)

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Experiment]:
    """A store of its own (the forgeries here add receipts that would compete, as producers
    of the same outputs, with the session experiment's): a copy of the tamper suite's run of
    ``EXPERIMENT``, which runs once per test run."""
    root, steps = shared_experiment(tmp_path_factory)
    assert (root / "experiment.toml").read_text() == EXPERIMENT
    store = Store(root / ".nscas")
    yield Experiment(root=root, store=store, steps=steps)
    store.close()


def by_name(report: Report) -> dict[str, Any]:
    return {c.name: c for c in report.checks}


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def label(receipt: str) -> str:
    return f"report.{receipt[7:15]}"


def store_receipt(e: Experiment, change: Any) -> str:
    """The report receipt with ``change`` applied to a copy, stored through the store API."""
    record = copy.deepcopy(e.record(e.report))
    change(record)
    return str(e.store.put_record(record))


def rank0_seconds(e: Experiment, step: str) -> list[float]:
    """The update seconds of rank 0's journal, read here without the verifiers."""
    for journal in e.record(str(e.steps[step].receipt))["journals"]:
        record = e.record(journal)
        if record["rank"] == 0:
            lines = e.store.get_bytes(Digest.parse(record["entries"])).decode().splitlines()
            return [x["seconds"] for x in map(json.loads, lines)
                    if "step" in x and "event" not in x]
    raise AssertionError("no rank 0 journal")


def test_the_report_verifies_with_every_claim_recomputed(experiment: Experiment) -> None:
    report = verify(experiment.report, store=experiment.store_dir)
    assert report.ok and exit_code(report) == 0, report.failures
    checks = by_name(report)
    name = label(experiment.report)
    claims = {c.removeprefix(f"{name}.claims.") for c in checks
              if c.startswith(f"{name}.claims.")}
    assert claims == CLAIMS
    for claim in CLAIMS:
        assert checks[f"{name}.claims.{claim}"].status == "passed", claim
    for check in REPORT_CHECKS:
        assert checks[f"{name}.{check}"].status == "passed", check
    # Nothing of the report is left unrecomputed: no skipped report check at all.
    assert not [c for c in checks if c.startswith(name) and checks[c].status == "skipped"]
    recomputed = {c: checks[f"{name}.claims.{c}"].recomputed for c in CLAIMS}
    assert recomputed["documents"] == 16
    single, pair = rank0_seconds(experiment, "train-single"), rank0_seconds(experiment,
                                                                            "train-pair")
    assert len(single) == len(pair) == 4
    assert math.isclose(recomputed["update_seconds.clean-pair"], sum(pair), rel_tol=1e-12)
    assert math.isclose(recomputed["median_update_seconds.clean-single"],
                        statistics.median(single), rel_tol=1e-12)
    assert math.isclose(recomputed["update_seconds_ratio.clean-pair:clean-single"],
                        sum(pair) / sum(single), rel_tol=1e-9)
    for arm in ARMS[1:]:  # p is the exact McNemar tail of the comparison's wins and losses
        p = recomputed[f"p.{arm}"]
        assert isinstance(p, Fraction) and recomputed[f"p_exact.{arm}"] == (
            f"{p.numerator}/{p.denominator}")
    assert recomputed["cache_hits"] == 0 and recomputed["identical_outputs"] is True


@pytest.mark.parametrize(("claim", "change"), [
    ("correct.seed", lambda v: v + 1),
    ("p_exact.clean-pair", lambda v: "1/2"),
    ("update_seconds_ratio.clean-pair:clean-single", lambda v: v * 1.01),
    ("identical_outputs", lambda v: not v),
])
def test_a_changed_claim_fails_naming_it(experiment: Experiment, claim: str, change: Any) -> None:
    def edit(record: dict[str, Any]) -> None:
        record["claims"][claim]["value"] = change(record["claims"][claim]["value"])

    tampered = store_receipt(experiment, edit)
    report = verify(tampered, store=experiment.store_dir)
    assert failed(report) == {f"{label(tampered)}.claims.{claim}"}
    assert exit_code(report) == 1


def restore_report(e: Experiment, tmp_path: Path, edit: Any) -> str:
    """The report tree materialised, ``edit(dir)`` applied, re-put as a new tree/1 and a new
    receipt pointing at it: consistent for integrity, only the content is wrong."""
    out = tmp_path / "report"
    e.store.materialise(Digest.parse(e.record(e.report)["outputs"]["report"]), out)
    edit(out)
    tree = str(e.store.put_tree(out))
    return store_receipt(e, lambda r: r["outputs"].update(report=tree))


def test_an_edited_report_json_fails_naming_each_field(experiment: Experiment,
                                                       tmp_path: Path) -> None:
    def edit(out: Path) -> None:
        data = json.loads((out / "report.json").read_text(encoding="utf-8"))
        data["learning"]["arms"]["clean-single"]["correct"] += 1
        data["training"]["arms"]["clean-pair"]["updates"] += 1
        data["serving"]["phases"]["pair"]["wall_seconds"] *= 0.5
        data["resources"]["notes"][0] = "prose is compared too"
        (out / "report.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    tampered = restore_report(experiment, tmp_path, edit)
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    assert failed(report) == {
        f"{name}.json.learning.arms.clean-single.correct",
        f"{name}.json.training.arms.clean-pair.updates",
        f"{name}.json.serving.phases.pair.wall_seconds",
        f"{name}.json.resources.notes[0]",
    }
    check = by_name(report)[f"{name}.json.learning.arms.clean-single.correct"]
    assert check.recomputed + 1 == check.claimed
    # The claims are the receipt's, untouched: they still verify.
    assert by_name(report)[f"{name}.claims.correct.clean-single"].status == "passed"


def test_a_page_without_a_task_fails(experiment: Experiment, tmp_path: Path) -> None:
    test = experiment.record(str(experiment.steps["prepare"].outputs["test"]))
    first = test["ids"][0]

    def edit(out: Path) -> None:
        page = (out / "generations.html").read_text(encoding="utf-8")
        assert first in page
        (out / "generations.html").write_text(page.replace(first, "gone"), encoding="utf-8")

    tampered = restore_report(experiment, tmp_path, edit)
    report = verify(tampered, store=experiment.store_dir)
    assert failed(report) == {f"{label(tampered)}.page.tasks", f"{label(tampered)}.page.exact"}
    assert "gone" in by_name(report)[f"{label(tampered)}.page.tasks"].message


def test_an_export_bundle_verifies_offline(experiment: Experiment, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = Digest.parse(experiment.report)
    export_bundle(experiment.store, target, tmp_path / "full")
    export_bundle(experiment.store, target, tmp_path / "light", weights=False)
    if shutil.which("sha256sum"):
        done = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"],
                              cwd=tmp_path / "full", capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no store here or above
    name = label(experiment.report)
    full = verify(str(tmp_path / "full"))
    assert full.ok, full.failures
    checks = by_name(full)
    for check in (*REPORT_CHECKS, *(f"claims.{c}" for c in CLAIMS)):
        assert checks[f"{name}.{check}"].status == "passed", check
    light = verify(str(tmp_path / "light"))
    assert light.ok, light.failures
    weights = by_name(light)[f"{name}.weights"]
    assert weights.status == "skipped" and weights.needs == "weights"
    assert "weights" in weights.message
    # The parameter distances need the weights: not rechecked, never passed; the figure and
    # the page are still checked against report.json's own part.
    distances = by_name(light)[f"{name}.json.parameters"]
    assert distances.status == "skipped" and distances.needs == "weights"
    for check in ("index.parameters", "index.exact", "json.figures",
                  *(f"figures.parameters.{x}" for x in FORMATS)):
        assert by_name(light)[f"{name}.{check}"].status == "passed", check
    assert by_name(light)[f"{name}.json.learning"].status == "passed"


def test_an_unreadable_report_json_fails_its_comparisons_not_the_claims(
        experiment: Experiment, tmp_path: Path) -> None:
    def edit(out: Path) -> None:
        (out / "report.json").write_text('{"learning": NaN}\n', encoding="utf-8")

    tampered = restore_report(experiment, tmp_path, edit)
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    checks = by_name(report)
    parts = ("learning", "training", "serving", "resources", "header", "figures", "parts",
             "parameters")
    assert failed(report) == {f"{name}.files.report.json", f"{name}.weights",
                              *(f"{name}.json.{part}" for part in parts)}
    assert all(checks[f"{name}.claims.{claim}"].status == "passed" for claim in CLAIMS)


def edit_json(change: Any) -> Any:
    def edit(out: Path) -> None:
        data = json.loads((out / "report.json").read_text(encoding="utf-8"))
        change(data)
        (out / "report.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return edit


def edit_page(old: str, new: str) -> Any:
    def edit(out: Path) -> None:
        page = (out / "generations.html").read_text(encoding="utf-8")
        assert old in page, old
        (out / "generations.html").write_text(page.replace(old, new, 1), encoding="utf-8")
    return edit


def test_a_page_count_or_verdict_that_differs_fails(experiment: Experiment,
                                                    tmp_path: Path) -> None:
    seed = experiment.steps["evaluate-seed"].claims["correct"]
    cases = {
        "headline": (f"<th>seed</th><td>{seed} / 16</td>", f"<th>seed</th><td>{seed + 1} / 16</td>"),
        "verdicts": ('data-outcome="wrong"', 'data-outcome="correct"'),
        "answers": ("<td><pre>", "<td><pre>forged "),
        "filters": ('<option value="sort">sort</option>', ""),
    }
    for part, (old, new) in cases.items():
        tampered = restore_report(experiment, tmp_path / part, edit_page(old, new))
        report = verify(tampered, store=experiment.store_dir)
        name = label(tampered)
        assert failed(report) == {f"{name}.page.{part}", f"{name}.page.exact"}, part
    # A change no part holds (the page's own script) is still caught, byte for byte.
    tampered = restore_report(experiment, tmp_path / "script",
                              edit_page("shown + \" of \"", "16 + \" of \""))
    assert failed(verify(tampered, store=experiment.store_dir)) == {
        f"{label(tampered)}.page.exact"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_swapped_figure_fails_in_every_format(experiment: Experiment, tmp_path: Path,
                                                fmt: str) -> None:
    def edit(out: Path) -> None:
        shutil.copyfile(out / f"accuracy.{fmt}", out / f"comparison.{fmt}")
        (out / f"training.{fmt}").write_bytes((out / f"training.{fmt}").read_bytes()[:200])

    tampered = restore_report(experiment, tmp_path, edit)
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    assert failed(report) == {f"{name}.figures.comparison.{fmt}",
                              f"{name}.figures.training.{fmt}"}


def test_figure_data_changed_in_report_json_fails(experiment: Experiment,
                                                  tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        (loss,) = [p for p in data["figures"]["training"]["panels"]
                   if p["title"] == "Training objective"]
        loss["series"][0]["y"][0] += 1e-9  # a copied journal value: compared exactly
        data["figures"]["accuracy"]["panels"][0]["series"][0]["label"] = "seed (16/16)"

    tampered = restore_report(experiment, tmp_path, edit_json(change))
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    assert failed(report) == {f"{name}.json.figures.training.panels[3].series[0].y[0]",
                              f"{name}.json.figures.accuracy.panels[0].series[0].label"}


def test_an_extra_member_or_part_in_report_json_fails(experiment: Experiment,
                                                      tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["learning"]["arms"]["seed"]["verdict"] = "best arm"
        data["audit"] = {"values_checked": 1, "mismatches": 0}

    tampered = restore_report(experiment, tmp_path, edit_json(change))
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    assert failed(report) == {f"{name}.json.learning.arms.seed.verdict", f"{name}.json.parts"}


def test_numbers_compare_exactly_where_they_are_exact(experiment: Experiment,
                                                      tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        versus = data["learning"]["comparisons"][0]
        versus["p"] = math.nextafter(versus["p"], 0.0)  # not the correctly rounded rational
        data["learning"]["arms"]["seed"]["correct"] += 1e-12  # a count that is not an integer
        data["learning"]["documents"] = float(data["learning"]["documents"])

    tampered = restore_report(experiment, tmp_path, edit_json(change))
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    assert failed(report) == {f"{name}.json.learning.comparisons[0].p",
                              f"{name}.json.learning.arms.seed.correct",
                              f"{name}.json.learning.documents"}


@pytest.mark.parametrize(("claim", "change"), [
    ("p.clean-pair", lambda v: math.nextafter(float(v), 0.0)),
    ("p.clean-single", lambda v: 1e-12),
    ("p_exact.clean-single", lambda v: "2/4" if v == "1/2" else "1/2"),
    ("correct.seed", lambda v: v + 1e-12),
    ("documents", lambda v: float(v) + 0.5),
])
def test_a_claim_that_is_not_exact_fails(experiment: Experiment, claim: str,
                                         change: Any) -> None:
    def edit(record: dict[str, Any]) -> None:
        record["claims"][claim]["value"] = change(record["claims"][claim]["value"])

    tampered = store_receipt(experiment, edit)
    report = verify(tampered, store=experiment.store_dir)
    assert failed(report) == {f"{label(tampered)}.claims.{claim}"}


def test_hostile_report_content_fails_without_a_traceback(experiment: Experiment,
                                                          tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["learning"]["arms"] = [1, 2]
        data["figures"] = "drawn elsewhere"
        data["training"]["arms"]["clean-pair"]["updates"] = "4"
        data["serving"]["phases"] = {"single": {"requests": {"deep": [[[[]]]]}}}

    def edit(out: Path) -> None:
        edit_json(change)(out)
        (out / "generations.html").write_text("<div>" * 5000 + "</p></table>",
                                              encoding="utf-8")

    tampered = restore_report(experiment, tmp_path, edit)
    report = verify(tampered, store=experiment.store_dir)
    name = label(tampered)
    bad = failed(report)
    assert {f"{name}.json.learning.arms", f"{name}.json.figures",
            f"{name}.json.training.arms.clean-pair.updates", f"{name}.page.exact"} <= bad
    assert f"{name}.json.serving.phases.single.requests" in bad
    assert exit_code(report) == 1


def edit_index(old: str, new: str) -> Any:
    def edit(out: Path) -> None:
        page = (out / "index.html").read_text(encoding="utf-8")
        assert page.count(old) >= 1, old
        (out / "index.html").write_text(page.replace(old, new, 1), encoding="utf-8")
    return edit


def test_an_edited_summary_page_fails_in_the_part_it_changed(experiment: Experiment,
                                                             tmp_path: Path) -> None:
    data = json.loads(experiment.store.get_bytes(Digest.parse(experiment.record(
        experiment.record(experiment.report)["outputs"]["report"])["entries"]["report.json"][
        "id"])))
    seed = data["learning"]["arms"]["seed"]["correct"]
    row = "<tr><th>Updates</th>"
    cases = {
        "learning": edit_index(f"<th>All tasks, out of 16</th><td class=\"n\">{seed}</td>",
                               f"<th>All tasks, out of 16</th><td class=\"n\">{seed + 1}</td>"),
        "serving": edit_index("<th>Cache hits</th><td class=\"n\">0</td>",
                              "<th>Cache hits</th><td class=\"n\">0</td>"
                              "<script>alert(1)</script>"),
        "head": edit_index("<h1>", "<script src=\"https://example.com/x.js\"></script><h1>"),
    }

    def drop_row(out: Path) -> None:
        page = (out / "index.html").read_text(encoding="utf-8")
        start = page.index(row)
        (out / "index.html").write_text(page[:start] + page[page.index("</tr>", start) + 5:],
                                        encoding="utf-8")

    cases["training"] = drop_row
    for part, edit in cases.items():
        tampered = restore_report(experiment, tmp_path / part, edit)
        report = verify(tampered, store=experiment.store_dir)
        name = label(tampered)
        assert failed(report) == {f"{name}.index.{part}", f"{name}.index.exact"}, part
        assert exit_code(report) == 1
    # Outside every part (after the page's end) the bytes still catch it.
    tampered = restore_report(experiment, tmp_path / "tail",
                              edit_index("</html>\n", "</html>\n<script>alert(1)</script>"))
    assert failed(verify(tampered, store=experiment.store_dir)) >= {
        f"{label(tampered)}.index.exact"}


def test_the_mean_training_loss_is_rechecked_in_report_json_and_on_the_page(
        experiment: Experiment, tmp_path: Path) -> None:
    """The train receipts claim the loss, so the report shows each arm's mean loss per update:
    forged, or left out, in report.json or on the summary page, it fails there."""
    data = json.loads(experiment.store.get_bytes(Digest.parse(experiment.record(
        experiment.record(experiment.report)["outputs"]["report"])["entries"]["report.json"][
        "id"])))
    arm = data["training"]["arms"]["clean-pair"]
    train = experiment.record(arm["receipt"])["claims"]
    assert arm["mean_loss"] == train["mean_loss"]["value"]
    assert (arm["first_loss"], arm["last_loss"]) == (train["first_loss"]["value"],
                                                    train["last_loss"]["value"])
    shown = f"<th>Mean loss per update</th><td class=\"n\">{data['training']['arms']['clean-single']['mean_loss']:,.4f}</td>"
    cases = {
        "forged": edit_json(lambda d: d["training"]["arms"]["clean-pair"].update(
            mean_loss=math.nextafter(arm["mean_loss"], math.inf))),
        "dropped": edit_json(lambda d: d["training"]["arms"]["clean-pair"].pop("mean_loss")),
        "page": edit_index(shown, shown.replace('"n">', '"n">1')),
    }
    for case, edit in cases.items():
        tampered = restore_report(experiment, tmp_path / case, edit)
        name = label(tampered)
        bad = failed(verify(tampered, store=experiment.store_dir))
        if case == "page":
            assert bad == {f"{name}.index.training", f"{name}.index.exact"}
        else:
            assert bad and all(b.startswith(f"{name}.json.training") for b in bad), (case, bad)


def test_a_summary_page_and_report_json_edited_together_still_fail(experiment: Experiment,
                                                                   tmp_path: Path) -> None:
    def edit(out: Path) -> None:
        edit_json(lambda d: d["serving"].update(cache_hits=7))(out)
        edit_index("<th>Cache hits</th><td class=\"n\">0</td>",
                   "<th>Cache hits</th><td class=\"n\">7</td>")(out)

    tampered = restore_report(experiment, tmp_path, edit)
    name = label(tampered)
    assert failed(verify(tampered, store=experiment.store_dir)) == {
        f"{name}.json.serving.cache_hits", f"{name}.index.serving", f"{name}.index.exact"}


def test_a_report_without_its_summary_page_or_action_fails(experiment: Experiment,
                                                          tmp_path: Path) -> None:
    def edit(out: Path) -> None:
        (out / "index.html").unlink()
        edit_json(lambda d: d.update(action="blake3:" + "0" * 64))(out)

    tampered = restore_report(experiment, tmp_path, edit)
    name = label(tampered)
    assert failed(verify(tampered, store=experiment.store_dir)) == {
        f"{name}.files", f"{name}.json.action", *(f"{name}.index.{p}" for p in INDEX_PARTS)}


V1_COLOURS = ("#6b7280", "#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")


def _v1_figures(figures: dict[str, Any], arms: list[str]) -> dict[str, Any]:
    """report@1's figure data from report@2's, by the version-1 definitions (docs/experiment.md
    §6): colours by position, arms and serving phases alike; no corner, zero axes or notes."""
    colours = {arm: V1_COLOURS[i] for i, arm in enumerate(arms)}
    out = copy.deepcopy(figures)
    for name, figure in out.items():
        figure.pop("corner")
        for panel in figure["panels"]:
            zero = panel.pop("note") is not None  # the tiny models answer nothing correctly
            if panel["kind"] != "grouped":
                assert (panel.pop("ylim") is None) != zero
            elif zero and panel["ylim"] == [0.0, 1.0]:
                panel["ylim"] = None
            if panel["kind"] == "bars":
                panel["colours"] = ([colours[a] for a in panel["labels"]]
                                    if panel["labels"][0] in colours
                                    else list(V1_COLOURS[:len(panel["labels"])]))
            for j, series in enumerate(panel.get("series", [])):
                arm = series["label"].split(" ")[0]
                series["colour"] = colours[arm] if arm in colours else V1_COLOURS[j + 1]
        assert name in FIGURES
    return out


def _figure_file(fmt: str, text: str) -> bytes:
    """A figure file carrying ``text`` as its figure data, as matplotlib writes one."""
    import io

    from matplotlib.figure import Figure

    meta = {"svg": {"Description": text}, "pdf": {"Subject": text},
            "png": {"nscas-figure": text}}[fmt]
    buffer = io.BytesIO()
    Figure(figsize=(1, 1)).savefig(buffer, format=fmt, metadata=meta)
    return buffer.getvalue()


def test_a_report_at_version_1_is_checked_by_the_version_1_definitions(
        experiment: Experiment, tmp_path: Path) -> None:
    """A run of report@1 (published before index.html): no summary page, figures and the
    answer page of version 1. Made here from the report@2 run by those definitions."""
    receipt = experiment.record(experiment.report)
    action = copy.deepcopy(experiment.record(receipt["action"]))
    assert action["recipe"] == "report@2"
    action["recipe"] = "report@1"
    old_action = str(experiment.store.put_record(action))

    def to_v1(out: Path) -> None:
        data = json.loads((out / "report.json").read_text(encoding="utf-8"))
        del data["action"], data["parameters"], data["figures"]["parameters"]
        for fmt in FORMATS:
            (out / f"parameters.{fmt}").unlink()
        data["format"] = "nscas-report/2"
        data["figures"] = _v1_figures(data["figures"], list(data["learning"]["arms"]))
        (out / "report.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        (out / "index.html").unlink()
        page = (out / "generations.html").read_text(encoding="utf-8")
        # Version 1 shows every answer as it is (no compact runs of blank lines).
        texts = []
        for _ in range(data["learning"]["documents"]):
            texts.append([])
        for arm in data["learning"]["arms"].values():
            blob = experiment.record(arm["evaluation"])["outputs"]["generations"]
            lines = experiment.store.get_bytes(Digest.parse(blob)).decode().splitlines()
            for i, line in enumerate(lines):
                texts[i].append(html.escape(json.loads(line)["text"], quote=True))
        answers = iter(t for task in texts for t in task)
        assert 'class="gap"' in page  # these tiny models do write long runs of blank lines
        page = re.sub(r"<td><pre>(.*?)</pre></td></tr>",
                      lambda m: f"<td><pre>{next(answers)}</pre></td></tr>", page,
                      flags=re.DOTALL)
        page = page.replace(".gap{color:#6b7280;font-style:italic}\n", "").replace(
            '<p><a href="index.html">Summary</a> &middot; <a href="report.json">report.json'
            "</a></p>", "")
        (out / "generations.html").write_text(page, encoding="utf-8")
        for name, figure in data["figures"].items():
            text = json.dumps({"format": "nscas-figure/1", "figure": name, "data": figure},
                              sort_keys=True, separators=(",", ":"), ensure_ascii=True)
            for fmt in FORMATS:
                (out / f"{name}.{fmt}").write_bytes(_figure_file(fmt, text))

    out = tmp_path / "report"
    experiment.store.materialise(Digest.parse(receipt["outputs"]["report"]), out)
    to_v1(out)
    tree = str(experiment.store.put_tree(out))
    old = store_receipt(experiment, lambda r: r.update(action=old_action,
                                                       outputs={"report": tree}))
    report = verify(old, store=experiment.store_dir)
    assert report.ok, report.failures
    checks = by_name(report)
    name = label(old)
    for check in V1_CHECKS:
        assert checks[f"{name}.{check}"].status == "passed", check
    assert not [c for c in checks if c.startswith(f"{name}.index.")]
    # The same outputs under report@2 fail: its files, report.json, figures and page differ.
    newer = store_receipt(experiment, lambda r: r["outputs"].update(report=tree))
    bad = failed(verify(newer, store=experiment.store_dir))
    n = label(newer)
    assert {f"{n}.files", f"{n}.json.format", f"{n}.json.action", f"{n}.page.exact",
            f"{n}.figures.comparison.svg"} <= bad


def _report_json(e: Experiment) -> dict[str, Any]:
    tree = e.record(e.record(e.report)["outputs"]["report"])
    return json.loads(e.store.get_bytes(Digest.parse(tree["entries"]["report.json"]["id"])))


def test_the_parameter_distances_are_recomputed_from_the_weights(
        experiment: Experiment) -> None:
    """Every compared pair, against distances computed here with NumPy from the stored
    tensors (float64, whole arrays: the test's own, unstreamed definition)."""
    import numpy as np

    part = _report_json(experiment)["parameters"]
    arms = _report_json(experiment)["learning"]["arms"]
    assert [(p["candidate"], p["baseline"]) for p in part["pairs"]] == [
        ("clean-single", "seed"), ("clean-pair", "seed"), ("clean-pair", "clean-single")]

    def values(arm: str) -> dict[str, Any]:
        tensors = experiment.record(arms[arm]["parameter_digest"])["tensors"]
        assert {t["dtype"] for t in tensors.values()} == {"F32"}
        return {n: np.frombuffer(experiment.store.get_bytes(Digest.parse(t["data"])),
                                 dtype="<f4").astype(np.float64)
                for n, t in sorted(tensors.items())}

    for pair in part["pairs"]:
        a, b = values(pair["baseline"]), values(pair["candidate"])
        d = np.concatenate([b[n] - a[n] for n in a])
        ref = np.concatenate(list(a.values()))
        assert pair["relative_l2"] == pytest.approx(
            float(np.linalg.norm(d) / np.linalg.norm(ref)), rel=1e-9)
        assert pair["max_abs_diff"] == float(np.max(np.abs(d)))
        assert pair["identical_tensors"] == sum(np.array_equal(a[n], b[n]) for n in a)
        assert pair["layers"] and [x["layer"] for x in pair["layers"]] == sorted(
            {int(n.split(".")[2]) for n in a if n.startswith("model.layers.")})
    name = label(experiment.report)
    check = by_name(verify(experiment.report, store=experiment.store_dir))[
        f"{name}.json.parameters"]
    assert check.status == "passed"


def test_a_forged_parameter_distance_fails_naming_it(experiment: Experiment,
                                                     tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        pairs = data["parameters"]["pairs"]
        pairs[2]["relative_l2"] *= 1.001  # a pair that is closer than it is
        pairs[0]["by_tensor"][1]["identical"] = not pairs[0]["by_tensor"][1]["identical"]
        pairs[1]["max_abs_diff"] *= 1 + 1e-12  # within float_recomputation: not a finding

    tampered = restore_report(experiment, tmp_path, edit_json(change))
    name = label(tampered)
    assert failed(verify(tampered, store=experiment.store_dir)) == {
        f"{name}.json.parameters.pairs[2].relative_l2",
        f"{name}.json.parameters.pairs[0].by_tensor[1].identical"}


def test_a_parameters_figure_or_page_row_that_differs_fails(experiment: Experiment,
                                                            tmp_path: Path) -> None:
    pair = _report_json(experiment)["parameters"]["pairs"][-1]
    shown = f"{pair['relative_l2']:.6g}"

    def edit(out: Path) -> None:
        edit_json(lambda d: d["figures"]["parameters"]["panels"][1]["series"][0]["y"].__setitem__(
            0, d["figures"]["parameters"]["panels"][1]["series"][0]["y"][0] * 2))(out)
        edit_index(f'<td class="n">{shown}</td>', '<td class="n">0</td>')(out)

    tampered = restore_report(experiment, tmp_path, edit)
    name = label(tampered)
    assert failed(verify(tampered, store=experiment.store_dir)) == {
        f"{name}.json.figures.parameters.panels[1].series[0].y[0]",
        f"{name}.index.parameters", f"{name}.index.exact"}
