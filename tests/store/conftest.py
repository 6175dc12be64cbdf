"""The store implementations the contract suite runs against: SQLite + a local directory, and a
team store (PostgreSQL + S3 on moto's server, both started once per session: tests/store/services.py).

A new implementation adds one entry to ``IMPLEMENTATIONS``: a function that creates a fresh,
empty store under a directory, given the session's services. Every ``Test*Contract`` class then
runs against it unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nscas.store import Store, init_store
from nscas.storeconfig import S3Settings, StoreConfig
from tests.store.services import S3_KEYS, Moto, Postgres, start_moto, start_postgres


@dataclass
class TeamServices:
    postgres: Postgres
    moto: Moto

    def config(self) -> StoreConfig:
        """A fresh database and bucket for one store."""
        return StoreConfig(database=self.postgres.new_database(),
                           objects=f"s3://{self.moto.new_bucket()}/store",
                           s3=S3Settings(endpoint_url=self.moto.endpoint))


@pytest.fixture(scope="session")
def team_services() -> Iterator[TeamServices]:
    """One PostgreSQL and one moto server for the whole session (skips only where they truly
    cannot start: not installed)."""
    pg = start_postgres()
    if isinstance(pg, str):
        pytest.skip(pg)
    moto = start_moto()
    if isinstance(moto, str):
        pg.stop()
        pytest.skip(moto)
    saved = {k: os.environ.get(k) for k in S3_KEYS}
    os.environ.update(S3_KEYS)
    try:
        yield TeamServices(postgres=pg, moto=moto)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        moto.process.kill()
        moto.process.wait()
        pg.stop()


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
