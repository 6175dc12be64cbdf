"""The services a team store needs, started by the tests themselves: Debian's PostgreSQL in a
temporary directory (as the unprivileged user ``nscas-test`` when the suite runs as root, as CI
does) and moto's standalone S3 server, both on 127.0.0.1, once per test session (once per
pytest-xdist worker).

No real S3 service installs here: the S3 tests talk to moto's server over HTTP with the same
boto3 client code a real S3 or MinIO endpoint gets. A pytest plugin (tests/conftest.py loads it):
``team_services`` is one fixture for every test directory, so one session starts one of each.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nscas.store.config import S3Settings, StoreConfig
from tests.waiting import GENEROUS

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "nscas"
PG_PASSWORD = "nscas-test-password"
TEST_OS_USER = "nscas-test"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin() -> Path | None:
    if (PG_BIN / "initdb").is_file():
        return PG_BIN
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _as_user() -> list[str]:
    """The prefix that runs a command as an unprivileged user (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(TEST_OS_USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", TEST_OS_USER], capture_output=True, check=False)
        if done.returncode != 9:  # 9: the name is taken (another pytest-xdist worker's add)
            done.check_returncode()
    return ["runuser", "-u", TEST_OS_USER, "--"]


@dataclass
class Postgres:
    """A PostgreSQL server of the test session: ``new_database()`` gives each store its own."""

    bin: Path
    data: Path
    port: int
    prefix: list[str]
    fsync: bool = False
    """Off for the tests (nothing they check needs it); benchmarks/store.py turns it on."""

    def url(self, db: str = "postgres", *, password: str = PG_PASSWORD) -> str:
        return f"postgresql://{PG_USER}:{password}@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        import psycopg

        name = "s_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.data), "-w",
                        "-t", "60", *args], check=True, capture_output=True)

    def start(self) -> None:
        fsync = "on" if self.fsync else "off"
        self.pg_ctl("-o", f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 "
                          f"-c fsync={fsync} -c max_connections=200", "-l", str(self.data / "log"),
                    "start")

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "stop")

    def close(self) -> None:
        """Stop the server and remove its directory (a data directory grows to gigabytes)."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.data.parent, ignore_errors=True)


def start_postgres(*, fsync: bool = False) -> Postgres | str:
    """A running server, or why none can start here."""
    bin_ = _pg_bin()
    if bin_ is None:
        return "PostgreSQL is not installed (Debian package 'postgresql'; 'make system')"
    prefix = _as_user()
    base = Path(tempfile.mkdtemp(prefix="nscas-pg-"))
    data = base / "data"
    pwfile = base / "pw"
    pwfile.write_text(PG_PASSWORD + "\n")
    if prefix:
        shutil.chown(base, TEST_OS_USER)
        shutil.chown(pwfile, TEST_OS_USER)
    subprocess.run([*prefix, str(bin_ / "initdb"), "-D", str(data), "-U", PG_USER,
                    "--pwfile", str(pwfile), "--auth=scram-sha-256", "--locale=C",
                    "--encoding=UTF8"], check=True, capture_output=True)
    pg = Postgres(bin=bin_, data=data, port=free_port(), prefix=prefix, fsync=fsync)
    pg.start()
    return pg


@dataclass
class Moto:
    """moto's standalone S3 server: ``new_bucket()`` gives each store its own."""

    endpoint: str
    process: subprocess.Popen[bytes]

    def new_bucket(self) -> str:
        import boto3

        name = "b-" + uuid.uuid4().hex[:12]
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=name)
        return name


def start_moto() -> Moto | str:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto[server] is not installed (pip install -e '.[dev]')"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + GENEROUS
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Moto(endpoint=f"http://127.0.0.1:{port}", process=proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    return f"moto's S3 server did not start within {GENEROUS:g} s"


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
        pg.close()
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
        pg.close()
