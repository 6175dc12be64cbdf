"""Credentials never print: the one function that hides them in any text nscas shows.

Every library error passes its message through :func:`redact` (``NscasError``), and so do the
CLI's error lines and ``--json`` output and the UI's error page: a URL's ``user:password@``,
a secret query parameter (``password=``, ``sslpassword=``, S3 keys and signatures), a libpq
keyword string's ``password=...``, and the literal values of the secret environment variables
(``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``, ...) all become ``***``. The standard library only.
"""

from __future__ import annotations

import os
import re

HIDDEN = "***"
SECRET_PARAMETERS = frozenset({
    "password", "pass", "passwd", "pwd", "sslpassword", "passfile", "sslkey", "secret",
    "token", "access_token", "auth", "authorization", "api_key", "apikey",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "access_key_id",
    "secret_access_key", "session_token", "x-amz-credential", "x-amz-signature",
    "x-amz-security-token", "signature", "awsaccesskeyid",
})
"""Query parameters (and libpq keywords) whose value is a credential, compared casefolded."""
SECRET_ENVIRONMENT = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN",
                      "PGPASSWORD", "PGSSLPASSWORD")
"""Environment variables whose values never print, wherever they turn up in a message."""
_MIN_SECRET = 4  # shorter environment values would hide ordinary words

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/?#@:]*):"
                       r"(?P<password>[^\s/?#]*)@")
_PARAMETER = re.compile(r"(?P<key>[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>\s*=\s*)"
                        r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;#'\"]+)")


def redact(text: str, *, secrets: tuple[str | None, ...] = ()) -> str:
    """``text`` with every credential in it replaced by ``***``; ``secrets`` are further
    literal values to hide (a store.toml's S3 keys)."""
    if not text:
        return text
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{HIDDEN}@", text)
    out = _PARAMETER.sub(_parameter, out)
    values = [os.environ.get(name) for name in SECRET_ENVIRONMENT] + list(secrets)
    for value in sorted({v for v in values if v and len(v) >= _MIN_SECRET}, key=len, reverse=True):
        out = out.replace(value, HIDDEN)
    return out


def _parameter(m: re.Match[str]) -> str:
    key = m["key"].rsplit("?", 1)[-1]
    if key.casefold() not in SECRET_PARAMETERS:
        return m[0]
    return f"{m['key']}{m['sep']}{HIDDEN}"
