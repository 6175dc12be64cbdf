"""Fixtures shared by every test package. Keep this small: one fresh store per test."""

from __future__ import annotations

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
