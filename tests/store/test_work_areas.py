"""Work areas (docs/format.md §5.8): claimed by one live process, kept across its crash, and
removed by gc once their action has succeeded or their process is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.objects.digests import Digest
from nscas.runs.runner import environment
from nscas.store.workarea import WorkAreaBusy, read_owner
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import gc

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with init_store(tmp_path / "home") as s:
        yield s


def holder(store: Store, action: Digest) -> tuple[subprocess.Popen[str], Path]:
    """A process that claims ``action``'s area and holds it until killed."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.store.workers", "hold-area",
                             str(store.root), str(action)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    return proc, Path(json.loads(proc.stdout.readline())["root"])


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def succeeded_receipt(store: Store, action: Digest) -> Digest:
    """A succeeded receipt of ``action`` finished now (the action must be a stored record)."""
    from datetime import UTC, datetime

    now = datetime.now(UTC).isoformat(timespec="microseconds")
    return store.put_record({
        "nscas": "receipt/1", "action": str(action),
        "environment": str(store.put_record(environment())), "outputs": {}, "journals": [],
        "claims": {}, "started": now, "finished": now, "status": "succeeded"})


def an_action(store: Store, label: str) -> Digest:
    code = store.put_record({"nscas": "tree/1", "entries": {}})
    return store.put_record({"nscas": "action/1", "recipe": "probe@1", "code": str(code),
                             "inputs": {}, "params": {"label": label}})


def areas(store: Store) -> set[str]:
    work = store.root / "work"
    return {p.name for p in work.iterdir() if p.name != ".lock"} if work.is_dir() else set()


def test_gc_removes_finished_and_dead_areas_and_keeps_a_live_one(store: Store) -> None:
    finished, dead, live = (an_action(store, x) for x in ("finished", "dead", "live"))
    mine = store.work_area(finished)  # held by this (live) process, but its action then succeeds
    (mine.persistent / "state").write_text("x")
    succeeded_receipt(store, finished)
    dead_proc, dead_root = holder(store, dead)
    kill(dead_proc)
    live_proc, live_root = holder(store, live)
    try:
        assert areas(store) == {finished.hex, dead.hex, live.hex}
        owner = read_owner(dead_root)
        assert owner is not None and owner.pid == dead_proc.pid and owner.action == dead
        dry = gc(store, dry_run=True, min_age=0)
        assert {(a.action, a.removed, a.reason) for a in dry.work_areas} == {
            (finished, True, "succeeded"), (dead, True, "process-gone"), (live, False, "alive")}
        assert areas(store) == {finished.hex, dead.hex, live.hex}  # a dry run removes nothing
        report = gc(store, min_age=0)
        assert {(a.action, a.removed) for a in report.work_areas} == {
            (finished, True), (dead, True), (live, False)}
        assert areas(store) == {live.hex}
        assert (live_root / "area" / "progress").read_text() == "half done\n"
        with pytest.raises(WorkAreaBusy, match=f"held by process {live_proc.pid}"):
            store.work_area(live)
        store.release_work_area(mine, keep=True)  # gc took it already: nothing to do
    finally:
        kill(live_proc)
    # Its holder gone, the area is taken over with what it holds; scratch starts empty.
    taken = store.work_area(live)
    assert (taken.persistent / "progress").read_text() == "half done\n"
    assert list(taken.scratch.iterdir()) == []
    owner = read_owner(taken.root)
    assert owner is not None and owner.pid == os.getpid()
    store.release_work_area(taken, keep=True)
    owner = read_owner(taken.root)
    assert owner is not None and owner.pid is None
    assert not taken.scratch.exists() and taken.persistent.is_dir()
    assert [(a.removed, a.reason) for a in gc(store, min_age=0).work_areas] == [(True, "unowned")]
    assert areas(store) == set()


def test_a_succeeded_run_leaves_no_area_and_a_failed_one_keeps_it(store: Store) -> None:
    action = an_action(store, "released")
    area = store.work_area(action)
    assert area.root == store.root / "work" / action.hex and area.scratch.is_dir()
    with pytest.raises(WorkAreaBusy):  # one holder at a time, this process included
        store.work_area(action)
    store.release_work_area(area, keep=False)
    assert areas(store) == set()


def test_leftovers_of_an_interrupted_create_are_removed(store: Store) -> None:
    store.work_area(an_action(store, "x"))  # makes work/
    (store.root / "work" / ".tmp-0123").mkdir()
    (store.root / "work" / ".trash-4567").mkdir()
    report = gc(store, min_age=0)
    assert sorted((a.path.name, a.reason) for a in report.work_areas if a.removed) == [
        (".tmp-0123", "incomplete"), (".trash-4567", "incomplete")]


def test_an_area_held_on_another_host_is_taken_over_only_under_the_actions_claim(
        store: Store) -> None:
    action = an_action(store, "elsewhere")
    area = store.work_area(action)
    (area.persistent / "progress").write_text("half done\n")
    owner = json.loads((area.root / "owner.json").read_text())
    # As a run on another host leaves it when it dies there (a Ray worker on another node).
    (area.root / "owner.json").write_text(json.dumps({**owner, "host": "another-host"}))
    with pytest.raises(WorkAreaBusy, match="on another-host"):  # it cannot be asked
        store.work_area(action)
    # A run holding the action's claim knows that holder has ended: it held the claim.
    taken = store.work_area(action, action_claimed=True)
    assert (taken.persistent / "progress").read_text() == "half done\n"
    held = read_owner(taken.root)
    assert held is not None and held.pid == os.getpid() and held.host != "another-host"
    with pytest.raises(WorkAreaBusy):  # a live holder on this host is refused even so
        store.work_area(action, action_claimed=True)
    store.release_work_area(taken, keep=False)


def test_a_shared_tree_goes_once_the_last_of_its_users_is_done_with_it(
        store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "seed"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    tree = store.put_tree(folder)
    one, two = (store.work_area(store.put_bytes(name)) for name in (b"one", b"two"))
    copy = store.shared_tree(one, tree)
    assert store.shared_tree(two, tree) == copy  # one copy for both
    store.unshare_tree(one, tree)
    assert (copy / "model.safetensors").read_bytes() == b"w" * 100  # two still uses it
    store.unshare_tree(two, tree)
    assert not copy.exists()
    # Asked for again (a resume), it is made again; the areas themselves stay.
    assert (store.shared_tree(one, tree) / "model.safetensors").is_file()
    assert one.persistent.is_dir() and two.persistent.is_dir()
    store.release_work_area(one, keep=False)
    store.release_work_area(two, keep=False)
    assert not (store.root / "work" / "shared").exists()
