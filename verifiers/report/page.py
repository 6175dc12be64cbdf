"""generations.html rechecked: the verifiers render the page they expect from their own
recomputation (every test prompt and target, every arm's retained answer with the verdict of
the verifiers' own rescoring, each arm's counts) and compare it with the published page.

The comparison is by structure, so that a finding says what a reader would see wrongly, and
then byte for byte, so that nothing outside those parts (the inline style or script, an
extra element) can change what the page shows. ``html.parser`` tokenises both pages the same
way; every token is sorted into the part of the page it belongs to:

- ``headline``: everything before the filter form: the title, the heading, the sentence with
  the number of prompts and the held-out variants, the table of per-arm counts, accuracy and
  valid JSON objects;
- ``filters``: the filter form (families, variants with their held-out marks, arms);
- ``tasks``: each task's section outside its answer rows: family, variant, number, task id,
  prompt and target;
- ``verdicts``: each answer row's arm, class, outcome and verdict text;
- ``answers``: each answer row's answer text;
- ``exact``: the whole page, byte for byte.

The page is rendered here from docs/experiment.md §6.6, its inline CSS and script read from
the pinned data files of docs/format.md §6.11 (``templates``). Version 2
(``report@2``) adds a line of links (to index.html and report.json) under the heading, a
``.gap`` style, and shows each answer compactly: every run of ``GAP_LINES`` or more blank
lines (only spaces, tabs or carriage returns on them) after a line break is one marker line
``&#8942; <n> blank lines``; version 1 shows answers as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from html import escape
from html.parser import HTMLParser
from typing import Any

from .templates import pinned_text

GAP_STYLE = ".gap{color:#6b7280;font-style:italic}\n"
"""The style report@2 added; report@1's page has the same CSS without it."""
GAP_LINES = 3
GAP = re.compile(r"\n(?:[ \t\r]*\n){" + str(GAP_LINES) + ",}")



MAX_DEPTH = 64
"""Open elements a page may nest; deeper is a finding, not a parse."""
PARTS = ("headline", "filters", "tasks", "verdicts", "answers")


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def compact(text: str) -> str:
    """An answer as version 2 shows it: escaped, each long run of blank lines one marker."""
    out, at = [], 0
    for m in GAP.finditer(text):
        out.append(_e(text[at:m.start()]))
        out.append(f'\n<span class="gap">&#8942; {m.group().count(chr(10)) - 1} blank lines'
                   "</span>\n")
        at = m.end()
    out.append(_e(text[at:]))
    return "".join(out)


def _select(ident: str, label: str, options: list[tuple[str, str]]) -> str:
    items = "".join(f'<option value="{_e(v)}">{_e(text)}</option>' for v, text in options)
    return f'<label>{_e(label)} <select id="{ident}">{items}</select></label>'



def page_css(version: int) -> str:
    """The page's inline CSS: docs/spec/report-page.css (report@2), less ``GAP_STYLE`` for report@1."""
    css = pinned_text("report-page.css")
    return css if version >= 2 else css.replace(GAP_STYLE, "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One arm's retained answer to one task, with the verifiers' verdict."""

    text: str
    correct: bool
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    id: str
    family: str
    variant: Any
    prompt: str
    target: str
    answers: dict[str, Answer]
    """By arm, in report order."""


def _task(index: int, task: Task, version: int) -> str:
    show = compact if version >= 2 else _e
    rows = []
    for arm, a in task.answers.items():
        outcome = "correct" if a.correct else "wrong"
        mark = "&#10003; correct" if a.correct else f"&#10007; {_e(a.reason)}"
        rows.append(f'<tr class="{outcome}" data-arm="{_e(arm)}" data-outcome="{outcome}">'
                    f'<th>{_e(arm)}</th><td class="verdict">{mark}</td>'
                    f"<td><pre>{show(a.text)}</pre></td></tr>")
    return (f'<section class="task" data-family="{_e(task.family)}" '
            f'data-variant="{_e(task.variant)}">'
            f"<h2>#{index + 1} &middot; {_e(task.family)} &middot; variant {_e(task.variant)} "
            f"&middot; <code>{_e(task.id)}</code></h2>"
            f"<details><summary>prompt</summary><pre>{_e(task.prompt)}</pre></details>"
            f"<p>target <code>{_e(task.target)}</code></p>"
            f"<table>{''.join(rows)}</table></section>")


def render(title: str, arms: Mapping[str, Mapping[str, Any]], tasks: Sequence[Task],
           held_out: Sequence[Any], *, version: int = 1) -> str:
    """The page report@``version`` must have written: ``arms`` is the recomputed
    ``learning.arms`` (``correct``, ``documents``, ``accuracy`` as a Fraction or float,
    ``valid_json_objects``)."""
    families = list(dict.fromkeys(t.family for t in tasks))
    variants = sorted({t.variant for t in tasks})
    held = set(held_out)
    summary = "".join(
        f"<tr><th>{_e(arm)}</th><td>{a['correct']} / {a['documents']}</td>"
        f"<td>{_percent(a['accuracy'])}%</td><td>{a['valid_json_objects']} valid JSON objects"
        f"</td></tr>" for arm, a in arms.items())
    names = list(tasks[0].answers) if tasks else list(arms)
    filters = "".join([
        _select("f-family", "Family", [("", "all"), *[(f, f) for f in families]]),
        _select("f-variant", "Variant", [("", "all"), *[
            (str(v), f"{v} (held out)" if v in held else str(v)) for v in variants]]),
        _select("f-arm", "Arm", [("", "all"), *[(a, a) for a in names]]),
        _select("f-outcome", "Outcome", [("", "any"), ("correct", "correct"),
                                         ("wrong", "wrong")]),
        '<span id="shown"></span>',
    ])
    body = "".join(_task(i, t, version) for i, t in enumerate(tasks))
    links = ('<p><a href="index.html">Summary</a> &middot; <a href="report.json">report.json'
             "</a></p>") if version >= 2 else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}: every answer</title>"
        f"<style>{page_css(version)}</style></head><body>"
        f"<h1>{_e(title)}: every answer</h1>{links}"
        f"<p>All {len(tasks)} final-test prompts with their checked targets and every "
        f"arm's retained answer, rescored by the strict checker for this page. Variants "
        f"{_e(', '.join(str(v) for v in held_out) or 'none')} are held-out wordings.</p>"
        f'<table class="summary">{summary}</table>'
        f'<form id="filters" onsubmit="return false">{filters}</form>'
        f"<main>{body}</main><script>{pinned_text('report-page.js')}</script></body></html>\n"
    )


def _percent(accuracy: Fraction | float) -> str:
    """As the recipe prints it: the float accuracy times 100, two decimals."""
    return f"{float(accuracy) * 100:.2f}"


# --- reading a page ------------------------------------------------------------------------

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "source", "track", "wbr"})


class _Reader(HTMLParser):
    """Sorts every token of a page into (part, task number, row number) groups."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.groups: dict[tuple[str, int, int], list[str]] = {}
        self.stack: list[str] = []
        self.task = -1
        self.row = -1
        self.in_form = False
        self.seen_form = False
        self.cell = ""
        self.problem: str | None = None

    def _part(self) -> tuple[str, int, int]:
        if "section" in self.stack:
            if "tr" in self.stack:
                return ("answers" if self.cell == "answer" else "verdicts", self.task, self.row)
            return ("tasks", self.task, -1)
        if self.in_form:
            return ("filters", -1, -1)
        if not self.seen_form:
            return ("headline", -1, -1)
        return ("other", -1, -1)

    def _add(self, token: str, part: tuple[str, int, int] | None = None) -> None:
        self.groups.setdefault(part or self._part(), []).append(token)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section" and "section" not in self.stack:
            self.task += 1
            self.row = -1
        if tag == "tr" and "section" in self.stack:
            self.row += 1
            self.cell = ""
        if tag == "form":
            self.in_form = self.seen_form = True
        if tag in ("th", "td") and "tr" in self.stack and "section" in self.stack:
            verdict = tag == "th" or ("class", "verdict") in attrs
            self.cell = "verdict" if verdict else "answer"
        shown = " ".join(f"{k}={v!r}" for k, v in attrs)
        if tag not in VOID:
            self.stack.append(tag)
            if len(self.stack) > MAX_DEPTH and self.problem is None:
                self.problem = f"elements nest deeper than {MAX_DEPTH}"
        self._add(f"<{tag} {shown}>".replace(" >", ">"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._add(f"<{tag} {' '.join(f'{k}={v!r}' for k, v in attrs)}/>")

    def handle_endtag(self, tag: str) -> None:
        part = self._part()
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass
        if tag == "form":
            self.in_form = False
        self._add(f"</{tag}>", part)
        if tag in ("td", "th"):
            self.cell = ""

    def handle_data(self, data: str) -> None:
        self._add(data)

    def handle_decl(self, decl: str) -> None:
        self._add(f"<!{decl}>")

    def unknown_decl(self, data: str) -> None:
        self._add(f"<![{data}]>")

    def handle_comment(self, data: str) -> None:
        self._add(f"<!--{data}-->")

    def handle_pi(self, data: str) -> None:
        self._add(f"<?{data}>")


def read_page(text: str) -> tuple[dict[tuple[str, int, int], list[str]], str | None]:
    """The page's tokens by part, and a problem when the page cannot be read as one."""
    reader = _Reader()
    try:
        reader.feed(text)
        reader.close()
    except Exception as exc:  # hostile markup: a finding, never a crash
        return reader.groups, f"not readable as HTML ({type(exc).__name__}: {exc})"
    return reader.groups, reader.problem


def _where(key: tuple[str, int, int], tasks: Sequence[Task]) -> str:
    part, task, row = key
    if task < 0:
        return part
    what = f"task #{task + 1}"
    if 0 <= task < len(tasks):
        what += f" ({tasks[task].id[:12]})"
    if row >= 0:
        arms = list(tasks[task].answers) if 0 <= task < len(tasks) else []
        what += f", row {row + 1}" + (f" ({arms[row]})" if row < len(arms) else "")
    return what


def _short(tokens: list[str], index: int) -> str:
    if index >= len(tokens):
        return "nothing"
    text = tokens[index]
    return repr(text if len(text) <= 80 else text[:77] + "...")


def compare_pages(page: str, expected: str,
                  tasks: Sequence[Task]) -> tuple[dict[str, list[str]], bool]:
    """Problems by part (``PARTS``, plus ``exact``), and whether the bytes are equal."""
    problems: dict[str, list[str]] = {part: [] for part in (*PARTS, "exact")}
    if page == expected:
        return problems, True
    mine, _ = read_page(expected)
    theirs, unreadable = read_page(page)
    if unreadable is not None:
        problems["exact"].append(unreadable)
    for key in sorted(set(mine) | set(theirs)):
        a, b = theirs.get(key, []), mine.get(key, [])
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        part = key[0] if key[0] in PARTS else "exact"
        problems[part].append(f"{_where(key, tasks)} shows {_short(a, first)} where "
                              f"{_short(b, first)} was recomputed")
    if not problems["exact"]:
        shown = [part for part in PARTS if problems[part]]
        problems["exact"].append("the page's bytes differ from the recomputed page's"
                                 + (f" (in {', '.join(shown)})" if shown else ""))
    return problems, False
