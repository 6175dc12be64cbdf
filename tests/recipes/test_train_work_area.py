"""A train run killed with SIGKILL leaves only its work area, which gc removes, and a second run
of the same action resumes from it (docs/format.md §5.8)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nscas.runs.runner import run_file
from nscas.store.opening import open_store
from nscas.store.workarea import read_owner
from nscas.upkeep.fsck import gc
from tests.pipelines import init_step, prepare_step, run_pipeline, tokenizer_step
from tests.waiting import GENEROUS, wait_until

PARAMS = "steps = 24\ncheckpoint_steps = [2]\nlr = 1e-3\n"


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_train_run_is_collected_or_resumed(tmp_path: Path) -> None:
    store, steps = run_pipeline(tmp_path, prepare_step(train=32, replay=8)
                                + tokenizer_step() + init_step())
    root = store.root
    prepared = steps["prepare"].outputs
    inputs = (f'base = "{steps["init"].outputs["checkpoint"]}"\n'
              f'documents = "{prepared["train"]}"\nreplay = "{prepared["replay"]}"\n')
    recipe = tmp_path / "train.toml"
    recipe.write_text(f'recipe = "train"\n[inputs]\n{inputs}[params]\n{PARAMS}')
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    nscas = Path(sys.executable).parent / "nscas"
    proc = subprocess.Popen([str(nscas), "--store", str(root), "run", str(recipe)],
                            env={**os.environ, "TMPDIR": str(tmpdir)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # A checkpoint directory named step-* is complete (it is renamed into place).
        wait_until(lambda: any((root / "work").glob("*/area/run/checkpoints/step-*"))
                   or proc.poll() is not None, "the first checkpoint", limit=300)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=GENEROUS)
    assert proc.returncode == -signal.SIGKILL
    work = root / "work"
    (area,) = [p for p in work.iterdir() if p.name not in (".lock", "shared")]  # shared: the seed
    owner = read_owner(area)
    assert owner is not None and owner.pid == proc.pid
    # The ranks notice their runner is gone (their output pipe breaks) and exit.
    wait_until(lambda: not _processes_naming(str(area)), "the orphaned ranks to exit")
    assert list(tmpdir.iterdir()) == []  # nothing outside the store

    shutil.copytree(root, tmp_path / "copy" / ".nscas")
    with open_store(tmp_path / "copy") as copy:
        report = gc(copy, min_age=0)
        assert [(a.reason, a.removed) for a in report.work_areas] == [("process-gone", True)]
        assert [p.name for p in (copy.root / "work").iterdir()] == [".lock"]

    (result,) = run_file(store, recipe)
    assert result.status == "succeeded" and not result.cached
    journals = store.get_record(result.receipt)["journals"]
    assert [store.get_record(store.resolve(j))["resumed_from"] for j in journals] == [2]
    assert [p.name for p in work.iterdir()] == [".lock"]
    # The resume state stayed in the work area; nothing of it is kept in the store.
    assert store.ref_list("states/") == []
    store.close()
