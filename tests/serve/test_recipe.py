"""The ``serve`` recipe end to end with real replica processes, and its faults: a replica
killed mid-phase, replicas that never become ready, an uncommitted model."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.recipes.serve.client import LoadPlan, run_phase
from nscas.recipes.serve.metrics import serving_claims
from nscas.recipes.serve.processes import ReplicaGroup, ReplicaStartError
from nscas.recipes.serve.recipe import RECIPE, ServeParams
from nscas.runs.recipe import NullProgress, RunContext
from nscas.store.opening import open_store
from nscas.verifiers.serving.throughput import check_serving
from tests.waiting import STARTUP

from .conftest import MAX_NEW_TOKENS, Served, start_replicas

FIELDS = {"request_id", "task_id", "phase", "attempt", "endpoint", "start", "end", "wall_start",
          "wall_end", "ok", "status", "error", "output_ids", "cached"}


def replica_children() -> list[int]:
    """Pids of this process's children that are replica processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"nscas.recipes.serve.replica_main" in cmdline:
            found.append(int(entry.name))
    return found


def run_recipe(served: Served, tmp_path: Path, inputs: dict[str, Digest] | None = None,
               **params: object):
    store = open_store(served.store_path)
    ctx = RunContext(
        store=store, inputs=inputs or {"model": served.checkpoint, "tasks": served.tasks},
        params=ServeParams(**params), workdir=tmp_path, progress=NullProgress(),  # type: ignore[arg-type]
        store_path=served.store_path, action=Digest.of(b"serve-test"))
    try:
        return store, RECIPE.run(ctx)
    except BaseException:
        store.close()
        raise


def test_three_phases_from_the_log(served: Served, tmp_path: Path) -> None:
    store, result = run_recipe(served, tmp_path, requests=8, warmup=1,
                               max_new_tokens=MAX_NEW_TOKENS, timeout=STARTUP)
    try:
        log = store.get_bytes(result.outputs["requests"])
    finally:
        store.close()
    assert replica_children() == []
    lines = [json.loads(x) for x in log.splitlines()]
    assert all(set(x) == FIELDS for x in lines)
    run_id = Digest.of(b"serve-test").short
    by_phase = {p: [x for x in lines if x["phase"] == p] for p in ("single", "pair", "failure")}
    # single and pair: one attempt each; failure: the odd requests met the stopped replica first.
    assert [len(v) for v in by_phase.values()] == [8, 8, 12]
    assert [x["request_id"] for x in by_phase["pair"]] == [f"{run_id}-pair-{i}" for i in range(8)]
    assert [x["task_id"] for x in by_phase["single"]] == list(served.task_ids[:8])
    assert len({x["endpoint"] for x in by_phase["single"]}) == 1
    assert len({x["endpoint"] for x in by_phase["pair"]}) == 2
    refused = [x for x in by_phase["failure"] if not x["ok"]]
    assert len(refused) == 4 and all(x["status"] is None and x["attempt"] == 1 for x in refused)
    assert all(x["error"].startswith("ConnectError") for x in refused)
    retried = [x for x in by_phase["failure"] if x["attempt"] == 2]
    assert [int(x["request_id"].rsplit("-", 1)[1]) for x in retried] == [1, 3, 5, 7]
    assert all(x["ok"] and x["endpoint"] == by_phase["single"][0]["endpoint"] for x in retried)
    # The phases ran in order, one after the other.
    assert max(x["end"] for x in by_phase["single"]) <= min(x["start"] for x in by_phase["pair"])
    assert max(x["end"] for x in by_phase["pair"]) <= min(x["start"] for x in by_phase["failure"])

    claims = {name: claim.value for name, claim in result.claims.items()}
    assert {claim.verifier for claim in result.claims.values()} == {"throughput"}
    assert claims == serving_claims(log)
    assert [claims[f"{p}.successes"] for p in ("single", "pair", "failure")] == [8, 8, 8]
    assert claims["failure_retries"] == 4
    assert claims["identical_outputs"] is True and claims["cache_hits"] == 0
    assert claims["throughput_ratio"] == pytest.approx(
        claims["pair.requests_per_second"] / claims["single.requests_per_second"])
    assert all(check.status == "passed" for check in check_serving(log, claims))


def test_a_replica_killed_mid_phase_is_retried_on_the_other(served: Served,
                                                            tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path) as group:
        endpoints = tuple(start_replicas(group, served, 2, max_batch=1, max_new_tokens=60))
        plan = LoadPlan(phase="pair", run_id="kill", endpoints=endpoints,
                        task_ids=served.task_ids[:12], model_digest=served.model_digest)

        async def main():
            phase = asyncio.create_task(run_phase(plan))
            async with httpx.AsyncClient(trust_env=False) as client:
                while (await client.get(f"{endpoints[1]}/stats")).json()["rows"] < 2:
                    await asyncio.sleep(0.02)
            group.kill(group.replicas[1])
            return await phase

        attempts = asyncio.run(main())
    assert replica_children() == []
    succeeded = {a.request_id for a in attempts if a.ok}
    assert succeeded == {plan.request_id(i) for i in range(12)}
    failed = [a for a in attempts if not a.ok]
    assert failed and all(a.endpoint == endpoints[1] and a.attempt == 1 for a in failed)
    retries = [a for a in attempts if a.attempt == 2]
    assert {a.request_id for a in retries} == {a.request_id for a in failed}
    assert all(a.ok and a.endpoint == endpoints[0] for a in retries)


def test_replicas_that_never_get_ready_fail_clearly_and_leave_nothing(
        served: Served, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"replica 0 did not become ready: no ready line "
                                          r"within 0.5 s"):
        run_recipe(served, tmp_path, requests=8, timeout=0.5)
    assert replica_children() == []


def test_a_health_check_that_never_passes(tmp_path: Path) -> None:
    # Prints a ready line naming a port nobody listens on, then hangs.
    fake = [sys.executable, "-c", "import time; print('listening http://127.0.0.1:9', "
            "flush=True); time.sleep(600)"]
    group = ReplicaGroup(tmp_path, grace=2)
    with group, pytest.raises(ReplicaStartError) as caught:
        group.wait_ready([group.start(fake)], timeout=1.5, model_digest=None)
    assert "http://127.0.0.1:9/health did not answer ready within 1.5 s" in caught.value.message
    assert group.replicas[0].process.returncode is not None


def test_the_model_must_be_committed(served: Served, tmp_path: Path) -> None:
    with open_store(served.store_path) as store:
        commitment = store.put_record({"nscas": "commitment/1", "purpose": "other candidates",
                                       "subjects": {"dev": str(served.tasks)}, "previous": None})
    inputs = {"model": served.checkpoint, "tasks": served.tasks, "commitment": commitment}
    with pytest.raises(RecipeError, match="does not name the model"):
        run_recipe(served, tmp_path, inputs=inputs)
    assert replica_children() == []


def test_params_are_checked() -> None:
    assert ServeParams(replicas=1).validate() is not None
    assert ServeParams(device="tpu").validate() is not None
    assert ServeParams(precision="fp16").validate() == "precision must be bf16 or fp32, got 'fp16'"
    assert ServeParams().validate() is None
    assert ServeParams(instances=0).validate() == "instances must be from 1 to 8, got 0"
    assert ServeParams(instances=9).validate() == "instances must be from 1 to 8, got 9"
    assert ServeParams(instances=8).validate() is None


def test_the_verifiers_take_instances_on_trust_and_refuse_impossible_counts() -> None:
    from nscas.verifiers.records.actionparams import params_checks

    honest = params_checks("serve.x", "serve@1", {"instances": 2, "requests": 8})
    assert [c.status for c in honest] == ["passed", "skipped"]
    assert honest[1].claimed == {"instances": 2}  # listed as not rechecked, with its value
    for forged in (0, 9, -1, True, "2", 2.0, None):
        [check, *_] = params_checks("serve.x", "serve@1", {"instances": forged})
        assert check.status == "failed" and f"instances={forged!r}" in check.message


def test_the_runner_can_hash_the_code_and_parse_params(store) -> None:
    from nscas.runs.codetree import code_tree
    from nscas.runs.config import parse_params

    entries = store.get_record(code_tree(store, RECIPE))["entries"]
    # The replica process is started with python -m, not imported: its module is named in a
    # string, and is part of the code all the same; the CLI and the verifiers are not.
    for path in ("nscas/recipes/serve/server.py", "nscas/recipes/serve/replica_main.py",
                 "nscas/models/checkpoints.py", "nscas/recipes/common/generate.py"):
        assert path in entries
    assert not [p for p in entries if p.startswith(("nscas/cli/", "nscas/verifiers/"))]
    params = parse_params(ServeParams, {"requests": 8, "timeout": 30, "max_wait_ms": 2},
                          "recipe.toml")
    assert (params.requests, params.timeout, params.max_batch) == (8, 30, 1)
