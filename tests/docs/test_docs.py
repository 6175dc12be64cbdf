"""Docs are tests: every shell block of README.md and docs/*.md runs, in order, against a
fresh copy of the demo's output, or says why it cannot (``<!-- not-run: REASON -->``); and
the lines the demo prints at its end work when pasted into a shell of one's own.

README.md runs in a fresh shell (no venv on PATH, no store named): its own lines must set
both up. docs/*.md assume a reader who did what the README says: the venv on PATH and
``NSCAS_STORE`` naming the demo's store.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.docs.blocks import REPO, Block, blocks, doc_files, script
from tests.docs.conftest import VENV_BIN, DemoOutput, checkout, example_recipe_path, plain_env

RUNNABLE = [path for path in doc_files()
            if any(b.is_shell and b.not_run is None for b in blocks(path))]


def test_every_block_names_its_language_and_every_shell_block_runs_or_says_why() -> None:
    untagged = [b.where for path in doc_files() for b in blocks(path) if not b.info]
    assert untagged == [], "name each fence's language (text for output): " + ", ".join(untagged)
    for path in doc_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        marked = {b.line - 1 for b in blocks(path) if b.not_run is not None and b.is_shell}
        for number, line in enumerate(lines, 1):
            if line.strip().startswith("<!-- not-run"):  # well formed, before a shell block
                assert number in marked, f"{path.relative_to(REPO)}:{number}: {line.strip()!r}"
    assert REPO / "README.md" in RUNNABLE


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_shell_blocks_of_a_doc_run(path: Path, demo_output: DemoOutput,
                                       tmp_path: Path) -> None:
    root = checkout(tmp_path / "checkout", demo_output)
    env = plain_env(tmp_path / "home")
    if path.name != "README.md":
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
        env["NSCAS_STORE"] = str(root / "demo-out" / ".nscas")
        env["PYTHONPATH"] = example_recipe_path(root)
    runnable = [b for b in blocks(path) if b.is_shell and b.not_run is None]
    done = subprocess.run(["bash", "-c", script(runnable)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, _failure(runnable, done)


def _failure(runnable: list[Block], done: subprocess.CompletedProcess[str]) -> str:
    started = re.findall(r"^### (\S+)$", done.stderr, flags=re.MULTILINE)
    return (f"the block at {started[-1] if started else runnable[0].where} exited "
            f"{done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
            f"{done.stderr[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_what_the_demo_says_to_paste_works(demo_output: DemoOutput, tmp_path: Path) -> None:
    if demo_output.printed is None:
        pytest.skip("the demo ran before this session ($NSCAS_TEST_DEMO_OUT): its lines are "
                    "not here")
    printed = demo_output.printed.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("== to look around"))
    pasted = printed[start + 1:]
    assert len(pasted) == 2 and pasted[0].startswith("export PATH="), printed[start:]
    report = demo_output.directory / "report"
    try:
        # From another directory, in a fresh shell: the lines carry everything they need.
        done = subprocess.run(["bash", "-c", "\n".join(pasted)], cwd=tmp_path,
                              env=plain_env(tmp_path / "home"), capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        assert (report / "index.html").is_file(), done.stdout
    finally:
        shutil.rmtree(report, ignore_errors=True)  # the demo's output stays as it was made
