"""fsck sees every way of switching an insert-only guard off on PostgreSQL: the trigger dropped,
disabled (``ALTER TABLE ... DISABLE TRIGGER``, or set to fire only in replica sessions), or its
function's body replaced; and the guard really is off each time (so the finding matters)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from nscas.database.pgschema import GUARD_FUNCTION, PG_TRIGGERS, TRUNCATE_FUNCTION
from nscas.store.config import StoreConfig
from nscas.store.writer import init_store
from nscas.upkeep.fsck import fsck
from tests.store.services import TeamServices
from tests.team.cli import nscas, team_store

_NOOP = ("CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
         "$$ BEGIN IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$")


def _switch_off(c: psycopg.Connection, trigger: str, how: str) -> str:
    """Switch ``trigger`` off in way ``how``; the finding fsck must report (name, problem)."""
    table, verb = PG_TRIGGERS[trigger]
    if how == "drop":
        c.execute(f"DROP TRIGGER {trigger} ON {table}")
        return f"{trigger}:missing-trigger"
    if how == "disable":
        c.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        return f"{trigger}:disabled-trigger"
    if how == "replica":
        c.execute(f"ALTER TABLE {table} ENABLE REPLICA TRIGGER {trigger}")
        return f"{trigger}:disabled-trigger"
    function = TRUNCATE_FUNCTION if verb == "TRUNCATE" else GUARD_FUNCTION
    c.execute(_NOOP.format(name=function))
    return f"{function}():changed-function"


@pytest.mark.parametrize("how", ["drop", "disable", "replica", "replace"])
@pytest.mark.parametrize("trigger", sorted(PG_TRIGGERS))
def test_fsck_reports_a_guard_switched_off(team_services: TeamServices, tmp_path: Path,
                                           trigger: str, how: str) -> None:
    # The guards are PostgreSQL's: the objects' bytes may as well lie in a local directory
    # (a team store's other kind), which spares each case a bucket and an S3 client.
    store = init_store(tmp_path, StoreConfig(database=team_services.postgres.new_database(),
                                             objects=str(tmp_path / "objects")))
    store.put_bytes(b"guarded")
    assert fsck(store).errors == ()
    assert store.config is not None
    with psycopg.connect(store.config.database, autocommit=True) as c:
        wanted = _switch_off(c, trigger, how)
        table, verb = PG_TRIGGERS[trigger]
        if table == "objects":  # and the guard is indeed off: the verb goes through
            c.execute({"UPDATE": "UPDATE objects SET created = created",
                       "DELETE": "DELETE FROM objects WHERE false",
                       "TRUNCATE": "SELECT 1"}[verb])
    found = [f"{f.object}:{f.problem}" for f in fsck(store).errors]
    assert wanted in found, found
    store.close()


def test_fsck_cli_exit_code_for_a_disabled_guard(team_services: TeamServices,
                                                 tmp_path: Path) -> None:
    toml = team_store(team_services, tmp_path / "team")
    assert nscas("fsck", store=toml).code == 0
    url = toml.read_text().split('"')[1]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER TABLE ref_log DISABLE TRIGGER ref_log_no_delete")
    ran = nscas("fsck", store=toml)
    assert ran.code != 0 and "ref_log_no_delete is disabled" in ran.out + ran.err, ran
