"""Faults around a replica: clients that stall, too many connections, and a starter that is
SIGKILLed (its replicas must not live on, holding a port and their memory)."""

from __future__ import annotations

import json
import math
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

from .conftest import MAX_NEW_TOKENS, Served

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
MAX_CONNECTIONS = 3


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
        url = group.wait_ready([started], timeout=90, model_digest=served.model_digest)[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port)


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    return sock


def _read_all(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    data, _, closed = _read_timed(sock, within)
    return data, closed


def _read_timed(sock: socket.socket, within: float) -> tuple[bytes, float, float]:
    """What the server sends until it closes, seconds to its first byte and to the close."""
    started = time.monotonic()
    first = math.inf
    sock.settimeout(within)
    data = b""
    while chunk := sock.recv(65536):
        first = min(first, time.monotonic() - started)
        data += chunk
    return data, first, time.monotonic() - started


def test_a_connection_stalled_in_its_headers_is_closed(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        data, seconds = _read_all(sock, within=HEADER_TIMEOUT + 10)
    assert data == b""
    assert seconds < HEADER_TIMEOUT + 5


def test_a_connection_that_never_sends_is_closed(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        data, seconds = _read_all(sock, within=HEADER_TIMEOUT + 10)
    assert data == b"" and seconds < HEADER_TIMEOUT + 5


def test_a_stalled_body_gets_408(strict_replica: tuple[str, int]) -> None:
    with _connect(strict_replica) as sock:
        sock.sendall(b"POST /infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n\r\n{\"request_id\":")
        data, answered, closed = _read_timed(sock, within=BODY_TIMEOUT + 15)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert "did not arrive" in json.loads(body)["error"]["message"]
    assert answered < BODY_TIMEOUT + 4
    assert closed < BODY_TIMEOUT + LINGER_SECONDS + 4


def test_a_connection_over_the_bound_gets_503_and_the_others_are_served(
        strict_replica: tuple[str, int]) -> None:
    held = [_connect(strict_replica) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # let the server accept them all
        with _connect(strict_replica) as extra:
            data, _ = _read_all(extra, within=5)
        assert data.startswith(b"HTTP/1.1 503"), data[:80]
        error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
        assert "too many open connections" in error["message"]
        assert error["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    with _connect(strict_replica) as sock:  # once they are closed, a new one is served
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data, _ = _read_all(sock, within=10)
    assert data.startswith(b"HTTP/1.1 200"), data[:80]


@pytest.mark.parametrize("flag,value", [("--header-timeout", "nan"), ("--body-timeout", "0"),
                                        ("--max-connections", "0")])
def test_bad_server_limits_are_one_line_exit_2(served: Served, flag: str, value: str) -> None:
    argv = [*replica_command(str(served.checkpoint), store_path=served.store_path, tasks=None,
                             options=ReplicaOptions()), flag, value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and flag in done.stderr, done.stderr


# -- a starter that is SIGKILLed ----------------------------------------------------------------

STARTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
    checkpoint, store, tasks, digest, workdir = sys.argv[1:6]
    group = ReplicaGroup(Path(workdir))
    argv = replica_command(checkpoint, store_path=Path(store), tasks=tasks,
                           options=ReplicaOptions(max_new_tokens=4))
    started = [group.start(argv) for _ in range(2)]
    group.wait_ready(started, timeout=90, model_digest=digest)
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
        starter.wait(timeout=10)
        assert _wait_gone(pids, within=10) == []
    finally:
        starter.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


MIDDLE = textwrap.dedent("""
    import subprocess, sys, time
    # like torchrun: starts the watcher in a session of its own, and outlives the owner
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
""")
WATCHER = ("from nscas.recipes.common.lifetime import exit_with_owner; import time; "
           "exit_with_owner(); time.sleep(600)")
OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from nscas.recipes.common.lifetime import owner_env
    middle = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                              env={**os.environ, **owner_env()})
    print(middle.pid, flush=True)
    time.sleep(600)
""")


def test_a_grandchild_ends_with_its_owner_though_its_parent_lives(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, MIDDLE, WATCHER],
                             stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert owner.stdout is not None
        pids = [int(owner.stdout.readline()), int(owner.stdout.readline())]
        middle, watcher = pids
        time.sleep(0.5)  # the watcher has started watching
        assert _alive(watcher)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert _wait_gone([watcher], within=5) == []
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
