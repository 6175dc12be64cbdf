"""Disk as a declared resource: the scheduler starts a step only while its disk estimate and the
running steps' fit the store's free disk (less the margin), holds it back while they do not,
and fails at once a step that could never fit, naming what it asked for and what there is."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nscas.recipes.train.config import TrainParams
from nscas.runs.resources import Disk, Needs, input_sizes, needs_of, store_disk
from nscas.runs.scheduler import Options, StepEvent, StepNeverFits, StepsFailed, run_scheduled
from nscas.store.writer import Store, init_store
from tests.runner.helpers import write
from tests.runner.jobs_helpers import REPO, probe_site, release_fifo, wait_running

GB = 1e9


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store, with the probe recipe registered here and in every job's process."""
    site = probe_site(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO), *sys.path]))
    with init_store(tmp_path / "home") as opened:
        yield opened


def _disk(usable_gb: float) -> Options:
    return Options(jobs=2, disk=lambda: Disk(usable_gb=usable_gb, free_gb=usable_gb + 1))


def _two_holding(tmp_path: Path, disk_gb: float) -> tuple[Path, Path, dict[str, Path]]:
    """A file of two independent probe steps x and y, each holding ``disk_gb`` and held open
    until the test releases its FIFO: (file, hold directory, FIFOs by label)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "two.toml", f"""
        [[step]]
        name = "x"
        recipe = "probe"
        params = {{ label = "x", hold = "{hold}", disk_gb = {disk_gb} }}
        [[step]]
        name = "y"
        recipe = "probe"
        params = {{ label = "y", hold = "{hold}", disk_gb = {disk_gb} }}
        """)
    return file, hold, {label: release_fifo(hold, label) for label in ("x", "y")}


@contextmanager
def _running(store: Store, file: Path, options: Options,
             on_event: Callable[[StepEvent], None]) -> Iterator[None]:
    """``run_scheduled`` in a thread while the body runs; its exception, if any, fails the
    test once the body is done."""
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run_scheduled(store, file, options, on_event=on_event)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    runner = threading.Thread(target=go)
    runner.start()
    try:
        yield
    finally:
        runner.join(timeout=300)
    assert not errors, errors


def test_a_step_waits_while_the_disk_is_taken(store: Store, tmp_path: Path) -> None:
    file, hold, fifos = _two_holding(tmp_path, 6.0)
    events: list[StepEvent] = []
    with _running(store, file, _disk(10.0), events.append):
        end = wait_running(fifos["x"])
        # x took 6 of the 10 GB; y's 6 would not fit beside it: it waits, with cores free.
        assert not (hold / "y.json").exists()
        assert [e.step for e in events if e.state == "running"] == ["x"]
        os.close(end)
        os.close(wait_running(fifos["y"]))  # x ended, its disk came back: y runs
    order = [(e.step, e.state) for e in events if e.state in ("running", "done")]
    assert order == [("x", "running"), ("x", "done"), ("y", "running"), ("y", "done")]


def test_a_step_waits_for_the_disk_running_steps_hold_rather_than_failing(
        store: Store, tmp_path: Path) -> None:
    # While x runs it holds disk, so what is free now is less than y's estimate, which the
    # whole disk would hold: y waits for x to end (serialised), it does not fail.
    file, hold, fifos = _two_holding(tmp_path, 6.0)
    events: list[StepEvent] = []
    held = threading.Event()  # x's files are on the disk

    def seen(event: StepEvent) -> None:
        events.append(event)
        if event.step == "x" and event.state == "running":
            held.set()

    def free() -> Disk:
        usable = 4.0 if held.is_set() else 10.0
        return Disk(usable_gb=usable, free_gb=usable + 1)

    with _running(store, file, Options(jobs=2, disk=free), seen):
        end = wait_running(fifos["x"])
        assert not (hold / "y.json").exists()
        assert [e.state for e in events if e.step == "y"] == ["waiting"]
        held.clear()  # x's work area goes as it ends
        os.close(end)
        os.close(wait_running(fifos["y"]))
    order = [(e.step, e.state) for e in events if e.state in ("running", "done", "failed")]
    assert order == [("x", "running"), ("x", "done"), ("y", "running"), ("y", "done")]


def test_steps_that_fit_together_run_together(store: Store, tmp_path: Path) -> None:
    file, _hold, fifos = _two_holding(tmp_path, 4.0)
    with _running(store, file, _disk(10.0), lambda _event: None):
        ends = [wait_running(fifo) for fifo in fifos.values()]  # both at once: 8 of 10 GB
        for end in ends:
            os.close(end)


def test_a_step_that_can_never_fit_fails_before_anything_runs(store: Store,
                                                              tmp_path: Path) -> None:
    file = write(tmp_path, "big.toml", """
        [[step]]
        name = "small"
        recipe = "probe"
        [[step]]
        name = "huge"
        recipe = "probe"
        params = { label = "huge", disk_gb = 100.0 }
        """)
    events: list[StepEvent] = []
    with pytest.raises(StepNeverFits) as err:
        run_scheduled(store, file, _disk(10.0), on_event=events.append)
    assert err.value.message == (
        "step 'huge' cannot run here: it needs 1 CPU core, about 100 GB of disk; the store's "
        "disk has 11 GB free, 10 GB of it usable beside the margin (short of 90 GB of disk)")
    assert events == []  # nothing started


def test_a_step_whose_inputs_make_it_too_big_fails_once_they_are_known(
        store: Store, tmp_path: Path) -> None:
    # b's estimate counts its input's bytes, known only once a has run: then it fails at once,
    # naming what it asked for and what there is; a's result stands.
    file = write(tmp_path, "chain.toml", """
        [[step]]
        name = "a"
        recipe = "probe"
        params = { label = "a" }
        [[step]]
        name = "b"
        recipe = "probe"
        inputs = { source = "step.a.seen" }
        params = { label = "b" }
        """)
    events: list[StepEvent] = []
    with pytest.raises(StepsFailed) as err:
        run_scheduled(store, file, _disk(1e-9), on_event=events.append)
    assert list(err.value.failed) == ["b"]
    (failed,) = [e for e in events if e.state == "failed"]
    assert failed.step == "b" and failed.message is not None
    assert failed.message.startswith("cannot run here: it needs 1 CPU core, about ")
    assert "GB of disk; the store's disk has 1 GB free, 1e-09 GB of it usable beside the " \
        "margin (short of" in failed.message
    assert [e.step for e in events if e.state == "running"] == ["a"]


def test_train_declares_its_checkpoints_the_seed_and_what_it_stores() -> None:
    w = 10**9  # a 1 GB seed
    params = TrainParams(steps=128, checkpoint_steps=(64, 128), publish_state=(64,))
    needs = needs_of("train", params, {"base": w})
    # Writing step 128 (its files, W: no resume state at the final step) beside step 64 (W +
    # 2W resume state + 2W published, if not yet stored) and what step 64 stored (W + 2W).
    assert needs.disk_gb == pytest.approx(9.0)
    # Without a published state: step 64 (3W) beside the seed's copy (W) and what it stored
    # (W), or writing step 128 (W) beside step 64 (3W) and what it stored (W).
    assert needs_of("train", TrainParams(steps=128, checkpoint_steps=(64, 128)),
                    {"base": w}).disk_gb == pytest.approx(5.0)
    # Every checkpoint but the final one keeps a resume state: more checkpoints, more held.
    assert needs_of("train", TrainParams(steps=8, checkpoint_steps=(2, 4, 6)),
                    {"base": w}).disk_gb == pytest.approx(3.0 + 3.0 + 2.0)
    assert needs_of("evaluate", _evaluate_params(), {"model": 3 * w}) == Needs(
        cores=1, disk_gb=3.0)


def test_the_published_scale_trains_run_one_at_a_time_on_a_64_gib_disk() -> None:
    # examples/cooperative-learning/qwen2.5-coder-1.5b.toml's header: W = 7.11 GB, a store of
    # 4.95 GB before the run, 64 GiB under it. Each train fits the disk alone, so none fails at
    # admission; two never fit at once, so the scheduler runs them one at a time.
    import tomllib

    file = tomllib.loads((REPO / "examples" / "cooperative-learning" /
                          "qwen2.5-coder-1.5b.toml").read_text())
    trains = [s for s in file["step"] if s["recipe"] == "train"]
    assert len(trains) == 4 and all("publish_state" not in s["params"] for s in trains)
    w = 7.11e9
    needs = [needs_of("train", TrainParams(**s["params"]), {"base": int(w)}) for s in trains]
    assert [n.disk_gb for n in needs] == pytest.approx([5 * w / GB] * 4)
    total = 64 * 2**30
    usable = (total - 4.95e9 - max(1e9, 0.02 * total)) / GB
    space = Disk(usable_gb=usable, free_gb=usable + 1.37)
    assert all(space.never_fits(n) is None for n in needs)
    assert not space.fits(needs[1], [needs[0]])


def _evaluate_params() -> Any:
    from nscas.recipes.evaluate.recipe import EvaluateParams

    return EvaluateParams()


def test_input_sizes_count_a_checkpoints_files(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"x" * 1000)
    (folder / "b.json").write_bytes(b"{}")
    tree = store.put_tree(folder)
    blob = store.put_bytes(b"y" * 10)
    assert input_sizes(store, {"t": tree, "b": blob}) == {"t": 1002, "b": 10}


def test_the_stores_disk_keeps_a_margin(tmp_path: Path) -> None:
    disk = store_disk(tmp_path)
    assert disk.usable_gb == 0 or disk.usable_gb <= disk.free_gb - 1.0  # at least 1 GB kept
    assert "short of" in (disk.never_fits(Needs(disk_gb=disk.free_gb + 1)) or "")
    space = Disk(usable_gb=10.0, free_gb=11.0)
    assert space.never_fits(Needs(disk_gb=10.0)) is None
    assert space.fits(Needs(disk_gb=4.0), [Needs(disk_gb=6.0)])
    assert not space.fits(Needs(disk_gb=4.1), [Needs(disk_gb=6.0)])
    assert space.fits(Needs(), [Needs(disk_gb=10.0)])  # no estimate: never held back
