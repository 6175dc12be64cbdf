"""A real ``nscas ui`` process: a verify page that closes ends its verification, at most the
documented number run at once, the bound address is accepted as Host, and a team store whose
database is down answers 503 in one line."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.ui.app import LIMITS
from nscas.ui.settings import VERIFY_SLOTS_DEFAULT
from tests.serve.servers import Running, get_head, read_until_closed, request, ui_server
from tests.ui.conftest import Hostile, build_hostile
from tests.waiting import GENEROUS, wait_until


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return build_hostile(tmp_path_factory.mktemp("ui-server"))


@pytest.fixture()
def ui(store: Hostile, tmp_path: Path) -> Iterator[tuple[Running, int]]:
    """The server and its process id (its verifications are its children)."""
    with ui_server(store.store_dir, tmp_path, header_timeout=30, max_connections=16) as running:
        yield running, running.pid


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _wait(condition: object, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _open_verify(running: Running, oid: str) -> socket.socket:
    sock = socket.create_connection(running.address, timeout=GENEROUS)
    sock.sendall(get_head(running, f"/verify/{oid}", close=False))
    data = b""
    while b"\r\n\r\n" not in data:  # the stream has begun (its headers come first)
        data += sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return sock


def _stop_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)  # it can finish nothing until it is ended


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_closing_a_verify_page_ends_its_process(ui: tuple[Running, int], store: Hostile) -> None:
    running, server_pid = ui
    page = _open_verify(running, str(store.receipt))
    wait_until(lambda: _children(server_pid), "the verify page's verification to start")
    verifiers = _children(server_pid)
    _stop_all(verifiers)  # held mid-run: only the server's kill can end it now
    try:
        page.close()
        wait_until(lambda: not any(_alive(p) for p in verifiers),
                   f"the closed page's verifications {verifiers} to end")
    finally:
        for pid in verifiers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_at_most_the_documented_number_of_verifications_run(ui: tuple[Running, int],
                                                          store: Hostile) -> None:
    running, server_pid = ui
    pages = [_open_verify(running, str(store.receipt)) for _ in range(VERIFY_SLOTS_DEFAULT + 2)]
    seen: set[int] = set()
    try:
        def slots_full() -> bool:
            running_now = _children(server_pid)
            _stop_all(running_now)
            seen.update(running_now)
            return len(running_now) >= VERIFY_SLOTS_DEFAULT

        wait_until(slots_full, "every verification slot to be taken")
        # The others wait for a slot: none starts while the first ones are held (a look over
        # a while, which load can only make see less, never fail).
        assert not _wait(lambda: len(_children(server_pid)) > VERIFY_SLOTS_DEFAULT, within=1.5)
    finally:
        for page in pages:
            page.close()
    wait_until(lambda: not _children(server_pid), "the closed pages' verifications to end")
    assert len(seen) == VERIFY_SLOTS_DEFAULT  # the waiting pages' verifications never began


def test_a_bound_loopback_address_is_accepted_as_host(store: Hostile, tmp_path: Path) -> None:
    with ui_server(store.store_dir, tmp_path, host="127.0.0.2") as running:
        assert running.host == "127.0.0.2"
        for host in ("127.0.0.2", f"127.0.0.2:{running.port}", "localhost", "127.0.0.1"):
            head = (f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").encode()
            status, data = request(running, head)
            assert status == 200, (host, data[:300])
        head = b"GET / HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n"
        status, _ = request(running, head)
        assert status == 421


def test_a_page_of_a_store_whose_database_is_down_is_503(tmp_path: Path) -> None:
    from nscas.store.config import StoreConfig
    from nscas.store.writer import init_store
    from tests.store.services import start_moto, start_postgres

    pg = start_postgres()
    if isinstance(pg, str):
        pytest.skip(pg)
    moto = start_moto()
    stopped = False
    try:
        if isinstance(moto, str):
            pytest.skip(moto)
        from nscas.store.config import S3Settings
        from tests.store.services import S3_KEYS

        os.environ.update(S3_KEYS)
        config = StoreConfig(database=pg.new_database(), objects=f"s3://{moto.new_bucket()}/s",
                             s3=S3Settings(endpoint_url=moto.endpoint))
        root = tmp_path / "team"
        init_store(root, config).close()
        with ui_server(root / ".nscas", tmp_path) as running:
            status, _ = request(running, get_head(running, "/"))
            assert status == 200
            pg.stop()
            stopped = True
            before = running.log()
            status, data = request(running, get_head(running, "/"))
            assert status == 503, data[:400]
            assert b"\r\nRetry-After: " in data
            added = running.log()[len(before):]
            assert "Traceback" not in added and added.count("\n") <= 1, added
            status, _ = request(running, get_head(running, "/?bogus=1"))
            assert status == 400  # the asker's fault stays theirs
    finally:
        if not isinstance(moto, str):
            moto.process.kill()
            moto.process.wait()
        if stopped:
            import shutil

            shutil.rmtree(pg.data.parent, ignore_errors=True)
        else:
            pg.close()


def test_the_ui_reads_no_body_for_long(ui: tuple[Running, int]) -> None:
    running, _ = ui
    head = (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
    bound = 10 * LIMITS.body_timeout  # bounded by the body timeout, with room for a loaded box
    with socket.create_connection(running.address, timeout=GENEROUS) as sock:
        sock.sendall(head + b"x" * 10)
        started = time.monotonic()
        data = read_until_closed(sock, bound + GENEROUS)
    assert data.startswith(b"HTTP/1.1 ") and time.monotonic() - started < bound
