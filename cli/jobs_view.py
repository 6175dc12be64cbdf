"""How a scheduled run (``nscas run --jobs``) looks: a live table of its steps on a terminal,
JSON events with ``--json``, plain lines otherwise. Everything but ``--json`` goes to stderr
while the run goes on; each finished step is then reported on stdout as a sequential run
reports it."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nscas.cli.progress import format_duration, format_fields
from nscas.runs.scheduler import StepEvent

_SHOWN = {"waiting": "waiting", "running": "running", "progress": "running", "note": "running",
          "cached": "cached", "done": "done", "failed": "failed", "stopped": "stopped",
          "not-run": "not run"}
_STYLE = {"cached": "dim", "done": "green", "failed": "bold red", "stopped": "yellow",
          "not run": "yellow", "running": "cyan"}


def json_events(event: StepEvent) -> None:
    """One JSON object a line on stdout, as each event happens."""
    json_line(event.to_json())


def json_line(value: Any) -> None:
    from nscas.redacting import redact  # no credential in --json output either

    sys.stdout.write(redact(json.dumps(value)) + "\n")
    sys.stdout.flush()


@dataclass(slots=True, kw_only=True)
class _Row:
    state: str = "waiting"
    devices: str = ""
    progress: str = ""
    started: float | None = None
    seconds: float | None = None


class LiveTable:
    """A rich table of the run's steps on stderr, redrawn as events arrive (a terminal only)."""

    def __init__(self, then: Callable[[StepEvent], None]) -> None:
        """``then`` gets every event after the table has shown it."""
        from rich.console import Console
        from rich.live import Live

        self._rows: dict[str, _Row] = {}
        self._lock = threading.Lock()
        self._then = then
        self._started = False
        self._live = Live(console=Console(file=sys.stderr), auto_refresh=True,
                          refresh_per_second=2, get_renderable=self._table, transient=False)

    def __enter__(self) -> LiveTable:
        return self  # shown from the first event on: a file refused before that shows none

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._started:
            self._live.__exit__(kind, exc, tb)

    def __call__(self, event: StepEvent) -> None:
        if not self._started:
            self._started = True
            self._live.__enter__()
        with self._lock:
            row = self._rows.setdefault(event.step, _Row())
            row.state = _SHOWN.get(event.state, event.state)
            if event.state == "running":
                row.devices, row.started = event.devices or "", time.monotonic()
            if event.state == "progress":
                done = f"{event.done}/{event.total}" if event.total else str(event.done or 0)
                row.progress = " ".join(p for p in (done, format_fields(event.fields)) if p)
            if event.seconds is not None:
                row.seconds = event.seconds
            if event.state in ("failed", "not-run", "stopped", "note") and event.message:
                row.progress = event.message
        self._then(event)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("step", "state", "devices", "time", "progress"):
            table.add_column(column, overflow="fold")
        now = time.monotonic()
        with self._lock:
            for step, row in self._rows.items():
                took = row.seconds if row.seconds is not None else (
                    now - row.started if row.started is not None else None)
                table.add_row(step, f"[{_STYLE.get(row.state, '')}]{row.state}[/]"
                              if row.state in _STYLE else row.state, row.devices,
                              format_duration(took) if took is not None else "", row.progress)
        return table


class PlainLines:
    """One line on stderr as each step starts or stops; every event then handed to ``then``."""

    def __init__(self, then: Callable[[StepEvent], None]) -> None:
        self._then = then

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, event: StepEvent) -> None:
        if event.state == "running":
            sys.stderr.write(f"step {event.step}: running on {event.devices}\n")
        elif event.state in ("stopped", "not-run"):
            why = f" ({event.message})" if event.message else ""
            sys.stderr.write(f"step {event.step}: {_SHOWN[event.state]}{why}\n")
        self._then(event)
