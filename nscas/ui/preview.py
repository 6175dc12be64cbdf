"""Blob previews, by what the bytes are: JSONL as a paged table, a safetensors header as a tensor
table, images and SVG inline (as ``<img>``), HTML in a sandboxed frame, text, else a hex dump.

Every preview reads a bounded amount of the blob (``TEXT_BYTES``, a page of lines, the header):
a blob of gigabytes costs what a page shows, and its bytes come whole only as a download.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

SNIFF_BYTES = 64 << 10
"""What is read to tell the type of a blob (and the text shown of a text blob)."""
TEXT_BYTES = 64 << 10
PAGE_LINES = 50
"""JSONL lines per page."""
MAX_SCAN_BYTES = 256 << 20
"""How far into a JSONL blob a page may start: paging further is refused, not slow."""
CELL_CHARS = 2000
"""Characters of one table cell shown; the rest is cut, marked."""
HEADER_MAX = 16 << 20
"""The largest safetensors header previewed."""
IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif",
               "webp": "image/webp", "svg": "image/svg+xml"}

Kind = Literal["jsonl", "json", "safetensors", "png", "jpeg", "gif", "webp", "svg", "html",
               "text", "binary", "empty"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sniffed:
    kind: Kind
    name: str | None
    """A file name the blob has in some tree/1 record, if any."""

    @property
    def image(self) -> bool:
        return self.kind in IMAGE_TYPES

    @property
    def media_type(self) -> str:
        """What ``/raw`` serves the blob as (inline); anything not shown inline is octet."""
        if self.kind in IMAGE_TYPES:
            return IMAGE_TYPES[self.kind]
        if self.kind == "html":
            return "text/html; charset=utf-8"
        if self.kind in ("json", "jsonl", "text"):
            return "text/plain; charset=utf-8"
        return "application/octet-stream"


def sniff(store: ObjectReader, oid: Digest) -> Sniffed:
    """What a blob holds, judged from its first bytes and the names trees give it."""
    name = _tree_name(store, oid)
    head = _head(store, oid, SNIFF_BYTES)
    return Sniffed(kind=_kind(head, name, store.info(oid).size), name=name)


def _tree_name(store: ObjectReader, oid: Digest) -> str | None:
    for link in store.links_to(oid, limit=20):
        # tree/1 entries link as $.entries["<path>"].id
        inner = link.path.removeprefix("$.entries[").removesuffix("].id")
        if inner != link.path and link.path.endswith("].id"):
            try:
                name = json.loads(inner)
            except ValueError:
                continue
            if isinstance(name, str):
                return name
    return None


def _head(store: ObjectReader, oid: Digest, n: int) -> bytes:
    out = bytearray()
    for leaf in store.leaves(oid):
        out += store.read_leaf(*leaf)
        if len(out) >= n:
            break
    return bytes(out[:n])


def _kind(head: bytes, name: str | None, size: int) -> Kind:
    lower = (name or "").lower()
    if not head:
        return "empty"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if lower.endswith(".safetensors") or _safetensors_header_size(head, size) is not None:
        return "safetensors"
    text = _text(head, complete=len(head) == size)
    if text is None:
        return "binary"
    start = text.lstrip()[:512].lower()
    if lower.endswith(".svg") or start.startswith("<svg") or (
            start.startswith("<?xml") and "<svg" in text[:2048].lower()):
        return "svg"
    if lower.endswith((".html", ".htm")) or start.startswith(("<!doctype html", "<html")):
        return "html"
    if lower.endswith(".jsonl") or _jsonl(text, complete=len(head) == size):
        return "jsonl"
    if lower.endswith(".json") or start.startswith(("{", "[")):
        return "json"
    return "text"


def _text(head: bytes, *, complete: bool) -> str | None:
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not complete and exc.start >= len(head) - 3:  # a character cut at the end
            return head[:exc.start].decode("utf-8")
        return None


def _jsonl(text: str, *, complete: bool) -> bool:
    lines = text.splitlines()
    if not complete:
        lines = lines[:-1]  # the last may be cut
    lines = [ln for ln in lines[:50] if ln.strip()]
    if len(lines) < 1 or (len(lines) == 1 and not complete):
        return False
    try:
        return all(isinstance(json.loads(ln), dict) for ln in lines) and (
            len(lines) > 1 or text.endswith("\n"))
    except ValueError:
        return False


def _safetensors_header_size(head: bytes, size: int) -> int | None:
    if len(head) < 10:
        return None
    n: int = struct.unpack("<Q", head[:8])[0]
    if n < 2 or 8 + n > size or n > HEADER_MAX or head[8:9] != b"{":
        return None
    return n


# ---------------------------------------------------------------- previews


@dataclass(frozen=True, slots=True, kw_only=True)
class TextPreview:
    text: str
    truncated: bool


def text_preview(store: ObjectReader, oid: Digest) -> TextPreview:
    size = store.info(oid).size
    head = _head(store, oid, TEXT_BYTES)
    text = _text(head, complete=len(head) == size) or head.decode("utf-8", "replace")
    return TextPreview(text=text, truncated=size > len(head))


@dataclass(frozen=True, slots=True, kw_only=True)
class HexPreview:
    rows: tuple[tuple[str, str, str], ...]
    """(offset, hex, printable) per 16 bytes."""
    truncated: bool


def hex_preview(store: ObjectReader, oid: Digest, n: int = 1024) -> HexPreview:
    head = _head(store, oid, n)
    rows = tuple((f"{i:08x}", head[i:i + 16].hex(" "),
                  "".join(chr(b) if 32 <= b < 127 else "." for b in head[i:i + 16]))
                 for i in range(0, len(head), 16))
    return HexPreview(rows=rows, truncated=store.info(oid).size > len(head))


@dataclass(frozen=True, slots=True, kw_only=True)
class TablePage:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    first: int
    """The 1-based number of the first line shown."""
    page: int
    more: bool
    """Whether lines follow this page."""
    bad_lines: int
    """Lines of this page that are not JSON objects (shown whole in the first column)."""


class PageOutOfRange(Exception):
    """A page past the end of a JSONL blob, or beyond what a page may scan to."""

    def __init__(self, page: int, why: str) -> None:
        super().__init__(f"page {page}: {why}")
        self.page = page
        self.why = why


def jsonl_page(store: ObjectReader, oid: Digest, page: int) -> TablePage:
    """Lines ``(page-1)*PAGE_LINES + 1`` onwards, as a table of their members."""
    start = (page - 1) * PAGE_LINES
    lines: list[bytes] = []
    more = False
    scanned = 0
    for index, line in enumerate(_lines(store, oid)):
        scanned += len(line)
        if index < start:
            if scanned > MAX_SCAN_BYTES:
                raise PageOutOfRange(page, f"it starts more than {MAX_SCAN_BYTES >> 20} MiB "
                                           "into the blob; download it to read that far")
            continue
        if len(lines) == PAGE_LINES:
            more = True
            break
        lines.append(line)
    if not lines and page > 1:
        raise PageOutOfRange(page, "the blob has fewer lines")
    parsed: list[dict[str, Any] | str] = []
    for raw in lines:
        text = raw.decode("utf-8", "replace").rstrip("\n")
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        parsed.append(value if isinstance(value, dict) else text)
    columns = tuple(dict.fromkeys(k for v in parsed if isinstance(v, dict) for k in v))
    rows = []
    for v in parsed:
        if isinstance(v, dict):
            rows.append(tuple(cell(v[c]) if c in v else "" for c in columns))
        else:
            rows.append((cell(v), *("" for _ in columns[1:])))
    return TablePage(columns=columns or ("line",), rows=tuple(rows), first=start + 1,
                     page=page, more=more, bad_lines=sum(isinstance(v, str) for v in parsed))


def cell(value: Any) -> str:
    """A value as a table cell: strings as they are, the rest as compact JSON; cut long."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + f"… ({len(text)} chars)"


def _lines(store: ObjectReader, oid: Digest) -> Iterator[bytes]:
    with store.open(oid) as f:
        yield from f


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    name: str
    dtype: str
    shape: str
    start: int
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorTable:
    tensors: tuple[Tensor, ...]
    metadata: tuple[tuple[str, str], ...]
    error: str | None
    """Why the header could not be read, if it could not."""


def safetensors_header(store: ObjectReader, oid: Digest) -> TensorTable:
    size = store.info(oid).size
    head = _head(store, oid, 8)
    if len(head) < 8:
        return TensorTable(tensors=(), metadata=(), error="shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > HEADER_MAX or 8 + n > size:
        return TensorTable(tensors=(), metadata=(),
                           error=f"a header of {n} bytes (in a blob of {size})")
    try:
        header = json.loads(_head(store, oid, 8 + n)[8:])
    except ValueError as exc:
        return TensorTable(tensors=(), metadata=(), error=f"the header is not JSON ({exc})")
    if not isinstance(header, dict):
        return TensorTable(tensors=(), metadata=(), error="the header is not a JSON object")
    meta = header.pop("__metadata__", None)
    tensors = []
    for name, t in header.items():
        if not isinstance(t, dict):
            continue
        offsets = t.get("data_offsets") or [0, 0]
        tensors.append(Tensor(name=name, dtype=str(t.get("dtype")),
                              shape="×".join(str(d) for d in t.get("shape") or []) or "scalar",
                              start=_int(offsets[0]), end=_int(offsets[-1])))
    metadata = tuple((str(k), cell(v)) for k, v in meta.items()) if isinstance(meta, dict) else ()
    return TensorTable(tensors=tuple(tensors), metadata=metadata, error=None)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
