"""``nscas ui`` as a command: it listens on loopback, warns off loopback, and refuses bad
options in one line (exit 2) without starting."""

from __future__ import annotations

import socket
import subprocess
import urllib.request

from tests.ui.conftest import NSCAS, Hostile, free_port, start_ui, stop_ui
from tests.waiting import GENEROUS


def test_serves_on_loopback_and_stops_on_sigterm(hostile: Hostile) -> None:
    server = start_ui(hostile.store_dir)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url + "/", timeout=GENEROUS) as r:
            assert r.status == 200 and b"hostile/receipt" in r.read()
    finally:
        stop_ui(server)
    assert server.process.returncode == 0


def test_a_host_off_loopback_warns(hostile: Hostile) -> None:
    proc = subprocess.Popen([str(NSCAS), "--store", str(hostile.store_dir), "ui", "--host",
                             "0.0.0.0", "--port", str(free_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("listening ")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=GENEROUS)
    assert err.startswith("nscas: warning: --host 0.0.0.0 is not loopback")


def run(*args: str, cwd: object = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NSCAS), *args], capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd)


def test_bad_options_are_one_line_exit_2(hostile: Hostile, tmp_path: object) -> None:
    store = ["--store", str(hostile.store_dir)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        cases = [run(*store, "ui", "--port", "70000"), run(*store, "ui", "--port", "x"),
                 run(*store, "ui", "--port", busy), run("ui", cwd=tmp_path),
                 run(*store, "ui", "--host", " 127.0.0.1")]
    for done in cases:
        assert done.returncode == 2, done
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert done.stdout == ""
