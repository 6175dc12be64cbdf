"""Unit tests of the cross-checks of issue 14 (classes 3, 4, 6, 7 and the journal rules):
typed comparison, the environment record against params, the learning-rate schedule,
weighted targets, bytes communicated and serving routing. Expectations are written out by
hand from docs/experiment.md, never computed with the verifier's code."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from nscas.verifiers.core.compare import Exact, Tolerance, compare
from nscas.verifiers.core.errors import LogFormatError
from nscas.verifiers.records.environment import environment_check
from nscas.verifiers.serving.throughput import ServeRun, check_serving
from nscas.verifiers.training.journals import (
    bytes_check,
    lr_check,
    run_values,
    weighted_targets_check,
)

# --- class 4: numbers ------------------------------------------------------------------

@pytest.mark.parametrize("claimed", [1e-12, 0.0, 1.0000000001, True, "0", None])
def test_a_count_must_be_the_integer(claimed: Any) -> None:
    want = 1 if claimed == 1.0000000001 else 0
    assert compare("c", claimed, want).status == "failed"


def test_counts_in_structures_are_exact() -> None:
    assert compare("c", {"lookup": 3, "sort": 2}, {"lookup": 3, "sort": 2}).status == "passed"
    assert compare("c", {"lookup": 3.0000001, "sort": 2}, {"lookup": 3, "sort": 2}).status \
        == "failed"


def test_a_p_value_is_the_correctly_rounded_float_of_the_rational() -> None:
    p = Fraction(79, 4096)
    assert compare("p", 0.019287109375, p).status == "passed"  # 79/4096 is exact in binary
    third = Fraction(1, 3)
    assert compare("p", 0.3333333333333333, third).status == "passed"
    assert compare("p", 0.33333333333333337, third).status == "failed"  # one ulp off
    tiny = Fraction(1, 2**60)  # 8.67e-19
    assert compare("p", 1e-12, tiny).status == "failed"
    assert compare("p", 1, Fraction(1)).status == "passed"  # RFC 8785 writes 1.0 as 1


def test_a_rational_string_must_equal_exactly() -> None:
    assert compare("p_exact", "79/4096", Fraction(79, 4096)).status == "passed"
    assert compare("p_exact", "158/8192", Fraction(79, 4096)).status == "failed"
    assert compare("p_exact", "0.019287109375", Fraction(79, 4096)).status == "failed"


def test_tolerances_are_named_and_exact_means_exact() -> None:
    check = compare("s", 1.0 + 1e-12, Tolerance(1.0, rel=1e-9, why="summation order"))
    assert check.status == "passed" and "summation order" in check.message
    assert "1e-09" in check.message
    assert compare("s", 1.0 + 1e-6, Tolerance(1.0, rel=1e-9)).status == "failed"
    assert compare("s", 2, Tolerance(2.0)).status == "passed"  # an integral float reads as 2
    assert compare("s", 20.5 + 1e-14, Exact(20.5)).status == "failed"
    assert compare("s", None, Tolerance(None)).status == "passed"
    assert compare("s", 10**400, 1.0).status == "failed"  # no OverflowError


# --- journal rules -----------------------------------------------------------------------

def _steps(n: int, lrs: list[float]) -> list[dict[str, Any]]:
    return [{"step": s + 1, "lr": lrs[s], "documents": ["g1", "r1"], "targets": 10,
             "weighted_targets": 50, "tokens": 100, "seconds": 0.5,
             "bytes_communicated": 0} for s in range(n)]


def test_the_lr_schedule_warmup_then_cosine() -> None:
    # lr 1.0, warmup 2, 5 steps: 0.5, 1.0, then cosine over 3 decay steps to 0.1:
    # progress 0, 0.5, 1 -> 1.0, 0.1 + 0.45 * (1 + cos(pi/2)) = 0.55, 0.1.
    params = {"lr": 1.0, "warmup": 2, "steps": 5}
    good = _steps(5, [0.5, 1.0, 1.0, 0.55, 0.1])
    assert lr_check(good, params, "t").status == "passed"
    bad = _steps(5, [0.5, 1.0, 1.0, 0.56, 0.1])
    check = lr_check(bad, params, "t")
    assert check.status == "failed" and "step 4" in check.message
    assert lr_check(good, {"lr": "1", "warmup": 2, "steps": 5}, "t").status == "failed"
    assert lr_check(_steps(1, ["0.5"]), params, "t").status == "failed"  # type: ignore[list-item]


def test_weighted_targets_follow_the_document_weights() -> None:
    params = {"grounded_weight": 8, "replay_weight": 1}
    only_grounded = [{"step": 1, "documents": ["g1", "g2"], "targets": 10,
                      "weighted_targets": 80}]
    assert weighted_targets_check(only_grounded, params, {"r1"}, {"g1", "g2"}, "t").status \
        == "passed"
    only_grounded[0]["weighted_targets"] = 79
    assert weighted_targets_check(only_grounded, params, {"r1"}, {"g1", "g2"}, "t").status \
        == "failed"
    mixed = [{"step": 1, "documents": ["g1", "r1"], "targets": 10, "weighted_targets": 81}]
    assert weighted_targets_check(mixed, params, {"r1"}, {"g1"}, "t").status == "failed"
    mixed[0]["weighted_targets"] = 45
    assert weighted_targets_check(mixed, params, {"r1"}, {"g1"}, "t").status == "passed"
    stranger = [{"step": 1, "documents": ["x"], "targets": 1, "weighted_targets": 8}]
    assert weighted_targets_check(stranger, params, {"r1"}, {"g1"}, "t").status == "failed"


def test_bytes_communicated_are_the_fp32_gradients_per_update() -> None:
    steps = [{"step": 1, "bytes_communicated": 4 * 1000}, {"step": 2, "bytes_communicated": 4000}]
    assert bytes_check(steps, world=2, parameters=1000, not_rechecked=None, why_not=None,
                       name="t").status == "passed"
    steps[1]["bytes_communicated"] = 4001
    assert bytes_check(steps, world=2, parameters=1000, not_rechecked=None, why_not=None,
                       name="t").status == "failed"
    one = [{"step": 1, "bytes_communicated": 1}]
    assert bytes_check(one, world=1, parameters=None, not_rechecked=None, why_not="x",
                       name="t").status == "failed"
    skipped = bytes_check(steps, world=2, parameters=None, not_rechecked=("weights", "omitted"),
                          why_not=None, name="t")
    assert skipped.status == "skipped" and skipped.needs == "weights"


def test_float_counts_in_a_journal_are_refused() -> None:
    steps = _steps(2, [0.1, 0.2])
    steps[1]["targets"] = 10.000001
    values, problems = run_values(steps)
    assert problems and "targets" in problems[0] and not values
    steps[1]["targets"] = 10**400
    values, problems = run_values(steps)
    assert values["targets"] == 10 + 10**400  # an exact integer, never a float


# --- class 7: the environment -------------------------------------------------------------

CPU_ENV = {"python": "3.11.7", "platform": "Linux", "host": "vm",
           "packages": {"torch": "2.13.0+cpu"},
           "torch": {"version": "2.13.0+cpu", "cuda": None},
           "devices": [{"type": "cpu", "name": "x86_64", "count": 2}]}


def gpu(i: int) -> dict[str, Any]:
    return {"type": "cuda", "index": i, "name": "H200", "memory_bytes": 150_000_000_000}


def test_an_honest_cpu_environment_passes() -> None:
    check = environment_check(CPU_ENV, {"device": "cpu", "world": 2, "nnodes": 1}, "t",
                              [{"rank": 0, "host": "vm"}, {"rank": 1, "host": "vm"}])
    assert check.status == "passed" and check.name == "t.environment"


@pytest.mark.parametrize("change,params,journals", [
    ({"devices": [*CPU_ENV["devices"], gpu(0)]}, {"device": "cpu"}, []),  # the case
    ({"torch": {"version": "2.13.0+cpu", "cuda": "12.4"}}, {}, []),
    ({"torch": {"version": "2.5.1+cu124", "cuda": "12.1"}, "packages": {"torch": "2.5.1+cu124"}},
     {}, []),
    ({"packages": {"torch": "2.12.0"}}, {}, []),
    ({}, {"device": "cuda"}, []),
    ({"torch": {"version": "2.5.1", "cuda": "12.4"}, "packages": {"torch": "2.5.1"},
      "devices": [gpu(0)]}, {"device": "cuda", "world": 2, "nnodes": 1}, []),
    ({"torch": {"version": "2.5.1", "cuda": "12.4"}, "packages": {"torch": "2.5.1"},
      "devices": [gpu(0)]}, {"device": "cuda:1"}, []),
    ({}, {"device": "cpu", "nnodes": 1}, [{"rank": 0, "host": "elsewhere"}]),
    ({"devices": "cpu"}, {}, []),
    ({"torch": "2.13"}, {}, []),
    # one release, two different local tags: two builds
    ({"torch": {"version": "2.11.0+cu130", "cuda": "13.0"}, "packages": {"torch": "2.11.0+cu128"},
      "devices": [gpu(0)]}, {"device": "cuda"}, []),
    ({"torch": {"version": "2.11.0+cu130", "cuda": "13.0"}, "packages": {"torch": "2.11.1"},
      "devices": [gpu(0)]}, {"device": "cuda"}, []),
])
def test_environment_contradictions_fail(change: dict[str, Any], params: dict[str, Any],
                                         journals: list[dict[str, Any]]) -> None:
    env = {**CPU_ENV, **change}
    assert environment_check(env, params, "t", journals).status == "failed"


def test_a_build_whose_metadata_drops_the_local_tag_passes() -> None:
    # as on the GPU image the 135M experiment ran on: metadata 2.11.0, torch 2.11.0+cu130
    env = {**CPU_ENV, "torch": {"version": "2.11.0+cu130", "cuda": "13.0"},
           "packages": {"torch": "2.11.0"}, "devices": [CPU_ENV["devices"][0], gpu(0)]}
    assert environment_check(env, {"device": "cuda", "world": 1, "nnodes": 1}, "t",
                             [{"rank": 0, "host": "vm"}]).status == "passed"


def test_a_cuda_run_on_enough_gpus_passes() -> None:
    env = {**CPU_ENV, "torch": {"version": "2.5.1", "cuda": "12.4"},
           "packages": {"torch": "2.5.1"}, "devices": [CPU_ENV["devices"][0], gpu(0), gpu(1)]}
    assert environment_check(env, {"device": "cuda", "world": 2, "nnodes": 1}, "t",
                             [{"rank": 0, "host": "vm", "peak_memory_bytes": 10}]).status \
        == "passed"
    assert environment_check(env, {"device": "cuda", "world": 2}, "t",
                             [{"rank": 0, "host": "vm",
                               "peak_memory_bytes": 200_000_000_000}]).status == "failed"


# --- class 6: serving routing ---------------------------------------------------------------

E0, E1 = "http://127.0.0.1:1000", "http://127.0.0.1:2000"
TASKS = ("t0", "t1", "t2", "t3")
RUN = ServeRun(run_id="abcdef012345", task_ids=TASKS, committed_dev=frozenset(TASKS),
               requests=4, replicas=2, attempts=2)


def line(phase: str, i: int, a: int, endpoint: str, start: float, ok: bool = True,
         task: str | None = None) -> dict[str, Any]:
    task = task or TASKS[i]
    return {"request_id": f"abcdef012345-{phase}-{i}", "task_id": task, "phase": phase,
            "attempt": a, "endpoint": endpoint, "start": start, "end": start + 0.5, "ok": ok,
            "status": 200 if ok else None, "error": None if ok else "connection refused",
            "output_ids": [ord(task[-1])] if ok else None, "cached": False if ok else None}


def served() -> list[dict[str, Any]]:
    """By hand, docs/experiment.md §5's routing: attempt a (from 1) of request i goes to
    endpoints[(i + a - 1) % 2]; in the failure phase E1 is stopped."""
    lines = [line("single", i, 1, E0, i) for i in range(4)]
    lines += [line("pair", i, 1, (E0, E1)[i % 2], 10 + i) for i in range(4)]
    for i in range(4):
        if i % 2 == 0:
            lines.append(line("failure", i, 1, E0, 20 + i))
        else:
            lines.append(line("failure", i, 1, E1, 20 + i, ok=False))
            lines.append(line("failure", i, 2, E0, 20.6 + i))
    return lines


def rules(lines: list[dict[str, Any]], run: ServeRun = RUN) -> dict[str, str]:
    log = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    return {c.name: c.status for c in check_serving(log, {}, run=run) if ".rule." in c.name}


def test_an_honestly_routed_log_passes() -> None:
    assert set(rules(served()).values()) == {"passed"}


def test_a_pair_phase_served_by_one_endpoint_fails() -> None:
    lines = [dict(x, endpoint=E0) if x["phase"] == "pair" else x for x in served()]
    assert rules(lines)["serving.rule.routing"] == "failed"


def test_a_single_phase_on_two_endpoints_fails() -> None:
    lines = served()
    lines[1] = dict(lines[1], endpoint=E1)
    assert rules(lines)["serving.rule.routing"] == "failed"


def test_a_failure_phase_without_a_retry_to_the_survivor_fails() -> None:
    lines = [x for x in served() if not (x["phase"] == "failure" and x["attempt"] == 2)]
    assert rules(lines)["serving.rule.routing"] == "failed"
    lines = served()
    for x in lines:
        if x["phase"] == "failure" and x["attempt"] == 2:
            x["endpoint"] = E1  # retried to the stopped replica
    assert rules(lines)["serving.rule.routing"] == "failed"


def test_requests_for_tasks_that_are_not_committed_dev_tasks_fail() -> None:
    lines = served()
    for x in lines:
        if x["request_id"].endswith("-0"):
            x["task_id"] = "test-task"
    assert rules(lines)["serving.rule.tasks"] == "failed"
    run = ServeRun(run_id=RUN.run_id, task_ids=TASKS, committed_dev=None, requests=4,
                   replicas=2, attempts=2)
    assert rules(served(), run)["serving.rule.tasks"] == "failed"


def test_request_ids_of_another_run_or_count_fail() -> None:
    lines = [dict(x, request_id=x["request_id"].replace("abcdef012345", "000000000000"))
             for x in served()]
    assert rules(lines)["serving.rule.request_ids"] == "failed"
    lines = [x for x in served() if not x["request_id"].endswith("single-3")]
    assert rules(lines)["serving.rule.request_ids"] == "failed"


def test_a_success_must_look_like_one() -> None:
    lines = served()
    lines[0]["cached"] = None
    assert rules(lines)["serving.rule.responses"] == "failed"


def test_hostile_numbers_in_a_log_are_a_finding() -> None:
    lines = served()
    lines[0]["start"] = 10**400
    log = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    with pytest.raises(LogFormatError) as caught:  # the serve checker turns it into a finding
        check_serving(log, {}, run=RUN)
    assert "line 1" in str(caught.value)
