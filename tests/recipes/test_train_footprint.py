"""A train run's work area holds one checkpoint (plus the one being written) at a time: each
checkpoint leaves it once it is stored, only the latest keeps a resume state and the final one
has none, the seed is read from one shared read-only copy that goes once the ranks have loaded
it, the run never holds more disk than its recipe declares to the scheduler, and a run
interrupted after a trim resumes to the same checkpoints as a run from the start."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nscas.recipes.train.recipe as train_recipe
from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.recipes.train.checkpoints import COMMITTED_FILE
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.resources import disk_bytes
from nscas.runs.resources import input_sizes
from nscas.runs.runner import StepFailed, run_file
from nscas.store.workarea import WorkAreas
from nscas.store.writer import Store
from tests.pipelines import init_step, prepare_step, run_pipeline, tokenizer_step

PARAMS = ("steps = 8\ncheckpoint_steps = [2, 4, 6]\npublish_state = [4]\nlr = 1e-3\n"
          "batch = 4\nwarmup = 2\n")
TRAIN = TrainParams(steps=8, checkpoint_steps=(2, 4, 6), publish_state=(4,), lr=1e-3, batch=4,
                    warmup=2)


def _bytes(root: Path) -> int:
    """The bytes of the files under ``root`` now (files may vanish while it walks)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


class Sampler:
    """The largest size a directory's files reached while it ran (sampled)."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _bytes(self.root))
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _train_inputs(steps: dict[str, Any]) -> dict[str, Digest]:
    prepared = steps["prepare"].outputs
    return {"base": steps["init"].outputs["checkpoint"], "documents": prepared["train"],
            "replay": prepared["replay"]}


def _train_file(tmp_path: Path, steps: dict[str, Any]) -> Path:
    prepared = steps["prepare"].outputs
    recipe = tmp_path / "train.toml"
    recipe.write_text(f'recipe = "train"\n[inputs]\nbase = "{steps["init"].outputs["checkpoint"]}"\n'
                      f'documents = "{prepared["train"]}"\nreplay = "{prepared["replay"]}"\n'
                      f"[params]\n{PARAMS}")
    return recipe


@pytest.fixture
def trained(tmp_path: Path) -> Iterator[tuple[Store, Path, dict[str, Digest]]]:
    store, steps = run_pipeline(tmp_path, prepare_step(train=16, replay=4)
                                + tokenizer_step() + init_step())
    yield store, _train_file(tmp_path, steps), _train_inputs(steps)
    store.close()


def _watch(monkeypatch: pytest.MonkeyPatch, store: Store,
           before_put: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Wrap the recipe's put_checkpoint: what the work area held each time a checkpoint was
    about to be stored."""
    seen: list[dict[str, Any]] = []
    put = train_recipe.put_checkpoint
    shared = store.root / "work" / "shared"

    def watched(st: Any, hf_dir: Path, *, step: int, **kw: Any) -> Digest:
        run_dir = hf_dir.parents[2]
        area = run_dir.parents[1]
        held = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        seen.append({"step": step, "held": held, "area": area,
                     "published": sorted(p.parent.name for p in
                                         (run_dir / "checkpoints").glob("*/state")),
                     "states": sorted(p.parent.name for p in
                                      (run_dir / "checkpoints").glob("*/state.pt")),
                     "scratch": sorted(p.name for p in (area / "scratch").iterdir()),
                     "shared": sorted(shared.iterdir()) if shared.is_dir() else []})
        if before_put is not None:
            before_put(step)
        return put(st, hf_dir, step=step, **kw)

    unshare = WorkAreas.unshare

    def unsharing(areas: WorkAreas, area: Any, tree: Digest) -> None:
        # What the seed's one copy was when the run let it go: read-only, the seed's files.
        copy = shared / tree.hex / "tree"
        seen.append({"unshared": tree, "seed_bytes": _bytes(copy), "modes": {
            p.stat().st_mode & 0o777 for p in copy.rglob("*") if p.is_file()}})
        unshare(areas, area, tree)

    monkeypatch.setattr(train_recipe, "put_checkpoint", watched)
    monkeypatch.setattr(WorkAreas, "unshare", unsharing)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_work_area_keeps_only_the_latest_checkpoint(
        trained: tuple[Store, Path, dict[str, Digest]], monkeypatch: pytest.MonkeyPatch) -> None:
    store, recipe, inputs = trained
    seen = _watch(monkeypatch, store)
    work = store.root / "work"
    before = _bytes(store.root)
    with Sampler(store.root) as sampler:
        (result,) = run_file(store, recipe)
    assert result.status == "succeeded"
    (unshared,) = [s for s in seen if "unshared" in s]
    puts = [s for s in seen if "step" in s]
    assert [s["step"] for s in puts] == [2, 4, 6, 8]
    assert seen.index(unshared) == 0  # let go after the first update, before any checkpoint
    for s in puts:
        # Every checkpoint before the one being stored has left the work area (the worker may
        # be writing a later one meanwhile), and so has a stored step's published state.
        assert [h for h in s["held"] if h.startswith("step-") and int(h[5:]) <= s["step"]] == [
            f"step-{s['step']:06d}"], s
        assert s["published"] in ([], [f"step-{s['step']:06d}"]), s
        # One resume state, the latest checkpoint's, and none at the final step.
        assert [h for h in s["states"] if int(h[5:]) <= s["step"]] == (
            [] if s["step"] == 8 else [f"step-{s['step']:06d}"]), s
        # The seed is read from the one shared copy, not copied into the run's scratch, and
        # that copy went once the ranks had loaded it.
        assert "base" not in s["scratch"] and s["shared"] == [], s
    assert unshared["modes"] == {0o444}  # read-only: no run writes into another's seed
    assert unshared["seed_bytes"] > 0
    # Everything the run held under the store at once, its stored objects included, within
    # what train declares to the scheduler's disk admission.
    declared = disk_bytes(TRAIN, input_sizes(store, inputs))
    grew = sampler.peak - before
    assert 0 < grew <= declared, (grew, declared)
    assert [p.name for p in work.iterdir()] == [".lock"]  # the area and the seed's copy went
    steps = store.get_record(result.outputs["checkpoints"])["entries"]
    assert sorted(steps) == [f"step-{s:06d}" for s in (2, 4, 6, 8)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_interrupted_after_a_trim_resumes_to_the_same_checkpoints(
        trained: tuple[Store, Path, dict[str, Digest]], monkeypatch: pytest.MonkeyPatch) -> None:
    store, recipe, _inputs = trained

    failing = {6}

    def fail_at_six(step: int) -> None:
        if step in failing:
            failing.discard(step)
            raise RecipeError("interrupted on purpose")

    seen = _watch(monkeypatch, store, fail_at_six)
    with pytest.raises(StepFailed, match="interrupted on purpose"):
        run_file(store, recipe)
    area = seen[-1]["area"]
    run_dir = area / "area" / "run"
    # Steps 2 and 4 were stored, and left once a later one was complete; 6 is not stored.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000006"]
    assert (run_dir / COMMITTED_FILE).exists()
    assert not (store.root / "work" / "shared").exists()  # let go once loaded; a resume makes it

    seen.clear()
    (resumed,) = run_file(store, recipe)
    assert resumed.status == "succeeded" and not resumed.cached
    assert [s["step"] for s in seen if "step" in s] == [6, 8]  # 2 and 4: from committed.json
    journals = store.get_record(resumed.receipt)["journals"]
    assert [store.get_record(store.resolve(j))["resumed_from"] for j in journals] == [6]

    (again,) = run_file(store, recipe, rerun=True)  # from the start, in a fresh area
    assert again.status == "succeeded"
    assert again.outputs == resumed.outputs  # every checkpoint, bit for bit
    assert [p.name for p in (store.root / "work").iterdir()] == [".lock"]


def test_a_stored_checkpoint_gone_from_the_store_is_named(tmp_path: Path) -> None:
    from nscas.recipes.train.checkpoints import record_committed
    from nscas.store.writer import init_store

    with init_store(tmp_path / "s") as store:
        gone = Digest.parse("blake3:" + "0" * 64)
        (tmp_path / "run").mkdir()
        record_committed(tmp_path / "run", 4, str(gone))
        with pytest.raises(RecipeError, match="step 4 that an earlier run of this action stored"):
            train_recipe._stored_checkpoints(store, tmp_path / "run")


def test_a_checkpoint_waits_for_the_earlier_ones_to_be_stored(tmp_path: Path) -> None:
    import threading

    from nscas.recipes.train.checkpoints import await_stored, record_committed

    record_committed(tmp_path, 2, "blake3:" + "2" * 64)
    await_stored(tmp_path, [], timeout=0)
    await_stored(tmp_path, [2], timeout=0)
    with pytest.raises(RecipeError, match=r"steps \[4\] were not stored within 0.05 s"):
        await_stored(tmp_path, [2, 4], timeout=0.05)
    # The recipe's process records step 4 while the rank waits: the wait ends then.
    storing = threading.Thread(target=record_committed, args=(tmp_path, 4, "blake3:" + "4" * 64))
    storing.start()
    await_stored(tmp_path, [2, 4], timeout=600)
    storing.join()
