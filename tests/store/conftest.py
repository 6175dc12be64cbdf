"""The store implementations the contract suite runs against: SQLite + a local directory, and a
team store (PostgreSQL + S3 on moto's server, both started once per session by the
``team_services`` fixture of tests/store/services.py, a plugin of tests/conftest.py).

A new implementation adds one entry to ``IMPLEMENTATIONS``: a function that creates a fresh,
empty store under a directory, given the session's services. Every ``Test*Contract`` class then
runs against it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nscas.store.writer import Store, init_store

IMPLEMENTATIONS: dict[str, Callable[[Path, pytest.FixtureRequest], Store]] = {
    "sqlite": lambda path, _request: init_store(path),
    "postgres+s3": lambda path, request: init_store(
        path, request.getfixturevalue("team_services").config()),
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each implementation in turn."""
    s = IMPLEMENTATIONS[request.param](tmp_path / "store", request)
    yield s
    s.close()
