"""The only module of the CLI that prints: rich on a terminal, plain text otherwise, JSON on request.

rich is imported only when stdout is a terminal, so scripted use (and ``--json``) stays cheap
and its output carries no colour codes or box drawing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ERROR_PREFIX = "nscas: error: "
_FULL_ID = re.compile(r"blake3:([0-9a-f]{12})[0-9a-f]{52}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Branch:
    """One line of a rendered tree and the lines under it."""

    label: str
    children: tuple[Branch, ...] = field(default=())


def is_tty() -> bool:
    return sys.stdout.isatty()


def _abbrev(text_: str) -> str:
    """Full IDs shortened to 12 hex digits, for terminal tables and trees (still valid prefixes)."""
    return _FULL_ID.sub(r"\1", text_)


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(file=sys.stderr if stderr else sys.stdout, highlight=False)


def json_out(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def text(line: str = "") -> None:
    """A line for the reader, printed as is (no markup interpretation)."""
    sys.stdout.write(line + "\n")


def error(message: str) -> None:
    """The one-line form of every user-facing error, on stderr."""
    line = " ".join(message.split())  # one line even if a message carries newlines
    sys.stderr.write(ERROR_PREFIX + line + "\n")


def raw(chunks: Iterable[bytes]) -> None:
    """Bytes to stdout unchanged (``nscas cat``)."""
    out = sys.stdout.buffer
    for chunk in chunks:
        out.write(chunk)
    out.flush()


def fields(pairs: Sequence[tuple[str, str]]) -> None:
    """``key: value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0) + 1
    for key, value in pairs:
        text(f"{key + ':':<{width}} {value}")


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None) -> None:
    """A rich table on a terminal (IDs abbreviated); otherwise a header line and aligned columns."""
    if is_tty():
        from rich.markup import escape
        from rich.table import Table

        # Cells are data (paths, names): escaped so that "[red]" in a file name stays text.
        t = Table(title=escape(title) if title else None, title_justify="left")
        for name in columns:
            t.add_column(escape(name), overflow="fold", no_wrap=name == "time")
        for row in rows:
            t.add_row(*(escape(_abbrev(cell)) for cell in row))
        _console().print(t)
        return
    if title:
        text(title)
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows, strict=False)]
    for row in (columns, *rows):
        cells = [f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=False)]
        text("  ".join([*cells, str(row[-1])]).rstrip())


def record(value: Any) -> None:
    """A JSON value pretty-printed: highlighted on a terminal, indented JSON otherwise."""
    if is_tty():
        from rich.json import JSON

        _console().print(JSON(json.dumps(value)), soft_wrap=True)
    else:
        text(json.dumps(value, indent=2))


def tree(root: Branch) -> None:
    """A rich tree on a terminal (IDs abbreviated); ASCII guides otherwise, for any locale."""
    if is_tty():
        from rich.markup import escape
        from rich.tree import Tree

        def build(node: Branch, into: Any) -> None:
            for child in node.children:
                build(child, into.add(escape(_abbrev(child.label))))

        top = Tree(escape(_abbrev(root.label)))
        build(root, top)
        _console().print(top)
        return
    text(root.label)

    def walk(node: Branch, indent: str) -> None:
        for i, child in enumerate(node.children):
            last = i == len(node.children) - 1
            text(f"{indent}{'`-- ' if last else '|-- '}{child.label}")
            walk(child, indent + ("    " if last else "|   "))

    walk(root, "")


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while it runs, only on a terminal; yields ``advance(n)``."""
    if not (is_tty() and sys.stderr.isatty()):
        yield lambda n: None
        return
    from rich.progress import Progress

    with Progress(console=_console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
