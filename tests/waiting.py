"""Waiting for something a test can observe, never for a fixed time: a loaded machine makes
any fixed sleep too short, and a generous deadline costs nothing when the event comes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

GENEROUS = 120.0
"""Seconds to wait before calling a wait failed: far beyond any wait on a loaded 2-core box."""


def wait_until(condition: Callable[[], object], what: str, *, limit: float = GENEROUS,
               every: float = 0.02) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` if it is not within ``limit``
    seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"waited {limit:g} s for {what}"
        time.sleep(every)

STARTUP = 3 * GENEROUS
"""Seconds for a process that imports torch and loads a model (a replica) to say it is ready:
a loaded 2-core box has been seen to take more than 90 s."""


class DeadlinePassed(Exception):
    """A ``deadline`` passed (no ``OSError``, which the code under it may catch)."""


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise ``DeadlinePassed`` naming ``what`` in the block if it runs past ``seconds``: a bound
    for work that is no test's (a shared fixture's build), which pytest-timeout does not bound.
    Off the main thread, where no signal can arrive, the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise DeadlinePassed(f"{what} took over {seconds:g} s")

    before = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


STALL = GENEROUS
"""Seconds a process (and every process it started) may use no CPU at all before a wait for
its end calls it stuck: a slow process on a loaded machine still gets some CPU each second."""


def cpu_ticks(pid: int) -> int:
    """The CPU time, in clock ticks, that ``pid`` and its descendants have used (those still
    running, and those that ended and were waited for), from ``/proc``; 0 once it is gone."""
    used: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3, the state
        used[int(entry.name)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += used.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def communicate(process: subprocess.Popen[Any], what: str, *, input: Any = None,
                stall: float = STALL, every: float = 1.0) -> tuple[Any, Any]:
    """``process.communicate()``: its output once it has ended, however long it takes while it
    (or a process it started) keeps using CPU; killed, and the wait failed naming ``what``,
    once it has used none for ``stall`` seconds (it is stuck, not slow)."""
    last, since = cpu_ticks(process.pid), time.monotonic()
    while True:
        try:
            return process.communicate(input, timeout=every)
        except subprocess.TimeoutExpired:
            input = None  # sent already: communicate() takes it only once
        now = cpu_ticks(process.pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            process.kill()
            _, err = process.communicate()
            raise AssertionError(f"{what}: used no CPU for {stall:g} s, stuck (killed); "
                                 f"its stderr: {err!r}")


def run_to_end(argv: Sequence[str], what: str, *, input: Any = None, stall: float = STALL,
               **popen: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, capture_output=True, ...)`` bounded by progress, not wall time:
    see ``communicate``."""
    stdin = subprocess.PIPE if input is not None else popen.pop("stdin", None)
    with subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          **popen) as process:
        try:
            out, err = communicate(process, what, input=input, stall=stall)
        finally:
            if process.poll() is None:
                process.kill()
    return subprocess.CompletedProcess(list(argv), process.returncode, out, err)
