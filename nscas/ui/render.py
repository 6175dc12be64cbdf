"""Rendering: the Jinja2 environment (autoescape on for every template), the filters the
templates use, and records as pretty-printed JSON whose IDs are links.

Every string that comes from a record or a blob reaches the page through autoescape or through
``markupsafe.escape`` here; nothing here marks store text safe unescaped.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from nscas.objects.digests import Digest

ID_TEXT = re.compile(r"blake3:[0-9a-f]{64}")
INDENT = "  "
_MAX_ITEMS = 2000  # members or items of one JSON value shown before "… N more"


@cache
def environment() -> Environment:
    env = Environment(loader=PackageLoader("nscas.ui", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(short=short, human=human, json_html=json_html, seconds=seconds,
                       idlink=idlink, q=quote_path, size=size, count=count)
    env.globals.update(url=url)
    return env


def page(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def short(oid: Digest | str | None) -> str:
    """``blake3:`` and 12 hex digits (still a valid prefix)."""
    if oid is None:
        return "-"
    text = str(oid)
    return text[:19] if ID_TEXT.fullmatch(text) else text


def quote_path(text: str) -> str:
    """A ref name or ID as a URL path segment (slashes kept: refs have them)."""
    return quote(str(text), safe="/:@")


def url(path: str, /, **query: Any) -> str:
    """``path?query``, leaving out empty values; list values repeat their key."""
    pairs: list[tuple[str, str]] = []
    for key, value in query.items():
        for v in value if isinstance(value, list | tuple) else [value]:
            if v is not None and v != "":
                pairs.append((key, str(v)))
    return path + ("?" + urlencode(pairs) if pairs else "")


def idlink(oid: Digest | str | None) -> Markup:
    if oid is None:
        return Markup("-")
    text = str(oid)
    return Markup('<a class="id" href="/object/{}" title="{}">{}</a>').format(
        quote_path(text), text, short(text))


def human(value: Any) -> str:
    """Floats to 4 significant digits for people; everything else as it is."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


def size(value: int | None) -> str:
    """A byte count for people: ``812 bytes``, ``3.24 MiB``."""
    if value is None:
        return "-"
    amount, unit = float(value), 0
    while amount >= 1024 and unit < len(_UNITS) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{value} bytes" if unit == 0 else f"{amount:.3g} {_UNITS[unit]}"


def count(value: int | None) -> str:
    """A count with thousands separators: ``1,234,567``."""
    return "-" if value is None else f"{value:,}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.3g} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60)} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60)} min"


def duration(started: Any, finished: Any) -> float | None:
    """Seconds from a receipt's ``started`` to ``finished`` (None if either is unreadable)."""
    try:
        a = datetime.fromisoformat(str(started))
        b = datetime.fromisoformat(str(finished))
        return max(0.0, (b - a).total_seconds())
    except (ValueError, TypeError):
        return None


def json_html(value: Any) -> Markup:
    """A JSON value pretty-printed as HTML: strings escaped, full IDs linked to their page."""
    out: list[str] = []
    _emit(value, 0, out)
    return Markup("".join(out))


def _emit(value: Any, level: int, out: list[str]) -> None:
    pad = INDENT * (level + 1)
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        out.append("{\n")
        items = list(value.items())
        for i, (k, v) in enumerate(items[:_MAX_ITEMS]):
            out.append(f'{pad}<span class="k">{escape(json.dumps(str(k), ensure_ascii=False))}</span>: ')
            _emit(v, level + 1, out)
            out.append(",\n" if i < len(items) - 1 else "\n")
        if len(items) > _MAX_ITEMS:
            out.append(f"{pad}… {len(items) - _MAX_ITEMS} more members\n")
        out.append(INDENT * level + "}")
    elif isinstance(value, list):
        if not value:
            out.append("[]")
            return
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in value) and len(value) <= 64:
            out.append(escape(json.dumps(value)))
            return
        out.append("[\n")
        for i, v in enumerate(value[:_MAX_ITEMS]):
            out.append(pad)
            _emit(v, level + 1, out)
            out.append(",\n" if i < len(value) - 1 else "\n")
        if len(value) > _MAX_ITEMS:
            out.append(f"{pad}… {len(value) - _MAX_ITEMS} more items\n")
        out.append(INDENT * level + "]")
    elif isinstance(value, str):
        if ID_TEXT.fullmatch(value):
            out.append(str(Markup('"<a class="id" href="/object/{}">{}</a>"').format(value, value)))
        else:
            out.append(f'<span class="s">{escape(json.dumps(value, ensure_ascii=False))}</span>')
    else:
        out.append(f'<span class="n">{escape(json.dumps(value))}</span>')
