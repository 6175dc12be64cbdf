"""Faults around a replica: clients that stall, too many connections, and a starter that is
SIGKILLed (its replicas must not live on, holding a port and their memory)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.recipes.common.lifetime import ORPHANED, OWNER_ENV
from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
from nscas.recipes.serve.server import LINGER_SECONDS
from tests.waiting import STARTUP, wait_until

from .conftest import MAX_NEW_TOKENS, Served

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
MAX_CONNECTIONS = 3
SLACK = 30.0
"""Seconds a timed close may come late on a loaded machine: it must come, not come promptly."""


@pytest.fixture(scope="module")
def strict_replica(served: Served, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, int]]:
    """A replica with one-second header and body timeouts and room for three connections."""
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks),
                           options=ReplicaOptions(max_new_tokens=MAX_NEW_TOKENS))
    argv += ["--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
             "--max-connections", str(MAX_CONNECTIONS)]
    with ReplicaGroup(tmp_path_factory.mktemp("strict")) as group:
        started = group.start(argv)
        url = group.wait_ready([started], timeout=STARTUP, model_digest=served.model_digest)[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port)


@pytest.fixture(scope="module")
def bounded_replica(served: Served, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[str, int]]:
    """A replica with room for three connections and timeouts no test waits for: the
    connections a test holds stay open until it closes them."""
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks),
                           options=ReplicaOptions(max_new_tokens=MAX_NEW_TOKENS))
    argv += ["--header-timeout", "600", "--max-connections", str(MAX_CONNECTIONS)]
    with ReplicaGroup(tmp_path_factory.mktemp("bounded")) as group:
        started = group.start(argv)
        url = group.wait_ready([started], timeout=STARTUP, model_digest=served.model_digest)[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port)


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=SLACK)
    return sock


def _read_all(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed within
    ``within`` seconds."""
    sock.settimeout(within)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_connection_stalled_in_its_headers_is_closed(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        data = _read_all(sock, within=HEADER_TIMEOUT + SLACK)  # a timeout here fails
    assert data == b""


def test_a_connection_that_never_sends_is_closed(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        data = _read_all(sock, within=HEADER_TIMEOUT + SLACK)
    assert data == b""


def test_a_stalled_body_gets_408(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        sock.sendall(b"POST /infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n\r\n{\"request_id\":")
        data = _read_all(sock, within=BODY_TIMEOUT + LINGER_SECONDS + SLACK)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert "did not arrive" in json.loads(body)["error"]["message"]


def _health_over(address: tuple[str, int], *, keep_alive: bool) -> tuple[socket.socket, bytes]:
    """A connection and the head of its answer to ``GET /health`` (the connection is open
    after it when ``keep_alive``, closed by the server otherwise)."""
    sock = _connect(address)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 + (b"" if keep_alive else b"Connection: close\r\n") + b"\r\n")
    sock.settimeout(SLACK)
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    return sock, data


def test_a_connection_over_the_bound_gets_503_and_the_others_are_served(
        bounded_replica: tuple[str, int]) -> None:
    # Each held connection has had an answer: the server has counted it, whatever the load.
    held = [_health_over(bounded_replica, keep_alive=True) for _ in range(MAX_CONNECTIONS)]
    try:
        assert all(head.startswith(b"HTTP/1.1 200") for _, head in held)
        with _connect(bounded_replica) as extra:
            data = _read_all(extra, within=SLACK)
        assert data.startswith(b"HTTP/1.1 503"), data[:80]
        error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
        assert "too many open connections" in error["message"]
        assert error["code"] == "too_many_connections"
    finally:
        for sock, _ in held:
            sock.close()

    def served_again() -> bool:  # once the server has seen them close, a new one is served
        sock, head = _health_over(bounded_replica, keep_alive=False)
        sock.close()
        return head.startswith(b"HTTP/1.1 200")

    wait_until(served_again, "a connection to be served once the held ones closed")


@pytest.mark.parametrize("flag,value", [("--header-timeout", "nan"), ("--body-timeout", "0"),
                                        ("--max-connections", "0")])
def test_bad_server_limits_are_one_line_exit_2(served: Served, flag: str, value: str) -> None:
    argv = [*replica_command(str(served.checkpoint), store_path=served.store_path, tasks=None,
                             options=ReplicaOptions()), flag, value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and flag in done.stderr, done.stderr


# -- a starter that is SIGKILLed ----------------------------------------------------------------

STARTER = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
    checkpoint, store, tasks, digest, workdir = sys.argv[1:6]
    group = ReplicaGroup(Path(workdir))
    argv = replica_command(checkpoint, store_path=Path(store), tasks=tasks,
                           options=ReplicaOptions(max_new_tokens=4))
    started = [group.start(argv) for _ in range(2)]
    group.wait_ready(started, timeout={STARTUP:g}, model_digest=digest)
    print(" ".join(str(r.pid) for r in started), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for every purpose but its entry; /proc tells the two apart
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_replicas_die_with_a_sigkilled_starter(served: Served, tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(served.checkpoint), str(served.store_path),
         str(served.tasks), served.model_digest, str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert starter.stdout is not None
        pids = [int(p) for p in starter.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=SLACK)
        assert _wait_gone(pids, within=SLACK) == []
    finally:
        starter.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


MIDDLE = textwrap.dedent("""
    import os, subprocess, sys, time
    # like torchrun: starts the watcher in a session of its own, and outlives the owner
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
    print("middle", os.getpid(), flush=True)
    time.sleep(600)
""")
WATCHER = ("from nscas.recipes.common.lifetime import exit_with_owner; import os, time; "
           "exit_with_owner(); print('watcher', os.getpid(), flush=True); time.sleep(600)")
OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from nscas.recipes.common.lifetime import owner_env
    middle = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                              env={**os.environ, **owner_env()})
    time.sleep(600)
""")


def test_a_grandchild_ends_with_its_owner_though_its_parent_lives(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, MIDDLE, WATCHER],
                             stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert owner.stdout is not None
        # Each names itself once it is ready, the watcher once it watches its owner.
        named = dict(owner.stdout.readline().split() for _ in range(2))
        middle, watcher = int(named["middle"]), int(named["watcher"])
        pids = [middle, watcher]
        assert _alive(watcher)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=SLACK)
        assert _wait_gone([watcher], within=SLACK) == []
        assert _alive(middle)
    finally:
        owner.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_whose_owner_is_gone_exits_at_once() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    child = subprocess.run([sys.executable, "-c", WATCHER], timeout=30,
                           env={**os.environ, OWNER_ENV: str(gone.pid)})
    assert child.returncode == ORPHANED
