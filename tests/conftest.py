"""Fixtures shared by every test package. Keep this small: one fresh store per test."""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.store.writer import Store, init_store

# team_services: one PostgreSQL and one moto S3 server per session, for tests/store and tests/team.
pytest_plugins = ("tests.store.services",)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh SQLite store at ``tmp_path/.nscas``, closed after the test."""
    s = init_store(tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="session", autouse=True)
def no_store_above_the_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test finds a store it did not make: the search upwards stops at this session's base
    temporary directory (``NSCAS_CEILING_DIRECTORIES``, inherited by every process a test
    starts), so a stray ``/tmp/.nscas`` is never found, and a caller's ``NSCAS_STORE`` is
    dropped. A test of the search itself sets the ceiling to its own ``tmp_path``."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("NSCAS_STORE", raising=False)
        env.setenv("NSCAS_CEILING_DIRECTORIES", str(tmp_path_factory.getbasetemp().resolve()))
        yield


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per process unless the caller says otherwise: the suite runs several
    workers on few cores, and every process it starts (a CLI run, a torchrun rank, the demo)
    inherits this. torch's default of a thread per core, times the workers, made CPU trains
    spin against each other (a single-rank train: 19 s alone with one thread, 238-270 s with
    the default on a busy 2-core machine). Tests of the scheduler's thread counts set their own.
    """
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    # Bytecode caches are written even where the caller's environment says not to
    # (PYTHONDONTWRITEBYTECODE): the suite starts thousands of Python processes from this
    # checkout (CLI runs, recipe runs, torchrun ranks, each pytest-xdist worker), and without
    # __pycache__ each one compiles the product's source again and each worker rewrites the
    # asserts of every test module again (collection: 18.5 s of CPU per worker, 10.3 s cached).
    # Set before any test module is imported, so pytest caches its rewritten modules too.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # A suite started in the background of a script (`make test &`, a detached CI job) inherits
    # SIGINT ignored, and so would every process it starts: the tests that stop a run with
    # Ctrl-C need the default, which an exec restores from Python's handler.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _scope(item: pytest.Item) -> str:
    """The unit ``--dist loadscope`` hands to one worker: a module, or a class of one."""
    return item.nodeid.rsplit("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadscope``) each module, or class, runs on
    one worker, which makes its module- and class-scoped fixtures once, as a serial run does.

    The units are handed out longest first: those holding a test marked ``slow``, then the
    others by their number of tests, so that no long one starts when the rest are nearly done.
    """
    sizes = Counter(_scope(item) for item in items)
    slow = {_scope(item) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (_scope(item) not in slow, -sizes[_scope(item)]))
