"""A team store's edges: NSCAS_STORE naming a store.toml, TRUNCATE refused, ref prefixes matched
case-sensitively on both engines, two `nscas init` racing on one empty database."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from nscas.database.pgschema import PG_TRIGGERS
from nscas.store.config import render_config
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from tests.store.services import TeamServices
from tests.team.cli import nscas, team_store

INSERT_ONLY = ("objects", "parts", "links", "ref_log", "object_sha256")


def test_nscas_store_may_name_a_store_toml(team_services: TeamServices, tmp_path: Path) -> None:
    toml = team_store(team_services, tmp_path / "team")
    (tmp_path / "f").write_bytes(b"through store.toml")
    for how in ({"store": toml}, {}):
        args = () if how else ("--store", str(toml))
        ran = nscas(*args, "add", str(tmp_path / "f"), "--ref", "f", **how)  # type: ignore[arg-type]
        assert ran.code == 0, ran.err
    assert nscas("cat", "f", store=toml).out == "through store.toml"
    for extra in ((), ("--upgrade",)):  # init of the store the file names: nothing new
        again = nscas("init", *extra, store=toml)
        assert again.code == 0 and again.out.startswith("nscas store already in"), again
    bad = nscas("ref", "list", store=tmp_path / "nowhere" / "store.toml")
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1, bad.err


def test_truncate_cannot_bypass_insert_only(team_services: TeamServices, tmp_path: Path) -> None:
    store = init_store(tmp_path, team_services.config())
    a = store.put_record({"nscas": "commitment/1", "subjects": {"x": str(store.put_bytes(b"x"))},
                          "purpose": "kept", "previous": None})
    store.ref_set("r", a)
    assert store.schema_differences() == []
    assert {n for n, (_, verb) in PG_TRIGGERS.items() if verb == "TRUNCATE"} == {
        f"{t}_no_truncate" for t in INSERT_ONLY}
    assert store.config is not None
    with psycopg.connect(store.config.database, autocommit=True) as c:
        for table in INSERT_ONLY:
            with pytest.raises(psycopg.Error, match=f"{table} is insert-only"):
                c.execute(f"TRUNCATE {table} CASCADE")
        # Not even inside gc's session, which lets row deletes through.
        with pytest.raises(psycopg.Error, match="insert-only"), c.transaction():
            c.execute("INSERT INTO gc_session VALUES (1)")
            c.execute("TRUNCATE ref_log")
        c.execute("DROP TRIGGER ref_log_no_truncate ON ref_log")
    assert [d.name for d in store.schema_differences()] == ["ref_log_no_truncate"]
    assert store.ref_get("r") == a and store.counts()["objects"] == 2
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres+s3"])
def test_ref_prefixes_are_case_sensitive(kind: str, team_services: TeamServices,
                                         tmp_path: Path) -> None:
    store = init_store(tmp_path, team_services.config() if kind != "sqlite" else None)
    oid = store.put_bytes(b"x")
    for name in ("Exp/a", "exp/b", "exp_c", "expXd"):
        store.ref_set(name, oid)
    assert [n for n, _ in store.ref_list("exp")] == ["exp/b", "expXd", "exp_c"]  # code point order
    assert [n for n, _ in store.ref_list("Exp")] == ["Exp/a"]
    assert [n for n, _ in store.ref_list("exp_")] == ["exp_c"]  # no wildcards
    assert store.ref_list("EXP") == []
    store.close()
    reader = open_store(tmp_path / ".nscas", readonly=True)
    assert [n for n, _ in reader.ref_list("exp/")] == ["exp/b"]
    reader.close()


_INIT_AT = """
import sys, time
from pathlib import Path
from nscas.store.writer import init_store
import alembic.command, nscas.migrations  # imported before the start: the migrations race
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
init_store(Path(sys.argv[1])).close()
"""


def test_concurrent_init_of_one_empty_database(team_services: TeamServices, tmp_path: Path) -> None:
    config = team_services.config()
    dirs = [tmp_path / f"host{i}" / ".nscas" for i in range(4)]
    for d in dirs:
        d.mkdir(parents=True)
        (d / "store.toml").write_text(render_config(config))
    start = time.time() + 4
    procs = [subprocess.Popen([sys.executable, "-c", _INIT_AT, str(d), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for d in dirs]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    assert all(code == 0 for code, _ in results), results
    with open_store(dirs[0]) as s:
        assert s.schema_differences() == []
    assert nscas("init", store=dirs[1] / "store.toml").code == 0
