"""One scheduled step, in a process of its own: ``python -m nscas.runs.job SPEC``.

The scheduler (nscas.runs.scheduler) starts this module with a ``JobSpec`` (JSON) as its one
argument, in a new process group, with the step's devices already in its environment. It runs
the one step through the runner (so it is cached exactly as in a sequential run), planning only
that step (the scheduler checked the whole file) and importing only its recipe, taking the
outputs of the steps it reads from the receipts the spec names, and writes its
events, one JSON object a line, to the file descriptor the spec names: progress while it runs,
then the outcome (the step's result, pickled: only the scheduler that started it reads it).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Protocol

from nscas.errors import NscasError
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.writer import Store

PROGRESS_INTERVAL_S = 0.5
"""The least time between two progress events of one job (starts, notes and ends always go)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What a job is to run: the step ``step`` of the run file ``file`` (with ``sets`` and
    ``name``, as the whole run has them) in the store at ``store``; ``upstream`` the receipts
    of the steps it reads (by step name); ``cores`` the CPUs it may use; ``events`` the file
    descriptor it writes its events to."""

    store: str
    file: str
    step: str
    sets: tuple[str, ...] = ()
    name: str | None = None
    rerun: bool = False
    upstream: dict[str, str] = field(default_factory=dict)
    cores: tuple[int, ...] = ()
    events: int = 1
    sign_key: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        raw = json.loads(text)
        raw["sets"], raw["cores"] = tuple(raw["sets"]), tuple(raw["cores"])
        return cls(**raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How a job ended: its step's result (None if the step did not get as far as one), or the
    error that stopped it, the exit code that error has, and its failed receipt, if one."""

    result: Any = None  # a nscas.runs.runner.StepResult
    error: str | None = None
    exit_code: int = 0
    receipt: Digest | None = None


class EventSink(Protocol):
    """Where a running step's events go: a job's pipe (``Events``), or the Ray executor's
    queue back to the scheduler."""

    def send(self, event: dict[str, Any]) -> None: ...


class Events:
    """Writes a job's events to a stream (its pipe); thread-safe (a recipe may report from threads)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._stream.write(json.dumps(event) + "\n")
            self._stream.flush()


class EventProgress:
    """``Progress`` as events: the scheduler shows them in its table."""

    def __init__(self, events: EventSink) -> None:
        self._events = events
        self._done = 0
        self._total: int | None = None
        self._last = 0.0

    def start(self, total: int | None, description: str) -> None:
        self._done, self._total = 0, total
        self._events.send({"event": "progress", "done": 0, "total": total,
                           "description": description, "fields": {}})

    def advance(self, n: int = 1, **fields: Any) -> None:
        self._done += n
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S and self._done != self._total:
            return
        self._last = now
        shown = {k: v for k, v in fields.items() if isinstance(v, int | float | str)}
        self._events.send({"event": "progress", "done": self._done, "total": self._total,
                           "fields": shown})

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        self._events.send({"event": "note", "message": message})


def run_job(spec: JobSpec, events: EventSink) -> Outcome:
    from nscas.store.writer import Store

    with Store(Path(spec.store)) as store:
        return run_in(store, spec, events)


def run_in(store: Store, spec: JobSpec, events: EventSink) -> Outcome:
    """Run the spec's step in ``store`` (opened by the caller: the spec's, as a node sees it)."""
    from nscas.runs.plans import plan_one_step
    from nscas.runs.runner import StepFailed, StepResult, run_plan
    from nscas.signing.signatures import KeySigner, configured_key

    seen: list[StepResult] = []
    key = configured_key(Path(spec.sign_key) if spec.sign_key else None)
    try:
        # The scheduler checked the whole file: plan (and import the recipe of) this step only.
        planned = plan_one_step(store, Path(spec.file), spec.step, sets=spec.sets,
                                name=spec.name, upstream={
                                    k: Digest.parse(v) for k, v in spec.upstream.items()})
        run_plan(store, planned, rerun=spec.rerun, progress=lambda _: EventProgress(events),
                 on_step=seen.append, signer=KeySigner(key) if key is not None else None)
    except StepFailed as exc:
        return Outcome(result=seen[0] if seen else None, error=exc.message,
                       exit_code=exc.exit_code, receipt=exc.receipt)
    except NscasError as exc:
        return Outcome(result=seen[0] if seen else None, error=exc.message,
                       exit_code=exc.exit_code)
    return Outcome(result=seen[0])


def _stop_on_term(signum: int, frame: FrameType | None) -> None:
    # A stopped job ends as an interrupted one: the runner records it (a failed receipt) and
    # the recipe's own cleanup stops what it started.
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def die_with(fd: int) -> None:
    """End this job when the scheduler that started it dies (even by SIGKILL), so that no job
    outlives its run: the scheduler holds the write end of the pipe ``fd`` reads and never
    writes, so a read returns end-of-file exactly when it is gone. The watch reads the raw
    descriptor: a daemon thread blocked in a buffered ``sys.stdin`` read holds that buffer's
    lock, and the interpreter's exit, flushing stdin, then dies with "Fatal Python error:
    _enter_buffered_busy" (exit status 134) instead of returning the job's own."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:  # the descriptor is gone: nothing to watch
            return
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="scheduler-watch", daemon=True).start()


def serve(spec: JobSpec, *, watch: int) -> int:
    """Run ``spec`` as this process's one job (its signals, its CPUs, its events), ending it
    if the pipe ``watch`` reads reaches end-of-file; the job's exit status. Shared by a cold
    job process (``main``) and one forked warm (nscas.runs.warm)."""
    signal.signal(signal.SIGTERM, _stop_on_term)
    signal.signal(signal.SIGINT, _stop_on_term)
    die_with(watch)
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    events = Events(os.fdopen(spec.events, "w", encoding="utf-8"))
    outcome = run_job(spec, events)
    events.send({"event": "outcome",
                 "pickle": base64.b64encode(pickle.dumps(outcome)).decode("ascii")})
    return outcome.exit_code


def main(argv: list[str]) -> int:
    return serve(JobSpec.from_json(argv[1]), watch=sys.stdin.fileno())


if __name__ == "__main__":
    # Run as the module of its own name, so that what it pickles names nscas.runs.job.
    from nscas.runs.job import main as job_main

    sys.exit(job_main(sys.argv))
