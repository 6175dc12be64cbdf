"""The report recipe on a hand-built experiment: every number against a hand computation."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nscas.objects.digests import Digest
from nscas.store.writer import init_store
from tests.recipes.test_report_fixtures import (
    SCRIPT_ANSWER,
    SEED_WEIGHTS,
    WALL_SECONDS,
    Experiment,
    build,
    report_files,
    run_report,
    weights,
)

PRICE = 2.0
FIGURES = ("comparison", "accuracy", "training", "serving", "parameters")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Experiment]:
    root = tmp_path_factory.mktemp("experiment")
    store = init_store(root)
    yield build(store, root)
    store.close()


@pytest.fixture(scope="module")
def done(experiment: Experiment, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = run_report(experiment, params={"price_per_host_hour": PRICE})
    assert result.status == "succeeded", result.error
    files = report_files(experiment, result, tmp_path_factory.mktemp("out") / "report")
    report = json.loads((files / "report.json").read_text(encoding="utf-8"))
    return {"result": result, "files": files, "report": report}


def _comparison(report: dict[str, Any], kind: str, candidate: str) -> dict[str, Any]:
    found = [c for c in report["learning"]["comparisons"]
             if c["kind"] == kind and c["candidate"] == candidate]
    assert len(found) == 1
    return found[0]


def test_per_arm_counts_by_family_variant_and_held_out(done: dict[str, Any]) -> None:
    arms = done["report"]["learning"]["arms"]
    assert list(arms) == ["seed", "clean-single", "damaged-single", "clean-pair"]
    assert {a: arms[a]["correct"] for a in arms} == {
        "seed": 2, "clean-single": 11, "damaged-single": 6, "clean-pair": 10}
    single = arms["clean-single"]
    assert single["documents"] == 16 and single["accuracy"] == 11 / 16
    # correct {0,1,3,4,5,7,8,9,12,13,15}: family = i % 4, variant = (i // 4) % 4
    assert {f: v["correct"] for f, v in single["by_family"].items()} == {
        "lookup": 4, "filter": 4, "total": 0, "sort": 3}
    assert {v: x["correct"] for v, x in single["by_variant"].items()} == {
        "0": 3, "1": 3, "2": 2, "3": 3}
    assert single["held_out"] == {"variants": [2, 3], "correct": 5, "documents": 8}
    # wrong answers: even index -> not JSON, odd index -> a JSON object of the wrong schema
    assert single["valid_json_objects"] == 11 + 1  # wrong {2, 6, 10, 11, 14}: only 11 is odd
    assert single["reasons"] == {"correct": 11, "invalid_json_object": 4,
                                 "wrong_schema_or_value": 1}
    assert arms["seed"]["valid_json_objects"] == 2 + 8
    assert arms["seed"]["held_out"]["correct"] == 0
    assert single["trained_on"] == "clean" and arms["damaged-single"]["trained_on"] == "damaged"
    assert arms["clean-pair"]["world"] == 2
    assert arms["seed"]["retention_mean_loss"] == pytest.approx(2.75)


def test_comparisons_with_the_seed(done: dict[str, Any]) -> None:
    report = done["report"]
    single = _comparison(report, "versus_seed", "clean-single")
    assert (single["wins"], single["losses"]) == (9, 0)
    assert single["p_exact"] == "1/512" and single["p"] == 1 / 512
    assert single["gain_exact"] == "9/16" and single["gain_points"] == 56.25
    damaged = _comparison(report, "versus_seed", "damaged-single")
    assert (damaged["wins"], damaged["losses"]) == (5, 1)
    assert damaged["p_exact"] == "7/64"  # (C(6,5) + C(6,6)) / 2^6
    assert damaged["gain_exact"] == "1/4"
    pair = _comparison(report, "versus_seed", "clean-pair")
    assert (pair["wins"], pair["losses"], pair["p_exact"]) == (8, 0, "1/256")
    # retention changes of clean-single: -0.1, +0.1, -0.1, -0.1
    ret = single["retention"]
    assert ret["mean"] == pytest.approx(-0.05)
    assert ret["se"] == pytest.approx(0.05)  # sample stdev 0.1 over sqrt(4)
    assert ret["upper"] == pytest.approx(-0.05 + 2.576 * 0.05)
    assert (ret["improved"], ret["worsened"]) == (3, 1)
    contract = report["contract"]
    assert contract["clean-single"]["gain"]["passed"] and contract["clean-single"]["p"]["passed"]
    assert not contract["clean-single"]["retention_upper"]["passed"]
    assert not contract["clean-single"]["passed"]
    assert not contract["damaged-single"]["p"]["passed"]
    assert contract["clean-pair"]["passed"]


def test_clean_versus_damaged_and_pair_versus_single(done: dict[str, Any]) -> None:
    report = done["report"]
    clean = _comparison(report, "clean_versus_damaged", "clean-single")
    assert clean["baseline"] == "damaged-single"
    assert (clean["wins"], clean["losses"], clean["p_exact"]) == (5, 0, "1/32")
    pair = _comparison(report, "pair_versus_single", "clean-pair")
    assert pair["baseline"] == "clean-single"
    assert (pair["wins"], pair["losses"], pair["p_exact"]) == (1, 2, "7/8")
    assert pair["gain_exact"] == "-1/16"
    assert len(report["learning"]["comparisons"]) == 5


def test_training_from_journals(done: dict[str, Any], experiment: Experiment) -> None:
    training = done["report"]["training"]
    single, pair = training["arms"]["clean-single"], training["arms"]["clean-pair"]
    assert (single["updates"], single["update_seconds"], single["median_update_seconds"]) == (
        4, 16.0, 2.5)
    assert (pair["world"], pair["update_seconds"], pair["median_update_seconds"]) == (2, 22.0, 5.5)
    assert pair["bytes_communicated"] == 4000 and pair["bytes_per_update"] == 1000
    assert [r["update_seconds"] for r in pair["ranks"]] == [22.0, pytest.approx(22.4)]
    assert pair["parameters_agree"] and pair["final_parameters_blake3"] == "bb" * 32
    assert pair["from_seed"] and pair["documents"] == "clean"
    assert training["arms"]["damaged-single"]["documents"] == "damaged"
    store = experiment.store
    assert pair["parameter_digest"] == store.get_record(experiment.checkpoints["clean-pair"])[
        "params"]
    assert (pair["targets"], pair["weighted_targets"], pair["tokens_per_second"]) == (
        40, 200, 400 / 22)
    assert pair["loss_by_step"] == [2.5, 2.0, 1.5, 1.0]
    # The train receipts claim the loss, so the arms show its mean per update too.
    assert (pair["first_loss"], pair["last_loss"], pair["mean_loss"]) == (2.5, 1.0, 1.75)
    for rank in pair["ranks"]:  # every rank's series by step, as the training figure draws
        assert rank["loss_by_step"] == [2.5, 2.0, 1.5, 1.0]
        assert rank["lr_by_step"] == [0.001] * 4 and rank["grad_norm_by_step"] == [1.0] * 4
    assert pair["claimed_only"]["loop_seconds"] == 27
    (ratio,) = training["ratios"]
    assert (ratio["pair"], ratio["single"]) == ("clean-pair", "clean-single")
    assert ratio["update_seconds"] == 22 / 16 and ratio["median_update_seconds"] == 5.5 / 2.5
    assert ratio["claimed_only"]["allocated_device_seconds_in_loop"] == pytest.approx(
        27 * 2 / 21)


def test_serving_from_the_request_log(done: dict[str, Any]) -> None:
    serving = done["report"]["serving"]
    single = serving["phases"]["single"]
    # latencies 1.0, 1.1, 1.2, 1.3; first start 0, last end 4.3
    assert single["wall_seconds"] == pytest.approx(4.3)
    assert single["requests_per_second"] == pytest.approx(4 / 4.3)
    assert single["median_latency_seconds"] == pytest.approx(1.15)
    assert single["p95_latency_seconds"] == pytest.approx(1.3)  # sorted(l)[ceil(3.8) - 1]
    failure = serving["phases"]["failure"]
    assert (failure["requests"], failure["attempts"], failure["failed_attempts"]) == (4, 6, 2)
    assert failure["median_latency_seconds"] == pytest.approx(1.0)
    assert serving["throughput_ratio"] == pytest.approx(2.0 / (4 / 4.3))
    assert (serving["failure_retries"], serving["identical_outputs"], serving["cache_hits"]) == (
        2, True, 0)
    assert serving["served_arm"] == "clean-pair"


def test_resources_and_cost_estimate(done: dict[str, Any]) -> None:
    resources = done["report"]["resources"]
    runs = {r["input"]: r for r in resources["runs"]}
    assert set(runs) == set(done["report"]["inputs"])
    pair = runs["train.clean-pair"]
    assert (pair["wall_seconds"], pair["devices_used"], pair["allocated_device_seconds"]) == (
        600, 2, 1200)
    assert pair["device_type"] == "cpu" and pair["device_names"] == ["x86_64"]
    assert runs["serve"]["allocated_device_seconds"] == 2 * WALL_SECONDS["serve"]
    assert runs["evaluate.seed"]["allocated_device_seconds"] == WALL_SECONDS["evaluate"]
    hours = sum(r["wall_seconds"] for r in runs.values()) / 3600
    cost = resources["cost_estimate"]
    assert cost["estimate"] == pytest.approx(PRICE * hours)
    assert "estimate" in cost["note"] and "not an invoice" in cost["note"]
    assert any("CPU 'device'" in note for note in resources["notes"])
    resources_file = json.loads((done["files"] / "resources.json").read_text(encoding="utf-8"))
    assert resources_file == resources


def test_no_price_no_estimate(experiment: Experiment) -> None:
    result = run_report(experiment)
    store = experiment.store
    tree = store.get_record(result.outputs["report"])["entries"]
    resources = json.loads(store.get_bytes(Digest.parse(tree["resources.json"]["id"])))
    assert resources["cost_estimate"]["estimate"] is None
    assert "no price" in resources["cost_estimate"]["note"]


def _distance(candidate: str, baseline: str, names: list[str]) -> tuple[float, float]:
    """(relative L2, max |difference|) over ``names``, computed here with NumPy in float64."""
    a, b = weights(candidate), weights(baseline)
    diff = np.concatenate([a[n].astype(np.float64) - b[n].astype(np.float64) for n in names])
    ref = np.concatenate([b[n].astype(np.float64) for n in names])
    return float(np.linalg.norm(diff) / np.linalg.norm(ref)), float(np.max(np.abs(diff)))


def test_the_parameters_of_every_compared_pair(done: dict[str, Any]) -> None:
    part = done["report"]["parameters"]
    pairs = {(p["kind"], p["candidate"], p["baseline"]): p for p in part["pairs"]}
    assert list(pairs) == [(c["kind"], c["candidate"], c["baseline"])
                           for c in done["report"]["learning"]["comparisons"]]
    names = sorted(SEED_WEIGHTS)
    for (_, candidate, baseline), p in pairs.items():
        rel, most = _distance(candidate, baseline, names)
        assert p["relative_l2"] == pytest.approx(rel, rel=1e-12), (candidate, baseline)
        assert p["max_abs_diff"] == most
        assert p["tensors"] == 3 and p["elements"] == 10
        assert [t["name"] for t in p["by_tensor"]] == names
        for t in p["by_tensor"]:
            one = _distance(candidate, baseline, [t["name"]])
            same = bool(np.array_equal(weights(candidate)[t["name"]],
                                       weights(baseline)[t["name"]]))
            assert t["identical"] is same
            assert t["relative_l2"] == (0.0 if same else pytest.approx(one[0], rel=1e-12))
            assert t["max_abs_diff"] == (0.0 if same else one[1])
        assert p["identical_tensors"] == sum(t["identical"] for t in p["by_tensor"])
        assert [x["layer"] for x in p["layers"]] == [0, 1]
        layer1 = _distance(candidate, baseline, ["model.layers.1.mlp.weight"])[0]
        assert p["layers"][1]["relative_l2"] == pytest.approx(layer1, rel=1e-12)
    pair = pairs[("pair_versus_single", "clean-pair", "clean-single")]
    assert pair["identical_tensors"] == 2 and pair["max_abs_diff"] == 0.125
    assert pair["layers"][0] == {"layer": 0, "relative_l2": 0.0, "max_abs_diff": 0.0}
    damaged = pairs[("clean_versus_damaged", "clean-single", "damaged-single")]
    assert damaged["identical_tensors"] == 1 and damaged["max_abs_diff"] == 1.0
    # The figure: a bar and a line per pair, in the candidate's colour.
    figure = done["report"]["figures"]["parameters"]
    bars, lines = figure["panels"]
    assert bars["labels"] == [f"{c} vs {b}" for _, c, b in pairs]
    assert bars["values"] == [p["relative_l2"] for p in pairs.values()]
    assert [s["y"] for s in lines["series"]] == [
        [x["relative_l2"] for x in p["layers"]] for p in pairs.values()]
    assert [s["style"] for s in lines["series"]] == ["-", "-", "-", "--", ":"]


def test_the_parameters_part_is_compare_params_bit_for_bit(done: dict[str, Any],
                                                          experiment: Experiment) -> None:
    """The report compares all its pairs in one pass (``compare_pairs``); each pair's numbers
    are those of ``compare_params`` on that pair alone, to the last bit."""
    from nscas.models.distance import compare_params
    from nscas.recipes.report.parameters import ParameterPair

    pairs = done["report"]["parameters"]["pairs"]
    assert len(pairs) == 5
    for written in pairs:
        diff = compare_params(experiment.store, Digest.parse(written["baseline_parameters"]),
                              Digest.parse(written["candidate_parameters"]))
        alone = ParameterPair(kind=written["kind"], candidate=written["candidate"],
                              baseline=written["baseline"], diff=diff).to_json()
        assert json.dumps(written) == json.dumps(alone), (written["candidate"],
                                                          written["baseline"])


def test_headline_claims_name_their_verifiers(done: dict[str, Any],
                                              experiment: Experiment) -> None:
    record = experiment.store.get_record(done["result"].receipt)
    claims = record["claims"]
    assert claims["correct.clean-single"] == {"value": 11, "verifier": "answers"}
    assert claims["p_exact.clean-single"] == {"value": "1/512", "verifier": "statistics"}
    assert claims["gain.clean-pair"] == {"value": 0.5, "verifier": "statistics"}
    assert claims["contract.clean-pair"] == {"value": True, "verifier": "statistics"}
    assert claims["median_update_seconds.clean-pair"] == {"value": 5.5, "verifier": "journals"}
    assert claims["update_seconds_ratio.clean-pair:clean-single"]["value"] == 22 / 16
    assert claims["throughput_ratio"]["verifier"] == "throughput"
    assert {c["verifier"] for c in claims.values()} == {
        "answers", "statistics", "journals", "throughput"}


def test_files_in_every_format_and_the_page_escapes_answers(done: dict[str, Any]) -> None:
    files: Path = done["files"]
    magic = {"svg": b"<?xml", "png": b"\x89PNG", "pdf": b"%PDF"}
    for name in FIGURES:
        for fmt, head in magic.items():
            assert (files / f"{name}.{fmt}").read_bytes().startswith(head), f"{name}.{fmt}"
    page = (files / "generations.html").read_text(encoding="utf-8")
    assert SCRIPT_ANSWER not in page
    assert "&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;" in page
    assert page.count("<script") == 1  # the page's own filter script only
    assert "src=" not in page and "@import" not in page
    assert re.findall(r'href="([^"]*)"', page) == ["index.html", "report.json"]
    assert page.count('<section class="task"') == 16
    for select in ("f-family", "f-variant", "f-arm", "f-outcome"):
        assert f'<select id="{select}">' in page
    assert sorted(p.name for p in files.iterdir()) == sorted(
        ["report.json", "resources.json", "index.html", "generations.html"]
        + [f"{n}.{f}" for n in FIGURES for f in ("svg", "png", "pdf")])


def _embedded(fmt: str, data: bytes) -> Any:
    """The figure data a file carries, read here with the standard library only."""
    if fmt == "svg":
        (text,) = re.findall(r"<dc:description>([^<]*)</dc:description>", data.decode())
        text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    elif fmt == "png":
        at, texts = 8, []
        while at < len(data):
            length, kind = struct.unpack(">I4s", data[at:at + 8])
            body = data[at + 8:at + 8 + length]
            assert zlib.crc32(kind + body) == struct.unpack(
                ">I", data[at + 8 + length:at + 12 + length])[0]
            if kind == b"tEXt" and body.startswith(b"nscas-figure\0"):
                texts.append(body.split(b"\0", 1)[1].decode("latin-1"))
            at += 12 + length
        (text,) = texts
    else:
        (raw,) = re.findall(rb"/Subject \(((?:[^\\()]|\\.)*)\)", data)
        text = re.sub(rb"\\(.)", rb"\1", raw).decode("ascii")
    return json.loads(text)


def test_each_figure_is_its_data_and_carries_it_in_every_format(done: dict[str, Any]) -> None:
    report, files = done["report"], done["files"]
    figures = report["figures"]
    assert list(figures) == list(FIGURES)
    accuracy = figures["accuracy"]["panels"][0]
    assert accuracy["groups"][0] == "all"
    assert [s["values"][0] for s in accuracy["series"]] == [
        a["accuracy"] for a in report["learning"]["arms"].values()]
    lines = {p["title"]: p for p in figures["training"]["panels"] if p["kind"] == "lines"}
    assert set(lines) == {"Training objective", "Learning rate", "Gradient norm"}
    labels = [s["label"] for s in lines["Gradient norm"]["series"]]
    assert labels == ["clean-single", "damaged-single", "clean-pair", "clean-pair rank 1"]
    assert lines["Training objective"]["series"][2]["y"] == [2.5, 2.0, 1.5, 1.0]
    throughput = figures["serving"]["panels"][0]
    assert throughput["values"] == [p["requests_per_second"]
                                    for p in report["serving"]["phases"].values()]
    assert throughput["texts"] == [f"{v:.2f}" for v in throughput["values"]]
    for name, data in figures.items():
        for fmt in ("svg", "png", "pdf"):
            carried = _embedded(fmt, (files / f"{name}.{fmt}").read_bytes())
            assert carried == {"format": "nscas-figure/2", "figure": name, "data": data}, (
                name, fmt)
        assert data["corner"] == f"action {done['result'].action}"


def test_report_json_has_only_recomputable_parts(done: dict[str, Any]) -> None:
    report = done["report"]
    assert report["format"] == "nscas-report/3"
    assert set(report) == {"format", "title", "action", "inputs", "prepared", "commitment",
                           "learning", "contract", "training", "serving", "parameters",
                           "resources", "figures"}
    assert report["action"] == str(done["result"].action)


def test_rerun_is_identical(done: dict[str, Any], experiment: Experiment) -> None:
    again = run_report(experiment, params={"price_per_host_hour": PRICE}, rerun=True)
    assert again.outputs == done["result"].outputs
    assert again.receipt != done["result"].receipt
    assert again.verdicts["report"].status == "identical"


class _Links(HTMLParser):
    """Every link and image source, every script, and the cells of every table row."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.scripts = 0
        self.handlers: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.links += [v or "" for k, v in attrs if k in ("href", "src")]
        self.handlers += [k for k in a if k.startswith("on")]
        self.scripts += tag == "script"
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _row(parsed: _Links, first: str, *, tables: int = 1) -> list[str]:
    """The row headed ``first`` (of the first table holding one; ``tables``: how many do)."""
    rows = [r for r in parsed.rows if r and r[0] == first]
    assert len(rows) == tables, (first, rows)
    return rows[0][1:]


def test_the_summary_page_shows_the_headline_tables(done: dict[str, Any]) -> None:
    report, files = done["report"], done["files"]
    page = (files / "index.html").read_text(encoding="utf-8")
    parsed = _Links()
    parsed.feed(page)
    arms = report["learning"]["arms"]
    assert _row(parsed, "Final test") == list(arms)
    assert _row(parsed, "All tasks, out of 16") == ["2", "11", "6", "10"]
    assert _row(parsed, "Accuracy") == ["12.50%", "68.75%", "37.50%", "62.50%"]
    assert _row(parsed, "sort, out of 4")[1] == "3"
    assert _row(parsed, "Held-out variants (2, 3), out of 8") == [
        str(a["held_out"]["correct"]) for a in arms.values()]
    single = _row(parsed, "clean-single versus the seed", tables=3)  # retention, parameters
    assert single[:3] == ["seed", "9", "0"]
    assert single[3] == f"{_comparison(report, 'versus_seed', 'clean-single')['gain_points']:+.2f}"
    assert _row(parsed, "Updates") == ["4", "4", "4"]
    assert _row(parsed, "First loss") == ["2.5000"] * 3
    assert _row(parsed, "Mean loss per update") == ["1.7500"] * 3
    pair = report["parameters"]["pairs"][-1]
    rows = [r for r in parsed.rows if r and r[0] == "clean-pair pair versus single"]
    assert rows[-1][1:] == ["clean-single", "3", "2", "10", f"{pair['relative_l2']:.6g}",
                            "0.125"]
    assert page.count("<details><summary>Per tensor: ") == len(report["parameters"]["pairs"])
    assert ["model.layers.1.mlp.weight", "3", "no",
            f"{pair['by_tensor'][2]['relative_l2']:.6g}", "0.125"] in parsed.rows
    assert _row(parsed, "Throughput ratio (pair / single)") == [
        f"{report['serving']['throughput_ratio']:.2f}x"]
    assert _row(parsed, "Identical outputs across phases") == ["yes"]
    for name, receipt in report["inputs"].items():
        assert [name, f"receipt {receipt}"] in parsed.rows
    # The action in the corner; nothing loaded from elsewhere, no script, every link a file
    # of the report's own tree.
    assert f'<p id="action">action <code>{report["action"]}</code></p>' in page
    assert parsed.scripts == 0 and parsed.handlers == []
    assert set(parsed.links) == {p.name for p in files.iterdir()} - {"index.html"}
    assert "generations.html" in parsed.links and "comparison.svg" in parsed.links


def test_an_arm_whose_receipt_claims_no_loss_shows_no_mean(tmp_path: Path) -> None:
    """A train receipt from before the loss claims: its arm has first and last loss, as
    before, and no mean; the page's mean row says n/a for it."""
    store = init_store(tmp_path)
    old = frozenset(("train.clean-single", c) for c in ("first_loss", "last_loss", "mean_loss"))
    exp = build(store, tmp_path, drop=old)
    result = run_report(exp)
    assert result.status == "succeeded", result.error
    (tmp_path / "out").mkdir()
    files = report_files(exp, result, tmp_path / "out" / "report")
    arms = json.loads((files / "report.json").read_text(encoding="utf-8"))["training"]["arms"]
    assert "mean_loss" not in arms["clean-single"] and arms["clean-single"]["first_loss"] == 2.5
    assert arms["clean-pair"]["mean_loss"] == 1.75
    parsed = _Links()
    parsed.feed((files / "index.html").read_text(encoding="utf-8"))
    assert _row(parsed, "Mean loss per update") == ["n/a", "1.7500", "1.7500"]
    # and none of them claiming it: no such row at all
    every = frozenset((f"train.{arm}", c) for arm in ("clean-single", "damaged-single",
                                                      "clean-pair")
                      for c in ("first_loss", "last_loss", "mean_loss"))
    (tmp_path / "none").mkdir()
    (tmp_path / "none-out").mkdir()
    other = init_store(tmp_path / "none")
    exp = build(other, tmp_path / "none", drop=every)
    result = run_report(exp)
    files = report_files(exp, result, tmp_path / "none-out" / "report")
    assert "Mean loss per update" not in (files / "index.html").read_text(encoding="utf-8")
    store.close()
    other.close()


def test_the_summary_page_escapes_every_string(done: dict[str, Any]) -> None:
    from nscas.recipes.report.index import render_index

    report = json.loads(json.dumps(done["report"]))
    report["title"] = 'T <script>alert("t")</script>'
    arms = report["learning"]["arms"]
    arms['<img src=x onerror="alert(1)">'] = arms.pop("clean-pair")
    report["training"]["arms"]["a&b"] = report["training"]["arms"].pop("clean-pair")
    page = render_index(report)
    assert "<script" not in page and "<img src=x" not in page and "onerror=\"" not in page
    assert "T &lt;script&gt;alert(&quot;t&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page and "a&amp;b" in page


def test_figures_keep_one_colour_per_arm_and_draw_zero_panels_on_a_fixed_axis(
        done: dict[str, Any]) -> None:
    from matplotlib.figure import Figure

    from nscas.recipes.report.figures import (
        ARM_COLOURS,
        PHASE_COLOURS,
        ZERO_NOTE,
        Bars,
        FigureData,
        draw,
    )

    figures = done["report"]["figures"]
    seen: dict[str, set[str]] = {}
    for data in figures.values():
        for panel in data["panels"]:
            if panel["kind"] == "bars" and panel["labels"][0] in ARM_COLOURS:
                for label, colour in zip(panel["labels"], panel["colours"], strict=True):
                    seen.setdefault(label, set()).add(colour)
            for series in panel.get("series", []):
                arm = series["label"].split(" ")[0]
                if arm in ARM_COLOURS:
                    seen.setdefault(arm, set()).add(series["colour"])
    assert seen == {arm: {ARM_COLOURS[arm]} for arm in
                    ("seed", "clean-single", "damaged-single", "clean-pair")}
    serving = figures["serving"]["panels"]
    assert set(serving[0]["colours"]) | {s["colour"] for s in serving[1]["series"]} <= set(
        PHASE_COLOURS)
    assert not set(PHASE_COLOURS) & set(ARM_COLOURS.values())
    zero = Bars(title="t", ylabel="y", labels=("a", "b"), values=(0.0, None),
                texts=("0.00", "n/a"), colours=("#000000", "#000000"), ylim=(0.0, 1.0),
                note=ZERO_NOTE)
    fig = Figure(figsize=(3, 3), layout="constrained")
    draw(fig, FigureData(size=(3, 3), rows=1, cols=1, panels=(zero,), corner="action x"))
    (ax,) = fig.axes
    assert ax.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts][-1] == ZERO_NOTE  # after the bar texts
    assert [t.get_text() for t in fig.texts] == ["action x"]
