"""The replica's pure parts: request parsing, incremental text with stop strings, sampling,
the batcher, the retry cache and the claims computed from a request log (checked against the
independent verifier)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from nscas.recipes.serve.batching import Batcher, BatchStats, RequestConflict, RetryCache
from nscas.recipes.serve.client import LoadPlan, _check_answer
from nscas.recipes.serve.decoding import RowControl, Sampler, TextStream
from nscas.recipes.serve.metrics import nearest_rank, serving_claims
from nscas.recipes.serve.protocol import (
    RequestRejected,
    Sampling,
    error_body,
    parse_chat,
    parse_infer,
    parse_json_body,
    parse_text_completion,
)
from nscas.verifiers.serving.throughput import check_serving, read_log, recompute


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
    assert chat.messages == (("user", "ab"),) and chat.params.max_tokens == 96
    assert chat.params.stream and chat.params.include_usage and chat.params.model == "m"
    assert chat.params.sampling.greedy and chat.params.stop == ()
    sampled = parse_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                          "temperature": 0.7, "top_p": 0.5, "seed": -(1 << 63),
                          "stop": ["a", "bc"]}, default_max_tokens=96, limit=4096).params
    assert sampled.max_tokens == 5 and sampled.stop == ("a", "bc")
    assert sampled.sampling == Sampling(temperature=0.7, top_p=0.5, seed=-(1 << 63))
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "stop": "\n",
                       "seed": (1 << 64) - 1, "temperature": 2}, default_max_tokens=96,
                      limit=4096).params.stop == ("\n",)


def _user(**members: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "x"}], **members}


@pytest.mark.parametrize(("body", "param", "code", "fragment"), [
    ({"messages": []}, "messages", "invalid_value", "non-empty array"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value",
     "role must be one of"),
    (_user(n=2), "n", "unsupported_parameter", "n=2 is not supported"),
    (_user(n=True), "n", "unsupported_parameter", "not supported"),
    (_user(max_tokens=0), "max_tokens", "invalid_value", "from 1 to 4096, not 0"),
    (_user(max_tokens=4097), "max_tokens", "invalid_value", "from 1 to 4096"),
    (_user(max_tokens="5"), "max_tokens", "invalid_value", "integer"),
    (_user(bogus=1), "bogus", "unknown_parameter", "unknown key(s) ['bogus']"),
    (_user(temperature=2.5), "temperature", "invalid_value", "from 0 to 2, not 2.5"),
    (_user(temperature=-0.1), "temperature", "invalid_value", "from 0 to 2"),
    (_user(temperature=True), "temperature", "invalid_value", "number"),
    (_user(top_p=0), "top_p", "invalid_value", "above 0 and at most 1, not 0"),
    (_user(top_p=1.5), "top_p", "invalid_value", "at most 1"),
    (_user(seed=1 << 64), "seed", "invalid_value", "64 bits"),
    (_user(seed=-(1 << 63) - 1), "seed", "invalid_value", "64 bits"),
    (_user(seed=1.5), "seed", "invalid_value", "integer"),
    (_user(stop=["a"] * 5), "stop", "invalid_value", "at most 4 strings"),
    (_user(stop=[""]), "stop", "invalid_value", "1 to 200 characters"),
    (_user(stop=7), "stop", "invalid_value", "a string or a list"),
    (_user(stream="yes"), "stream", "invalid_value", "true or false"),
    (_user(model=5), "model", "invalid_value", "must be a string"),
    (_user(stream_options={"x": 1}), "stream_options", "invalid_value", "include_usage"),
])
def test_chat_bodies_refused_name_the_member(body: Any, param: str, code: str,
                                             fragment: str) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_chat(body, default_max_tokens=96, limit=4096)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)
    assert fragment in caught.value.message


def test_text_completion_bodies() -> None:
    text = parse_text_completion({"model": "m", "prompt": "Once", "echo": False, "stop": "."},
                                 default_max_tokens=16, limit=4096)
    assert text.prompt == "Once" and text.params.stop == (".",) and text.params.max_tokens == 16
    assert parse_text_completion({"prompt": ["one"]}, default_max_tokens=1,
                                 limit=4).prompt == "one"
    for body, param in (({"prompt": ""}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"),
                        ({"prompt": [1, 2]}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
                        ({"prompt": "a", "messages": []}, "messages"), ({}, "prompt")):
        with pytest.raises(RequestRejected) as caught:
            parse_text_completion(body, default_max_tokens=16, limit=4096)
        assert caught.value.param == param and caught.value.status == 400


def test_error_bodies_have_openai_shape() -> None:
    assert error_body(400, "bad", code="invalid_value", param="top_p") == {"error": {
        "message": "bad", "type": "invalid_request_error", "param": "top_p",
        "code": "invalid_value"}}
    assert error_body(503, "busy", code="shutting_down")["error"]["type"] == (
        "service_unavailable_error")
    assert error_body(500, "x", code="internal_error")["error"]["type"] == "server_error"
    # The load client logs the message of a refusal, as it did of the plain one.
    refusal = error_body(503, "the replica is shutting down", code="shutting_down")
    assert _check_answer(503, refusal, "r", "t", "d") == "HTTP 503: the replica is shutting down"


class ByteTokenizer:
    """Decodes ids as UTF-8 bytes, so a token may hold half a character."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def _pushed(text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], TextStream]:
    stream = TextStream(ByteTokenizer(), stop)
    pieces = [stream.push(byte) for byte in text.encode()]
    return [*pieces, stream.finish()], stream


def test_text_is_released_only_once_it_decodes_cleanly() -> None:
    pieces, stream = _pushed("a€b")  # the euro sign is three bytes, so three tokens
    assert pieces == ["a", "", "", "€", "b", ""]
    assert stream.text == "a€b" and stream.stopped_at is None
    # A character of four bytes, split over four tokens, as the last thing decoded.
    pieces, _ = _pushed("x😀")
    assert pieces == ["x", "", "", "", "😀", ""] and "\ufffd" not in "".join(pieces)


def test_stop_strings_cut_the_text_and_hold_back_what_may_begin_one() -> None:
    pieces, stream = _pushed("one. two", stop=("wo", ". t"))
    # ". t" is held back while it may be a stop string, then the text ends before it.
    assert "".join(pieces) == "one" and stream.text == "one" and stream.stopped_at == 3
    assert pieces[:4] == ["o", "n", "e", ""]
    pieces, stream = _pushed("a.b", stop=(". t",))  # a possible start that was not one
    assert "".join(pieces) == "a.b" and stream.stopped_at is None
    pieces, stream = _pushed("ab€", stop=("€",))  # found once the character decodes
    assert "".join(pieces) == "ab" and stream.stopped_at == 2
    # At the very end, what was held back goes out.
    pieces, stream = _pushed("xy.", stop=(".z",))
    assert pieces[-1] == "." and stream.text == "xy."


def test_a_row_control_streams_stops_and_reports() -> None:
    sent: list[str] = []
    control = RowControl(tokenizer=ByteTokenizer(), eos=frozenset({0}), prompt_tokens=3,
                         stop=("!",), sampling=Sampling(), emit=sent.append)
    assert [control.on_token(t) for t in b"hi"] == [True, True]
    assert sent == ["h", "i"]  # each piece is handed out as its token is chosen
    assert control.on_token(ord("!")) is False  # the stop string ends the row
    completion = control.finish(limit=10)
    assert (completion.text, completion.finish_reason, completion.output_ids) == (
        "hi", "stop", (104, 105, 33))
    assert completion.pieces == ("h", "i") and completion.seed is None
    assert completion.first_token_time <= completion.last_token_time  # type: ignore[operator]
    ended = RowControl(tokenizer=ByteTokenizer(), eos=frozenset({0}), prompt_tokens=1, stop=(),
                       sampling=Sampling(), emit=None)
    assert ended.on_token(ord("a")) and ended.on_token(0)
    assert ended.finish(limit=2).finish_reason == "stop"  # the end-of-turn token, at the limit
    full = RowControl(tokenizer=ByteTokenizer(), eos=frozenset({0}), prompt_tokens=1, stop=(),
                      sampling=Sampling(), emit=None)
    assert full.on_token(ord("a")) and full.on_token(ord("b"))
    assert full.finish(limit=2).finish_reason == "length"
    full.cancel()
    assert full.on_token(ord("c")) is False


def test_sampling_is_seeded_and_top_p_keeps_the_likely_tokens() -> None:
    import torch

    logits = torch.tensor([2.0, 1.9, 1.8, -5.0, -6.0])

    def draws(sampling: Sampling) -> list[int]:
        sampler = Sampler(sampling)
        return [sampler.draw(logits) for _ in range(200)]

    same = draws(Sampling(temperature=1.0, seed=11))
    assert same == draws(Sampling(temperature=1.0, seed=11))
    assert same != draws(Sampling(temperature=1.0, seed=12))
    assert set(same) >= {0, 1, 2}  # it really samples
    assert set(draws(Sampling(temperature=1.0, top_p=0.3, seed=1))) == {0}
    assert set(draws(Sampling(temperature=1.0, top_p=0.5, seed=1))) == {0, 1}
    assert Sampler(Sampling(temperature=1.0)).seed >= 0  # drawn when not given


@dataclass(frozen=True, slots=True, kw_only=True)
class Made:
    """What a stand-in generation gives a row: a value to tell rows apart, and its ids."""

    value: int
    output_ids: tuple[int, ...]


def test_batcher_batches_what_arrives_together() -> None:
    calls: list[tuple[int, int]] = []

    def generate(prompts: Any, max_new_tokens: int, controls: Any) -> list[Made]:
        assert list(controls) == [None] * len(prompts)
        calls.append((len(prompts), max_new_tokens))
        # Row [i] makes i tokens (fewer than asked, as a row ended early would).
        return [Made(value=sum(p) * 10 + max_new_tokens, output_ids=(0,) * sum(p))
                for p in prompts]

    async def main() -> tuple[list[Made], BatchStats]:
        batcher = Batcher(generate, max_batch=4, max_wait_s=0.2)
        batcher.start()
        try:
            made = await asyncio.gather(
                *(batcher.submit([i], 3) for i in range(6)), batcher.submit([7], 5))
            return list(made), batcher.stats
        finally:
            await batcher.close()

    results, stats = asyncio.run(main())
    assert [r.value for r in results] == [3, 13, 23, 33, 43, 53, 75]
    # Four at once (max_batch), then the other limit and the rest apart from each other.
    assert calls[0] == (4, 3) and sorted(calls[1:]) == [(1, 5), (2, 3)]
    # The tokens counted are those the rows made, not the limits they were given.
    assert (stats.rows, stats.tokens) == (7, 0 + 1 + 2 + 3 + 4 + 5 + 7)
    assert stats.to_json()["generated_tokens"] == 22


def test_a_failed_row_adds_no_tokens() -> None:
    def generate(prompts: Any, max_new_tokens: int, controls: Any) -> list[Any]:
        return [ValueError("alone") if p[0] == 0 else Made(value=0, output_ids=(1, 2))
                for p in prompts]

    async def main() -> BatchStats:
        batcher = Batcher(generate, max_batch=2, max_wait_s=0.2)
        batcher.start()
        try:
            await asyncio.gather(batcher.submit([0], 3), batcher.submit([1], 3),
                                 return_exceptions=True)
            return batcher.stats
        finally:
            await batcher.close()

    stats = asyncio.run(main())
    assert (stats.batches, stats.rows, stats.tokens) == (1, 2, 2)


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
