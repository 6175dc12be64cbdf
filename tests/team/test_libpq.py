"""nscas.database.libpq, the read connection over libpq through ctypes: the rows psycopg gives for every
type the reads meet, parameters as values (never SQL), errors in one line, notices kept off
stderr, every result cleared, and the psycopg connection where no libpq loads."""

from __future__ import annotations

import contextlib
import math
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

from nscas.database import libpq, postgres
from nscas.database.libpq import PgError
from nscas.errors import DamagedStore, NscasError, ReadOnlyStore, StoreError
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from tests.store.services import TeamServices
from tests.team.cli import nscas, team_store
from tests.waiting import GENEROUS, wait_until

OPTIONS = {"connect_timeout": "10", "application_name": "nscas", "client_encoding": "UTF8"}
# Every type a read of the store meets (bpchar IDs, varchar, text, name, int4, int8, float8,
# bytea), and the others the converter knows.
COLUMNS = ("id char(64), kind varchar(64), msg text, nm name, i2 int2, i4 int4, i8 int8, "
           "f4 float4, f8 float8, data bytea, flag bool, o oid")
ROWS = [
    ("a" * 64, "receipt/1", "it's \"quoted\"; -- not SQL\n\ttabbed", "tgname", -32768, 2**31 - 1,
     2**63 - 1, 1.5, 1 / 3, bytes(range(256)), True, 4294967295),
    ("b" * 64, "", "", "", 0, 0, -(2**63), float("inf"), float("-inf"), b"", False, 0),
    ("c" * 64, "ünïcødé", "日本語 ✓", "n", 1, -1, 0, float("nan"), -0.0, b"\x00\\x00'", True, 1),
    ("d" * 64, None, None, None, None, None, None, None, None, None, None, None),
    ("e" * 64, "k", "x", "y", 2, 3, 4, -1e-38, 1e-300, b"\\x", False, 2),
]


@pytest.fixture
def url(team_services: TeamServices) -> Iterator[str]:
    """A fresh database holding table ``t`` of :data:`COLUMNS` and :data:`ROWS`."""
    url = team_services.postgres.new_database()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"CREATE TABLE t ({COLUMNS})")
        with c.cursor() as cur:
            cur.executemany(f"INSERT INTO t VALUES ({', '.join(['%s'] * len(ROWS[0]))})", ROWS)
    yield url


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, and -0.0 told from 0.0 (both sides must read the same text)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def _connect(url: str) -> libpq.Connection:
    c = libpq.connect(url, OPTIONS)
    assert c is not None, "libpq did not load"
    return c


def test_libpq_loads_here_without_importing_psycopg() -> None:
    code = ("import sys; from nscas import libpq; assert libpq.load() is not None; "
            "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('psycopg')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stdout


def test_rows_are_those_psycopg_gives_for_every_type(url: str) -> None:
    sql = "SELECT * FROM t ORDER BY id"
    with psycopg.connect(url) as p:
        want = p.execute(sql).fetchall()
    c = _connect(url)
    try:
        got = c.execute(sql).fetchall()
    finally:
        c.close()
    assert len(got) == len(want) == len(ROWS)
    for g, w, given in zip(got, want, ROWS, strict=True):
        assert all(_same(x, y) for x, y in zip(g, w, strict=True)), (g, w)
        assert g[9] == given[9]  # bytea: every byte value, NUL and backslashes included
    # bytea_output = escape, which some servers are set to: decoded by libpq's own function.
    c = _connect(url)
    try:
        c.execute("SET bytea_output = escape")
        assert [r[0] for r in c.execute("SELECT data FROM t ORDER BY id")] == [r[9] for r in ROWS]
    finally:
        c.close()


def test_a_type_without_a_conversion_is_an_error_naming_it(url: str) -> None:
    c = _connect(url)
    try:
        with pytest.raises(TypeError, match="OID 1700"):
            c.execute("SELECT 1.5::numeric")
    finally:
        c.close()


def test_parameters_are_values_never_sql(url: str) -> None:
    c = _connect(url)
    try:
        evil = "x'; DROP TABLE t; --"
        assert c.execute("SELECT ?::text, ?::text", (evil, "?")).fetchone() == (evil, "?")
        assert c.execute("SELECT id FROM t WHERE msg = ?", (evil,)).fetchall() == []
        assert c.execute("SELECT count(*) FROM t WHERE msg = ?",
                         (ROWS[0][2],)).fetchone() == (1,)
        row = c.execute("SELECT ?::int8, ?::float8, ?::bool, ?::text, ?::bytea, ?::float8",
                        (2**62, 0.1, True, None, b"\x00'\\", float("-inf"))).fetchone()
        assert row == (2**62, 0.1, True, None, b"\x00'\\", float("-inf"))
        assert c.execute("SELECT count(*) FROM t").fetchone() == (len(ROWS),)
        with pytest.raises(TypeError, match="dict"):
            c.execute("SELECT ?::text", ({},))
    finally:
        c.close()


def test_read_transactions_are_repeatable_read_read_only(url: str) -> None:
    c = postgres.PgConnection(url)
    try:
        assert not c.in_transaction
        c.execute("BEGIN")
        assert c.in_transaction
        assert c.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        assert c.execute("SHOW transaction_read_only").fetchone() == ("on",)
        before = c.execute("SELECT count(*) FROM t").fetchone()
        with psycopg.connect(url, autocommit=True) as w:  # a writer commits meanwhile
            w.execute("INSERT INTO t (id) VALUES (%s)", ("f" * 64,))
        assert c.execute("SELECT count(*) FROM t").fetchone() == before  # one snapshot
        with pytest.raises(PgError) as err:
            c.execute("DELETE FROM t")
        assert isinstance(postgres.database_error(err.value, Path("/s")), ReadOnlyStore)
        c.rollback()
        assert not c.in_transaction
        assert c.execute("SELECT count(*) FROM t").fetchone() == (before[0] + 1,)
        assert c.execute("SHOW application_name").fetchone() == ("nscas",)
    finally:
        c.close()
    # The store's settings win over the URL's, as psycopg's keyword arguments do.
    c = postgres.PgConnection(url + "?application_name=other")
    try:
        assert c.execute("SHOW application_name").fetchone() == ("nscas",)
    finally:
        c.close()


def test_errors_carry_sqlstate_and_one_line(url: str) -> None:
    c = _connect(url)
    try:
        with pytest.raises(PgError) as err:
            c.execute("SELECT * FROM no_such_table")
        assert err.value.sqlstate == "42P01" and not err.value.operational
        assert err.value.message == 'relation "no_such_table" does not exist'
        assert isinstance(postgres.database_error(err.value, Path("/s")), DamagedStore)
        with pytest.raises(PgError) as err:
            c.execute("SELEC 1")
        mapped = postgres.database_error(err.value, Path("/s"))
        assert mapped.message == 'the store database of the store /s failed: syntax error at or near "SELEC"'
        assert c.execute("SELECT 1").fetchone() == (1,)  # autocommit: nothing left to undo
    finally:
        c.close()
    with pytest.raises(PgError, match="closed"):
        c.execute("SELECT 1")


def test_notices_stay_off_stderr(url: str, capfd: pytest.CaptureFixture[str]) -> None:
    c = _connect(url)
    try:
        c.execute("ROLLBACK")  # WARNING: there is no transaction in progress
        c.execute("DO $$ BEGIN RAISE NOTICE 'hello'; END $$")
    finally:
        c.close()
    assert capfd.readouterr().err == ""


def test_every_result_is_cleared(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = libpq.load()
    assert lib is not None
    made: list[int] = []
    cleared: list[int] = []
    exec_params, clear = lib.PQexecParams, lib.PQclear

    def counting_exec(*args: Any) -> int:
        res = exec_params(*args)
        made.append(res)
        return res

    def counting_clear(res: int) -> None:
        cleared.append(res)
        clear(res)

    monkeypatch.setattr(lib, "PQexecParams", counting_exec)
    monkeypatch.setattr(lib, "PQclear", counting_clear)
    c = _connect(url)
    try:
        c.execute("SELECT * FROM t")
        c.execute("BEGIN")
        c.execute("ROLLBACK")
        for bad in ("SELECT * FROM nowhere", "SELECT 1.5::numeric"):  # a server error, a type
            with pytest.raises((PgError, TypeError)):
                c.execute(bad)
    finally:
        c.close()
    assert len(made) == 5 and all(made) and sorted(cleared) == sorted(made)


def test_a_broken_connection_is_one_operational_error(url: str) -> None:
    c = postgres.PgConnection(url)
    try:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(url, autocommit=True) as k:
            k.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(PgError) as err:
            c.execute("SELECT 1")
        assert err.value.operational and "\n" not in err.value.message
        mapped = postgres.database_error(err.value, Path("/s"), url)
        assert mapped.message.startswith("cannot reach the store database postgresql://nscas:***@")
        c.rollback()  # nothing to end on a broken connection, and no error
    finally:
        c.close()


@pytest.fixture
def team_toml(team_services: TeamServices, tmp_path: Path) -> Path:
    return team_store(team_services, tmp_path / "team")


@pytest.fixture
def fresh_load() -> Iterator[None]:
    """``libpq.load`` asked again (it remembers what it loaded), and again after the test."""
    libpq.load.cache_clear()
    yield
    libpq.load.cache_clear()


def test_the_copy_in_psycopgs_wheel_serves_when_no_other_loads(
        url: str, fresh_load: None, monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = [c for c in libpq._candidates() if "psycopg_binary.libs" in c]
    if not bundled:
        pytest.skip("psycopg's binary wheel (and the libpq it carries) is not installed")
    monkeypatch.setattr(libpq, "_candidates", lambda: iter(["/nowhere/libpq.so.5", *bundled]))
    lib = libpq.load()
    assert lib is not None and "psycopg_binary.libs" in lib._name
    c = libpq.Connection(lib, url, OPTIONS)
    try:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (len(ROWS),)
    finally:
        c.close()


@pytest.mark.parametrize("dlopen", [True, False], ids=["dlopen", "ctypes.CDLL"])
def test_libpq_loads_through_dlopen_or_where_none_is_callable_through_ctypes(
        url: str, fresh_load: None, dlopen: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not dlopen:
        monkeypatch.setattr(libpq, "_dl", lambda: None)
    with pytest.raises(OSError, match=r"nowhere/libpq\.so\.5"):  # the loader's own reason
        libpq._open("/nowhere/libpq.so.5")
    lib = libpq.load()
    assert lib is not None
    c = libpq.Connection(lib, url, OPTIONS)
    try:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (len(ROWS),)
    finally:
        c.close()


def test_without_libpq_reads_go_through_psycopg(url: str, fresh_load: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libpq, "_candidates", lambda: iter(["/nowhere/libpq.so.5"]))
    assert libpq.load() is None
    c = postgres.PgConnection(url)
    try:
        assert isinstance(c._c, postgres._Psycopg)
        assert c.execute("SELECT i8, data FROM t WHERE id = ?", ("a" * 64,)).fetchall() == [
            (ROWS[0][6], ROWS[0][9])]
        c.execute("BEGIN")
        assert c.in_transaction
        assert c.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        with pytest.raises(PgError) as err:  # psycopg's error, as nscas.database.libpq's
            c.execute("SELECT * FROM nowhere")
        assert err.value.sqlstate == "42P01" and not err.value.operational
        c.rollback()
        assert not c.in_transaction
    finally:
        c.close()


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


@pytest.mark.parametrize("fallback", [False, True], ids=["libpq", "psycopg"])
def test_connection_errors_are_one_clear_line(team_services: TeamServices, team_toml: Path,
                                              tmp_path: Path, fallback: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if fallback:
        monkeypatch.setattr(libpq, "load", lambda: None)
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


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread that made each read connection, as they are made."""
    threads: list[str] = []
    real = postgres.PgConnection.__init__

    def init(self: postgres.PgConnection, url: str) -> None:
        threads.append(threading.current_thread().name)
        real(self, url)

    monkeypatch.setattr(postgres.PgConnection, "__init__", init)
    return threads


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every read connection closed, as they are closed."""
    connections: list[object] = []
    real = postgres.PgConnection.close

    def close(self: postgres.PgConnection) -> None:
        connections.append(self)
        real(self)

    monkeypatch.setattr(postgres.PgConnection, "close", close)
    return connections


def test_a_reader_takes_the_connection_made_while_it_imported(team_toml: Path,
                                                              made: list[str]) -> None:
    with open_store(team_toml, readonly=True) as s:
        s.log(limit=1)
        s.counts()
    # one connection in all, made beside the import, then reused by every read
    assert made == ["nscas-connect"]
    assert postgres._early == {}


def test_an_early_connection_no_reader_took_is_closed(
        team_toml: Path, closed: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    from nscas.store import reading

    def no_backend(*_: object) -> object:
        raise StoreError("no object storage here")

    monkeypatch.setattr(reading, "chunk_backend", no_backend)  # fails before it connects
    with pytest.raises(StoreError, match="no object storage here"):
        open_store(team_toml, readonly=True)
    assert len(closed) == 1 and postgres._early == {}


def test_a_read_command_starts_connecting_before_it_imports_its_code(
        team_toml: Path, made: list[str]) -> None:
    """The CLI enters ``connecting`` before it imports the reading code: the connection made
    there is the one the reader takes, and the only one."""
    from nscas.store.config import parse_config
    from nscas.store.opening import connecting

    with connecting(team_toml):
        assert list(postgres._early) == [parse_config(team_toml).database]
        with open_store(team_toml, readonly=True) as s:
            s.log(limit=1)
    assert made == ["nscas-connect"] and postgres._early == {}


def test_a_connection_no_command_took_is_closed(team_toml: Path, closed: list[object]) -> None:
    """``nscas lineage --help`` on a team store: the command line goes to typer after the
    connection was started; it is closed, not left open (by its thread, once it is made)."""
    from nscas.store.opening import connecting

    with connecting(team_toml):
        pass
    assert postgres._early == {}
    wait_until(lambda: closed, "the connection no command took to be closed")
    assert len(closed) == 1


def test_leaving_connecting_never_waits_for_a_server_that_does_not_answer(
        team_toml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nscas log --help`` with the database down: typer answers at once, not after the
    connection times out."""
    from nscas.store.opening import connecting

    port, listener = _silent_server()
    # A timeout far beyond the bound below: had leaving waited for it, it would pass the bound.
    monkeypatch.setitem(postgres._OPTIONS, "connect_timeout", str(int(GENEROUS)))
    toml = _with_database(team_toml, f"postgresql://nscas:pw@127.0.0.1:{port}/x", tmp_path / "s")
    try:
        t0 = time.monotonic()
        with connecting(toml):
            pass
        assert time.monotonic() - t0 < GENEROUS / 2 and postgres._early == {}
    finally:
        listener.close()


@pytest.mark.parametrize("damage", ["missing", "not toml", "unknown key", "not a store"])
def test_connecting_leaves_a_bad_store_for_open_store_to_report(
        team_toml: Path, tmp_path: Path, damage: str) -> None:
    from nscas.store.opening import connecting

    where = {"missing": tmp_path / "none", "not a store": tmp_path}.get(damage, team_toml)
    if damage == "not toml":
        team_toml.write_text("database = [[[\n")
    elif damage == "unknown key":
        team_toml.write_text(team_toml.read_text() + "colour = 'blue'\n")
    with connecting(where):  # never raises: nothing connects
        assert postgres._early == {}
        with pytest.raises(NscasError) as err:
            open_store(where, readonly=True)
    assert "\n" not in str(err.value)


def test_an_unexpected_error_making_the_early_connection_is_raised_as_itself(
        team_toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: postgres.PgConnection, url: str) -> None:
        raise TypeError("not a connection error")

    monkeypatch.setattr(postgres.PgConnection, "__init__", broken)
    with pytest.raises(TypeError, match="not a connection error"):
        open_store(team_toml, readonly=True)
    assert postgres._early == {}


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


def test_reads_through_the_psycopg_fallback_are_the_same(team_toml: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with open_store(team_toml) as s:
        blob = s.put_bytes(b"some bytes\x00\xff")
        rec = s.put_record({"nscas": "commitment/1", "subjects": {"x": str(blob)},
                            "purpose": "it's kept", "previous": None})
        s.ref_set("r/one", rec, message="first 'quoted'")

    def reads() -> list[Any]:
        with open_store(team_toml, readonly=True) as s:
            c = s._connect()
            assert isinstance(c._c, libpq.Connection) is (libpq.load() is not None)
            c.close()
            return [s.log(limit=5), s.ref_log(), s.ref_list("r/"), s.links_from(rec),
                    s.links_to(blob), s.get_bytes(blob), s.get_record(rec), s.counts(),
                    s.resolve(rec.hex[:10]), s.info(blob), s.schema_differences(), s.closure([rec])]

    direct = reads()
    monkeypatch.setattr(libpq, "load", lambda: None)
    assert reads() == direct
    ran = nscas("log", store=team_toml)  # and the CLI reads without psycopg
    assert ran.code == 0, ran.err


def test_a_team_read_command_imports_no_psycopg(team_toml: Path) -> None:
    probe = ("import sys, json\nfrom nscas.cli.main import app\ntry:\n"
             "    app(prog_name='nscas', args=sys.argv[1:])\nexcept SystemExit as exc:\n"
             "    code = exc.code\nprint(json.dumps([code, sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('psycopg', 'psycopg_binary', 'sqlalchemy'))]))")
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
