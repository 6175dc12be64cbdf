"""One real replica process on 127.0.0.1: answers, the retry cache, every refusal, random
bodies, and the OpenAI-compatible endpoint driven by the official ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import MAX_NEW_TOKENS, Served


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=60) as client:
        yield client


def infer(http: httpx.Client, replica: str, request_id: str, task_id: str) -> httpx.Response:
    return http.post(f"{replica}/infer", json={"request_id": request_id, "task_id": task_id})


def test_health_names_the_checked_digest(http: httpx.Client, replica: str,
                                         served: Served) -> None:
    answer = http.get(f"{replica}/health")
    assert answer.status_code == 200
    assert answer.json() == {"ready": True, "model_digest": served.model_digest}


def test_infer_answers_and_a_retry_is_served_from_the_cache(
        http: httpx.Client, replica: str, served: Served) -> None:
    task = served.task_ids[0]
    first = infer(http, replica, "req-1", task)
    assert first.status_code == 200
    body = first.json()
    assert (body["request_id"], body["task_id"], body["model_digest"], body["cached"]) == (
        "req-1", task, served.model_digest, False)
    assert len(body["output_ids"]) == MAX_NEW_TOKENS or body["ended_with_eos"]
    assert all(isinstance(t, int) for t in body["output_ids"])
    again = infer(http, replica, "req-1", task)
    assert again.status_code == 200
    assert again.json() == {**body, "cached": True}
    conflict = infer(http, replica, "req-1", served.task_ids[1])
    assert conflict.status_code == 409
    assert conflict.json() == {"error": {
        "message": "request id 'req-1' was already used for another request",
        "type": "invalid_request_error", "param": None, "code": "request_id_conflict"}}
    # Another id for the same task is a new request with the same answer.
    other = infer(http, replica, "req-2", task).json()
    assert other["output_ids"] == body["output_ids"] and other["cached"] is False


@pytest.mark.parametrize(("content", "fragment"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object, not an array"),
    (b'"text"', "must be a JSON object, not a string"),
    (b'{"request_id": "r"}', "missing key(s) ['task_id']"),
    (b'{"request_id": "r", "task_id": "t", "extra": 0}', "unknown key(s) ['extra']"),
    (b'{"request_id": 1, "task_id": "t"}', "request_id must be a string"),
    (b'{"request_id": "r", "task_id": ["t"]}', "task_id must be a string"),
    (b'{"request_id": "", "task_id": "t"}', "1 to 128 characters long, not 0"),
    (json.dumps({"request_id": "x" * 129, "task_id": "t"}).encode(), "not 129"),
    (b'{"request_id": "r", "task_id": "no-such-task"}', "unknown task id 'no-such-task'"),
    (b'{"request_id": "r", "request_id": "s", "task_id": "t"}', "repeats"),
])
def test_bad_bodies_get_400_with_a_json_error(http: httpx.Client, replica: str, content: bytes,
                                              fragment: str) -> None:
    answer = http.post(f"{replica}/infer", content=content,
                       headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert answer.headers["Content-Type"].startswith("application/json")
    assert set(answer.json()) == {"error"} and fragment in answer.json()["error"]["message"]
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_oversized_bodies_get_413(http: httpx.Client, replica: str, served: Served) -> None:
    big = json.dumps({"request_id": "r", "task_id": served.task_ids[0], "pad": "x" * 5000})
    declared = http.post(f"{replica}/infer", content=big.encode())
    assert declared.status_code == 413 and "limit is 4096" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        for _ in range(10):
            yield b" " * 1000

    streamed = http.post(f"{replica}/infer", content=chunks())
    assert streamed.status_code == 413
    assert "over the limit" in streamed.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/nowhere", 404), ("POST", "/v2/infer", 404), ("GET", "/infer", 405),
    ("POST", "/health", 405), ("DELETE", "/v1/chat/completions", 405),
    ("POST", "/v1/models", 405), ("GET", "/v1/completions", 405),
])
def test_unknown_routes_and_methods(http: httpx.Client, replica: str, method: str, path: str,
                                    status: int) -> None:
    answer = http.request(method, f"{replica}{path}")
    assert answer.status_code == status
    assert set(answer.json()) == {"error"}
    assert answer.json()["error"]["code"] == {404: "unknown_route", 405: "method_not_allowed"}[
        status]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=10)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_bodies_never_break_the_replica(http: httpx.Client, replica: str,
                                               served: Served, data: st.DataObject) -> None:
    ids = st.text(min_size=0, max_size=3) | JSON
    body: Any = data.draw(st.one_of(
        st.binary(max_size=300),
        JSON.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"request_id": ids, "task_id": st.sampled_from(served.task_ids)
                               | JSON}).map(lambda v: json.dumps(v).encode()),
    ))
    path = data.draw(st.sampled_from(["/infer", "/v1/chat/completions", "/v1/completions"]))
    answer = http.post(f"{replica}{path}", content=body)
    assert answer.status_code in (200, 400, 404, 409, 413)
    assert isinstance(answer.json(), dict)
    if answer.status_code != 200:
        assert set(answer.json()) == {"error"}
    assert http.get(f"{replica}/health").json()["ready"] is True


def test_openai_client_gets_the_infer_answer(http: httpx.Client, replica: str,
                                             served: Served) -> None:
    from openai import OpenAI

    task = served.task_ids[3]
    expected = infer(http, replica, "oa-reference", task).json()
    client = OpenAI(base_url=f"{replica}/v1", api_key="x",
                    http_client=httpx.Client(trust_env=False))
    messages: Any = [{"role": "user", "content": served.prompts[task]}]
    name = str(served.checkpoint)  # the served name defaults to the checkpoint as given
    completion = client.chat.completions.create(
        model=name, messages=messages, extra_headers={"Idempotency-Key": "oa-1"})
    choice = completion.choices[0]
    assert choice.message.content == expected["text"]
    assert choice.finish_reason == ("stop" if expected["ended_with_eos"] else "length")
    assert completion.model == name and completion.system_fingerprint == str(served.checkpoint)
    extra = completion.model_extra["nscas"]
    assert extra["output_ids"] == expected["output_ids"] and extra["cached"] is False
    assert extra["model_digest"] == served.model_digest
    assert completion.usage.completion_tokens == len(expected["output_ids"])
    assert completion.usage.prompt_tokens == expected["prompt_tokens"]
    repeat = client.chat.completions.create(
        model=name, messages=messages, extra_headers={"Idempotency-Key": "oa-1"})
    assert repeat.model_extra["nscas"]["cached"] is True
    assert repeat.choices[0].message.content == expected["text"]
    # The same key for another prompt is refused; the client raises the 409.
    import openai

    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "other"}],
            extra_headers={"Idempotency-Key": "oa-1"})


def test_openai_streaming_joins_to_the_infer_answer(http: httpx.Client, replica: str,
                                                    served: Served) -> None:
    from openai import OpenAI

    task = served.task_ids[4]
    expected = infer(http, replica, "oa-stream-reference", task).json()
    client = OpenAI(base_url=f"{replica}/v1", api_key="x",
                    http_client=httpx.Client(trust_env=False))
    stream = client.chat.completions.create(
        model=str(served.checkpoint), messages=[{"role": "user", "content": served.prompts[task]}],
        stream=True, stream_options={"include_usage": True}, max_tokens=MAX_NEW_TOKENS)
    pieces, finishes, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finishes.append(choice.finish_reason)
    assert "".join(pieces) == expected["text"]
    assert len([p for p in pieces if p]) >= 2  # streamed in pieces, not one blob
    assert finishes[-1] == ("stop" if expected["ended_with_eos"] else "length")
    assert all(f is None for f in finishes[:-1])
    assert usage is not None and usage.completion_tokens == len(expected["output_ids"])


def test_chat_refusals_are_json(http: httpx.Client, replica: str) -> None:
    url = f"{replica}/v1/chat/completions"
    cases = [
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 3.0}, {}, 400),
        ({"messages": [{"role": "user", "content": "hi"}]}, {"Idempotency-Key": ""}, 400),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2048}, {}, 400),
        ({"messages": "hi"}, {}, 400),
    ]
    for body, headers, status in cases:
        answer = http.post(url, json=body, headers=headers)
        assert answer.status_code == status, body
        assert set(answer.json()) == {"error"}
    # 2048 new tokens would need more positions than the model's 2048 with this prompt.
    refused = http.post(url, json=cases[2][0]).json()["error"]
    assert "positions" in refused["message"] and refused["code"] == "context_length_exceeded"
