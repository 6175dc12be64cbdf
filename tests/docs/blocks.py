"""The fenced blocks of the repository's Markdown, and the shell script a doc's shell blocks
make.

A shell block is a fence tagged ``sh``, ``shell``, ``bash`` or ``console``. In a ``console``
block the commands are the lines after ``$ `` (and the lines a trailing backslash continues);
the other lines are what they print. Every fence names its language (``text`` for output and
layouts), so that no command hides in an untagged block. A shell block that cannot run in
the suite follows, on the line before its fence, ``<!-- not-run: REASON -->``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL = frozenset({"sh", "shell", "bash", "console"})
NOT_RUN = re.compile(r"<!-- not-run: (?P<reason>\S.*\S) -->")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    line: int
    """The line of its opening fence, counted from 1."""
    info: str
    """The fence's info string (its language), or "" if it names none."""
    text: str
    not_run: str | None
    """The reason given by a ``<!-- not-run: ... -->`` line right before the fence."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.info.split()[0] in SHELL if self.info else False

    def commands(self) -> str:
        """The shell text the block runs: a console block's ``$`` lines, or the whole block."""
        if self.info.split()[0] != "console":
            return self.text
        commands: list[str] = []
        continued = False
        for line in self.text.splitlines():
            if continued or line.startswith("$ "):
                commands.append(line if continued else line[2:])
                continued = line.endswith("\\")
        return "\n".join(commands) + "\n"


def doc_files() -> list[Path]:
    """README.md, then docs/*.md by name: the order a reader meets them."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        end = next((j for j in range(index + 1, len(lines)) if lines[j].startswith(fence)
                    and not lines[j][len(fence):].strip()), None)
        assert end is not None, f"{path}:{index + 1}: a fence that is never closed"
        before = lines[index - 1] if index else ""
        marker = NOT_RUN.fullmatch(before.strip())
        found.append(Block(path=path, line=index + 1, info=opening["info"].strip(),
                           text="".join(line + "\n" for line in lines[index + 1:end]),
                           not_run=marker["reason"] if marker else None))
        index = end + 1
    return found


def script(runnable: list[Block]) -> str:
    """One bash script running ``runnable`` in order; each block announces itself on stderr
    first, so that a failure names the block it stopped in."""
    parts = ["set -eo pipefail\n"]
    for block in runnable:
        parts.append(f"echo {shlex.quote('### ' + block.where)} >&2\n")
        parts.append(block.commands())
    return "".join(parts)
