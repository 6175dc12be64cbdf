"""generations.html: one self-contained page with every test prompt, its target and every
arm's retained answer, marked by this report's rescoring, filterable by family, variant,
arm and outcome.

Answers are model output and prompts are input data: every piece of text goes through
``html.escape`` (quotes included, for attributes). The page loads nothing: its CSS and its
few lines of vanilla JS (docs/spec/report-page.css and .js, docs/format.md §6.11) are inline,
and filtering only toggles ``hidden`` on elements.

An answer is shown compactly: each run of ``GAP_LINES`` or more blank lines (lines holding
only spaces, tabs or carriage returns) is drawn as one marker line saying how many blank
lines it stands for; the retained answer itself is unchanged (it is the evaluation's
``generations`` blob).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from html import escape
from typing import Any

from .learning import ArmSummary, FinalTest, Scored
from .templates import read_template

GAP_LINES = 3
GAP = re.compile(r"\n(?:[ \t\r]*\n){" + str(GAP_LINES) + ",}")
"""A line break, then GAP_LINES or more blank lines."""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def compact(text: str) -> str:
    """An answer as HTML: escaped, each long run of blank lines drawn as one marker line."""
    out, at = [], 0
    for m in GAP.finditer(text):
        blank = m.group().count("\n") - 1
        out.append(_e(text[at:m.start()]))
        out.append(f'\n<span class="gap">&#8942; {blank} blank lines</span>\n')
        at = m.end()
    out.append(_e(text[at:]))
    return "".join(out)


def _select(ident: str, label: str, options: list[tuple[str, str]]) -> str:
    items = "".join(f'<option value="{_e(v)}">{_e(text)}</option>' for v, text in options)
    return f'<label>{_e(label)} <select id="{ident}">{items}</select></label>'


def _task(index: int, record: dict[str, Any], scored: Mapping[str, Scored]) -> str:
    family, variant = record["task"]["family"], record["task"]["variant"]
    rows = []
    for arm, s in scored.items():
        result = s.results[index]
        outcome = "correct" if result.correct else "wrong"
        mark = "&#10003; correct" if result.correct else f"&#10007; {_e(result.reason)}"
        rows.append(f'<tr class="{outcome}" data-arm="{_e(arm)}" data-outcome="{outcome}">'
                    f'<th>{_e(arm)}</th><td class="verdict">{mark}</td>'
                    f"<td><pre>{compact(s.texts[index])}</pre></td></tr>")
    return (f'<section class="task" data-family="{_e(family)}" data-variant="{_e(variant)}">'
            f"<h2>#{index + 1} &middot; {_e(family)} &middot; variant {_e(variant)} &middot; "
            f"<code>{_e(record['id'])}</code></h2>"
            f"<details><summary>prompt</summary><pre>{_e(record['prompt'])}</pre></details>"
            f"<p>target <code>{_e(record['target'])}</code></p>"
            f"<table>{''.join(rows)}</table></section>")


def render_page(title: str, arms: Mapping[str, ArmSummary], tests: FinalTest,
                scored: Mapping[str, Scored]) -> str:
    """The whole page as text (UTF-8 when written); ``arms`` are the learning totals."""
    families = list(dict.fromkeys(r["task"]["family"] for r in tests.records))
    variants = sorted({r["task"]["variant"] for r in tests.records})
    held = set(tests.held_out)
    summary = "".join(
        f"<tr><th>{_e(arm)}</th><td>{a.correct} / {a.documents}</td>"
        f"<td>{a.accuracy * 100:.2f}%</td><td>{a.valid_json_objects} valid JSON objects"
        f"</td></tr>" for arm, a in arms.items())
    filters = "".join([
        _select("f-family", "Family", [("", "all"), *[(f, f) for f in families]]),
        _select("f-variant", "Variant", [("", "all"), *[
            (str(v), f"{v} (held out)" if v in held else str(v)) for v in variants]]),
        _select("f-arm", "Arm", [("", "all"), *[(a, a) for a in scored]]),
        _select("f-outcome", "Outcome", [("", "any"), ("correct", "correct"),
                                         ("wrong", "wrong")]),
        '<span id="shown"></span>',
    ])
    tasks = "".join(_task(i, r, scored) for i, r in enumerate(tests.records))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}: every answer</title><style>{read_template('report-page.css')}</style></head><body>"
        f"<h1>{_e(title)}: every answer</h1>"
        '<p><a href="index.html">Summary</a> &middot; <a href="report.json">report.json</a>'
        "</p>"
        f"<p>All {len(tests.records)} final-test prompts with their checked targets and every "
        f"arm's retained answer, rescored by the strict checker for this page. Variants "
        f"{_e(', '.join(str(v) for v in tests.held_out) or 'none')} are held-out wordings.</p>"
        f'<table class="summary">{summary}</table>'
        f'<form id="filters" onsubmit="return false">{filters}</form>'
        f"<main>{tasks}</main><script>{read_template('report-page.js')}</script></body></html>\n"
    )
