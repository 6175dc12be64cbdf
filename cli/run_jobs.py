"""``nscas run --jobs N``: the scheduled run, shown as it goes (nscas.cli.jobs_view)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from nscas.cli import render
from nscas.cli.jobs_view import LiveTable, PlainLines, json_events, json_line
from nscas.cli.run import results_json, summary_line
from nscas.runs.config import JOBS_MAX
from nscas.runs.executor import Executor
from nscas.runs.resources import Machine
from nscas.runs.runner import StepResult
from nscas.runs.scheduler import Options, StepEvent, StepsFailed, run_scheduled
from nscas.store.writer import Store


def run_with_jobs(store: Store, file: Path, *, jobs: int, gpu_share: int, keep_going: bool,
                  rerun: bool, sets: tuple[str, ...], only: tuple[str, ...], start: str | None,
                  name: str | None, variant: str | None, sign_key: Path | None, wide: bool,
                  as_json: bool, events: bool, steps: int,
                  on_step: Callable[[StepResult], None],
                  executor: Executor | None = None, machine: Machine | None = None) -> None:
    """Run the pipeline scheduled (by ``executor``: default, local processes); each finished
    step reported through ``on_step`` as a sequential run reports it, in run order, then the
    summary line. With ``--json``: ``events`` (one JSON object a line as steps change, then a
    last event), else the list a sequential ``--json`` run prints."""
    order: list[str] = []
    ended: dict[str, StepEvent | None] = {}
    reported: list[str] = []
    results: list[StepResult] = []

    def report(event: StepEvent) -> None:
        if event.result is not None:
            results.append(event.result)
            on_step(event.result)
        elif not as_json:
            render.text(f"step {event.step}: failed: {event.message}")

    def in_order(event: StepEvent) -> None:
        """Steps end in any order; they are reported in run order, as a sequential run
        reports them, each once every step before it has ended."""
        if event.state == "waiting":
            order.append(event.step)
            return
        if event.state in ("cached", "done", "failed"):
            ended[event.step] = event
        elif event.state in ("stopped", "not-run"):
            ended[event.step] = None
        while len(reported) < len(order) and order[len(reported)] in ended:
            step = order[len(reported)]
            reported.append(step)
            if (done := ended[step]) is not None:
                report(done)

    def view_json(event: StepEvent) -> None:
        if events:
            json_events(event)
        in_order(event)

    options = Options(jobs=jobs, gpu_share=gpu_share, keep_going=keep_going,
                      executor=executor, machine=machine)
    live = render.is_tty() and not as_json
    view = LiveTable(in_order) if live else PlainLines(in_order)
    failure: StepsFailed | None = None
    with view, _terminate_as_interrupt():
        try:
            run_scheduled(store, file, options, rerun=rerun, sets=sets, only=only, start=start,
                          name=name, sign_key=sign_key,
                          on_event=view_json if as_json else view)
        except StepsFailed as exc:
            failure = exc
    crashed = sum(1 for step in (failure.failed if failure else {})
                  if not any(r.step == step for r in results))
    line = summary_line(results, steps=steps, rerun=rerun, crashed=bool(crashed))
    if as_json and events:
        json_line({"event": "finished", "summary": line,
                   "results": results_json(results, pipeline=True, variant=variant)})
    elif as_json:
        if results:
            render.json_out(results_json(results, pipeline=True, variant=variant))
    else:
        render.note(line)
    if failure is not None:
        raise failure


def run_on_ray(store: Store, file: Path, *, address: str | None, jobs: int | None,
               gpu_share: int, **rest: Any) -> None:
    """Run the pipeline scheduled, each step a task on the Ray cluster at ``address``, at
    most ``jobs`` at once (default: as many as the cluster's resources hold)."""
    from nscas.runs.rayexec import connect

    cluster = connect(address, store=store, gpu_share=gpu_share)
    try:
        run_with_jobs(store, file, jobs=jobs or JOBS_MAX, gpu_share=gpu_share,
                      executor=cluster, machine=cluster.machine(), **rest)
    finally:
        cluster.close()


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """A SIGTERM of ``nscas run`` ends it as Ctrl-C does: every job stopped first."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
