"""The replica as OpenAI clients use it, driven by the official ``openai`` client against one
real replica process on 127.0.0.1 served under ``--name``: the models list, text and chat
completions, streams that carry tokens as they are generated, stop strings, seeded sampling,
and refusals that the client raises with the replica's message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
from tests.waiting import GENEROUS, STARTUP, wait_until

from .conftest import Served

NAME = "tiny-coop"
LONG = 200
"""Tokens asked of the streaming-time test: about a second of decoding on a CPU."""


@pytest.fixture(scope="module")
def endpoint(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks), options=ReplicaOptions(max_new_tokens=16))
    with ReplicaGroup(tmp_path_factory.mktemp("openai")) as group:
        started = group.start([*argv, "--name", NAME])
        yield group.wait_ready([started], timeout=STARTUP, model_digest=served.model_digest)[0]


@pytest.fixture(scope="module")
def client(endpoint: str) -> Iterator[OpenAI]:
    with httpx.Client(trust_env=False, timeout=120) as http:
        yield OpenAI(base_url=f"{endpoint}/v1", api_key="unused", http_client=http,
                     max_retries=0)


def chat(served: Served, index: int) -> Any:
    return [{"role": "user", "content": served.prompts[served.task_ids[index]]}]


def test_models_list_names_the_served_model(client: OpenAI, served: Served) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [NAME] and models[0].owned_by == "nscas"
    assert models[0].model_extra["nscas"] == {"checkpoint": str(served.checkpoint),
                                              "model_digest": served.model_digest}
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.code == "model_not_found"
    assert "the model 'gpt-4o' is not served here" in caught.value.body["message"]


def test_text_completion_whole_and_streamed(client: OpenAI, served: Served) -> None:
    prompt = served.prompts[served.task_ids[5]]
    whole = client.completions.create(model=NAME, prompt=prompt, max_tokens=16)
    assert whole.object == "text_completion" and whole.model == NAME
    assert whole.system_fingerprint == str(served.checkpoint)
    extra = whole.model_extra["nscas"]
    assert extra["model_digest"] == served.model_digest and extra["seed"] is None
    choice = whole.choices[0]
    assert choice.finish_reason == ("length" if len(extra["output_ids"]) == 16 else "stop")
    assert whole.usage.completion_tokens == len(extra["output_ids"])
    pieces, finishes, usage = [], [], None
    for chunk in client.completions.create(model=NAME, prompt=prompt, max_tokens=16,
                                           stream=True, stream_options={"include_usage": True}):
        assert chunk.model == NAME
        usage = chunk.usage or usage
        for c in chunk.choices:
            pieces.append(c.text)
            finishes.append(c.finish_reason)
    assert "".join(pieces) == choice.text and len([p for p in pieces if p]) >= 2
    assert finishes[-1] == choice.finish_reason and set(finishes[:-1]) == {None}
    assert usage is not None and usage.model_dump() == {**whole.usage.model_dump()}


def _timed_stream(client: OpenAI, prompt: str) -> tuple[list[float], Any, str]:
    """Client arrival times of the text chunks, the replica's nscas member, the text."""
    arrivals, extra, text = [], None, ""
    for chunk in client.completions.create(model=NAME, prompt=prompt, max_tokens=LONG,
                                           stream=True):
        now = time.time()
        for c in chunk.choices:
            if c.text:
                arrivals.append(now)
                text += c.text
        extra = (chunk.model_extra or {}).get("nscas", extra)
    return arrivals, extra, text


@pytest.fixture(scope="module")
def long_answer(client: OpenAI, served: Served) -> tuple[str, Any]:
    """A prompt whose answer runs long, so that decoding takes about a second, and its answer."""
    for task in served.task_ids:
        whole = client.completions.create(model=NAME, prompt=served.prompts[task],
                                          max_tokens=LONG)
        if len(whole.model_extra["nscas"]["output_ids"]) >= LONG * 3 // 4:
            return served.prompts[task], whole
    pytest.fail("no prompt gives a long answer; the fixture's model has changed")


def test_a_stream_carries_tokens_as_they_are_generated(client: OpenAI,
                                                       long_answer: tuple[str, Any]) -> None:
    prompt, whole = long_answer
    arrivals, extra, text = _timed_stream(client, prompt)
    assert text == whole.choices[0].text
    first, last = extra["first_token_time"], extra["last_token_time"]
    # Buffered, the first chunk could only leave after the last token was chosen; streamed,
    # it arrives while the row still decodes (same host, same clock). The margin is the whole
    # long answer's decoding, which a loaded machine stretches as much as it delays the chunk.
    assert len(extra["output_ids"]) >= LONG * 3 // 4 and len(arrivals) > 10
    assert arrivals[0] < last, (arrivals[0] - first, last - first)


def test_chat_stream_with_usage_and_stop(client: OpenAI, served: Served) -> None:
    messages = chat(served, 6)
    full = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16)
    text = full.choices[0].message.content
    assert text is not None and len(text) > 6
    # A stop string from the middle of the answer, at its first occurrence.
    cut = next(i for i in range(3, len(text) - 2) if text.find(text[i:i + 2]) == i)
    stop = text[cut:cut + 2]
    stopped = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16,
                                             stop=[stop, "never-in-the-text"])
    assert stopped.choices[0].message.content == text[:cut]
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens <= full.usage.completion_tokens
    pieces, finishes, usage, roles = [], [], None, []
    for chunk in client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=16, stop=stop, stream=True,
            stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finishes.append(c.finish_reason)
            roles.append(c.delta.role)
    assert "".join(pieces) == text[:cut] and roles[0] == "assistant"
    assert finishes[-1] == "stop" and usage == stopped.usage


def test_sampling_is_reproducible_by_seed(client: OpenAI, served: Served) -> None:
    messages = chat(served, 7)

    def sample(**params: Any) -> Any:
        return client.chat.completions.create(model=NAME, messages=messages, max_tokens=16,
                                              **params)

    greedy = sample().choices[0].message.content
    assert sample(temperature=0, seed=5).choices[0].message.content == greedy
    first = sample(temperature=1.0, top_p=0.95, seed=1234)
    assert first.model_extra["nscas"]["seed"] == 1234
    again = sample(temperature=1.0, top_p=0.95, seed=1234)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["nscas"]["output_ids"] == first.model_extra["nscas"]["output_ids"]
    others = {sample(temperature=1.0, seed=s).choices[0].message.content for s in (1, 2, 3)}
    assert len(others) > 1 and greedy not in others  # it samples, and not the argmax
    # Without a seed one is drawn and named: asking with it gives the same text again.
    drawn = sample(temperature=1.5)
    seed = drawn.model_extra["nscas"]["seed"]
    assert isinstance(seed, int)
    assert sample(temperature=1.5, seed=seed).choices[0].message.content == (
        drawn.choices[0].message.content)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=16, temperature=1.0, top_p=0.95, seed=1234,
        stream=True) if c.choices)
    assert streamed == first.choices[0].message.content


@pytest.mark.parametrize(("params", "error", "code", "param", "fragment"), [
    ({"temperature": 2.5}, openai.BadRequestError, "invalid_value", "temperature",
     "temperature must be a number from 0 to 2, not 2.5"),
    ({"top_p": 0}, openai.BadRequestError, "invalid_value", "top_p", "above 0"),
    ({"seed": 1 << 64}, openai.BadRequestError, "invalid_value", "seed", "64 bits"),
    ({"stop": ["a", "b", "c", "d", "e"]}, openai.BadRequestError, "invalid_value", "stop",
     "at most 4"),
    ({"n": 2}, openai.BadRequestError, "unsupported_parameter", "n", "not supported"),
    ({"extra_body": {"bogus": 1}}, openai.BadRequestError, "unknown_parameter", "bogus",
     "unknown key(s) ['bogus']"),
    ({"max_tokens": 2048}, openai.BadRequestError, "context_length_exceeded", "max_tokens",
     "positions"),
    ({"model": "gpt-4o"}, openai.NotFoundError, "model_not_found", "model",
     "is not served here"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_refusals_surface_in_the_client(client: OpenAI, served: Served, params: dict[str, Any],
                                        error: type[openai.APIStatusError], code: str,
                                        param: str, fragment: str, stream: bool) -> None:
    arguments = {"model": NAME, "messages": chat(served, 0), **params}
    with pytest.raises(error) as caught:  # a stream is refused before it starts, by status
        client.chat.completions.create(**arguments, stream=stream)
    assert (caught.value.code, caught.value.param) == (code, param)
    assert fragment in caught.value.body["message"] and fragment in str(caught.value)


def test_a_bad_body_and_an_unknown_route_are_openai_errors(endpoint: str) -> None:
    with httpx.Client(trust_env=False, timeout=GENEROUS) as http:
        bad = http.post(f"{endpoint}/v1/completions", content=b"{not json")
        missing = http.get(f"{endpoint}/v1/embeddings")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_route"


def test_a_retried_stream_replays_the_first_answer(client: OpenAI, served: Served) -> None:
    arguments: Any = {"model": NAME, "prompt": served.prompts[served.task_ids[8]],
                      "max_tokens": 16, "extra_headers": {"Idempotency-Key": "stream-1"}}
    first = client.completions.create(**arguments)
    chunks = list(client.completions.create(**arguments, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
    assert chunks[-1].model_extra["nscas"]["cached"] is True
    with pytest.raises(openai.ConflictError) as caught:  # the same key for another request
        client.completions.create(**{**arguments, "max_tokens": 3}, stream=True)
    assert caught.value.code == "request_id_conflict"


def test_a_client_that_leaves_a_stream_ends_its_row(endpoint: str,
                                                    long_answer: tuple[str, Any]) -> None:
    prompt, whole = long_answer
    full = len(whole.model_extra["nscas"]["output_ids"])
    with httpx.Client(trust_env=False, timeout=GENEROUS) as http:
        before = http.get(f"{endpoint}/stats").json()
        with http.stream("POST", f"{endpoint}/v1/completions",
                         json={"prompt": prompt, "max_tokens": LONG, "stream": True}) as answer:
            assert answer.status_code == 200
            next(answer.iter_lines())  # the first piece has come: leave
        wait_until(lambda: http.get(f"{endpoint}/stats").json()["batches"] > before["batches"],
                   "the left row's batch to end")
        after = http.get(f"{endpoint}/stats").json()
    # The row ended once the client had left, not after all of its tokens: counted in tokens
    # the replica generated (greedy, the same prompt makes the same tokens up to there).
    assert after["rows"] - before["rows"] == 1
    assert 1 <= after["generated_tokens"] - before["generated_tokens"] < full
