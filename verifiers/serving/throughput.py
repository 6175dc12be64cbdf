"""Recompute the serving claims of docs/experiment.md §5 from the client's request log.

The log is JSONL, one line per attempt, with members ``request_id``, ``task_id``, ``phase``
(``single``, ``pair`` or ``failure``), ``attempt`` (integer), ``endpoint``, ``start`` and
``end`` (monotonic seconds), ``ok``, ``status`` (HTTP status or null), ``error`` (text or
null), ``output_ids`` (token ids or null) and ``cached`` (boolean or null).

Definitions, per phase:
- a request is the set of attempts sharing ``request_id``; it succeeded if any attempt did;
- ``successes``: requests that succeeded;
- ``wall_seconds``: latest ``end`` minus earliest ``start`` over the phase's attempts;
- ``requests_per_second``: successes / wall seconds;
- latency of a succeeded request: ``end`` of its first successful attempt minus ``start`` of
  its first attempt (lowest attempt number); ``median`` is ``statistics.median``, ``p95`` the
  nearest rank ``sorted(l)[ceil(0.95 n) - 1]`` (computed in integers: ``ceil(19 n / 20)``).
Across phases:
- ``throughput_ratio``: pair requests/s divided by single requests/s;
- ``failure_retries``: attempts of the failure phase that succeeded and are not the first
  attempt of their request (their attempt number is above the request's lowest one);
- ``identical_outputs``: every task id that appears in the log has a successful attempt in
  every phase present, and all its successful attempts carry the same ``output_ids``;
- ``cache_hits``: attempts with ``cached`` true, in all phases.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, TypeGuard

from ..core.compare import ABS_TOL, REL_TOL, compare
from ..core.errors import LogFormatError, RecordParseError
from ..core.results import Check
from ..records.reading import parse_json

PHASES = ("single", "pair", "failure")


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One line of the request log."""

    line: int
    request_id: str
    task_id: str
    phase: str
    attempt: int
    endpoint: str
    start: float
    end: float
    ok: bool
    status: int | None
    error: str | None
    output_ids: tuple[int, ...] | None
    cached: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseStats:
    """The recomputed numbers of one phase."""

    requests: int
    """Distinct request ids."""
    successes: int
    wall_seconds: float
    requests_per_second: float | None
    """None when the wall time is zero."""
    median_latency_seconds: float | None
    """None when nothing succeeded."""
    p95_latency_seconds: float | None


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an integer beyond any float
        return False


_FIELDS: dict[str, Any] = {
    "request_id": lambda v: isinstance(v, str) and 0 < len(v) <= 128,
    "task_id": lambda v: isinstance(v, str) and bool(v),
    "phase": lambda v: v in PHASES,
    "attempt": lambda v: _is_int(v) and v >= 0,
    "endpoint": lambda v: isinstance(v, str) and bool(v),
    "start": _is_num,
    "end": _is_num,
    "ok": lambda v: isinstance(v, bool),
    "status": lambda v: v is None or _is_int(v),
    "error": lambda v: v is None or isinstance(v, str),
    "output_ids": lambda v: v is None or (isinstance(v, list) and all(_is_int(x) for x in v)),
    "cached": lambda v: v is None or isinstance(v, bool),
}


def read_log(data: bytes) -> list[Attempt]:
    """Parse a request log; raises ``LogFormatError`` naming every unusable line."""
    attempts: list[Attempt] = []
    problems: list[tuple[int, str]] = []
    seen: set[tuple[str, str, int]] = set()
    task_of: dict[tuple[str, str], str] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = parse_json(line, what="log line")
        except RecordParseError as exc:
            problems.append((number, exc.why))
            continue
        if not isinstance(value, dict):
            problems.append((number, "not a JSON object"))
            continue
        bad = [k for k, valid in _FIELDS.items() if k not in value or not valid(value[k])]
        if bad:
            problems.append((number, f"missing or malformed {bad}"))
            continue
        if value["end"] < value["start"]:
            problems.append((number, "end is before start"))
        if value["ok"] and value["output_ids"] is None:
            problems.append((number, "a successful attempt without output_ids"))
        key = (value["phase"], value["request_id"], value["attempt"])
        if key in seen:
            problems.append((number, f"attempt {key} appears twice"))
        seen.add(key)
        known = task_of.setdefault(key[:2], value["task_id"])
        if known != value["task_id"]:
            problems.append((number, f"request {value['request_id']} names two task ids"))
        attempts.append(Attempt(
            line=number, request_id=value["request_id"], task_id=value["task_id"],
            phase=value["phase"], attempt=value["attempt"], endpoint=value["endpoint"],
            start=float(value["start"]), end=float(value["end"]), ok=value["ok"],
            status=value["status"], error=value["error"],
            output_ids=None if value["output_ids"] is None else tuple(value["output_ids"]),
            cached=value["cached"]))
    if problems:
        raise LogFormatError("request log", problems)
    return attempts


def _requests(attempts: list[Attempt]) -> dict[str, list[Attempt]]:
    grouped: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        grouped[a.request_id].append(a)
    for group in grouped.values():
        group.sort(key=lambda a: a.attempt)
    return grouped


def nearest_rank_p95(values: list[float]) -> float:
    n = len(values)
    return sorted(values)[-(-19 * n // 20) - 1]


def phase_stats(attempts: list[Attempt]) -> PhaseStats:
    """Numbers of one phase from its attempts (all of the same phase)."""
    requests = _requests(attempts)
    latencies = []
    for group in requests.values():
        success = next((a for a in group if a.ok), None)
        if success is not None:
            latencies.append(success.end - group[0].start)
    wall = max(a.end for a in attempts) - min(a.start for a in attempts)
    return PhaseStats(
        requests=len(requests), successes=len(latencies), wall_seconds=wall,
        requests_per_second=len(latencies) / wall if wall > 0 else None,
        median_latency_seconds=statistics.median(latencies) if latencies else None,
        p95_latency_seconds=nearest_rank_p95(latencies) if latencies else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    """Everything recomputed from one request log."""

    phases: dict[str, PhaseStats]
    """Per phase present in the log, in the fixed order single, pair, failure."""
    throughput_ratio: float | None
    failure_retries: int
    identical_outputs: bool
    cache_hits: int
    phase_order_ok: bool
    """Each phase starts after the previous one ended (phases run in their fixed order)."""

    def claims(self) -> dict[str, Any]:
        """The recomputed values under the claim names the serve recipe uses."""
        values: dict[str, Any] = {}
        for phase, s in self.phases.items():
            values.update({
                f"{phase}.successes": s.successes,
                f"{phase}.wall_seconds": s.wall_seconds,
                f"{phase}.requests_per_second": s.requests_per_second,
                f"{phase}.median_latency_seconds": s.median_latency_seconds,
                f"{phase}.p95_latency_seconds": s.p95_latency_seconds,
            })
        values.update(throughput_ratio=self.throughput_ratio,
                      failure_retries=self.failure_retries,
                      identical_outputs=self.identical_outputs, cache_hits=self.cache_hits)
        return values


def recompute(attempts: list[Attempt]) -> Serving:
    """Recompute every serving number from parsed attempts."""
    by_phase = {p: [a for a in attempts if a.phase == p] for p in PHASES}
    by_phase = {p: group for p, group in by_phase.items() if group}
    phases = {p: phase_stats(group) for p, group in by_phase.items()}
    single, pair = phases.get("single"), phases.get("pair")
    ratio = None
    if single and pair and single.requests_per_second and pair.requests_per_second is not None:
        ratio = pair.requests_per_second / single.requests_per_second
    retries = 0
    for group in _requests(by_phase.get("failure", [])).values():
        retries += sum(1 for a in group if a.ok and a.attempt > group[0].attempt)
    outputs: dict[str, dict[str, set[tuple[int, ...]]]] = defaultdict(lambda: defaultdict(set))
    for a in attempts:
        outputs[a.task_id].setdefault(a.phase, set())
        if a.ok and a.output_ids is not None:
            outputs[a.task_id][a.phase].add(a.output_ids)
    identical = all(
        all(by_phase_outputs.get(p) for p in by_phase)
        and len(set().union(*by_phase_outputs.values())) == 1
        for by_phase_outputs in outputs.values())
    present = list(by_phase.values())
    order_ok = all(max(a.end for a in earlier) <= min(a.start for a in later)
                   for earlier, later in pairwise(present))
    return Serving(phases=phases, throughput_ratio=ratio, failure_retries=retries,
                   identical_outputs=identical,
                   cache_hits=sum(1 for a in attempts if a.cached is True),
                   phase_order_ok=order_ok)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRun:
    """What the serve action fixes about its log (docs/experiment.md §5): the run id that prefixes
    every request id, the tasks it names, the committed dev task ids, and its params."""

    run_id: str
    """The action ID's first 12 hex digits: request ids are ``<run id>-<phase>-<index>``."""
    task_ids: tuple[str, ...]
    """The ids of the serve's ``tasks`` input, in order: request i asks for ``task_ids[i]``."""
    committed_dev: frozenset[str] | None
    """The dev task ids of the committed prepared inputs; None when none is found."""
    requests: Any
    replicas: Any
    attempts: Any


MAX_ATTEMPTS = 2
"""docs/experiment.md §5: at most two attempts per request."""


def _by_phase_request(attempts: list[Attempt]) -> dict[str, dict[str, list[Attempt]]]:
    out: dict[str, dict[str, list[Attempt]]] = {}
    for phase in PHASES:
        out[phase] = _requests([a for a in attempts if a.phase == phase])
    return out


def _problems(name: str, problems: list[str], **values: Any) -> Check:
    shown = "; ".join(problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return Check.verdict(name, not problems, message=f"{len(problems)} problem(s): {shown}"
                         f"{more}", **values)


def serving_rules(attempts: list[Attempt], run: ServeRun, prefix: str) -> list[Check]:
    """The log against the serve action and docs/experiment.md §5: request ids, requested tasks,
    routing per phase, retries, response shape."""
    phases = _by_phase_request(attempts)
    checks = []
    # request ids and tasks
    ids_problems, task_problems = [], []
    n = run.requests if isinstance(run.requests, int) and not isinstance(run.requests, bool) \
        else None
    if n is None or n < 1:
        ids_problems.append(f"the params give no request count ({run.requests!r})")
    if run.committed_dev is None:
        task_problems.append("no committed dev set is found in the serve's lineage (its "
                             "commitment's prepared inputs), so its task ids are not shown "
                             "to be committed dev tasks")
    index_of: dict[tuple[str, str], int] = {}
    for phase in PHASES:
        requests = phases[phase]
        if not requests:
            ids_problems.append(f"phase {phase!r} is missing from the log")
            continue
        if n and len(requests) != n:
            ids_problems.append(f"phase {phase}: {len(requests)} requests, the params say {n}")
        expected = {f"{run.run_id}-{phase}-{i}" for i in range(n)} if n and len(
            requests) == n else set()
        if expected and set(requests) != expected:
            odd = sorted(set(requests) ^ expected)[:3]
            ids_problems.append(f"phase {phase}: request ids are not {run.run_id}-{phase}-0.."
                                f"{len(requests) - 1} (differing: {odd})")
        for rid, group in requests.items():
            tail = rid.rpartition("-")[2]
            if tail.isdigit() and len(tail) <= 9:
                index_of[(phase, rid)] = int(tail)
            task = group[0].task_id
            index = index_of.get((phase, rid))
            if run.committed_dev is not None and task not in run.committed_dev:
                task_problems.append(f"{rid} asks for {task[:16]}, not a committed dev task")
            if index is not None and (index >= len(run.task_ids) or run.task_ids[index] != task):
                task_problems.append(f"{rid} asks for {task[:16]}, not task {index} of the "
                                     "serve's task set")
    checks.append(_problems(f"{prefix}.rule.request_ids", ids_problems, recomputed=n))
    checks.append(_problems(f"{prefix}.rule.tasks", task_problems,
                            recomputed=len(run.committed_dev or ())))
    checks.append(_routing(phases, index_of, run, prefix))
    checks.append(_responses(attempts, run, prefix))
    return checks


def _routing(phases: dict[str, dict[str, list[Attempt]]], index_of: dict[tuple[str, str], int],
             run: ServeRun, prefix: str) -> Check:
    """single: one endpoint; pair: all replicas, attempt a of request i to
    ``endpoints[(i + a - 1) % R]`` (a from 1); failure: the same routing, one replica
    stopped (every attempt to it failed), each request sent to it retried to the next."""
    problems: list[str] = []
    replicas = run.replicas
    if not (isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 2):
        return Check.failed(f"{prefix}.rule.routing", f"the params give no replica count of at "
                                                      f"least 2 ({replicas!r})")
    limit = run.attempts if isinstance(run.attempts, int) and not isinstance(
        run.attempts, bool) else MAX_ATTEMPTS
    limit = min(limit, MAX_ATTEMPTS)
    for requests in phases.values():
        for rid, group in requests.items():
            numbers = [a.attempt for a in group]
            if numbers != list(range(1, len(numbers) + 1)) or len(numbers) > limit:
                problems.append(f"{rid}: attempts {numbers[:4]}, expected 1.. at most {limit}")
            if any(a.ok for a in group[:-1]):
                problems.append(f"{rid}: an attempt follows a successful one")
    single = {a.endpoint for g in phases["single"].values() for a in g}
    if len(single) != 1:
        problems.append(f"the single phase used {len(single)} endpoints, not one")
    order: list[str] = []
    pair = phases["pair"]
    for i in range(replicas):
        shown = next((r for r in pair if index_of.get(("pair", r)) == i), None)
        if shown is None:
            problems.append(f"the pair phase has no request {i} to show replica {i}'s endpoint")
            break
        order.append(pair[shown][0].endpoint)
    if len(order) == replicas:
        if len(set(order)) != replicas:
            problems.append(f"the pair phase's first {replicas} requests went to "
                            f"{len(set(order))} distinct endpoint(s), not {replicas} replicas")
        elif single and order[0] not in single:
            problems.append("the pair phase's first replica is not the single phase's endpoint")
        for phase in ("pair", "failure"):
            used = {a.endpoint for g in phases[phase].values() for a in g}
            if phase == "pair" and used != set(order):
                problems.append(f"the pair phase used {len(used)} endpoint(s), not the "
                                f"{replicas} replicas")
            for rid, group in phases[phase].items():
                at = index_of.get((phase, rid))
                if at is None:
                    continue
                for a in group:
                    want = order[(at + a.attempt - 1) % replicas]
                    if a.endpoint != want:
                        problems.append(f"{rid} attempt {a.attempt} went to {a.endpoint}, not "
                                        f"{want}")
        problems += _failure_phase(phases["failure"], order, limit)
    return _problems(f"{prefix}.rule.routing", problems, recomputed=order)


def _failure_phase(requests: dict[str, list[Attempt]], order: list[str], limit: int) -> list[str]:
    problems = []
    attempts = [a for g in requests.values() for a in g]
    dead = [e for e in order if any(a.endpoint == e for a in attempts)
            and all(not a.ok for a in attempts if a.endpoint == e)]
    if len(dead) != 1:
        return [f"the failure phase has {len(dead)} stopped replica(s) (endpoints whose every "
                "attempt failed), not one"]
    stopped = dead[0]
    for rid, group in requests.items():
        for a, b in pairwise(group):
            if a.endpoint == stopped and b.endpoint == stopped:
                problems.append(f"{rid} was retried to the stopped replica")
        last = group[-1]
        if last.endpoint == stopped and len(group) < limit:
            problems.append(f"{rid} was not retried after the stopped replica refused it")
        if last.endpoint == stopped and len(group) >= limit:
            problems.append(f"{rid} ended at the stopped replica without a retry to a survivor")
    return problems


def _responses(attempts: list[Attempt], run: ServeRun, prefix: str) -> Check:
    """A successful attempt is an HTTP 200 with output ids and ``cached: false``; a failed
    one names its error."""
    problems = []
    for a in attempts:
        if a.ok and (a.status != 200 or a.error is not None or a.output_ids is None
                     or a.cached is not False):
            problems.append(f"line {a.line}: a success needs status 200, no error, output ids "
                            "and cached false")
        if not a.ok and not a.error:
            problems.append(f"line {a.line}: a failed attempt names no error")
    return _problems(f"{prefix}.rule.responses", problems, recomputed=len(attempts))


def check_serving(log: bytes, claims: Mapping[str, Any], *, prefix: str = "serving",
                  run: ServeRun | None = None, rel_tol: float = REL_TOL,
                  abs_tol: float = ABS_TOL) -> list[Check]:
    """Compare claimed serving values (name -> value) with the log's recomputation, and check
    the serving rules: phases in order, identical outputs, no cache hits and, given the serve
    action's facts (``run``), request ids, requested tasks, routing and responses.

    A claim name the verifier cannot recompute fails: a claim nobody rechecks is no evidence.
    """
    attempts = read_log(log)
    serving = recompute(attempts)
    recomputed = serving.claims()
    checks: list[Check] = []
    for claim, value in claims.items():
        name = f"{prefix}.{claim}"
        if claim not in recomputed:
            checks.append(Check.failed(name, "no recomputation exists for this claim name "
                                       "(or its phase is not in the log)", claimed=value))
        else:
            checks.append(compare(name, value, recomputed[claim], rel_tol=rel_tol,
                                  abs_tol=abs_tol))
    checks.append(Check.verdict(f"{prefix}.rule.phase_order", serving.phase_order_ok,
                                recomputed=list(serving.phases),
                                message="a phase starts before the previous one ended"))
    checks.append(Check.verdict(f"{prefix}.rule.identical_outputs", serving.identical_outputs,
                                recomputed=serving.identical_outputs,
                                message="outputs differ across phases or a task is missing"))
    checks.append(Check.verdict(f"{prefix}.rule.no_cache_hits", serving.cache_hits == 0,
                                recomputed=serving.cache_hits,
                                message=f"{serving.cache_hits} result(s) were cache hits"))
    if run is not None:
        checks.extend(serving_rules(attempts, run, prefix))
    return checks
