"""The load client (httpx, asyncio): one phase of requests against a list of endpoints.

Request i of a phase has id ``<run id>-<phase>-<i>`` and asks for ``task_ids[i]``; at most
``concurrency`` requests are in flight, taken in index order. Attempts are numbered from 1;
attempt a of request i goes to ``endpoints[(i + a - 1) % len(endpoints)]`` (the first attempt
of request i to endpoint ``i mod n``), and a request makes at most ``attempts`` attempts.
An attempt succeeds only on HTTP 200 with a JSON body that echoes the request id, the task
id and the expected model digest and carries integer ``output_ids``; anything else (a
refused connection, a timeout, another status, a wrong echo) is a failed attempt, logged
with its reason, and the next attempt goes to the next endpoint with the same request id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from nscas.errors import RecipeError

PHASES = ("single", "pair", "failure")


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One line of the request log (one HTTP attempt)."""

    request_id: str
    task_id: str
    phase: str
    """``single``, ``pair`` or ``failure`` (``warmup`` for warm-ups, which are never logged)."""
    attempt: int
    """1 for the first attempt of a request, 2 for its retry, ..."""
    endpoint: str
    """Base URL the attempt went to."""
    start: float
    """``time.monotonic()`` when the attempt started."""
    end: float
    """``time.monotonic()`` when it ended (answer read, or failure seen)."""
    wall_start: float
    """``time.time()`` at ``start``."""
    wall_end: float
    """``time.time()`` at ``end``."""
    ok: bool
    status: int | None
    """HTTP status, or None when no answer came."""
    error: str | None
    """Why the attempt failed; None when it succeeded."""
    output_ids: tuple[int, ...] | None
    cached: bool | None
    """The replica's ``cached`` flag, when it answered 200 with one."""

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "task_id": self.task_id, "phase": self.phase,
                "attempt": self.attempt, "endpoint": self.endpoint, "start": self.start,
                "end": self.end, "wall_start": self.wall_start, "wall_end": self.wall_end,
                "ok": self.ok, "status": self.status, "error": self.error,
                "output_ids": None if self.output_ids is None else list(self.output_ids),
                "cached": self.cached}


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPlan:
    """What one phase sends and how."""

    phase: str
    run_id: str
    endpoints: tuple[str, ...]
    task_ids: tuple[str, ...]
    """Request i asks for ``task_ids[i]``."""
    model_digest: str
    """Every answer must echo this digest."""
    concurrency: int = 2
    attempts: int = 2
    timeout: float = 300.0
    """Seconds one attempt may take before it counts as failed."""

    def __post_init__(self) -> None:
        if not self.endpoints or not self.task_ids:
            raise RecipeError(f"phase {self.phase}: no endpoints or no tasks to send")
        if self.concurrency < 1 or self.attempts < 1 or self.timeout <= 0:
            raise RecipeError(f"phase {self.phase}: concurrency and attempts must be at least 1 "
                              "and the timeout positive")

    def request_id(self, index: int) -> str:
        return f"{self.run_id}-{self.phase}-{index}"

    def endpoint(self, index: int, attempt: int) -> str:
        return self.endpoints[(index + attempt - 1) % len(self.endpoints)]


async def run_phase(plan: LoadPlan) -> list[Attempt]:
    """Send every request of ``plan``; all attempts, ordered by request index then attempt."""
    limits = httpx.Limits(max_connections=plan.concurrency * len(plan.endpoints),
                          max_keepalive_connections=plan.concurrency * len(plan.endpoints))
    results: list[list[Attempt]] = [[] for _ in plan.task_ids]
    next_index = iter(range(len(plan.task_ids)))

    async def worker(client: httpx.AsyncClient) -> None:
        # Each worker takes the next request in index order until none is left.
        for index in next_index:
            results[index] = await _request(client, plan, index)

    async with httpx.AsyncClient(trust_env=False, limits=limits,
                                 timeout=httpx.Timeout(plan.timeout)) as client:
        workers = min(plan.concurrency, len(plan.task_ids))
        await asyncio.gather(*(worker(client) for _ in range(workers)))
    return [attempt for group in results for attempt in group]


async def _request(client: httpx.AsyncClient, plan: LoadPlan, index: int) -> list[Attempt]:
    request_id, task_id = plan.request_id(index), plan.task_ids[index]
    attempts: list[Attempt] = []
    for number in range(1, plan.attempts + 1):
        attempt = await _attempt(client, plan, request_id, task_id, number,
                                 plan.endpoint(index, number))
        attempts.append(attempt)
        if attempt.ok:
            break
    return attempts


async def _attempt(client: httpx.AsyncClient, plan: LoadPlan, request_id: str, task_id: str,
                   number: int, endpoint: str) -> Attempt:
    wall_start, start = time.time(), time.monotonic()
    status: int | None = None
    body: Any = None
    try:
        answer = await client.post(f"{endpoint}/infer",
                                   json={"request_id": request_id, "task_id": task_id})
        status = answer.status_code
        body = answer.json()
        error = _check_answer(status, body, request_id, task_id, plan.model_digest)
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except ValueError:
        error = "the answer is not JSON"
    end, wall_end = time.monotonic(), time.time()
    ok = error is None
    cached = body.get("cached") if isinstance(body, dict) else None
    return Attempt(
        request_id=request_id, task_id=task_id, phase=plan.phase, attempt=number,
        endpoint=endpoint, start=start, end=end, wall_start=wall_start, wall_end=wall_end,
        ok=ok, status=status, error=error,
        output_ids=tuple(body["output_ids"]) if ok else None,
        cached=cached if isinstance(cached, bool) else None)


def _check_answer(status: int, body: Any, request_id: str, task_id: str,
                  model_digest: str) -> str | None:
    """Why an answer does not count as a success, or None if it does."""
    if status != 200:
        # A refusal is OpenAI's error object; the log keeps its message.
        error = body.get("error") if isinstance(body, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        return f"HTTP {status}" + (f": {detail}" if isinstance(detail, str) else "")
    if not isinstance(body, dict):
        return "the answer is not a JSON object"
    for key, expected in (("request_id", request_id), ("task_id", task_id),
                          ("model_digest", model_digest)):
        if body.get(key) != expected:
            return f"the answer's {key} is {body.get(key)!r}, not {expected!r}"
    ids = body.get("output_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
        return "the answer has no integer output_ids"
    return None


def first_failure(attempts: Sequence[Attempt]) -> str | None:
    """The reason of the first request that never succeeded, or None if all did."""
    succeeded = {a.request_id for a in attempts if a.ok}
    for a in attempts:
        if a.request_id not in succeeded:
            return f"{a.request_id} ({a.endpoint}): {a.error}"
    return None
