"""The one query layer on PostgreSQL (nscas.database.connections over psycopg): read
transactions that see one snapshot and write nothing, errors in one line, one connection per
command reused by every read, ``store.toml`` read once, and no thread or module-global state."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nscas.database import postgres
from nscas.database.connections import Pool
from nscas.errors import DamagedStore, ReadOnlyStore, StoreError
from nscas.objects.digests import Digest
from nscas.store import config as store_config
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from tests.store.services import TeamServices
from tests.team.cli import nscas, team_store

COLUMNS = "id char(64), msg text, data bytea"
ROWS = [("a" * 64, "it's \"quoted\"; -- not SQL", bytes(range(256))), ("b" * 64, "", b"")]


@pytest.fixture
def url(team_services: TeamServices) -> Iterator[str]:
    """A fresh database holding table ``t`` of :data:`COLUMNS` and :data:`ROWS`."""
    url = team_services.postgres.new_database()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"CREATE TABLE t ({COLUMNS})")
        with c.cursor() as cur:
            cur.executemany(f"INSERT INTO t VALUES ({', '.join(['%s'] * len(ROWS[0]))})", ROWS)
    yield url




def test_read_transactions_are_repeatable_read_read_only(url: str) -> None:
    engine = postgres.PgEngine(url, Path("/s"))
    c = engine.connect()
    try:
        assert not c.in_transaction
        engine.begin(c, write=False)
        assert c.in_transaction
        assert c.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        assert c.execute("SHOW transaction_read_only").fetchone() == ("on",)
        before = c.execute("SELECT count(*) FROM t").fetchone()
        with psycopg.connect(url, autocommit=True) as w:  # a writer commits meanwhile
            w.execute("INSERT INTO t (id) VALUES (%s)", ("f" * 64,))
        assert c.execute("SELECT count(*) FROM t").fetchone() == before  # one snapshot
        with pytest.raises(psycopg.Error) as err:
            c.execute("DELETE FROM t")
        assert isinstance(engine.error(err.value), ReadOnlyStore)
        c.execute("ROLLBACK")
        assert not c.in_transaction
        assert c.execute("SELECT count(*) FROM t").fetchone() == (before[0] + 1,)
        assert c.execute("SHOW application_name").fetchone() == ("nscas",)
    finally:
        c.close()
    # The store's settings win over the URL's, as psycopg's keyword arguments do.
    c = postgres.PgEngine(url + "?application_name=other", Path("/s")).connect()
    try:
        assert c.execute("SHOW application_name").fetchone() == ("nscas",)
    finally:
        c.close()


def test_parameters_are_values_never_sql(url: str) -> None:
    c = postgres.PgEngine(url, Path("/s")).connect()
    try:
        evil = "x' OR '1'='1"
        assert c.execute("SELECT ?::text, ?::text", (evil, "?")).fetchone() == (evil, "?")
        assert c.execute("SELECT id FROM t WHERE msg = ?", (evil,)).fetchall() == []
        assert c.execute("SELECT data FROM t WHERE id = ?", ("a" * 64,)).fetchone() == (
            bytes(range(256)),)
    finally:
        c.close()


def test_errors_carry_one_line(url: str) -> None:
    pool = Pool(postgres.PgEngine(url, Path("/s")))
    with pytest.raises(DamagedStore, match='relation "no_such_table" does not exist'), \
            pool.read() as c:
        c.execute("SELECT * FROM no_such_table")
    with pytest.raises(StoreError) as err, pool.read(snapshot=False) as c:
        c.execute("SELEC 1")
    assert err.value.message == ('the store database postgresql://nscas:***@'
                                 f'{url.split("@", 1)[1]} failed: syntax error at or near "SELEC"')
    with pool.read() as c:  # the connection rolled back, and is reused
        assert c.execute("SELECT 1").fetchone() == (1,)
    pool.close()


def test_a_broken_connection_is_one_line_and_not_reused(url: str) -> None:
    pool = Pool(postgres.PgEngine(url, Path("/s")))
    with pool.read() as c:
        first = c
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(url, autocommit=True) as k:
        k.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreError) as err, pool.read() as c:
        assert c is first
    assert err.value.message.startswith("cannot reach the store database postgresql://nscas:***@")
    assert "\n" not in err.value.message
    with pool.read() as c:  # a new connection: the broken one was closed, not pooled
        assert c is not first and c.execute("SELECT 1").fetchone() == (1,)
    pool.close()


@pytest.fixture
def team_toml(team_services: TeamServices, tmp_path: Path) -> Path:
    return team_store(team_services, tmp_path / "team")


def _with_database(toml: Path, url: str, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    lines = [f'database = "{url}"' if line.startswith("database") else line
             for line in toml.read_text().splitlines()]
    (where / "store.toml").write_text("\n".join(lines) + "\n")
    return where / "store.toml"


def _silent_server() -> tuple[int, socket.socket]:
    """A port that accepts connections and never answers (a server hung, or a firewall's)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while len(held) < 4:
                held.append(s.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return s.getsockname()[1], s


def test_connection_errors_are_one_clear_line(team_services: TeamServices, team_toml: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pg = team_services.postgres
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]  # nothing listens there once closed
    cases = {
        "wrong password": (pg.url(password="wrong"), 'password authentication failed for user "nscas"'),
        "server down": (f"postgresql://nscas:pw@127.0.0.1:{down}/x", "Connection refused"),
        "bad database": (pg.url("no_such_db"), 'database "no_such_db" does not exist'),
    }
    for name, (url, reason) in cases.items():
        toml = _with_database(team_toml, url, tmp_path / name.replace(" ", "-"))
        with pytest.raises(StoreError) as err:
            open_store(toml, readonly=True)
        message = err.value.message
        assert message.startswith("cannot reach the store database postgresql://nscas:***@"), message
        assert reason in message and "\n" not in message and "wrong" not in message, message
    port, listener = _silent_server()
    try:
        monkeypatch.setitem(postgres._OPTIONS, "connect_timeout", "2")
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=r"cannot reach the store database .*timeout"):
            open_store(_with_database(team_toml, f"postgresql://nscas:pw@127.0.0.1:{port}/x",
                                      tmp_path / "silent"), readonly=True)
        # Bounded by the timeout (a silent server never ends the wait itself), with slack
        # for a loaded machine.
        assert time.monotonic() - t0 < 10 * 2
    finally:
        listener.close()




def test_one_connection_per_command_and_store_toml_read_once(
        team_toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's schema check makes the connection that every read after it reuses; the
    config is parsed once; and opening a store starts no thread (no early connection)."""
    made: list[object] = []
    parsed: list[Path] = []
    real_init, real_parse = postgres.PgConnection.__init__, store_config.parse_config

    def init(self: postgres.PgConnection, url: str) -> None:
        made.append(self)
        real_init(self, url)

    def parse(path: Path) -> Any:
        parsed.append(path)
        return real_parse(path)

    monkeypatch.setattr(postgres.PgConnection, "__init__", init)
    monkeypatch.setattr(store_config, "parse_config", parse)
    threads = threading.active_count()
    with open_store(team_toml, readonly=True) as s:
        assert threading.active_count() == threads
        s.log(limit=1)
        s.counts()
        s.ref_list()
    assert len(made) == 1 and parsed == [team_toml]
    parsed.clear()
    with open_store(team_toml) as w:  # the writer too: one parse
        w.put_bytes(b"one")
    assert parsed == [team_toml]


def test_the_cli_says_it_in_one_line(team_services: TeamServices, team_toml: Path,
                                     tmp_path: Path) -> None:
    toml = _with_database(team_toml, team_services.postgres.url(password="wrong"), tmp_path / "w")
    ran = nscas("log", store=toml)
    assert ran.code == 2 and ran.out == ""
    assert ran.err.strip().splitlines() == [
        f"nscas: error: cannot reach the store database postgresql://nscas:***@127.0.0.1:"
        f"{team_services.postgres.port}/postgres: connection failed: connection to server at "
        f'"127.0.0.1", port {team_services.postgres.port} failed: FATAL: password authentication '
        'failed for user "nscas"'], ran.err


def test_a_team_read_command_imports_no_sqlalchemy(team_toml: Path) -> None:
    """psycopg, the plain driver, is all a team read loads of the database's code."""
    probe = ("import sys, json\nfrom nscas.cli.main import app\ntry:\n"
             "    app(prog_name='nscas', args=sys.argv[1:])\nexcept SystemExit as exc:\n"
             "    code = exc.code\nprint(json.dumps([code, sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('sqlalchemy', 'alembic'))]))")
    for args in (["log", "--limit", "20"], ["ref", "list"], ["fsck"]):
        p = subprocess.run([sys.executable, "-c", probe, "--store", str(team_toml), *args],
                           capture_output=True, text=True, check=False)
        assert p.stdout.strip().splitlines()[-1] == "[0, []]", (args, p.stdout, p.stderr)


def test_links_to_each_answers_on_postgresql_as_on_sqlite(team_services: TeamServices,
                                                          tmp_path: Path) -> None:
    from tests.store.test_batched_reads import _runs, check_linked

    answers = []
    for name, config in (("sqlite", None), ("team", team_services.config())):
        with init_store(tmp_path / name, config) as s:
            built = _runs(s, 7)
            ids = [built["env"], *built["receipts"], *built["ckpts"], Digest.of(b"not stored")]
            with open_store(s.root, readonly=True) as r:
                got: dict[Any, Any] = {limit: r.links_to_each(ids, limit)
                                       for limit in (None, 1, 3)}
                for limit, each in got.items():
                    assert each == {i: r.links_to(i, limit) for i in ids}
                # kinds and labels in one statement (lineage's read), as kinds_of and get_records
                kinds, labelled = r.kinds_and_records(ids, ("receipt/1", "checkpoint/1"))
                assert kinds == r.kinds_of(ids)
                assert labelled == r.get_records([*built["receipts"], *built["ckpts"]])
                got["kinds"] = kinds
                got["linked"] = check_linked(r, ids)  # a level of lineage in one statement
            answers.append(got)
    assert answers[0] == answers[1]
    assert len(answers[1][None][built["env"]]) == 7 and len(answers[1][3][built["env"]]) == 3
