"""The security headers of every response of the UI (docs/ui.md): a strict CSP for pages, and
for a blob's own bytes a sandbox with no script at all."""

from __future__ import annotations

PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-src 'self'; connect-src 'self'; font-src 'self'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'")
RAW_CSP = ("sandbox; default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
           "font-src 'self' data:; frame-ancestors 'self'")
"""For a blob's own bytes: no script at all (``sandbox`` without ``allow-scripts``), an opaque
origin, and framed only by the UI's own pages."""


def security_headers(*, raw: bool = False) -> dict[str, str]:
    """The headers a page carries (``raw``: a blob's own bytes)."""
    return {"Content-Security-Policy": RAW_CSP if raw else PAGE_CSP,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "SAMEORIGIN" if raw else "DENY",
            "Referrer-Policy": "no-referrer",
            "Cross-Origin-Opener-Policy": "same-origin",
            "Cross-Origin-Resource-Policy": "same-origin",
            "Cache-Control": "no-store"}
