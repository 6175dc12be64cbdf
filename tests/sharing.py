"""Expensive session data built once per test run, not once per pytest-xdist worker.

A session fixture runs once in each worker process, so four workers would run the tamper
suite's experiment four times on two cores. ``built_once`` lets the first worker that asks build
it in the run's shared temporary directory while the others wait on a file lock (the pattern of
the pytest-xdist docs); each worker then gets a copy of its own, so tests that add objects to a
store, as the tamper tests do, see only their own worker's writes, as in a serial run.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")

BUILT = "built.pickle"
"""Written last, beside the built directory: what ``build`` returned (its presence means done)."""


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], T], *, copy: bool = True) -> tuple[Path, T]:
    """The directory ``build(directory)`` filled, and what it returned (picklable).

    ``build`` runs once per test run: in the run's temporary directory, or under xdist in the
    one its workers share. With ``copy`` each call gets a copy of its own (at the same depth, so
    paths relative to it hold); without, all share the one directory, which then must not be
    changed.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        base = base.parent
    shared = base / f"shared-{name}"
    with FileLock(f"{shared}.lock"):
        done = shared.with_name(f"{shared.name}.{BUILT}")
        if not done.is_file():
            shutil.rmtree(shared, ignore_errors=True)  # a build that failed
            shared.mkdir()
            done.write_bytes(pickle.dumps(build(shared)))
        value: T = pickle.loads(done.read_bytes())
    if not copy:
        return shared, value
    mine = tmp_path_factory.mktemp(name)
    shutil.copytree(shared, mine, symlinks=True, dirs_exist_ok=True)
    return mine, value
