"""The tamperer against the report's summary page (index.html) in a consistently rewritten
bundle: every hash, link and checksum holds, only the page says something else. An edited
number, an injected script and a removed row each fail the page's own check (and the byte
comparison), nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import Demo, verify_here
from .test_tamper_classes import integrity_holds, label, rewrite

INDEX = "report/index.html"


def _drop_first_row(text: str, header: str) -> str:
    start = text.index(f"<tr><th>{header}</th>")
    return text[:start] + text[text.index("</tr>", start) + len("</tr>"):]


@pytest.mark.parametrize(("edit", "part"), [
    pytest.param(lambda s: re.sub(r'(<th>Accuracy</th><td class="n">)[0-9.]+%',
                                  r"\g<1>99.99%", s, count=1), "learning", id="number"),
    pytest.param(lambda s: s.replace("<h2>Serving</h2>",
                                     "<h2>Serving</h2><script>alert(1)</script>", 1),
                 "serving", id="script"),
    pytest.param(lambda s: s.replace('<p id="action">',
                                     '<img src="https://example.com/p.gif"><p id="action">', 1),
                 "head", id="external"),
    pytest.param(lambda s: _drop_first_row(s, "Updates"), "training", id="row"),
])
def test_an_edited_summary_page_fails(demo: Demo, tmp_path: Path, edit: Any,
                                      part: str) -> None:
    r = rewrite(demo, tmp_path)
    path = r.find(INDEX)
    before = r.bytes(path).decode()
    assert edit(before) != before, "the page no longer has what this test edits"
    r.edit_text(path, edit)
    v = verify_here(r.seal())
    integrity_holds(v)
    name = label("report", r.target)
    assert v.code == 1
    assert v.failed() == {f"{name}.index.{part}", f"{name}.index.exact"}, sorted(v.failed())
