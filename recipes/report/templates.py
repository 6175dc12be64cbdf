"""The report's page templates: data files of docs/format.md §6.11 (docs/spec/, installed as
``nscas.spec`` package data), each read only when its SHA-256 is the one pinned there; the
verifiers read the same files and pin the same digests."""

from __future__ import annotations

import hashlib
from importlib import resources

from nscas.errors import RecipeError

PINNED = {
    "report-index.html.jinja": "99ab3e414c501a23abf377f0905415c6f572d05c501d13619b988fb8862626cf",
    "report-page.css": "17f687fc4f47fcc1fca1ef29c9a0c0631ddf0aee72e388b5547a43c0f101c390",
    "report-page.js": "bb75b74a02449f95b0596f329d4eb3e9e3d57bc06cc57614cb3d4eddfbffc778",
}
"""File name -> SHA-256, as docs/format.md §6.11 pins them."""


def read_template(name: str) -> str:
    """The text of template ``name``; a file that is not the pinned one is refused."""
    data = resources.files("nscas.spec").joinpath(name).read_bytes()
    if hashlib.sha256(data).hexdigest() != PINNED[name]:
        raise RecipeError(f"the installed page template {name} is not the one docs/format.md "
                          "§6.11 pins (its SHA-256 differs): reinstall nscas")
    return data.decode("utf-8")
