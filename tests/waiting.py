"""Waiting for something a test can observe, never for a fixed time: a loaded machine makes
any fixed sleep too short, and a generous deadline costs nothing when the event comes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

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
