"""How a running recipe's progress looks: a rich bar on a terminal, plain periodic lines otherwise.

Both implement ``nscas.runs.recipe.Progress``. Progress goes to stderr, so ``--json`` output on
stdout stays clean. Recipes report custom fields (``loss=``, ``tokens_per_s=``) with
``advance``; both displays show the latest value of each.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from nscas.runs.recipe import Progress

PLAIN_INTERVAL_S = 10.0
"""Seconds between plain progress lines: often enough to see life, rarely enough for a log."""


def format_fields(fields: Mapping[str, Any]) -> str:
    """``loss=2.314 tokens/s=12,345``: four significant digits, thousands separated."""
    return " ".join(f"{_label(k)}={_number(v)}" for k, v in fields.items())


def _label(key: str) -> str:
    # Keyword arguments cannot hold a slash; ``tokens_per_s`` reads better as ``tokens/s``.
    return key.replace("_per_", "/")


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``12s``."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class PlainProgress:
    """Progress as plain lines on ``stream``: one at start, one every ``interval`` seconds
    while it advances, one at the end. ``clock`` is injectable for tests."""

    def __init__(self, label: str, *, stream: TextIO | None = None,
                 interval: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._interval = interval
        self._clock = clock
        self._description = ""
        self._total: int | None = None
        self._done = 0
        self._fields: dict[str, Any] = {}
        self._started: float | None = None
        self._last = 0.0

    def start(self, total: int | None, description: str) -> None:
        self.finish()  # a recipe may report several phases, one after the other
        self._description, self._total, self._done, self._fields = description, total, 0, {}
        self._started = self._last = self._clock()
        of = f" (0/{total})" if total is not None else ""
        self._write(f"{description}{of}")

    def advance(self, n: int = 1, **fields: Any) -> None:
        if self._started is None:
            self.start(None, "working")
        self._done += n
        self._fields.update(fields)
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self._write(self._status(now))

    def finish(self) -> None:
        if self._started is None:
            return
        now = self._clock()
        parts = [f"{self._description}: done"]
        if self._total is not None:
            parts.append(f"{self._done}/{self._total}")
        elif self._done:
            parts.append(str(self._done))
        parts.append(f"in {format_duration(now - self._started)}")
        if self._fields:
            parts.append(format_fields(self._fields))
        self._write(" ".join(parts))
        self._started = None

    def note(self, message: str) -> None:
        self._write(message)

    def _status(self, now: float) -> str:
        parts = [f"{self._description}:"]
        if self._total is not None:
            pct = f" {100 * self._done / self._total:.0f}%" if self._total else ""
            parts.append(f"{self._done}/{self._total}{pct}")
        else:
            parts.append(str(self._done))
        if self._fields:
            parts.append(format_fields(self._fields))
        elapsed = now - (self._started or now)
        if self._total is not None and 0 < self._done < self._total and elapsed > 0:
            left = (self._total - self._done) * elapsed / self._done
            parts.append(f"eta {format_duration(left)}")
        return " ".join(parts)

    def _write(self, line: str) -> None:
        self._stream.write(f"[{self._label}] {line}\n")
        self._stream.flush()


class RichProgress:
    """A rich progress bar on ``stream`` (a terminal): description, done/total, the latest
    custom fields, elapsed time and ETA. Each ``start`` adds a bar; finished bars stay."""

    def __init__(self, label: str, *, stream: TextIO | None = None) -> None:
        from rich.console import Console

        self._label = label
        self._console = Console(file=stream if stream is not None else sys.stderr,
                                highlight=False)
        self._bar: Any = None
        self._task: Any = None
        self._fields: dict[str, Any] = {}

    def start(self, total: int | None, description: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if self._bar is None:
            self._bar = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self._console, transient=False)
            self._bar.start()
        self._fields = {}
        self._task = self._bar.add_task(f"{self._label}: {description}", total=total, info="")

    def advance(self, n: int = 1, **fields: Any) -> None:
        if self._task is None:
            self.start(None, "working")
        self._fields.update(fields)
        self._bar.update(self._task, advance=n, info=format_fields(self._fields))

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._bar = self._task = None

    def note(self, message: str) -> None:
        self._console.print(f"[{self._label}] {message}", markup=False, highlight=False)


def progress_for(label: str, *, stream: TextIO | None = None) -> Progress:
    """The progress display for one step: rich on a terminal, plain lines otherwise."""
    out = stream if stream is not None else sys.stderr
    if out.isatty():
        return RichProgress(label, stream=out)
    return PlainProgress(label, stream=out)
