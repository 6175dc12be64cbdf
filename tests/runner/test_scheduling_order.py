"""Which ready steps a scheduled run starts, on a machine declared to the scheduler (one GPU,
eight cores; the probe recipe declares its GPU): every ready step that fits what is free, those
heading the longest chain of steps first. The jobs are real processes; only the machine the
scheduler hands out is declared rather than found."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nscas.runs.resources import Gpu, Machine
from nscas.runs.scheduler import Options, StepEvent, by_priority, run_scheduled
from nscas.store.writer import init_store
from tests.runner.helpers import write
from tests.runner.jobs_helpers import probe_site, release_fifo, wait_running

CORES = tuple(sorted(os.sched_getaffinity(0)))
ONE_GPU = Machine(cores=CORES, gpus=(Gpu(index=0, memory_gb=139.0),))
"""This machine's cores and one GPU (declared: none is used). The GPU steps below ask for no
core of their own, so that five of them fit on a machine of any size."""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The probe recipe and its needs, registered here and (through the path a job inherits)
    in every job."""
    found = probe_site(tmp_path / "site")
    monkeypatch.syspath_prepend(str(found))
    return found


def _step(name: str, hold: Path, *, after: str | None = None, gpus: int = 0, cores: int = 1,
          share: int | None = None) -> str:
    inputs = f'inputs = {{ source = "step.{after}.seen" }}\n' if after else ""
    return (f'[[step]]\nname = "{name}"\nrecipe = "probe"\n{inputs}'
            f'params = {{ label = "{name}", hold = "{hold}", gpus = {gpus}, cores = {cores} }}\n'
            + (f"share = {share}\n" if share else ""))


def test_the_seed_evaluation_starts_beside_four_shared_trains(tmp_path: Path,
                                                              site: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    trains = [f"train-{i}" for i in range(4)]
    text = _step("prepare", hold)
    text += "".join(_step(t, hold, after="prepare", gpus=1, cores=0, share=5) for t in trains)
    text += _step("commit", hold, after="train-3")
    text += _step("evaluate-seed", hold, after="prepare", gpus=1, cores=0,
                  share=5)
    file = write(tmp_path, "seed.toml", text)
    fifos = {name: release_fifo(hold, name) for name in [*trains, "evaluate-seed"]}
    store = init_store(tmp_path / "home")
    events: list[StepEvent] = []
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            run_scheduled(store, file, Options(jobs=8, machine=ONE_GPU),
                          on_event=events.append)
            done.append(None)
        except BaseException as exc:  # handed to the test's thread below
            done.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    ends = []
    try:
        # All five hold their FIFO open at once: the seed evaluation did not wait for the
        # trains, and the one GPU had all five.
        ends = [wait_running(fifo) for fifo in fifos.values()]
        ended = {e.step for e in list(events) if e.state in ("done", "failed")}
        running = {e.step: e.devices for e in list(events)
                   if e.state == "running" and e.step not in ended}
        assert set(running) == {*trains, "evaluate-seed"}
        assert all(devices and devices.endswith("gpu 0") for devices in running.values())
    finally:
        for end in ends:
            os.close(end)
        for fifo in fifos.values():
            fifo.unlink(missing_ok=True)  # a FIFO never opened releases its probe
        runner.join(timeout=300)
        store.close()
    assert done == [None]
    assert {e.step for e in events if e.state == "done"} == {"prepare", *trains, "commit",
                                                             "evaluate-seed"}


def test_of_the_ready_steps_the_longest_chain_starts_first(tmp_path: Path, site: Path) -> None:
    """One core: one step at a time. ``short`` comes first in the file and is ready from the
    start, but ``head`` and then ``middle`` head a longer chain, so they go first; ``short`` and
    ``tail``, each a chain of one, then go in run order."""
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "chain.toml", _step("short", hold) + _step("head", hold)
                 + _step("middle", hold, after="head") + _step("tail", hold, after="middle"))
    store = init_store(tmp_path / "home")
    events: list[StepEvent] = []
    try:
        run_scheduled(store, file, Options(jobs=4, machine=Machine(cores=CORES[:1])),
                      on_event=events.append)
    finally:
        store.close()
    assert [e.step for e in events if e.state == "running"] == ["head", "middle", "short",
                                                                 "tail"]


def test_priority_is_the_longest_chain_then_run_order() -> None:
    deps = {"a": set(), "b": set(), "c": {"b"}, "d": {"a", "c"}, "e": {"a"}, "f": set()}
    assert by_priority(list(deps), deps) == ["b", "a", "c", "d", "e", "f"]
    # Every step stays after the steps it reads.
    order = by_priority(list(deps), deps)
    assert all(order.index(u) < order.index(s) for s, ups in deps.items() for u in ups)
