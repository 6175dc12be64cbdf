"""index.html: the report's summary page, drawn from report.json alone (and nothing else, so
a verifier that has checked report.json renders the same page from it).

The page holds the headline tables of the published report (per arm: correct answers,
accuracy, each task family, the held-out variants, valid JSON objects; the paired McNemar
comparisons; retention; training cost; serving; the parameter differences of the compared
arms, per tensor in a collapsed ``<details>``), every figure (linked and shown by relative
path, so the page works offline from a bundle or a ``nscas get`` copy), the input receipt,
commitment and prepared IDs, links to generations.html and the raw files, and the report's
action ID in its top right corner (an output cannot hold the ID of the receipt that links
it; that receipt records this action).

The page is the template docs/spec/report-index.html.jinja (installed as ``nscas.spec``
package data), rendered with the settings docs/format.md §6.11 gives; the verifiers render the
same file. Its SHA-256 is pinned here and there: a template that is not the pinned one is
refused, never rendered. Every string goes through ``html.escape`` (quotes included); the page
has no script and loads nothing but its own figure files.
"""

from __future__ import annotations

from html import escape
from typing import Any

import jinja2

from .templates import read_template

Report = dict[str, Any]


def _escape(value: Any) -> str:
    return escape(str(value), quote=True)


def render_index(report: Report) -> str:
    """The whole page as text (UTF-8 when written), from report.json's parsed content."""
    env = jinja2.Environment(autoescape=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.do"])
    env.filters["e"] = _escape
    return env.from_string(read_template("report-index.html.jinja")).render(report=report)
