"""The serving claims, computed from the retained request log alone (docs/experiment.md §5).

The log is JSONL, one line per attempt (see ``client.Attempt``). Per phase:
- a request is the set of attempts sharing a request id; it succeeded if one attempt did;
- ``successes``: requests that succeeded;
- ``wall_seconds``: the phase's last ``end`` minus its first ``start``;
- ``requests_per_second``: successes / wall seconds (None if the wall time is 0);
- latency of a succeeded request: ``end`` of its successful attempt minus ``start`` of its
  first attempt; ``median_latency_seconds`` is ``statistics.median``,
  ``p95_latency_seconds`` the nearest rank ``sorted(l)[ceil(0.95 n) - 1]`` (None if empty).
Across phases:
- ``throughput_ratio``: pair requests/s divided by single requests/s;
- ``failure_retries``: attempts of the ``failure`` phase that succeeded with an attempt
  number above 1, i.e. requests that the stopped replica refused and the survivor answered;
- ``identical_outputs``: every task in the log has a successful attempt in each of the three
  phases, and all of its successful attempts carry the same ``output_ids``;
- ``cache_hits``: attempts answered with ``cached: true`` (a fresh request id never should be).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from nscas.errors import InvalidInput

from .client import PHASES, Attempt


def log_jsonl(attempts: Iterable[Attempt]) -> bytes:
    """The request log's bytes: one compact JSON object per attempt, newline-terminated."""
    return "".join(json.dumps(a.to_json(), separators=(",", ":")) + "\n"
                   for a in attempts).encode("utf-8")


def read_log(data: bytes) -> list[dict[str, Any]]:
    """The attempts of a request log, each line checked to be an object of a known phase."""
    attempts = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise InvalidInput(f"request log line {number}: not JSON: {exc}") from None
        if not isinstance(value, dict) or value.get("phase") not in PHASES:
            raise InvalidInput(f"request log line {number}: not an attempt of a known phase")
        attempts.append(value)
    return attempts


def nearest_rank(values: Sequence[float], fraction_num: int, fraction_den: int) -> float:
    """``sorted(values)[ceil(n * num / den) - 1]``, with the ceiling taken in integers."""
    n = len(values)
    rank = -(-n * fraction_num // fraction_den)
    return sorted(values)[max(rank, 1) - 1]


def phase_numbers(attempts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """successes, wall seconds, requests/s, median and p95 latency of one phase's attempts."""
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in attempts:
        by_request[a["request_id"]].append(a)
    latencies = []
    for group in by_request.values():
        group.sort(key=lambda a: a["attempt"])
        success = next((a for a in group if a["ok"]), None)
        if success is not None:
            latencies.append(success["end"] - group[0]["start"])
    wall = max(a["end"] for a in attempts) - min(a["start"] for a in attempts)
    return {
        "successes": len(latencies),
        "wall_seconds": wall,
        "requests_per_second": len(latencies) / wall if wall > 0 else None,
        "median_latency_seconds": statistics.median(latencies) if latencies else None,
        "p95_latency_seconds": nearest_rank(latencies, 95, 100) if latencies else None,
    }


def serving_claims(log: bytes) -> dict[str, Any]:
    """Every serving claim, from the log's bytes only: anyone holding the log gets the same."""
    attempts = read_log(log)
    claims: dict[str, Any] = {}
    for phase in PHASES:
        mine = [a for a in attempts if a["phase"] == phase]
        if not mine:
            raise InvalidInput(f"the request log holds no attempt of phase {phase!r}")
        for name, value in phase_numbers(mine).items():
            claims[f"{phase}.{name}"] = value
    single, pair = claims["single.requests_per_second"], claims["pair.requests_per_second"]
    claims["throughput_ratio"] = pair / single if single and pair is not None else None
    claims["failure_retries"] = sum(1 for a in attempts
                                    if a["phase"] == "failure" and a["ok"] and a["attempt"] > 1)
    claims["identical_outputs"] = _identical(attempts)
    claims["cache_hits"] = sum(1 for a in attempts if a["cached"] is True)
    return claims


def _identical(attempts: Sequence[dict[str, Any]]) -> bool:
    outputs: dict[str, dict[str, set[tuple[int, ...]]]] = defaultdict(lambda: defaultdict(set))
    for a in attempts:
        if a["ok"]:
            outputs[a["task_id"]][a["phase"]].add(tuple(a["output_ids"]))
    tasks = {a["task_id"] for a in attempts}
    return all(
        set(outputs[t]) == set(PHASES) and len(set().union(*outputs[t].values())) == 1
        for t in tasks)
