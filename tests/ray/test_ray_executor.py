"""``nscas run --executor ray``: each step a task on a real two-node Ray cluster on 127.0.0.1,
with the actions and outputs of a sequential run, on a local store and a team store, a worker
killed mid-step retried to the same action, and one clear line where a node cannot open the
store or no cluster answers."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.store.writer import Store, init_store
from tests.ray.cluster import Cluster, local_cluster
from tests.runner.helpers import PIPELINE, write
from tests.runner.jobs_helpers import facts, release_fifo, wait_gone, wait_running
from tests.verifiers.conftest import EXPERIMENT, experiment
from tests.waiting import communicate, run_to_end, wait_until

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory, cluster: Cluster) -> dict[str, Any]:
    """PIPELINE (prepare -> tokenizer -> init) run one step at a time in a store of its own."""
    base = tmp_path_factory.mktemp("sequential")
    init_store(base).close()
    file = write(base, "pipeline.toml", PIPELINE)
    return {r["step"]: r for r in _results(_nscas(cluster, base, "run", file, "--json"))}


def _nscas(cluster: Cluster, home: Path, *args: object,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_to_end([sys.executable, "-m", "nscas.cli", *map(str, args)],
                      f"nscas {' '.join(map(str, args))}", cwd=home, env=env or cluster.env,
                      text=True)


def _results(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    if done.stdout.startswith("["):
        return json.loads(done.stdout)
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["event"] == "finished"
    return last["results"]


def _ids(results: dict[str, Any]) -> dict[str, tuple[str, dict[str, str]]]:
    return {step: (r["action"], r["outputs"]) for step, r in results.items()}


def test_a_pipeline_on_the_cluster_gives_the_ids_of_a_sequential_run(
        tmp_path: Path, cluster: Cluster, sequential: dict[str, Any]) -> None:
    init_store(tmp_path).close()
    file = write(tmp_path, "pipeline.toml",
                 f'[executor]\nkind = "ray"\naddress = "{cluster.address}"\n' + PIPELINE)
    done = _nscas(cluster, tmp_path, "run", file, "--json", "--jobs", "2")  # events, then results
    on_ray = {r["step"]: r for r in _results(done)}
    assert _ids(on_ray) == _ids(sequential)
    assert not any(r["cached"] for r in on_ray.values())
    events = [json.loads(line) for line in done.stdout.splitlines()[:-1]]
    logs = [Path(e["log"]) for e in events if e["event"] == "done"]
    assert len(logs) == 3 and all(log.is_file() for log in logs)
    # What each task asked Ray for, and then the node Ray chose.
    assert {e["devices"] for e in events if e["event"] == "running"} == {"ray: 1 CPU"}
    assert {e["step"] for e in events if e["event"] == "note"
            and e["message"].startswith("on Ray node ")} == {"prepare", "tokenizer", "init"}
    # A task's progress comes back as a local job's does (prepare says what it generates).
    assert {"event": "progress", "step": "prepare", "done": 0,
            "description": "generating tasks"}.items() <= next(
        e for e in events if e["event"] == "progress").items()
    again = {r["step"]: r for r in _results(_nscas(cluster, tmp_path, "run", file, "--json",
                                                   "--executor", "local", "--jobs", "1"))}
    assert all(r["cached"] for r in again.values())  # one step at a time after it: all cached
    assert {s: r["receipt"] for s, r in again.items()} == \
        {s: r["receipt"] for s, r in on_ray.items()}


def test_a_team_store_on_the_cluster(tmp_path: Path, cluster: Cluster,
                                     sequential: dict[str, Any],
                                     request: pytest.FixtureRequest) -> None:
    config = request.getfixturevalue("team_services").config()
    init_store(tmp_path / "team", config).close()
    file = write(tmp_path, "pipeline.toml", PIPELINE)
    on_ray = {r["step"]: r for r in _results(_nscas(
        cluster, tmp_path, "--store", tmp_path / "team", "run", file, "--json",
        "--executor", "ray", "--ray-address", cluster.address))}
    assert _ids(on_ray) == _ids(sequential)
    with Store(tmp_path / "team" / ".nscas") as store:
        assert store.ref_get("coop/seed") is not None


def test_a_worker_killed_mid_step_is_retried_to_the_same_action(tmp_path: Path,
                                                                cluster: Cluster) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    for name in ("ray", "local"):
        (tmp_path / name).mkdir()
        init_store(tmp_path / name).close()
    file = write(tmp_path, "held.toml", f"""
        [[step]]
        name = "held"
        recipe = "probe"
        params = {{ label = "held", hold = "{hold}" }}
        [[step]]
        name = "after"
        recipe = "probe"
        inputs = {{ source = "step.held.seen" }}
        """)
    fifo = release_fifo(hold, "held")
    run = subprocess.Popen([sys.executable, "-m", "nscas.cli", "run", file, "--json",
                            "--jobs", "2", "--executor", "ray", "--ray-address",
                            cluster.address], cwd=tmp_path / "ray", env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = wait_running(fifo)  # the step runs in a worker, which holds the reading end
        killed = facts(hold, "held")[0]["pid"]
        os.kill(killed, signal.SIGKILL)
        assert wait_gone(killed)
        # Whenever Ray's retry gets there, it runs through: the FIFO is gone, or (opened
        # before this) its writer closes now.
        os.unlink(fifo)
        os.close(first)
        out, err = communicate(run, "the run whose worker was killed")
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    executions = facts(hold, "held")
    assert len(executions) == 2 and executions[0]["pid"] != executions[1]["pid"]
    events = [json.loads(line) for line in out.splitlines()]  # Ray's own messages: stderr
    assert any(e["event"] == "note" and e["step"] == "held"
               and "Ray runs the step again (attempt 2" in e["message"] for e in events)
    retried = {r["step"]: r for r in _results(subprocess.CompletedProcess([], 0, out, err))}
    local = {r["step"]: r for r in _results(_nscas(cluster, tmp_path / "local", "run", file,
                                                   "--json"))}
    assert _ids(retried) == _ids(local)
    # The retry took over the dead run's work area, and removed it once it had succeeded.
    assert not (tmp_path / "ray" / ".nscas" / "work" /
                retried["held"]["action"].split(":")[1]).exists()


@pytest.fixture
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tamper suite's local run of ``EXPERIMENT`` (made once per test run, a copy of its
    own here): the directory holding its ``.nscas``, and each step's action and outputs. A
    fixture, so that waiting for another worker to build it is not part of the test's time."""
    root, steps = experiment(tmp_path_factory)
    return root, {step: {"action": str(r.action),
                         "outputs": {k: str(v) for k, v in r.outputs.items()}}
                  for step, r in steps.items()}


@pytest.mark.timeout(1800)  # a run of every recipe on the cluster: minutes on two busy cores
def test_the_demo_experiment_on_the_cluster_gives_the_report_of_a_local_run(
        tmp_path: Path, cluster: Cluster, local_run: tuple[Path, dict[str, Any]]) -> None:
    # The demo's every recipe at the verify suite's size (examples/cooperative-learning's
    # experiment trains for tens of minutes on two busy cores). Its world-2 train and its
    # serve need two cores on one node: each node has two. The local side is the run the
    # tamper suite verifies (tests/verifiers/conftest.py): that a scheduled local run gives
    # the ids of a sequential one is tests/runner's business.
    file = write(tmp_path, "experiment.toml", EXPERIMENT)
    local_root, local_results = local_run
    (tmp_path / "ray").mkdir()
    init_store(tmp_path / "ray").close()
    done = _nscas(cluster, tmp_path / "ray", "run", file, "--json", "--executor", "ray",
                  "--ray-address", cluster.address)
    runs = {"local": local_results, "ray": {r["step"]: r for r in _results(done)}}
    with Store(local_root / ".nscas") as local, \
            Store(tmp_path / "ray" / ".nscas") as on_ray:
        assert _reproduced(local, runs["local"]) == _reproduced(on_ray, runs["ray"])
    # The steps that read outputs only (not receipts) and measure nothing: the same IDs.
    exact = ("prepare", "tokenizer", "init", "train-single", "train-pair", "commit")
    assert {s: _ids(runs["ray"])[s] for s in exact} == {s: _ids(runs["local"])[s] for s in exact}


def _reproduced(store: Store, results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each step's outputs as a rerun verdict compares them: an output that holds
    measurements (wall times, the receipt IDs a report cites) by the part of it that must
    reproduce, as its recipe defines it; any other by its ID."""
    from nscas.objects.digests import Digest
    from nscas.runs.registry import registered_recipe

    out = {}
    for step, result in results.items():
        recipe = registered_recipe(store.get_record(Digest.parse(result["action"]))
                                   ["recipe"].split("@")[0])
        assert recipe is not None
        out[step] = {name: recipe.measurements[name](store, Digest.parse(oid))
                     if name in recipe.measurements else oid
                     for name, oid in result["outputs"].items()}
    return out


def test_a_step_no_node_can_hold_fails_at_once(tmp_path: Path, cluster: Cluster) -> None:
    init_store(tmp_path).close()
    file = write(tmp_path, "wide.toml", """
        [[step]]
        name = "wide"
        recipe = "probe"
        params = { cores = 3 }
        """)  # the cluster has 4 CPUs, 2 a node: Ray would wait for ever
    done = _nscas(cluster, tmp_path, "run", file, "--executor", "ray", "--ray-address",
                  cluster.address)
    assert done.returncode == 2, done.stderr
    assert ("step 'wide' cannot run here: it needs 3 CPU cores on one node; no node of the "
            "Ray cluster has them (its nodes have at most 2 CPUs and 0 GPUs each)") \
        in done.stderr
    assert "Traceback" not in done.stderr


def test_stopping_the_run_cancels_its_tasks(tmp_path: Path, cluster: Cluster) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    init_store(tmp_path).close()
    file = write(tmp_path, "held.toml", f"""
        [[step]]
        name = "held"
        recipe = "probe"
        params = {{ label = "stopped", hold = "{hold}" }}
        """)
    fifo = release_fifo(hold, "stopped")
    run = subprocess.Popen([sys.executable, "-m", "nscas.cli", "run", file,
                            "--executor", "ray", "--ray-address", cluster.address],
                           cwd=tmp_path, env=cluster.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        held = wait_running(fifo)
        run.send_signal(signal.SIGINT)
        _, err = communicate(run, "the run stopped by SIGINT")
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0
    assert "Traceback" not in err
    os.close(held)
    wait_until(lambda: _no_reader(fifo), "the cancelled step to stop reading its FIFO")
    with Store(tmp_path / ".nscas") as store:
        statuses = [store.get_record(i.id)["status"]
                    for i in store.log(kind="receipt/1", limit=10)]
    assert "succeeded" not in statuses


def _no_reader(fifo: Path) -> bool:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        return exc.errno == errno.ENXIO
    return False


def test_a_node_that_cannot_open_the_store_fails_the_step_in_one_line(
        tmp_path: Path, cluster: Cluster) -> None:
    # The run's store is on a tmpfs mounted in this run's own mount namespace only: the run
    # opens it, the cluster's nodes (outside that namespace) see an empty directory.
    private = tmp_path / "private"
    private.mkdir()
    file = write(tmp_path, "pipeline.toml", PIPELINE)
    script = (f'mount -t tmpfs none "{private}" && "{sys.executable}" -m nscas.cli init '
              f'"{private}" >/dev/null && cd "{private}" && exec "{sys.executable}" -m '
              f'nscas.cli run "{file}" --executor ray --ray-address {cluster.address}')
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               script], env=cluster.env, capture_output=True, text=True,
                              timeout=600)
    except FileNotFoundError:
        pytest.skip("unshare is not installed")
    if "mount:" in done.stderr or "unshare:" in done.stderr:
        pytest.skip(f"no private mount here: {done.stderr.strip()}")
    assert done.returncode == 1, done.stderr
    line = f"the store {private}/.nscas cannot be opened on Ray node "
    assert line in done.stdout + done.stderr
    assert f"no store at {private}/.nscas on this node" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_no_cluster_is_one_line(tmp_path: Path, cluster: Cluster) -> None:
    from tests.store.services import free_port

    init_store(tmp_path).close()
    file = write(tmp_path, "pipeline.toml", PIPELINE)
    done = _nscas(cluster, tmp_path, "run", file, "--executor", "ray", "--ray-address",
                  f"127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no Ray cluster at 127.0.0.1:" in done.stderr


def test_ray_missing_is_one_line(tmp_path: Path, cluster: Cluster) -> None:
    shadow = tmp_path / "shadow"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    init_store(tmp_path).close()
    file = write(tmp_path, "pipeline.toml", PIPELINE)
    env = {**cluster.env, "PYTHONPATH": os.pathsep.join([str(shadow), cluster.env["PYTHONPATH"]])}
    done = _nscas(cluster, tmp_path, "run", file, "--executor", "ray", env=env)
    assert done.returncode == 2
    assert "install nscas[ray]" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("table, message", [
    ('[executor]\nkind = "ray"\nnodes = 2\n', "unknown key(s) in [executor]: nodes"),
    ('[executor]\nkind = "slurm"\n', "[executor] kind must be one of local, ray"),
    ('executor = "ray"\n', "'executor' must be a table"),
    ('[executor]\nkind = "ray"\naddress = 3\n', "[executor] address must be a non-empty"),
])
def test_a_bad_executor_table_is_one_line(tmp_path: Path, cluster: Cluster, table: str,
                                          message: str) -> None:
    init_store(tmp_path).close()
    file = write(tmp_path, "pipeline.toml", table + PIPELINE)
    done = _nscas(cluster, tmp_path, "run", file)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
