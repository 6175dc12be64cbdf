"""Where a scheduled run's steps execute: the seam between the scheduler and what runs a job.

The scheduler (nscas.runs.scheduler) decides when a step starts and with what; an ``Executor``
starts it and reports what it sends: each event (a dict, as nscas.runs.job writes them, the
last one the ``outcome``), then ``None`` once the step has ended. ``LocalProcesses`` runs each
step in a process group of its own on this machine, forked by a warm server (nscas.runs.warm)
or as ``python -m nscas.runs.job``; the Ray
executor (nscas.runs.rayexec) runs it as a task on a cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from nscas.runs.job import JobSpec
from nscas.runs.resources import Grant, Needs
from nscas.runs.warm import WarmJob, WarmJobs

Post = Callable[[dict[str, Any] | None], None]
"""Takes a started step's events, then None when it has ended (called from any thread)."""


class Running(Protocol):
    """One started step."""

    def stop(self) -> None:
        """Ask it to end; its recipe's cleanup runs and it records a failed receipt."""

    def wait(self, timeout: float) -> None:
        """Return once it has ended, or after ``timeout`` seconds."""

    def kill(self) -> None:
        """End it now, with whatever it left running; harmless once it has ended."""

    def why_ended(self) -> str:
        """Why it ended without an outcome, for the failed step's message."""


class Executor(Protocol):
    def never_fits(self, needs: Needs) -> str | None:
        """Why a step with these needs could never start where this executor puts it, though
        the machine's totals hold them (a cluster's steps run on one node each); else None."""

    def devices(self, needs: Needs, grant: Grant) -> str:
        """What a started step was given, as its ``running`` event shows it."""

    def start(self, spec: JobSpec, *, needs: Needs, grant: Grant, log: Path,
              post: Post) -> Running:
        """Start ``spec``'s step with what ``grant`` gave it; its output goes to ``log``."""


class LocalProcesses:
    """Each step in a process of its own on this machine, with its grant's cores and GPUs:
    forked by ``warm`` (nscas.runs.warm) where given and there, else started cold."""

    def __init__(self, warm: WarmJobs | None = None) -> None:
        self._warm = warm

    def never_fits(self, needs: Needs) -> str | None:
        return None  # one machine: its totals are what a step can have

    def devices(self, needs: Needs, grant: Grant) -> str:
        return grant.describe()  # its very cores and GPUs

    def start(self, spec: JobSpec, *, needs: Needs, grant: Grant, log: Path,
              post: Post) -> Running:
        read_end, write_end = os.pipe()
        spec = dataclasses.replace(spec, events=write_end)
        # The job imports what this process does (its recipes above all: the scheduler found
        # the cached ones by their code), however this process's path was made.
        env = {**os.environ, **grant.environment(needs),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        running: _Process | _Forked | None = None
        if self._warm is not None:
            watch_read, watch_write = os.pipe()  # the job's watch on this process
            with log.open("ab") as out:
                forked = self._warm.start(spec.to_json(), env=env, events=write_end,
                                          watch=watch_read, log=out.fileno())
            os.close(watch_read)
            if forked is not None:
                running = _Forked(forked, watch_write)
            else:
                os.close(watch_write)
        if running is None:
            with log.open("ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "nscas.runs.job", spec.to_json()], env=env,
                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                    pass_fds=(write_end,), start_new_session=True)
            running = _Process(process)
        os.close(write_end)
        threading.Thread(target=_read, args=(running, os.fdopen(read_end, "r"), post),
                         name=f"job-{spec.step}", daemon=True).start()
        return running


class _Process:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    def stop(self) -> None:
        _kill_group(self._process.pid, signal.SIGTERM)

    def wait(self, timeout: float | None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=timeout)

    def kill(self) -> None:
        _kill_group(self._process.pid, signal.SIGKILL)  # whatever it left in its group
        self._process.wait()

    def why_ended(self) -> str:
        return f"the job ended with exit status {self._process.returncode}"


class _Forked:
    """A job the warm server forked: its pid is its process group, as a cold job's; its exit
    status comes from the server, which reaps it."""

    def __init__(self, job: WarmJob, watch: int) -> None:
        self._job = job
        self._watch = watch  # the write end of the job's watch pipe: closed, the job stops

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def wait(self, timeout: float | None) -> None:
        self._job.ended.wait(timeout)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self._job.ended.wait()
        with contextlib.suppress(OSError):
            os.close(self._watch)

    def why_ended(self) -> str:
        return f"the job ended with exit status {self._job.returncode}"

    def _signal(self, sig: signal.Signals) -> None:
        if self._job.pid is None:
            return
        _kill_group(self._job.pid, sig)
        if not self._job.ended.is_set():  # not yet in a group of its own, just forked
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._job.pid, sig)


def _read(running: _Process | _Forked, stream: IO[str], post: Post) -> None:
    """A job's events, then its end (this thread's only output)."""
    with stream:
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                post(event)
    running.wait(None)
    post(None)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
