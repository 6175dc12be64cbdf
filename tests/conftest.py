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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) the tests of a module that
    shares a module- or class-scoped fixture stay on one worker, which makes that fixture once,
    as a serial run does; other tests go to whichever worker is free.

    The longest work is handed out first: tests marked ``slow``, then the modules kept
    together, then the rest, so that no long test starts when the others are nearly done.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group") is not None:
            continue
        if any(d.scope in ("module", "class", "package")
               for defs in info.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("xdist_group") is None))
