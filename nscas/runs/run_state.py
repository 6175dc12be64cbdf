"""A scheduled run's steps as they stand, for the UI to show while the run goes on.

The scheduler rewrites ``logs/<run>/state.json`` in the store's directory (atomically: a
temporary file renamed over it) as its steps change; the UI reads every such file whose run is
still in progress. Transient, not evidence (docs/format.md §6.12): receipts say what ran, and
nothing reads this file to decide anything.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nscas.runs.scheduler import StepEvent

LOGS = "logs"
"""The store directory holding each scheduled run's job logs (``logs/<run>/<step>.log``) and
its state file (``logs/<run>/state.json``)."""
STATE_FILE = "state.json"
SHOWN_STATES = ("running", "waiting")
"""The states of a step that the UI lists for a run in progress."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepState:
    step: str
    state: str
    devices: str = ""
    done: int | None = None
    total: int | None = None
    description: str = ""
    since: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInProgress:
    """One scheduled run that has not ended, as its state file says."""

    run: str
    file: str
    pid: int
    started: str
    updated: str
    steps: tuple[StepState, ...]


class RunStateFile:
    """The state file of one scheduled run, written by the scheduler's thread only."""

    def __init__(self, directory: Path, *, file: str, steps: list[str]) -> None:
        self._directory = directory
        self._head = {"run": directory.name, "file": file, "pid": os.getpid(),
                      "started": _now()}
        self._steps: dict[str, dict[str, Any]] = {s: {"state": "waiting"} for s in steps}

    def record(self, event: StepEvent) -> None:
        """Take in one of the run's events and rewrite the file."""
        step = self._steps.setdefault(event.step, {"state": "waiting"})
        if event.state == "progress":
            step.update(done=event.done, total=event.total)
            if event.description:
                step["description"] = event.description
        elif event.state != "note":
            step["state"] = event.state
            if event.state == "running":
                step.update(devices=event.devices or "", since=_now())
        self._write(finished=False)

    def close(self) -> None:
        """The run has ended (however): the file says so, and the UI lists it no more."""
        self._write(finished=True)

    def _write(self, *, finished: bool) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        body = json.dumps({**self._head, "updated": _now(), "finished": finished,
                           "steps": self._steps})
        fd, temporary = tempfile.mkstemp(dir=self._directory, prefix=".state-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(body)
            os.replace(temporary, self._directory / STATE_FILE)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def runs_in_progress(store_root: Path) -> list[RunInProgress]:
    """The scheduled runs of the store at ``store_root`` that have not ended and whose process still lives,
    newest first, each with its running and waiting steps. A file that cannot be read as one
    (being replaced, damaged) is passed over: the file is a view, not a record."""
    found = []
    for path in sorted((store_root / LOGS).glob(f"*/{STATE_FILE}"), reverse=True):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("finished") is not False or not _alive(int(raw["pid"])):
                continue
            steps = tuple(
                StepState(step=str(name), state=str(s["state"]), devices=str(s.get("devices", "")),
                          done=s.get("done"), total=s.get("total"),
                          description=str(s.get("description", "")), since=str(s.get("since", "")))
                for name, s in raw["steps"].items() if s.get("state") in SHOWN_STATES)
            found.append(RunInProgress(run=str(raw["run"]), file=str(raw["file"]),
                                       pid=int(raw["pid"]), started=str(raw["started"]),
                                       updated=str(raw["updated"]), steps=steps))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _alive(pid: int) -> bool:
    if pid <= 0:  # 0 and negatives name process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
