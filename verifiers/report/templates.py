"""The page templates docs/format.md §6.11 defines, read as data (docs/spec/, installed as
``nscas.spec`` package data) and used only after their SHA-256 is checked against the digests
pinned here, written from that section: the verifiers run no code of the product's."""

from __future__ import annotations

import hashlib
from importlib import resources

from ..core.errors import VerifierError

SHA256 = {
    "report-index.html.jinja": "99ab3e414c501a23abf377f0905415c6f572d05c501d13619b988fb8862626cf",
    "report-page.css": "17f687fc4f47fcc1fca1ef29c9a0c0631ddf0aee72e388b5547a43c0f101c390",
    "report-page.js": "bb75b74a02449f95b0596f329d4eb3e9e3d57bc06cc57614cb3d4eddfbffc778",
}
"""docs/format.md §6.11: each template's SHA-256."""


def pinned_text(name: str) -> str:
    """Template ``name`` as text, once its bytes are the pinned ones."""
    try:
        data = resources.files("nscas.spec").joinpath(name).read_bytes()
    except (ModuleNotFoundError, OSError) as exc:
        raise VerifierError(f"the page template {name} is not readable ({exc})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[name]:
        raise VerifierError(f"the page template {name} has SHA-256 {digest}, not the "
                            f"{SHA256[name]} of docs/format.md §6.11")
    return data.decode("utf-8")
