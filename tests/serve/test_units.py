"""The replica's pure parts: request parsing, stream deltas, the batcher, the retry cache and
the claims computed from a request log (checked against the independent verifier)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from nscas.recipes.serve.batching import Batcher, RequestConflict, RetryCache
from nscas.recipes.serve.client import LoadPlan
from nscas.recipes.serve.metrics import nearest_rank, serving_claims
from nscas.recipes.serve.protocol import (
    RequestRejected,
    parse_chat,
    parse_infer,
    parse_json_body,
    text_deltas,
)
from nscas.verifiers.throughput import check_serving, read_log, recompute


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b"\xff\xfe", 400, "not UTF-8"),
    (b"{", 400, "not JSON"),
    (b'{"a": 1, "a": 2}', 400, "repeats"),
    (b'{"request_id": NaN}', 400, "not a JSON number"),
    (b"[" * 3000 + b"]" * 3000, 400, "nests"),
])
def test_json_bodies_are_parsed_strictly(body: bytes, status: int, fragment: str) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_json_body(body)
    assert caught.value.status == status and fragment in caught.value.message


@pytest.mark.parametrize(("value", "fragment"), [
    ([], "must be a JSON object, not an array"),
    ({"request_id": "r"}, "missing key(s) ['task_id']"),
    ({"request_id": "r", "task_id": "t", "x": 1}, "unknown key(s) ['x']"),
    ({"request_id": 5, "task_id": "t"}, "request_id must be a string, not a number"),
    ({"request_id": "", "task_id": "t"}, "1 to 128 characters long, not 0"),
    ({"request_id": "r" * 129, "task_id": "t"}, "not 129"),
    ({"request_id": "r", "task_id": None}, "task_id must be a string, not null"),
])
def test_infer_bodies_are_exactly_two_strings(value: Any, fragment: str) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_infer(value)
    assert caught.value.status == 400 and fragment in caught.value.message


def test_infer_body_accepts_the_longest_id() -> None:
    parsed = parse_infer({"request_id": "r" * 128, "task_id": "t"})
    assert (parsed.request_id, parsed.task_id) == ("r" * 128, "t")


def test_chat_bodies() -> None:
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}},
        default_max_tokens=96, limit=4096)
    assert chat.messages == (("user", "ab"),) and chat.max_tokens == 96
    assert chat.stream and chat.include_usage
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5},
                      default_max_tokens=96, limit=4096).max_tokens == 5
    for body, fragment in (
        ({"messages": []}, "non-empty array"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role must be one of"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 0.7}, "greedily"),
        ({"messages": [{"role": "user", "content": "x"}], "n": True}, "greedily"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4097}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "bogus": 1}, "unknown key(s)"),
    ):
        with pytest.raises(RequestRejected) as caught:
            parse_chat(body, default_max_tokens=96, limit=4096)
        assert fragment in caught.value.message


@dataclass(frozen=True)
class FakeGeneration:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    text: str
    ended_with_eos: bool


class ByteTokenizer:
    """Decodes ids as UTF-8 bytes, so a token may hold half a character."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_stream_deltas_join_to_the_text_and_never_split_a_character() -> None:
    text = "a€b"  # the euro sign is three bytes, so three tokens
    ids = (*text.encode(), 0)
    generation = FakeGeneration(prompt_ids=(1,), output_ids=ids, text=text, ended_with_eos=True)
    pieces = list(text_deltas(generation, ByteTokenizer()))
    assert pieces == ["a", "€", "b"]


def test_batcher_batches_what_arrives_together() -> None:
    calls: list[tuple[int, int]] = []

    def generate(prompts: Any, max_new_tokens: int) -> list[int]:
        calls.append((len(prompts), max_new_tokens))
        return [sum(p) * 10 + max_new_tokens for p in prompts]

    async def main() -> list[int]:
        batcher = Batcher(generate, max_batch=4, max_wait_s=0.2)
        batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.submit([i], 3) for i in range(6)), batcher.submit([7], 5))
        finally:
            await batcher.close()

    results = asyncio.run(main())
    assert results == [3, 13, 23, 33, 43, 53, 75]
    # Four at once (max_batch), then the other limit and the rest apart from each other.
    assert calls[0] == (4, 3) and sorted(calls[1:]) == [(1, 5), (2, 3)]


def test_retry_cache_returns_the_first_answer_and_refuses_another_request() -> None:
    computed: list[str] = []

    async def main() -> None:
        cache = RetryCache(2)

        async def compute(value: str) -> str:
            computed.append(value)
            await asyncio.sleep(0.01)
            return value

        # A retry that arrives while the first is running waits for the same answer.
        both = await asyncio.gather(cache.run("r1", "t1", lambda: compute("a")),
                                    cache.run("r1", "t1", lambda: compute("b")))
        assert both == [("a", False), ("a", True)]
        with pytest.raises(RequestConflict):
            await cache.run("r1", "t2", lambda: compute("c"))
        await cache.run("r2", "t", lambda: compute("d"))
        await cache.run("r3", "t", lambda: compute("e"))  # evicts r1, the least recent
        assert await cache.run("r1", "t2", lambda: compute("f")) == ("f", False)
        assert cache.hits == 1

        async def broken() -> str:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            await cache.run("r9", "t", broken)
        assert await cache.run("r9", "t", lambda: compute("g")) == ("g", False)

    asyncio.run(main())
    assert computed == ["a", "d", "e", "f", "g"]


def test_attempts_rotate_over_endpoints() -> None:
    plan = LoadPlan(phase="pair", run_id="run", endpoints=("A", "B"), task_ids=("t",) * 3,
                    model_digest="d")
    assert [plan.endpoint(i, a) for i in range(3) for a in (1, 2)] == list("ABBAAB")
    assert plan.request_id(2) == "run-pair-2"


def test_nearest_rank_in_integers() -> None:
    assert nearest_rank([3.0, 1.0, 2.0], 95, 100) == 3.0
    values = [float(v) for v in range(1, 21)]
    assert nearest_rank(values, 95, 100) == 19.0  # ceil(19.0) - 1 = index 18
    assert nearest_rank(list(range(1, 101)), 95, 100) == 95


def line(phase: str, rid: str, task: str, attempt: int, start: float, end: float,
         ok: bool = True, output: list[int] | None = None, cached: bool = False) -> dict:
    return {"request_id": rid, "task_id": task, "phase": phase, "attempt": attempt,
            "endpoint": "http://127.0.0.1:1", "start": start, "end": end,
            "wall_start": 1e9 + start, "wall_end": 1e9 + end, "ok": ok,
            "status": 200 if ok else None, "error": None if ok else "ConnectError",
            "output_ids": (output or [1, 2]) if ok else None, "cached": cached if ok else None}


def hand_log() -> bytes:
    lines = [
        line("single", "r-single-0", "t1", 1, 0.0, 1.0),
        line("single", "r-single-1", "t2", 1, 0.5, 2.0),
        line("pair", "r-pair-0", "t1", 1, 10.0, 10.5),
        line("pair", "r-pair-1", "t2", 1, 10.0, 10.75),
        line("failure", "r-failure-0", "t1", 1, 20.0, 21.0),
        line("failure", "r-failure-1", "t2", 1, 20.0, 20.25, ok=False),
        line("failure", "r-failure-1", "t2", 2, 20.25, 22.0),
    ]
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def test_claims_from_a_hand_log() -> None:
    claims = serving_claims(hand_log())
    assert claims == {
        "single.successes": 2, "single.wall_seconds": 2.0, "single.requests_per_second": 1.0,
        "single.median_latency_seconds": 1.25, "single.p95_latency_seconds": 1.5,
        "pair.successes": 2, "pair.wall_seconds": 0.75,
        "pair.requests_per_second": 2 / 0.75, "pair.median_latency_seconds": 0.625,
        "pair.p95_latency_seconds": 0.75,
        "failure.successes": 2, "failure.wall_seconds": 2.0,
        "failure.requests_per_second": 1.0, "failure.median_latency_seconds": 1.5,
        "failure.p95_latency_seconds": 2.0,
        "throughput_ratio": 2 / 0.75, "failure_retries": 1, "identical_outputs": True,
        "cache_hits": 0,
    }
    # The independent verifier recomputes the same numbers from the same bytes.
    assert recompute(read_log(hand_log())).claims() == claims
    assert all(c.status == "passed" for c in check_serving(hand_log(), claims))


def test_claims_see_different_outputs_and_cache_hits() -> None:
    lines = [json.loads(x) for x in hand_log().splitlines()]
    lines[2]["output_ids"] = [9]
    lines[3]["cached"] = True
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    claims = serving_claims(data)
    assert claims["identical_outputs"] is False and claims["cache_hits"] == 1
