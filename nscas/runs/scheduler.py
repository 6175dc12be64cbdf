"""Run a pipeline's ready steps at once on one machine, each in a process of its own.

The run file is checked whole first (``plan_file``: bad input writes nothing). Then every step
whose upstream steps have succeeded is answered here if its action has a succeeded receipt
already (through the runner, under the action's claim, as a sequential run answers it: no job
started), and otherwise starts as soon as a job slot and its declared resources
(nscas.runs.resources: cores, GPUs, and for a step run on this machine the disk it estimates,
beside the running steps' estimates, within the store's free disk) are free: any ready step
that fits starts, those heading the longest chain of steps first (``by_priority``), as
a job in a new process group (forked by one warm server per run that imported the recipes,
torch and transformers once: nscas.runs.warm), with its CPUs (affinity, thread count)
and GPUs (``CUDA_VISIBLE_DEVICES``) given. Each job runs its one step through the runner, so
actions, outputs and IDs are those of a sequential run; two jobs (or runs) of one action run
it once (nscas.store.claims). A failed step stops the steps
that depend on it, and by default every other job too; a stopped or interrupted run ends every
job's process group before it returns.
"""

from __future__ import annotations

import base64
import os
import pickle
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nscas.errors import NscasError
from nscas.objects.digests import Digest
from nscas.runs.actions import code_id
from nscas.runs.config import load_run_file
from nscas.runs.executor import Executor, LocalProcesses, Running
from nscas.runs.job import JobSpec, Outcome
from nscas.runs.planning import Planned, Source, step_inputs
from nscas.runs.plans import RunPlan, plan_file
from nscas.runs.resources import (
    Disk,
    Grant,
    Machine,
    Needs,
    Pool,
    input_sizes,
    needs_of,
    store_disk,
    this_machine,
)
from nscas.runs.run_state import LOGS, RunStateFile
from nscas.runs.runner import StepResult, cached_receipt, run_planned_step
from nscas.runs.warm import WarmJobs
from nscas.store.writer import Store

STOP_GRACE_S = 10.0
"""How long a stopped job has to end (its recipe's cleanup) before its group is killed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How a scheduled run runs: at most ``jobs`` steps at once; ``gpu_share`` steps per GPU;
    ``keep_going``: after a failure, finish what does not depend on it."""

    jobs: int
    gpu_share: int = 1
    keep_going: bool = False
    machine: Machine | None = None
    """What to hand out; None: this machine (its CPU affinity and ``nvidia-smi``'s GPUs)."""
    executor: Executor | None = None
    """What runs each step; None: a process of its own on this machine."""
    disk: Callable[[], Disk] | None = None
    """The disk steps may take now; None: the store's file system (``store_disk``) where
    steps run on this machine, no disk admission under another executor (its nodes' disks)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEvent:
    """A change in one step's state: ``waiting``, ``running`` (with ``devices``), ``progress``
    (``done`` of ``total``, ``fields``), ``note``, ``cached``, ``done``, ``failed``,
    ``stopped`` (ended by the run), ``not-run`` (an upstream step failed)."""

    step: str
    state: str
    devices: str | None = None
    done: int | None = None
    total: int | None = None
    description: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    message: str | None = None
    result: StepResult | None = None
    seconds: float | None = None
    log: Path | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.state, "step": self.step}
        for key in ("devices", "done", "total", "description", "message", "seconds"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.fields:
            out["fields"] = dict(self.fields)
        if self.log is not None:
            out["log"] = str(self.log)
        if self.result is not None:
            out["receipt"] = str(self.result.receipt)
            out["action"] = str(self.result.action)
        return out


class StepsFailed(NscasError):
    """Steps of a scheduled run failed (or were stopped); their receipts are named."""

    exit_code = 1

    def __init__(self, failed: Mapping[str, Digest | None], results: list[StepResult],
                 stopped: tuple[str, ...]) -> None:
        named = ", ".join(f"{step} (receipt {receipt})" if receipt else step
                          for step, receipt in failed.items())
        extra = f"; stopped: {', '.join(stopped)}" if stopped else ""
        super().__init__(f"{len(failed)} step{'s' if len(failed) != 1 else ''} failed: "
                         f"{named}{extra}")
        self.failed = dict(failed)
        self.results = results
        self.stopped = stopped


class StepNeverFits(NscasError):
    """A step needs more than the machine has: it could never start."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"step {step!r} cannot run here: {why}")
        self.step = step


@dataclass(slots=True, kw_only=True)
class _Job:
    step: str
    running: Running
    grant: Grant
    needs: Needs
    started: float
    log: Path
    outcome: Outcome | None = None


def run_scheduled(store: Store, path: Path, options: Options, *, rerun: bool = False,
                  sets: tuple[str, ...] = (), only: tuple[str, ...] = (),
                  start: str | None = None, name: str | None = None,
                  sign_key: Path | None = None,
                  on_event: Callable[[StepEvent], None] | None = None) -> list[StepResult]:
    """Run the file's chosen steps at most ``options.jobs`` at once; their results in the order
    they ended. Raises ``StepsFailed`` (after every job has ended) if a step failed."""
    # Steps run on this machine fork from one warm server (nscas.runs.warm), started first so
    # that its imports overlap the planning; it imports the recipes the file names (a file
    # that cannot be read fails here as planning would fail on it).
    warm = (WarmJobs(tuple(dict.fromkeys(s.recipe for s in load_run_file(path).steps)))
            if options.executor is None else None)
    try:
        if warm is not None:
            warm.open()
        return _plan_and_run(store, path, options, warm, rerun=rerun, sets=sets, only=only,
                             start=start, name=name, sign_key=sign_key, on_event=on_event)
    finally:
        if warm is not None:
            warm.close()


def _plan_and_run(store: Store, path: Path, options: Options, warm: WarmJobs | None, *,
                  rerun: bool, sets: tuple[str, ...], only: tuple[str, ...], start: str | None,
                  name: str | None, sign_key: Path | None,
                  on_event: Callable[[StepEvent], None] | None) -> list[StepResult]:
    planned = plan_file(store, path, sets=sets, only=only, start=start, name=name)
    chosen = planned.names
    deps = {item.step.name: set(item.step.upstream.intersection(chosen)) for item in planned.steps}
    pool = Pool(options.machine or this_machine(), gpu_share=options.gpu_share)
    disk = _disk_of(store, options)
    space = disk() if disk is not None else None
    needs: dict[str, Needs] = {}
    for item in planned.steps:
        # Inputs from upstream steps count once those have run (``_Run._disk_admits``).
        needs[item.step.name] = needs_of(item.recipe.name, item.params,
                                         input_sizes(store, item.inputs))
        why = pool.never_fits(needs[item.step.name]) or (
            options.executor.never_fits(needs[item.step.name]) if options.executor else None) \
            or (space.never_fits(needs[item.step.name]) if space is not None else None)
        if why is not None:
            raise StepNeverFits(item.step.name, why)
    emit = on_event or (lambda _: None)
    for step_name in chosen:
        emit(StepEvent(step=step_name, state="waiting"))
    run = _Run(store, path, planned, options, pool, needs, deps, emit, rerun=rerun, sets=sets,
               name=name, sign_key=sign_key, warm=warm)
    return run.go(by_priority(chosen, deps))


def _disk_of(store: Store, options: Options) -> Callable[[], Disk] | None:
    if options.disk is not None:
        return options.disk
    return (lambda: store_disk(store.root)) if options.executor is None else None


class _Run:
    """One scheduled run's state, owned by the thread that called ``run_scheduled``; the
    jobs' reader threads only put events on its queue."""

    def __init__(self, store: Store, path: Path, planned: RunPlan, options: Options,
                 pool: Pool, needs: Mapping[str, Needs], deps: Mapping[str, set[str]],
                 emit: Callable[[StepEvent], None], *, rerun: bool, sets: tuple[str, ...],
                 name: str | None, sign_key: Path | None, warm: WarmJobs | None) -> None:
        self.store, self.path, self.options, self.pool = store, path, options, pool
        self.planned = planned
        self.items: dict[str, Planned] = {item.step.name: item for item in planned.steps}
        self.sources: dict[str, Source] = dict(planned.sources)
        self.needs, self.deps = dict(needs), deps
        self.rerun, self.sets, self.name, self.sign_key = rerun, sets, name, sign_key
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.logs = store.root / LOGS / f"{stamp}-{os.getpid()}"
        self.state = RunStateFile(self.logs, file=str(path), steps=planned.names)

        def shown(event: StepEvent) -> None:  # the UI's view of the run, then the caller's
            self.state.record(event)
            emit(event)

        self.emit = shown
        self.events: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        self.running: dict[str, _Job] = {}
        self.results: list[StepResult] = []
        self.receipts: dict[str, Digest] = {}
        self.failed: dict[str, Digest | None] = {}
        self.stopped: list[str] = []
        self.executor = options.executor or LocalProcesses(warm)
        self.disk = _disk_of(store, options)
        """The disk steps may take now; None: steps are not admitted by disk."""
        self.sized: set[str] = set()
        """Steps whose disk estimate counts all their inputs (they were ready)."""
        self.asked: set[str] = set()
        """Steps whose action the cache was asked about (once, when they were ready)."""
        self.codes: dict[str, Digest] = {}
        """Each recipe's code ID (``code_id``), by recipe name: found once a run."""

    def go(self, chosen: list[str]) -> list[StepResult]:
        waiting = list(chosen)
        stopping = False
        try:
            while waiting or self.running:
                failed: list[str] = []
                if not stopping:
                    waiting = self._start_ready(waiting, failed)
                if not failed:
                    if not self.running:
                        break  # what waits can never start: an upstream step failed
                    kind, step, event = self.events.get()
                    if kind == "event":
                        self._relay(step, event)
                        continue
                    if not self._ended(self.running.pop(step)):
                        failed.append(step)
                for step in failed:
                    blocked = _downstream_of(step, waiting, self.deps)
                    for other in blocked:
                        self.emit(StepEvent(step=other, state="not-run",
                                            message=f"step {step!r} failed"))
                    waiting = [w for w in waiting if w not in blocked]
                    if not self.options.keep_going and not stopping:
                        stopping = True
                        self._stop_all()
            for other in waiting:
                self.emit(StepEvent(step=other, state="not-run"))
        except BaseException:
            self._stop_all()  # Ctrl-C, a kill of this run: no job outlives it
            raise
        finally:
            self.state.close()
        if self.failed or self.stopped:
            raise StepsFailed(self.failed, self.results, tuple(self.stopped))
        return self.results

    def _start_ready(self, waiting: list[str], failed: list[str]) -> list[str]:
        """Answer or start every ready step that fits what is free, in ``waiting``'s order
        (``by_priority``: a step before those that depend on it, so that a chain of cached
        steps is answered in one pass); a step that does not fit now lets the next one try.
        The steps still waiting. A step that failed here joins ``failed``."""
        left = []
        for step in waiting:
            ready = self.deps[step] <= self.receipts.keys()
            if ready and not self.rerun and self._answer_cached(step, failed):
                continue
            if ready and not self._disk_admits(step, failed):  # disk admission (h42fit)
                if step not in failed:
                    left.append(step)
                continue
            grant = (self.pool.take(self.needs[step], self.items[step].step.share)
                     if ready and len(self.running) < self.options.jobs else None)
            if grant is None:
                left.append(step)
                continue
            self._start(step, grant)
        return left

    def _disk_admits(self, step: str, failed: list[str]) -> bool:
        """Whether a ready step's disk estimate (from all its inputs, now known) fits beside
        the running steps' estimates. One that does not fit what is free now waits while steps
        run (they hold disk they give back when they end); with none running, it never could
        fit, and fails here (joins ``failed``)."""
        if self.disk is None:
            return True
        item = self.items[step]
        if step not in self.sized:
            inputs = {**item.inputs,
                      **step_inputs(self.store, item, self.sources, self.planned.where)}
            declared = needs_of(item.recipe.name, item.params, input_sizes(self.store, inputs))
            self.needs[step] = replace(self.needs[step], disk_gb=declared.disk_gb)
            self.sized.add(step)
        needs = self.needs[step]
        space = self.disk()
        why = space.never_fits(needs)
        if why is None:
            return space.fits(needs, (job.needs for job in self.running.values()))
        if self.running:
            return False
        self.failed[step] = None
        failed.append(step)
        self.emit(StepEvent(step=step, state="failed", message=f"cannot run here: {why}"))
        return False

    def _answer_cached(self, step: str, failed: list[str]) -> bool:
        """Answer a step whose action has a succeeded receipt here, as a sequential run would
        (under the action's claim, moving its refs), without starting a job; whether it was
        (or failed trying). Asked once a step, as it becomes ready, not again while it waits
        for a slot: its job asks the cache again under the action's claim, so a receipt
        another run writes meanwhile is still reused, not run again."""
        if step in self.asked:
            return False
        self.asked.add(step)
        item = self.items[step]
        began = time.monotonic()
        try:
            code = self.codes.get(item.recipe.name) or code_id(item.recipe)
            self.codes[item.recipe.name] = code
            if cached_receipt(self.store, item, self.sources, self.planned.where,
                              code=code) is None:
                return False
            result = run_planned_step(self.store, self.planned, item, self.sources)
        except NscasError as exc:
            self.failed[step] = None
            failed.append(step)
            self.emit(StepEvent(step=step, state="failed", message=exc.message,
                                seconds=time.monotonic() - began))
            return True
        self.results.append(result)
        self._succeeded(step, result)
        self.emit(StepEvent(step=step, state="cached" if result.cached else "done",
                            result=result, seconds=time.monotonic() - began))
        return True

    def _succeeded(self, step: str, result: StepResult) -> None:
        self.receipts[step] = result.receipt
        self.sources[step] = Source(receipt=result.receipt, outputs=result.outputs)

    def _start(self, step: str, grant: Grant) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{step}.log"
        spec = JobSpec(store=str(self.store.root), file=str(self.path), step=step,
                       sets=self.sets, name=self.name, rerun=self.rerun,
                       upstream={d: str(self.receipts[d]) for d in self.deps[step]},
                       cores=grant.cores,
                       sign_key=str(self.sign_key) if self.sign_key else None)

        def post(event: dict[str, Any] | None) -> None:  # the job's thread: the queue only
            self.events.put(("event", step, event) if event is not None else ("end", step, {}))

        running = self.executor.start(spec, needs=self.needs[step], grant=grant, log=log,
                                      post=post)
        self.running[step] = _Job(step=step, running=running, grant=grant,
                                  needs=self.needs[step], started=time.monotonic(), log=log)
        self.emit(StepEvent(step=step, state="running",
                            devices=self.executor.devices(self.needs[step], grant), log=log))

    def _relay(self, step: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "outcome":
            self.running[step].outcome = pickle.loads(base64.b64decode(event["pickle"]))
        elif kind == "progress":
            self.emit(StepEvent(step=step, state="progress", done=event.get("done"),
                                total=event.get("total"), description=event.get("description"),
                                fields=event.get("fields") or {}))
        elif kind == "note":
            self.emit(StepEvent(step=step, state="note", message=str(event.get("message"))))

    def _ended(self, job: _Job) -> bool:
        """Record a job that ended; whether its step succeeded."""
        job.running.kill()  # whatever it left behind
        self.pool.give_back(job.grant, job.needs)
        seconds = time.monotonic() - job.started
        outcome, result = job.outcome, job.outcome.result if job.outcome else None
        if result is not None:
            self.results.append(result)
        if result is not None and result.status == "succeeded" and outcome is not None \
                and outcome.error is None:
            self._succeeded(job.step, result)
            self.emit(StepEvent(step=job.step, state="cached" if result.cached else "done",
                                result=result, seconds=seconds, log=job.log))
            return True
        if outcome is None and job.step in self.stopped:
            self.emit(StepEvent(step=job.step, state="stopped", seconds=seconds, log=job.log))
            return False
        receipt = result.receipt if result is not None else outcome.receipt if outcome else None
        message = (outcome.error if outcome is not None and outcome.error else
                   f"{job.running.why_ended()} before its step did (log: {job.log})")
        self.failed[job.step] = receipt
        self.stopped = [s for s in self.stopped if s != job.step]
        self.emit(StepEvent(step=job.step, state="failed", message=message, result=result,
                            seconds=seconds, log=job.log))
        return False

    def _stop_all(self) -> None:
        """End every running job: asked to stop (SIGTERM to its process group), then ended
        outright (SIGKILL) after the grace."""
        for job in self.running.values():
            if job.step not in self.stopped:
                self.stopped.append(job.step)
            job.running.stop()
        deadline = time.monotonic() + STOP_GRACE_S
        for job in list(self.running.values()):
            job.running.wait(max(0.0, deadline - time.monotonic()))
            job.running.kill()


def _downstream_of(step: str, waiting: list[str], deps: Mapping[str, set[str]]) -> set[str]:
    """The waiting steps that depend on ``step``, directly or through others."""
    found: set[str] = set()
    frontier = {step}
    while frontier:
        frontier = {w for w in waiting if w not in found and deps[w] & frontier}
        found |= frontier
    return found


def by_priority(steps: list[str], deps: Mapping[str, set[str]]) -> list[str]:
    """``steps`` (in run order) by the longest chain of steps each still heads, longest first,
    ties in run order: of the ready steps that fit, those on the critical path start first.
    A chain is counted in steps (a step's time is not known before it runs). A step heads a
    longer chain than any step that depends on it, so this order keeps every step before its
    dependents."""
    below: dict[str, set[str]] = {s: set() for s in steps}
    for step in steps:
        for upstream in deps[step]:
            below[upstream].add(step)
    chain: dict[str, int] = {}
    for step in reversed(steps):  # run order is an order of dependencies
        chain[step] = 1 + max((chain[d] for d in below[step]), default=0)
    place = {s: i for i, s in enumerate(steps)}
    return sorted(steps, key=lambda s: (-chain[s], place[s]))
