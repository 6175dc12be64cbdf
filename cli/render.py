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
from datetime import UTC, datetime
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


def iso_time(timestamp: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC, to the second (``2025-01-31T12:00:00Z``)."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    (``nscas cat ID | head``), which the caller quietens."""
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


_SHORT_CELL = 24  # the widest a column of IDs or times is kept whole on a terminal
_MIN_CELL = 4  # no other column is folded narrower than this or its name (or widest cell)


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


def change(name: str, old: Any, new: Any) -> str:
    """``name: old -> new``, the values as ``human`` writes them (IDs whole: a terminal table
    shortens them), ``(none)`` where a run has no such param or input."""
    from nscas.runs.changes import ABSENT

    def shown(value: Any) -> str:
        return "(none)" if value is ABSENT else human(str(value) if hasattr(value, "hex")
                                                       else value)

    return f"{name}: {shown(old)} -> {shown(new)}"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
          wide: bool = False) -> None:
    """A rich table on a terminal (IDs abbreviated), as wide as the terminal; otherwise, or
    ``wide``, a header line and aligned columns with every cell whole.

    On a terminal an ID is never wrapped or cut mid-ID: a column of IDs keeps their width, a
    column holding IDs among other words folds no narrower than its longest such word, and
    the others fold (widest first). Where the table would still be wider than the terminal,
    a column with one value in every row is said once, above the table. A status word is
    coloured."""
    if not is_tty() or wide:
        if title:
            text(title)
        widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows, strict=False)]
        for row in (columns, *rows):
            padded = [f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=False)]
            text("  ".join([*padded, str(row[-1])]).rstrip())
        return
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console = _console()
    names = list(columns)
    cells = [[_abbrev(cell) for cell in row] for row in rows]
    same: dict[int, str] = {}
    if len(cells) > 1 and all(len(row) == len(names) for row in cells):
        constant = sorted((i for i in range(len(names)) if len({row[i] for row in cells}) == 1),
                          key=lambda i: -len(cells[0][i]))  # the widest said first
        for i in constant:
            if _natural_width(names, cells, without=same) <= console.width:
                break
            same[i] = f"{names[i]}: {cells[0][i]}"
        names = [n for i, n in enumerate(names) if i not in same]
        cells = [[c for i, c in enumerate(row) if i not in same] for row in cells]
    if title:
        console.print(Text(_abbrev(title)))
    if same:
        console.print(Text("in every row: " + ", ".join(same[i] for i in sorted(same))))
    # No vertical rules and one space of padding: a column costs its width and two spaces.
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for i, name in enumerate(names):
        column = [row[i] for row in cells if i < len(row)]
        width = max((len(cell) for cell in column), default=0)
        # Cells are data (paths, names): escaped so that "[red]" in a file name stays text.
        if all(_SHORT_ID.fullmatch(c) or c in ("", "-") for c in column) or name == "time":
            t.add_column(escape(name), no_wrap=True, min_width=min(width, _SHORT_CELL))
            continue
        words = [w for c in column for w in c.split() if _SHORT_ID.search(w)]
        floor = max([min(width, max(len(name), _MIN_CELL)), *map(len, words)])
        t.add_column(escape(name), overflow="fold", min_width=floor)
    for row in cells:
        t.add_row(*(_styled(cell, escape) for cell in row))
    console.print(t)


def note(line: str) -> None:
    """A line for the reader that a terminal wraps at its width (``text`` elsewhere)."""
    if not is_tty():
        text(line)
        return
    from rich.text import Text

    _console().print(Text(line))


def _natural_width(columns: Sequence[str], rows: Sequence[Sequence[str]], *,
                   without: Iterable[int] = ()) -> int:
    """How wide a terminal table of these cells is with none folded (less columns ``without``)."""
    left = set(without)
    widths = [max(len(str(c)) for c in col)
              for i, col in enumerate(zip(columns, *rows, strict=False)) if i not in left]
    return sum(widths) + 2 * (len(widths) - 1)


def _styled(cell: str, escape: Callable[[str], str]) -> str:
    style = _STATUS_STYLE.get(cell)
    return f"[{style}]{escape(cell)}[/]" if style else escape(cell)


def record(value: Any) -> None:
    """A JSON value pretty-printed: highlighted on a terminal, indented JSON otherwise."""
    if is_tty():
        from rich.json import JSON

        _console().print(JSON(json.dumps(value)))  # wrapped at the terminal width
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
