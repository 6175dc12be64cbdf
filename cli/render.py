"""The only module of the CLI that prints: rich on a terminal, plain text otherwise, JSON on request.

rich is imported only when stdout is a terminal, so scripted use (and ``--json``) stays cheap
and its output carries no colour codes or box drawing.
"""

from __future__ import annotations

import errno
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

ERROR_PREFIX = "nscas: error: "
_FULL_ID = re.compile(r"blake3:([0-9a-f]{12})[0-9a-f]{52}")
_SHORT_ID = re.compile(r"(?<![0-9a-z])[0-9a-f]{12}(?![0-9a-z])")


class Branch(NamedTuple):
    """One line of a rendered tree and the lines under it."""

    label: str
    children: tuple[Branch, ...] = ()


def is_tty() -> bool:
    return sys.stdout.isatty()


def _abbrev(text_: str) -> str:
    """Full IDs shortened to 12 hex digits, for terminal tables and trees (still valid prefixes)."""
    return _FULL_ID.sub(r"\1", text_)


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(file=sys.stderr if stderr else sys.stdout, highlight=False)


def json_out(value: Any) -> None:
    from nscas.redacting import redact  # no credential in --json output either

    sys.stdout.write(redact(json.dumps(value, indent=2)) + "\n")


def text(line: str = "") -> None:
    """A line for the reader, printed as is (no markup interpretation)."""
    sys.stdout.write(line + "\n")


def error(message: str) -> None:
    """The one-line form of every user-facing error, on stderr."""
    from nscas.redacting import redact

    line = redact(" ".join(message.split()))  # one line even if a message carries newlines
    sys.stderr.write(ERROR_PREFIX + line + "\n")


def failure(exc: BaseException) -> int | None:
    """The exit code of an error a command raised, its one line printed (STYLE 6): a library
    error or an OS error (a full disk, a missing file). None: neither, or a closed pipe
    (``nscas cat ID | head``), which the caller quietens. The root group and nscas.cli.fast
    both map errors here, so a command fails alike however it was parsed."""
    from nscas.errors import NscasError

    if isinstance(exc, NscasError):
        error(exc.message)
        return exc.exit_code
    if not isinstance(exc, OSError) or exc.errno == errno.EPIPE:
        return None
    if exc.errno == errno.ENOSPC:  # as the store says it: one line, exit 2
        where = f" at {exc.filename}" if exc.filename else ""
        error(f"no space left on device{where}")
        return 2
    where = f": {exc.filename}" if exc.filename else ""
    error(f"{exc.strerror or exc}{where}")
    return 1


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


_STATUS_STYLE = {"succeeded": "green", "passed": "green", "identical": "green",
                 "failed": "bold red", "different": "bold red", "skipped": "yellow",
                 "within-tolerance": "yellow"}
"""How a status word is coloured on a terminal, wherever a table shows one."""


_SHORT_CELL = 24  # table columns no wider than this are never wrapped on a terminal


def status_style(word: str) -> str | None:
    return _STATUS_STYLE.get(word)


def human(value: Any) -> str:
    """A value for people: floats rounded to 4 significant digits (``--json`` keeps them
    exact), integers and strings as they are, other JSON values compact."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == 0 or 1e-4 <= abs(value) < 1e6:
            digits = max(0, 3 - int(f"{abs(value):e}".split("e")[1])) if value else 0
            return f"{value:.{digits}f}"
        return f"{value:.3e}"
    if isinstance(value, int | str):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None) -> None:
    """A rich table on a terminal (IDs abbreviated); otherwise a header line and aligned columns.

    On a terminal an ID is never wrapped or cut mid-ID: a column holding IDs keeps its width
    and the others give way; a status word is coloured."""
    if is_tty():
        from rich.markup import escape
        from rich.table import Table

        cells = [[_abbrev(cell) for cell in row] for row in rows]
        # Cells are data (paths, names): escaped so that "[red]" in a file name stays text.
        t = Table(title=escape(title) if title else None, title_justify="left")
        for i, name in enumerate(columns):
            ids = any(_SHORT_ID.search(row[i]) for row in cells if i < len(row))
            width = max((len(row[i]) for row in cells if i < len(row)), default=0)
            if ids or name == "time" or width <= _SHORT_CELL:  # kept whole; the rest wrap
                t.add_column(escape(name), no_wrap=True, min_width=min(width, 80))
            else:
                t.add_column(escape(name), overflow="fold")
        for row in cells:
            t.add_row(*(_styled(cell, escape) for cell in row))
        _console().print(t)
        return
    if title:
        text(title)
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows, strict=False)]
    for row in (columns, *rows):
        cells = [f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=False)]
        text("  ".join([*cells, str(row[-1])]).rstrip())


def _styled(cell: str, escape: Callable[[str], str]) -> str:
    style = _STATUS_STYLE.get(cell)
    return f"[{style}]{escape(cell)}[/]" if style else escape(cell)


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
                build(child, into.add(escape(_abbrev(child.label)), highlight=False))

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
