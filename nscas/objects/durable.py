"""Durability primitives: fsync a file, a directory, a whole tree, or an open file object.

The one copy of these helpers in the product code; every writer that promises "on disk before
the rename" (chunks, exports, work areas, the train recipe's checkpoints and journals) uses them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any


def fsync_file(path: Path) -> None:
    """Flush a file's (or a directory's) contents to stable storage, by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new name) durable."""
    fsync_file(path)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``, ``root`` included."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            fsync_file(Path(dirpath) / name)
        fsync_dir(Path(dirpath))


def sync(f: IO[Any]) -> None:
    """Flush an open file's buffer and fsync it."""
    f.flush()
    os.fsync(f.fileno())
