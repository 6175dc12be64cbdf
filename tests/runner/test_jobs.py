"""``nscas run --jobs``: steps at once in processes of their own, the same actions and outputs as
one at a time, one execution of an action however many runs ask for it, and no job left behind
when a step fails or the run is stopped."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from nscas.objects.digests import Digest
from nscas.store.claims import CLAIM_CLASS
from nscas.store.writer import Store, init_store
from tests.runner.helpers import PIPELINE, snapshot, write
from tests.runner.jobs_helpers import (
    facts,
    gone,
    group_members,
    nscas_process,
    probe_site,
    release_fifo,
    start_nscas,
    wait_gone,
    wait_running,
)
from tests.waiting import communicate

DIAMOND = """
name = "diamond"
refs = "exp/diamond"
[[step]]
name = "a"
recipe = "probe"
params = { label = "a" }
[[step]]
name = "b"
recipe = "probe"
inputs = { source = "step.a.seen" }
params = { label = "b" }
[[step]]
name = "c"
recipe = "probe"
inputs = { source = "step.a.seen" }
params = { label = "c" }
[[step]]
name = "d"
recipe = "probe"
inputs = { left = "step.b.seen", right = "step.c.seen", first = "step.a.receipt" }
params = { label = "d" }
"""
"""a, then b and c at once, then d (which also reads a's receipt)."""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return probe_site(tmp_path / "site")


def _home(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    home.mkdir()
    init_store(home).close()
    return home


def _steps(out: str) -> list[dict[str, Any]]:
    """The results of a ``--json`` run: a scheduled run's last line, a sequential run's list."""
    if out.startswith("["):
        return json.loads(out)
    last = json.loads(out.strip().splitlines()[-1])
    assert last["event"] == "finished"
    return last["results"]


def _run_json(home: Path, site: Path, file: Path, *args: object) -> list[dict[str, Any]]:
    done = nscas_process(home, site, "run", file, "--json", *args)
    assert done.returncode == 0, done.stderr
    return _steps(done.stdout)


def test_jobs_give_the_actions_and_outputs_of_a_sequential_run(tmp_path: Path, site: Path) -> None:
    one, two = _home(tmp_path, "one"), _home(tmp_path, "two")
    file = write(tmp_path, "diamond.toml", DIAMOND)
    sequential = {r["step"]: r for r in _run_json(one, site, file, "--jobs", "1")}
    jobs = {r["step"]: r for r in _run_json(two, site, file, "--jobs", "3")}
    assert set(jobs) == {"a", "b", "c", "d"}
    for step in ("a", "b", "c"):
        assert jobs[step]["action"] == sequential[step]["action"], step
        assert jobs[step]["outputs"] == sequential[step]["outputs"], step
    assert not any(r["cached"] for r in jobs.values())
    with Store(two / ".nscas") as store:  # d read what the jobs before it gave (a receipt
        action = store.get_record(Digest.parse(jobs["d"]["action"]))  # holds times: its own)
    assert action["inputs"] == {"first": jobs["a"]["receipt"],
                                "left": jobs["b"]["outputs"]["seen"],
                                "right": jobs["c"]["outputs"]["seen"]}
    again = _run_json(two, site, file, "--jobs", "1")  # one at a time, after: all cached
    assert all(r["cached"] for r in again)
    assert {r["step"]: r["receipt"] for r in again} == {s: r["receipt"] for s, r in jobs.items()}
    with Store(two / ".nscas") as store:  # the refs a sequential run moves, moved
        assert store.ref_get("exp/diamond/d/receipt") is not None
        assert str(store.ref_get("exp/diamond/d/seen")) == jobs["d"]["outputs"]["seen"]


def test_events_and_a_log_per_job(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", DIAMOND)
    done = nscas_process(home, site, "run", file, "--jobs", "2", "--json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    by_step: dict[str, list[str]] = {}
    for event in events[:-1]:
        by_step.setdefault(event["step"], []).append(event["event"])
    assert all(states[0] == "waiting" and states[-1] == "done" for states in by_step.values())
    started = {e["step"]: e for e in events if e["event"] == "running"}
    assert all(Path(e["log"]).is_file() for e in started.values())
    order = [e["step"] for e in events if e["event"] in ("running", "done")]
    assert order.index("a") < order.index("b") and order.index("a") < order.index("c")
    assert order.index("d") > max(order.index("b"), order.index("c"))


def test_ready_steps_run_at_once_each_with_its_cores(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "two.toml", f"""
        [[step]]
        name = "x"
        recipe = "probe"
        params = {{ label = "x", hold = "{hold}" }}
        [[step]]
        name = "y"
        recipe = "probe"
        params = {{ label = "y", hold = "{hold}" }}
        """)
    fifos = [release_fifo(hold, label) for label in ("x", "y")]
    run = start_nscas(home, site, "run", file, "--jobs", "2", "--json")
    try:
        ends = [wait_running(fifo) for fifo in fifos]  # both running at the same time
        x, y = facts(hold, "x")[0], facts(hold, "y")[0]
        assert x["pgid"] != y["pgid"] and x["pgid"] == x["pid"]  # each its own group
        if len(os.sched_getaffinity(0)) >= 2:
            assert len(x["cores"]) == 1 and x["cores"] != y["cores"]
        assert x["threads"] == y["threads"] == "1"
        # Forked by the run's warm server (nscas.runs.warm); where it had loaded torch before
        # this step's environment existed, the step's thread count is torch's own all the same.
        assert x["parent"] == y["parent"] != run.pid
        assert x["torch_threads"] in (None, 1) and y["torch_threads"] in (None, 1)
        for end in ends:
            os.close(end)
        out, err = communicate(run, "the run of two jobs")
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert {r["step"] for r in _steps(out)} == {"x", "y"}


def test_a_step_that_can_never_fit_fails_at_once(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "big.toml", """
        [[step]]
        name = "small"
        recipe = "probe"
        [[step]]
        name = "huge"
        recipe = "probe"
        params = { cores = 4096, label = "huge" }
        """)
    with Store(home / ".nscas") as store:
        before = snapshot(store)
    done = nscas_process(home, site, "run", file, "--jobs", "2")
    assert done.returncode == 2
    cores = len(os.sched_getaffinity(0))
    assert "step 'huge' cannot run here: it needs 4096 CPU cores" in done.stderr
    assert f"this machine has {cores} CPU core" in done.stderr
    assert "Traceback" not in done.stderr
    with Store(home / ".nscas") as store:
        assert snapshot(store) == before  # nothing ran, nothing written


@pytest.mark.parametrize("kind", ["sqlite", "postgres+s3"])
def test_two_runs_of_one_action_execute_it_once(tmp_path: Path, site: Path, kind: str,
                                                request: pytest.FixtureRequest) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = request.getfixturevalue("team_services").config() if kind != "sqlite" else None
    init_store(home / "store", config).close()
    store_dir = home / "store"
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "one.toml", f"""
        recipe = "probe"
        [params]
        label = "same"
        hold = "{hold}"
        """)
    fifo = release_fifo(hold, "same")
    first = start_nscas(home, site, "--store", store_dir, "run", file, "--json")
    end = wait_running(fifo)  # one run is executing the action
    second = start_nscas(home, site, "--store", store_dir, "run", file, "--json")
    try:
        if config is None:
            _wait_blocked_on_claim(store_dir / ".nscas")
        else:
            _wait_blocked_on_advisory_claim(config.database)
        os.close(end)
        outs = [json.loads(communicate(p, "a run waiting on a claim")[0])
                for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    assert first.returncode == second.returncode == 0
    assert len(facts(hold, "same")) == 1  # executed once
    assert outs[0]["receipt"] == outs[1]["receipt"]
    assert sorted(o["cached"] for o in outs) == [False, True]


def _wait_blocked_on_claim(store_dir: Path) -> None:
    """Until a process waits for the claim the other holds (``/proc/locks`` shows waiters as
    ``->``); no event says when a process starts waiting on a lock."""
    claims = store_dir / "claims.lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        inode = claims.stat().st_ino if claims.exists() else None
        locks = Path("/proc/locks").read_text().splitlines()
        if inode is not None and any("->" in line and f":{inode} " in line for line in locks):
            return
        time.sleep(0.05)
    raise AssertionError("the second run never waited for the claim")


def _wait_blocked_on_advisory_claim(database: str) -> None:
    """Until a session waits for an advisory lock of the claims' class (pg_locks)."""
    from nscas.database.postgres import PgConnection

    c = PgConnection(database)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            waiting = c.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid = ?", (CLAIM_CLASS,)).fetchone()[0]
            if waiting:
                return
            time.sleep(0.05)
    finally:
        c.close()
    raise AssertionError("the second run never waited for the claim")


def _two_holding(hold: Path, *, failing: bool) -> str:
    first = 'params = { fail = "error" }' if failing else f'params = {{ label = "z", hold = "{hold}" }}'
    return f"""
        [[step]]
        name = "bad"
        recipe = "probe"
        {first}
        [[step]]
        name = "after-bad"
        recipe = "probe"
        inputs = {{ source = "step.bad.seen" }}
        [[step]]
        name = "x"
        recipe = "probe"
        params = {{ label = "x", hold = "{hold}" }}
        [[step]]
        name = "y"
        recipe = "probe"
        params = {{ label = "y", hold = "{hold}" }}
        """


def test_a_failure_stops_every_job_and_names_the_failed_receipt(tmp_path: Path,
                                                                site: Path) -> None:
    home = _home(tmp_path, "home")
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "fails.toml", _two_holding(hold, failing=True))
    release_fifo(hold, "x")
    # bad fails while x holds (y waits: 2 jobs); x is stopped, after-bad and y never run.
    done = nscas_process(home, site, "run", file, "--jobs", "2")
    assert done.returncode == 1, done.stderr
    assert "step(s) failed" not in done.stderr
    assert "1 step failed: bad (receipt blake3:" in done.stderr
    assert "Traceback" not in done.stderr
    for execution in facts(hold, "x"):
        assert gone(execution["pid"]) and not group_members(execution["pgid"])
    assert not facts(hold, "y")


def test_keep_going_finishes_what_does_not_depend_on_the_failure(tmp_path: Path,
                                                                 site: Path) -> None:
    home = _home(tmp_path, "home")
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "fails.toml", _two_holding(hold, failing=True))
    done = nscas_process(home, site, "run", file, "--jobs", "2", "--keep-going", "--json")
    assert done.returncode == 1
    results = {r["step"]: r for r in _steps(done.stdout)}
    assert results["bad"]["status"] == "failed"
    assert "after-bad" not in results
    assert not results["x"]["cached"] and not results["y"]["cached"]
    assert "bad (receipt blake3:" in done.stderr


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_run_stops_every_job_and_a_later_run_resumes(
        tmp_path: Path, site: Path, how: signal.Signals) -> None:
    home = _home(tmp_path, "home")
    hold = tmp_path / "hold"
    hold.mkdir()
    file = write(tmp_path, "stop.toml", _two_holding(hold, failing=False))
    fifos = [release_fifo(hold, label) for label in ("z", "x")]
    run = start_nscas(home, site, "run", file, "--jobs", "2")
    ends = [wait_running(fifo) for fifo in fifos]  # bad (as z) and x hold; the rest wait
    run.send_signal(how)
    communicate(run, "the stopped run")
    assert run.returncode != 0
    for label in ("z", "x"):
        execution = facts(hold, label)[0]
        assert wait_gone(execution["pid"]), label
        assert not group_members(execution["pgid"])
    for end in ends:
        os.close(end)
    with Store(home / ".nscas") as store:
        before = {info.id for info in store.log(kind="receipt/1", limit=100)}
        succeeded = [r for r in (store.get_record(i) for i in before)
                     if r["status"] == "succeeded"]
    assert not succeeded  # nothing half done counts as done
    for label in ("z", "x"):
        os.unlink(hold / f"{label}.release")  # the next run's probes do not wait
    done = nscas_process(home, site, "run", file, "--jobs", "2", "--json")
    assert done.returncode == 0, done.stderr
    results = {r["step"]: r for r in _steps(done.stdout)}
    assert set(results) == {"bad", "after-bad", "x", "y"}
    assert not any(r["cached"] for r in results.values())


def test_real_recipes_give_the_same_ids_with_jobs(tmp_path: Path, site: Path) -> None:
    one, two = _home(tmp_path, "one"), _home(tmp_path, "two")
    file = write(tmp_path, "pipeline.toml", PIPELINE)
    sequential = {r["step"]: r for r in _run_json(one, site, file, "--jobs", "1")}
    jobs = {r["step"]: r for r in _run_json(two, site, file, "--jobs", "2")}
    assert {s: (r["action"], r["outputs"]) for s, r in jobs.items()} == \
        {s: (r["action"], r["outputs"]) for s, r in sequential.items()}


def test_a_sweep_runs_its_arms_as_jobs(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", DIAMOND)
    results = {r["step"]: r for r in _run_json(home, site, file, "--jobs", "3", "--set",
                                               'b.label=["x","y","z"]')}
    assert set(results) == {"a", "c", "b.label-x", "b.label-y", "b.label-z", "d.b.label-x",
                            "d.b.label-y", "d.b.label-z"}
    again = _run_json(home, site, file, "--jobs", "1", "--set", 'b.label=["x","y","z"]')
    assert all(r["cached"] for r in again)


def test_jobs_in_the_file_schedule_the_run(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", "jobs = 2\n" + DIAMOND)
    done = nscas_process(home, site, "run", file, "--json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert {e["event"] for e in events} >= {"waiting", "running", "done", "finished"}


@pytest.mark.parametrize("jobs", ["0", "true", '"4"', "2000"])
def test_bad_jobs_in_the_file_is_one_line(tmp_path: Path, site: Path, jobs: str) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", f"jobs = {jobs}\n" + DIAMOND)
    done = nscas_process(home, site, "run", file)
    assert done.returncode == 2
    assert "'jobs' of a pipeline file must be an integer from 1 to 1024" in done.stderr
    assert "Traceback" not in done.stderr


def _events(done: Any) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_cached_step_is_answered_without_a_job(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", DIAMOND)
    first = _events(nscas_process(home, site, "run", file, "--jobs", "2", "--json"))
    changed = write(tmp_path, "changed.toml", DIAMOND.replace('label = "d"', 'label = "d2"'))
    events = _events(nscas_process(home, site, "run", changed, "--jobs", "2", "--json"))
    assert [e["step"] for e in events if e["event"] == "running"] == ["d"]  # the one that runs
    assert {e["step"] for e in events if e["event"] == "cached"} == {"a", "b", "c"}
    assert all("log" not in e for e in events if e["event"] == "cached")
    before = {e["step"]: e for e in first[-1]["results"]}
    now = {e["step"]: e for e in events[-1]["results"]}
    assert all(now[s]["receipt"] == before[s]["receipt"] for s in ("a", "b", "c"))
    assert [r["step"] for r in events[-1]["results"]] == ["a", "b", "c", "d"]  # run order
    again = _run_json(home, site, changed, "--jobs", "1")  # one at a time, after: all cached
    assert all(r["cached"] for r in again)
    assert {r["step"]: r["receipt"] for r in again} == {s: r["receipt"] for s, r in now.items()}
    with Store(home / ".nscas") as store:  # the cached answer moved d's... and a's refs
        assert str(store.ref_get("exp/diamond/d/receipt")) == now["d"]["receipt"]
        assert str(store.ref_get("exp/diamond/a/receipt")) == now["a"]["receipt"]


def test_a_pipeline_runs_scheduled_by_default_and_reports_as_one_at_a_time(
        tmp_path: Path, site: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the default is one step at a time on a machine of one core")
    one, two = _home(tmp_path, "one"), _home(tmp_path, "two")
    file = write(tmp_path, "diamond.toml", DIAMOND)
    sequential = nscas_process(one, site, "run", file, "--jobs", "1")
    default = nscas_process(two, site, "run", file)
    assert sequential.returncode == default.returncode == 0, default.stderr
    assert "running on cpu" in default.stderr and "running on" not in sequential.stderr

    def shape(out: str) -> list[str]:  # receipts hold times: each run's own IDs
        return [" ".join("ID" if len(w) > 40 else w for w in line.split())
                for line in out.splitlines()]

    assert shape(default.stdout) == shape(sequential.stdout)
    assert default.stdout.splitlines()[-1] == "4 steps: 0 cached, 4 ran, 0 failed"
    as_json = json.loads(nscas_process(two, site, "run", file, "--json").stdout)
    assert [r["step"] for r in as_json] == ["a", "b", "c", "d"]  # a sequential run's list
    assert all(r["cached"] for r in as_json)


@pytest.mark.parametrize("share", ["0", "true", '"4"', "65", "2.5"])
def test_a_bad_share_is_one_line_and_runs_nothing(tmp_path: Path, site: Path,
                                                  share: str) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "diamond.toml", DIAMOND.replace(
        'params = { label = "b" }', f'params = {{ label = "b" }}\nshare = {share}'))
    with Store(home / ".nscas") as store:
        before = snapshot(store)
    done = nscas_process(home, site, "run", file, "--jobs", "2")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "'share' of [[step]] #2 must be an integer from 1 to 64" in done.stderr
    with Store(home / ".nscas") as store:
        assert snapshot(store) == before


def test_a_recipe_file_has_no_share(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    file = write(tmp_path, "one.toml", 'recipe = "probe"\nshare = 2\n')
    done = nscas_process(home, site, "run", file)
    assert done.returncode == 2 and "unknown key(s) in the recipe file: share" in done.stderr


def test_a_steps_share_is_not_part_of_its_action(tmp_path: Path, site: Path) -> None:
    home = _home(tmp_path, "home")
    plain = _run_json(home, site, write(tmp_path, "a.toml", DIAMOND), "--jobs", "2")
    shared = _run_json(home, site, write(tmp_path, "b.toml", DIAMOND.replace(
        'params = { label = "c" }', 'params = { label = "c" }\nshare = 4')), "--jobs", "2")
    assert all(r["cached"] for r in shared)
    assert [r["action"] for r in shared] == [r["action"] for r in plain]


@pytest.mark.parametrize(("args", "says"), [
    (("--executor", "slurm"), "--executor must be one of local, ray, got 'slurm'"),
    (("--executor", "ray", "--recipe-file"), "--executor ray runs a pipeline file's steps"),
])
def test_a_bad_executor_flag_is_one_line_and_runs_nothing(tmp_path: Path, site: Path,
                                                          args: tuple[str, ...],
                                                          says: str) -> None:
    home = _home(tmp_path, "home")
    if "--recipe-file" in args:
        file = write(tmp_path, "one.toml", 'recipe = "probe"\n')
        args = args[:-1]
    else:
        file = write(tmp_path, "diamond.toml", DIAMOND)
    with Store(home / ".nscas") as store:
        before = snapshot(store)
    done = nscas_process(home, site, "run", file, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert says in done.stderr
    with Store(home / ".nscas") as store:
        assert snapshot(store) == before


def test_a_claims_session_ends_soon_after_its_host_dies(request: pytest.FixtureRequest) -> None:
    # A holder whose host died sends no FIN: the server ends its session (and frees the
    # claim, for Ray's retry elsewhere) once its keepalives go unanswered, set here.
    from nscas.store.claims import CLAIM_SESSION, claim_session

    database = request.getfixturevalue("team_services").config().database
    c = claim_session(database)
    try:
        shown = {name: c.execute(f"SHOW {name}").fetchone()[0] for name in CLAIM_SESSION}
    finally:
        c.close()
    # As set (a session without them reads the system's 0; one over a Unix socket reads 0).
    assert shown == {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5",
                     "tcp_keepalives_count": "3", "tcp_user_timeout": "30000"}
