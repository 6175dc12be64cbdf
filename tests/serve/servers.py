"""Both nscas HTTP servers as real processes on 127.0.0.1, with small bounds, and raw-socket
probes of them: the same tests run against a replica and ``nscas ui``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
from tests.waiting import GENEROUS, STARTUP

from .conftest import MAX_NEW_TOKENS, Served

HEADER_TIMEOUT = 2.0
MAX_CONNECTIONS = 3
NSCAS = Path(sys.executable).with_name("nscas")


@dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """A server under test: where it listens, a path it answers 200, and its log."""

    kind: str
    pid: int
    host: str
    port: int
    ok_path: str
    log_path: Path

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _split(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


@contextmanager
def replica_server(served: Served, workdir: Path, *extra: str) -> Iterator[Running]:
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks),
                           options=ReplicaOptions(max_new_tokens=MAX_NEW_TOKENS))
    argv += ["--header-timeout", str(HEADER_TIMEOUT), "--max-connections",
             str(MAX_CONNECTIONS), *extra]
    with ReplicaGroup(workdir) as group:
        started = group.start(argv)
        url = group.wait_ready([started], timeout=STARTUP, model_digest=served.model_digest)[0]
        host, port = _split(url)
        yield Running(kind="replica", pid=started.pid, host=host, port=port, ok_path="/health",
                      log_path=started.log_path)


@contextmanager
def ui_server(store_dir: Path, workdir: Path, *, host: str = "127.0.0.1",
              header_timeout: float = HEADER_TIMEOUT,
              max_connections: int = MAX_CONNECTIONS) -> Iterator[Running]:
    """``nscas ui`` on a free port of ``host``; its stderr is its log."""
    log_path = workdir / "ui.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [str(NSCAS), "--store", str(store_dir), "ui", "--host", host, "--port", "0",
             "--max-connections", str(max_connections), "--header-timeout",
             str(header_timeout)],
            stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), (line, log_path.read_text())
        bound_host, port = _split(line.split()[1])
        yield Running(kind="ui", pid=proc.pid, host=bound_host, port=port, ok_path="/", log_path=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request(server: Running, head: bytes, body: bytes = b"", *, within: float = 30
            ) -> tuple[int, bytes]:
    """Send one raw request on a new connection; the status and everything sent back until
    the server closes (requests here ask it to close)."""
    with socket.create_connection(server.address, timeout=within) as sock:
        sock.sendall(head + body)
        data = read_until_closed(sock, within)
    return status_of(data), data


def read_until_closed(sock: socket.socket, within: float) -> bytes:
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our bytes unread: what came first counts
        pass
    return data


def status_of(data: bytes) -> int:
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else 0


def get_head(server: Running, path: str, *headers: str, close: bool = True) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {server.host}:{server.port}", *headers]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def wait_served(server: Running, within: float = GENEROUS) -> int:
    """Ask for the 200 path until it is answered (connections being closed are still counted
    for a moment); the last status."""
    deadline = time.monotonic() + within
    status = 0
    while time.monotonic() < deadline:
        status, _ = request(server, get_head(server, server.ok_path))
        if status == 200:
            return status
        time.sleep(0.05)
    return status
