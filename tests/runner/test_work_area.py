"""The runner hands a recipe its action's work area and a scratch directory, both under the
store: a succeeded run leaves neither, a failed one keeps the work area (docs/format.md §5.8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nscas.runs.recipe import Recipe
from nscas.runs.runner import StepFailed, run_file
from nscas.store.workarea import read_owner
from nscas.store.writer import init_store
from nscas.upkeep.fsck import gc
from tests.runner.helpers import write


def test_work_areas_of_succeeded_and_failed_runs(tmp_path: Path, probe: Recipe) -> None:
    with init_store(tmp_path / "home") as store:
        ok = write(tmp_path, "ok.toml", 'recipe = "probe"\n')
        (result,) = run_file(store, ok)
        work = store.root / "work"
        assert [p.name for p in work.iterdir()] == [".lock"]  # nothing left by the run
        bad = write(tmp_path, "bad.toml", 'recipe = "probe"\n[params]\nfail = "crash"\n')
        with pytest.raises(StepFailed) as failed:
            run_file(store, bad)
        kept = [p for p in work.iterdir() if p.name != ".lock"]
        assert len(kept) == 1 and (kept[0] / "area").is_dir() and not (kept[0] / "scratch").exists()
        owner = read_owner(kept[0])
        assert owner is not None and owner.pid is None  # released: a rerun may take it
        assert str(owner.action) == store.get_record(failed.value.receipt)["action"]
        assert [(a.action, a.reason) for a in gc(store, min_age=0).work_areas] == [
            (owner.action, "unowned")]
        assert [p.name for p in work.iterdir()] == [".lock"]
        assert result.status == "succeeded"
