"""The store implementations the contract suite runs against (today: SQLite only).

A new implementation (PostgreSQL, another chunk backend) adds one entry to ``IMPLEMENTATIONS``:
a function that creates a fresh, empty store under a directory. Every ``Test*Contract`` class
then runs against it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nscas.store import Store, init_store

IMPLEMENTATIONS: dict[str, Callable[[Path], Store]] = {
    "sqlite": init_store,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each implementation in turn."""
    s = IMPLEMENTATIONS[request.param](tmp_path / "store")
    yield s
    s.close()
