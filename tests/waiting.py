"""Waiting for something a test can observe, never for a fixed time: a loaded machine makes
any fixed sleep too short, and a generous deadline costs nothing when the event comes."""

from __future__ import annotations

import time
from collections.abc import Callable

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
