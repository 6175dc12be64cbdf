"""Fixtures shared by every test package. Keep this small: one fresh store per test."""

from __future__ import annotations

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
