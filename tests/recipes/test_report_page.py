"""generations.html on its own: escaping, structure, and (with node) what the filters show."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from nscas.objects.digests import Digest
from nscas.recipes.common.checker import check
from nscas.recipes.report.evidence import Run
from nscas.recipes.report.learning import ArmSummary, Count, FinalTest, Scored
from nscas.recipes.report.page import render_page

FAMILIES = ("lookup", "filter", "lookup", "sort")
TARGET = '{"ids":["A1"]}'
ANSWERS = {
    "seed": [TARGET, "</pre><script>alert(1)</script>", "nope", '{"ids":[]}'],
    "clean & <b>": [TARGET, TARGET, TARGET, "x"],
}
"""Arm names and answers are untrusted text too."""


def _page() -> tuple[str, dict[str, ArmSummary]]:
    records = tuple({"id": f"t{i}", "prompt": f"Prompt <{i}> & \"quotes\"", "target": TARGET,
                     "task": {"family": f, "variant": i}} for i, f in enumerate(FAMILIES))
    tests = FinalTest(records=records, held_out=(2, 3))
    run = Run(name="evaluate.x", recipe="evaluate", receipt=Digest.parse("blake3:" + "0" * 64),
              record={}, action={}, environment={})
    scored = {arm: Scored(arm=arm, run=run, texts=tuple(texts), retention=None,
                          results=tuple(check(t, TARGET) for t in texts))
              for arm, texts in ANSWERS.items()}
    zero = Digest.parse("blake3:" + "0" * 64)
    arms = {arm: ArmSummary(
        evaluation=zero, model=zero, parameter_digest=str(zero), committed_as=None,
        trained_on=None, world=None, documents=4, correct=sum(r.correct for r in s.results),
        accuracy=sum(r.correct for r in s.results) / 4, valid_json_objects=0, reasons={},
        by_family={}, by_variant={}, held_out_variants=(2, 3),
        held_out=Count(correct=0, documents=2), retention_mean_loss=None)
        for arm, s in scored.items()}
    return render_page("Title <x>", arms, tests, scored), arms


class _Structure(HTMLParser):
    """The elements the filter script works on, as the browser would parse them."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[dict[str, Any]] = []
        self.scripts: list[str] = []
        self.options: dict[str, list[str]] = {}
        self._in_script = False
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.tasks.append({"family": a["data-family"], "variant": a["data-variant"],
                               "rows": []})
        elif tag == "tr" and "data-arm" in a:
            self.tasks[-1]["rows"].append({"arm": a["data-arm"], "outcome": a["data-outcome"]})
        elif tag == "script":
            self._in_script = True
            self.scripts.append("")
        elif tag == "select":
            self._select = a["id"]
            self.options[a["id"] or ""] = []
        elif tag == "option" and self._select:
            self.options[self._select].append(a["value"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False
        elif tag == "select":
            self._select = None

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def test_everything_is_escaped_and_the_structure_is_what_the_script_expects() -> None:
    page, _ = _page()
    assert "<script>alert(1)</script>" not in page and "</pre><script>" not in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "clean &amp; &lt;b&gt;" in page and "<b>" not in page
    assert "Prompt &lt;0&gt; &amp; &quot;quotes&quot;" in page
    assert "<title>Title &lt;x&gt;: every answer</title>" in page
    parsed = _Structure()
    parsed.feed(page)
    assert len(parsed.scripts) == 1
    assert [t["family"] for t in parsed.tasks] == list(FAMILIES)
    assert parsed.tasks[1]["rows"] == [{"arm": "seed", "outcome": "wrong"},
                                       {"arm": "clean & <b>", "outcome": "correct"}]
    assert parsed.options["f-arm"] == ["", "seed", "clean & <b>"]
    assert parsed.options["f-variant"] == ["", "0", "1", "2", "3"]
    assert parsed.options["f-family"] == ["", "lookup", "filter", "sort"]


HARNESS = """
const data = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const selects = {};
for (const id of ["f-family", "f-variant", "f-arm", "f-outcome"]) {
  selects[id] = {value: "", listeners: [], addEventListener(e, f) { this.listeners.push(f); }};
}
const shown = {textContent: ""};
function element(attrs) { return {attrs, hidden: false, getAttribute(n) { return attrs[n]; }}; }
const tasks = data.tasks.map(t => {
  const e = element({"data-family": t.family, "data-variant": t.variant});
  e.rows = t.rows.map(r => element({"data-arm": r.arm, "data-outcome": r.outcome}));
  e.querySelectorAll = () => e.rows;
  return e;
});
global.document = {getElementById: id => id === "shown" ? shown : selects[id],
                   querySelectorAll: () => tasks};
eval(data.script);
const out = [];
for (const c of data.cases) {
  for (const k of Object.keys(c)) { selects[k].value = c[k]; }
  selects["f-arm"].listeners.forEach(f => f());
  out.push({tasks: tasks.flatMap((t, i) => t.hidden ? [] : [i]),
            rows: tasks.map(t => t.rows.filter(r => !r.hidden).length), shown: shown.textContent});
}
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_filters_show_what_they_say(tmp_path: Path) -> None:
    page, _ = _page()
    parsed = _Structure()
    parsed.feed(page)
    everything = {"f-family": "", "f-variant": "", "f-arm": "", "f-outcome": ""}
    cases = [
        everything,
        {**everything, "f-family": "lookup"},
        {**everything, "f-variant": "3"},
        {**everything, "f-arm": "seed", "f-outcome": "correct"},
        {**everything, "f-arm": "clean & <b>", "f-outcome": "wrong"},
        {**everything, "f-family": "filter", "f-outcome": "correct"},
        {**everything, "f-family": "sort", "f-arm": "seed", "f-outcome": "correct"},
    ]
    (tmp_path / "data.json").write_text(json.dumps(
        {"tasks": parsed.tasks, "script": parsed.scripts[0], "cases": cases}))
    (tmp_path / "harness.js").write_text(HARNESS)
    done = subprocess.run(["node", str(tmp_path / "harness.js"), str(tmp_path / "data.json")],
                          capture_output=True, text=True, timeout=30, check=True)
    results = json.loads(done.stdout)
    assert results[0] == {"tasks": [0, 1, 2, 3], "rows": [2, 2, 2, 2],
                          "shown": "4 of 4 tasks shown"}
    assert results[1]["tasks"] == [0, 2]
    assert results[2]["tasks"] == [3]
    assert results[3]["tasks"] == [0] and results[3]["rows"][0] == 1
    assert results[4]["tasks"] == [3]
    assert results[5] == {"tasks": [1], "rows": [2, 1, 1, 0], "shown": "1 of 4 tasks shown"}
    assert results[6]["tasks"] == [] and results[6]["shown"] == "0 of 4 tasks shown"


def test_long_runs_of_blank_lines_are_shown_compactly() -> None:
    from nscas.recipes.report.page import compact

    assert compact("a\n\n\nb") == "a\n\n\nb"  # two blank lines stay as they are
    assert compact("a\n\n \n\t\nb<\n" + "\n" * 40) == (
        'a\n<span class="gap">&#8942; 3 blank lines</span>\nb&lt;\n'
        '<span class="gap">&#8942; 40 blank lines</span>\n')
    assert compact("  x\n\n\n\n    y") == (
        '  x\n<span class="gap">&#8942; 3 blank lines</span>\n    y')  # indentation kept
