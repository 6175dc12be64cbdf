"""index.html rechecked: the verifiers render the summary page report@2 must have written
and compare it with the published one, section by section and then byte for byte.

The page is a function of report.json and nothing else (its ``action`` member is the
report's action ID). The verifiers render it from their own recomputation of report.json
(``strict.settle``: report.json's own value at each leaf equal to the recomputed one
under the comparison rules, so a float that agrees within ``float_recomputation`` is printed
as the report printed it) and the receipt's action ID. So a page that shows anything but the
recomputed numbers fails here, whatever report.json says, and an edit of report.json alone
fails only report.json's own checks.

Parts, each a check ``index.<part>``: ``head`` (everything outside the sections: title,
action corner, intro) and one per section in ``SECTIONS`` (``learning``, ``comparisons``,
``retention``, ``training``, ``serving``, ``parameters``, ``resources``, ``figures``,
``identity``, ``files``), then ``exact``: the whole page, byte for byte, so an element outside any part
(an injected script) still fails.

The page is rendered from the template docs/format.md §6.11 defines
(docs/spec/report-index.html.jinja, installed as ``nscas.spec`` package data: data, not code)
under the settings that section gives, after checking the file's SHA-256 against the digest
pinned here; a template that is not the pinned one makes the index checks fail.
"""

from __future__ import annotations

from functools import lru_cache
from html import escape
from html.parser import HTMLParser
from typing import Any

import jinja2

from .templates import pinned_text

SECTIONS = ("learning", "comparisons", "retention", "training", "serving", "parameters",
            "resources", "figures", "identity", "files")
"""The page's sections in order, by their element IDs (docs/experiment.md §6.6)."""

Report = dict[str, Any]


def render_index(report: Report) -> str:
    """The page report@2 writes for ``report`` (report.json's content with its action ID)."""
    return _compiled(pinned_text("report-index.html.jinja")).render(report=report)


@lru_cache(maxsize=2)  # keyed by the template text itself, so never stale
def _compiled(text: str) -> jinja2.Template:
    """The page template compiled under docs/format.md §6.11's settings (once per text)."""
    env = jinja2.Environment(autoescape=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.do"])
    env.filters["e"] = lambda value: escape(str(value), quote=True)
    return env.from_string(text)


# --- reading a page ------------------------------------------------------------------------

PARTS = ("head", *SECTIONS)
MAX_DEPTH = 64
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "source", "track", "wbr"})


class _Reader(HTMLParser):
    """Sorts every token of a page by the top-level section it is in (``head`` outside)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.groups: dict[str, list[str]] = {}
        self.stack: list[str] = []
        self.section: str | None = None
        self.depth = 0
        self.problem: str | None = None

    def _add(self, token: str) -> None:
        part = self.section if self.section in PARTS else ("head" if self.section is None
                                                           else "other")
        self.groups.setdefault(part, []).append(token)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section" and self.section is None:
            self.section = dict(attrs).get("id") or "other"
            self.depth = len(self.stack)
        if tag not in VOID:
            self.stack.append(tag)
            if len(self.stack) > MAX_DEPTH and self.problem is None:
                self.problem = f"elements nest deeper than {MAX_DEPTH}"
        shown = " ".join(f"{k}={v!r}" for k, v in attrs)
        self._add(f"<{tag} {shown}>".replace(" >", ">"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._add(f"<{tag} {' '.join(f'{k}={v!r}' for k, v in attrs)}/>")

    def handle_endtag(self, tag: str) -> None:
        self._add(f"</{tag}>")
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass
        if self.section is not None and len(self.stack) <= self.depth:
            self.section = None

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


def read_index(text: str) -> tuple[dict[str, list[str]], str | None]:
    """The page's tokens by part, and a problem when it cannot be read as one page."""
    reader = _Reader()
    try:
        reader.feed(text)
        reader.close()
    except Exception as exc:  # hostile markup: a finding, never a crash
        return reader.groups, f"not readable as HTML ({type(exc).__name__}: {exc})"
    return reader.groups, reader.problem


def _short(tokens: list[str], index: int) -> str:
    if index >= len(tokens):
        return "nothing"
    text = tokens[index]
    return repr(text if len(text) <= 80 else text[:77] + "...")


def compare_index(page: str, expected: str) -> tuple[dict[str, list[str]], bool]:
    """Problems by part (``PARTS``, plus ``exact``), and whether the bytes are equal."""
    problems: dict[str, list[str]] = {part: [] for part in (*PARTS, "exact")}
    if page == expected:
        return problems, True
    mine, _ = read_index(expected)
    theirs, unreadable = read_index(page)
    if unreadable is not None:
        problems["exact"].append(unreadable)
    for key in sorted(set(mine) | set(theirs)):
        a, b = theirs.get(key, []), mine.get(key, [])
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        part = key if key in PARTS else "exact"
        problems[part].append(f"{key if key in PARTS else 'outside the known sections'} "
                              f"shows {_short(a, first)} where {_short(b, first)} was rendered")
    if not problems["exact"]:
        shown = [part for part in PARTS if problems[part]]
        problems["exact"].append("the page's bytes differ from the rendered page's"
                                 + (f" (in {', '.join(shown)})" if shown else ""))
    return problems, False
