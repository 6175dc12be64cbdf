"""A train run's work area holds one checkpoint (plus the one being written) at a time: each
checkpoint leaves it once it is stored, the seed is read from one shared read-only copy, and a
run interrupted after a trim resumes to the same checkpoints as a run from the start."""

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
from nscas.runs.runner import StepFailed, run_file
from nscas.store.writer import Store
from tests.pipelines import init_step, prepare_step, run_pipeline, tokenizer_step

PARAMS = ("steps = 8\ncheckpoint_steps = [2, 4, 6]\npublish_state = [4]\nlr = 1e-3\n"
          "batch = 4\nwarmup = 2\n")


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


def _train_file(tmp_path: Path, steps: dict[str, Any]) -> Path:
    prepared = steps["prepare"].outputs
    recipe = tmp_path / "train.toml"
    recipe.write_text(f'recipe = "train"\n[inputs]\nbase = "{steps["init"].outputs["checkpoint"]}"\n'
                      f'documents = "{prepared["train"]}"\nreplay = "{prepared["replay"]}"\n'
                      f"[params]\n{PARAMS}")
    return recipe


@pytest.fixture
def trained(tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    store, steps = run_pipeline(tmp_path, prepare_step(train=16, replay=4)
                                + tokenizer_step() + init_step())
    yield store, _train_file(tmp_path, steps)
    store.close()


def _watch(monkeypatch: pytest.MonkeyPatch, store: Store,
           before_put: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Wrap the recipe's put_checkpoint: what the work area held each time a checkpoint was
    about to be stored."""
    seen: list[dict[str, Any]] = []
    put = train_recipe.put_checkpoint

    def watched(st: Any, hf_dir: Path, *, step: int, **kw: Any) -> Digest:
        run_dir = hf_dir.parents[2]
        area = run_dir.parents[1]
        held = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        seen.append({"step": step, "held": held, "area": area,
                     "published": sorted(p.parent.name for p in
                                         (run_dir / "checkpoints").glob("*/state")),
                     "scratch": sorted(p.name for p in (area / "scratch").iterdir()),
                     "shared": sorted((store.root / "work" / "shared").iterdir())})
        tree = seen[-1]["shared"][0] / "tree"
        seen[-1]["seed_bytes"] = _bytes(tree)
        seen[-1]["modes"] = {p.stat().st_mode & 0o777 for p in tree.rglob("*") if p.is_file()}
        if before_put is not None:
            before_put(step)
        return put(st, hf_dir, step=step, **kw)

    monkeypatch.setattr(train_recipe, "put_checkpoint", watched)
    return seen


def _one_checkpoint_bytes(store: Store, result: Any) -> int:
    """The bytes of one stored checkpoint's files, its published state, and a resume state of
    the same size as the moments (what the work area keeps of one checkpoint, at most)."""
    files = Digest.parse(store.get_record(result.outputs["checkpoint"])["files"])
    entries = store.get_record(files)["entries"]
    weights = sum(e["size"] for path, e in entries.items() if path.endswith(".safetensors"))
    hf = sum(e["size"] for e in entries.values())
    return hf + 4 * weights + (1 << 20)  # hf/, state.pt and state/ (2W each), a little more


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_work_area_keeps_only_the_latest_checkpoint(
        trained: tuple[Store, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    store, recipe = trained
    seen = _watch(monkeypatch, store)
    work = store.root / "work"
    with Sampler(work) as sampler:
        (result,) = run_file(store, recipe)
    assert result.status == "succeeded"
    assert [s["step"] for s in seen] == [2, 4, 6, 8]
    for s in seen:
        # Every checkpoint before the one being stored has left the work area (the worker may
        # be writing a later one meanwhile), and so has a stored step's published state.
        assert [h for h in s["held"] if h.startswith("step-") and int(h[5:]) <= s["step"]] == [
            f"step-{s['step']:06d}"], s
        assert s["published"] in ([], [f"step-{s['step']:06d}"]), s
        # The seed is read from the one shared copy, not copied into the run's scratch.
        assert "base" not in s["scratch"] and len(s["shared"]) == 1, s
    assert seen[0]["modes"] == {0o444}  # read-only: no run writes into another's seed
    one = _one_checkpoint_bytes(store, result)
    seed = seen[0]["seed_bytes"]
    # At most the latest complete checkpoint and the one being written, beside the seed.
    assert sampler.peak <= seed + 2 * one, (sampler.peak, seed, one)
    assert sampler.peak > seed  # it did see the run's checkpoints
    assert [p.name for p in work.iterdir()] == [".lock"]  # the area and the seed's copy went
    steps = store.get_record(result.outputs["checkpoints"])["entries"]
    assert sorted(steps) == [f"step-{s:06d}" for s in (2, 4, 6, 8)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_interrupted_after_a_trim_resumes_to_the_same_checkpoints(
        trained: tuple[Store, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    store, recipe = trained

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
    assert (store.root / "work" / "shared").is_dir()  # kept with the area, for the resume

    seen.clear()
    (resumed,) = run_file(store, recipe)
    assert resumed.status == "succeeded" and not resumed.cached
    assert [s["step"] for s in seen] == [6, 8]  # 2 and 4 came from committed.json
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
