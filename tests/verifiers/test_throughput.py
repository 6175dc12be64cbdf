"""Serving claims recomputed from a hand-built request log with a failure phase."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nscas.verifiers.core.errors import LogFormatError
from nscas.verifiers.serving.throughput import check_serving, nearest_rank_p95, read_log, recompute

OUT = {"t1": [5, 6, 7], "t2": [8], "t3": [9, 9]}


def attempt(phase: str, rid: str, task: str, n: int, start: float, end: float,
            ok: bool = True, endpoint: str = "http://127.0.0.1:8001", **extra: Any) -> dict:
    line = {"request_id": rid, "task_id": task, "phase": phase, "attempt": n,
            "endpoint": endpoint, "start": start, "end": end, "ok": ok,
            "status": 200 if ok else None, "error": None if ok else "connection refused",
            "output_ids": OUT[task] if ok else None, "cached": False if ok else None}
    line.update(extra)
    return line


def hand_log() -> list[dict]:
    return [
        # single: wall 0.0..4.0, latencies 1.0, 1.5, 3.0
        attempt("single", "run-0", "t1", 0, 0.0, 1.0),
        attempt("single", "run-1", "t2", 0, 0.5, 2.0),
        attempt("single", "run-2", "t3", 0, 1.0, 4.0),
        # pair: wall 10.0..12.0, latencies 0.5, 1.0, 1.5
        attempt("pair", "run-3", "t1", 0, 10.0, 10.5),
        attempt("pair", "run-4", "t2", 0, 10.0, 11.0, endpoint="http://127.0.0.1:8002"),
        attempt("pair", "run-5", "t3", 0, 10.5, 12.0),
        # failure: one endpoint down; two requests retried on the live one.
        attempt("failure", "run-6", "t1", 0, 20.0, 20.1, ok=False),
        attempt("failure", "run-6", "t1", 1, 20.1, 21.0),
        attempt("failure", "run-7", "t2", 0, 20.0, 20.5),
        attempt("failure", "run-8", "t3", 0, 20.2, 20.3, ok=False),
        attempt("failure", "run-8", "t3", 1, 20.3, 22.0),
    ]


def encode(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


EXPECTED = {
    "single.successes": 3, "single.wall_seconds": 4.0, "single.requests_per_second": 0.75,
    "single.median_latency_seconds": 1.5, "single.p95_latency_seconds": 3.0,
    "pair.successes": 3, "pair.wall_seconds": 2.0, "pair.requests_per_second": 1.5,
    "pair.median_latency_seconds": 1.0, "pair.p95_latency_seconds": 1.5,
    "failure.successes": 3, "failure.wall_seconds": 2.0, "failure.requests_per_second": 1.5,
    "failure.median_latency_seconds": 1.0, "failure.p95_latency_seconds": 1.8,
    "throughput_ratio": 2.0, "failure_retries": 2, "identical_outputs": True, "cache_hits": 0,
}


def test_recomputation_by_hand() -> None:
    serving = recompute(read_log(encode(hand_log())))
    claims = serving.claims()
    assert claims.keys() == EXPECTED.keys()
    for name, value in EXPECTED.items():
        assert claims[name] == pytest.approx(value, abs=1e-12), name
    assert serving.phase_order_ok


def test_matching_claims_pass_and_wrong_ones_fail() -> None:
    checks = check_serving(encode(hand_log()), EXPECTED)
    assert all(c.status == "passed" for c in checks), [c for c in checks if c.status != "passed"]
    wrong = dict(EXPECTED, **{"pair.requests_per_second": 1.6, "failure_retries": 1,
                              "serving.unknown": 3})
    by_name = {c.name: c for c in check_serving(encode(hand_log()), wrong)}
    assert by_name["serving.pair.requests_per_second"].status == "failed"
    assert by_name["serving.failure_retries"].status == "failed"
    assert by_name["serving.serving.unknown"].status == "failed"  # nobody rechecks it
    assert by_name["serving.single.requests_per_second"].status == "passed"


def test_different_outputs_missing_tasks_and_cache_hits_are_found() -> None:
    lines = hand_log()
    lines[4]["output_ids"] = [8, 1]
    serving = recompute(read_log(encode(lines)))
    assert serving.identical_outputs is False
    lines = hand_log()
    lines[7] = dict(lines[7], ok=False, output_ids=None, status=503)  # run-6 never succeeds
    serving = recompute(read_log(encode(lines)))
    assert serving.identical_outputs is False
    assert serving.phases["failure"].successes == 2
    assert serving.failure_retries == 1
    lines = hand_log()
    lines[5]["cached"] = True
    checks = {c.name: c for c in check_serving(encode(lines), {"cache_hits": 0})}
    assert checks["serving.cache_hits"].status == "failed"
    assert checks["serving.rule.no_cache_hits"].status == "failed"


def test_phase_order_rule() -> None:
    lines = hand_log()
    for line in lines[3:6]:  # pair phase now overlaps the single phase
        line["start"] -= 9.0
        line["end"] -= 9.0
    checks = {c.name: c for c in check_serving(encode(lines), {})}
    assert checks["serving.rule.phase_order"].status == "failed"


def test_nearest_rank_p95() -> None:
    assert nearest_rank_p95([float(x) for x in range(1, 21)]) == 19.0
    assert nearest_rank_p95([float(x) for x in range(100, 0, -1)]) == 95.0
    assert nearest_rank_p95([4.0]) == 4.0
    assert nearest_rank_p95([float(x) for x in range(1, 22)]) == 20.0  # ceil(19.95) = 20


def test_unusable_log_lines_are_all_named() -> None:
    lines = [json.dumps(x) for x in hand_log()]
    lines[1] = "{not json"
    lines[2] = json.dumps(dict(hand_log()[2], phase="warmup"))
    lines[3] = json.dumps(dict(hand_log()[3], end=9.0))
    lines.append(lines[0])
    with pytest.raises(LogFormatError) as err:
        read_log("\n".join(lines).encode())
    assert [line for line, _ in err.value.problems] == [2, 3, 4, 12]
