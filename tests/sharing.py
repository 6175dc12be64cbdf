"""Expensive session data built once per test run, not once per pytest-xdist worker.

A session fixture runs once in each worker process, so four workers would run the tamper
suite's experiment four times on two cores. ``built_once`` lets the first worker that asks build
it in the run's shared temporary directory while the others wait on a file lock (the pattern of
the pytest-xdist docs); each worker then gets a copy of its own, so tests that add objects to a
store, as the tamper tests do, see only their own worker's writes, as in a serial run.

A build is no test's work: pytest-timeout bounds only test functions (``timeout_func_only`` in
pyproject.toml), so a build that is slow on a loaded machine is not cut off by the timeout of the
test that happened to ask first. It has a deadline of its own, ``BUILD_DEADLINE``, for the
build and for a wait on another worker's. A build that failed is built once all the same: its
error is written beside it and every later ask, in any worker, fails with that error at once
rather than building again (and failing again, one test timeout each).
"""

from __future__ import annotations

import os
import pickle
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock, Timeout

from tests.waiting import deadline

T = TypeVar("T")

BUILT = "built.pickle"
"""Written last, beside the built directory: what ``build`` returned (its presence means done)."""

FAILED = "failed.txt"
"""Written beside the built directory instead when ``build`` raised: the error, for every ask."""

BUILD_DEADLINE = 3600.0
"""Seconds a build may take, or a worker wait for another's: the tamper experiment takes
about 5 minutes alone and has been seen near 12 on a loaded 2-core machine."""


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
    done = shared.with_name(f"{shared.name}.{BUILT}")
    failed = shared.with_name(f"{shared.name}.{FAILED}")
    try:
        with FileLock(f"{shared}.lock", timeout=BUILD_DEADLINE):
            if failed.is_file():
                pytest.fail(failed.read_text(encoding="utf-8"), pytrace=False)
            if not done.is_file():
                _build(shared, build, done, failed)
            value: T = pickle.loads(done.read_bytes())
    except Timeout:
        pytest.fail(f"waited {BUILD_DEADLINE:g} s for another worker to build {name}",
                    pytrace=False)
    if not copy:
        return shared, value
    mine = tmp_path_factory.mktemp(name)
    shutil.copytree(shared, mine, symlinks=True, dirs_exist_ok=True)
    return mine, value


def _build(shared: Path, build: Callable[[Path], T], done: Path, failed: Path) -> None:
    """Run ``build`` into ``shared`` within ``BUILD_DEADLINE``; write what it returned to
    ``done``, or its error to ``failed`` (and raise it)."""
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir()
    try:
        with deadline(BUILD_DEADLINE, f"building {shared.name}"):
            value = build(shared)
    except BaseException as e:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "the only worker")
        failed.write_text(f"building {shared.name} failed (once, in {worker}; its error "
                          f"follows):\n{''.join(traceback.format_exception(e))}",
                          encoding="utf-8")
        raise
    done.write_bytes(pickle.dumps(value))
