"""The Running page: the running and waiting steps of scheduled runs in progress, read from the
state file a scheduled run keeps beside its logs (nscas.runs.run_state)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

from nscas.runs.run_state import LOGS, STATE_FILE, RunStateFile
from nscas.runs.scheduler import StepEvent
from nscas.store.writer import init_store
from tests.ui.client import fetch


def _store(tmp_path: Path) -> Path:
    with init_store(tmp_path / "home") as store:
        return store.root


def _rows(text: str) -> list[list[str]]:
    return [[unescape(cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", text, re.S) if "<td>" in row]


def test_a_run_in_progress_shows_its_running_and_waiting_steps(tmp_path: Path) -> None:
    root = _store(tmp_path)
    state = RunStateFile(root / LOGS / "20261203T160000-1", file="exp/<pipeline>.toml",
                         steps=["a", "b", "c"])
    state.record(StepEvent(step="a", state="running", devices="cpu 0, gpu 1"))
    state.record(StepEvent(step="a", state="progress", done=3, total=10,
                           description="training"))
    state.record(StepEvent(step="c", state="cached"))
    page = fetch(root, "/running")[0]
    assert page.status == 200
    assert "exp/&lt;pipeline&gt;.toml" in page.text  # escaped, as everything shown
    rows = _rows(page.text)
    assert [r[:3] for r in rows] == [["a", "running", "cpu 0, gpu 1"], ["b", "waiting", ""]]
    assert rows[0][4] == "3/10 training"
    state.close()  # the run ended: listed no more
    assert "No scheduled run is in progress" in fetch(root, "/running")[0].text


def test_a_run_whose_process_is_gone_or_whose_file_is_damaged_is_not_listed(
        tmp_path: Path) -> None:
    root = _store(tmp_path)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = root / LOGS / "20261203T150000-9"
    dead.mkdir(parents=True)
    (dead / STATE_FILE).write_text(json.dumps({
        "run": dead.name, "file": "p.toml", "pid": int(ended.stdout), "started": "", "updated": "",
        "finished": False, "steps": {"a": {"state": "running"}}}))
    damaged = root / LOGS / "20261203T150001-9"
    damaged.mkdir()
    (damaged / STATE_FILE).write_text('{"run": ')
    page = fetch(root, "/running")[0]
    assert page.status == 200 and "No scheduled run is in progress" in page.text


def test_a_scheduled_run_leaves_its_state_file_finished(tmp_path: Path) -> None:
    from tests.runner.jobs_helpers import nscas_process, probe_site

    site = probe_site(tmp_path / "site")
    root = _store(tmp_path)
    file = tmp_path / "p.toml"
    file.write_text('[[step]]\nname = "a"\nrecipe = "probe"\n[[step]]\nname = "b"\n'
                    'recipe = "probe"\ninputs = { source = "step.a.seen" }\n')
    done = nscas_process(tmp_path / "home", site, "run", file, "--jobs", "2")
    assert done.returncode == 0, done.stderr
    (state,) = (root / LOGS).glob(f"*/{STATE_FILE}")
    raw = json.loads(state.read_text())
    assert raw["finished"] is True
    assert {s: v["state"] for s, v in raw["steps"].items()} == {"a": "done", "b": "done"}
