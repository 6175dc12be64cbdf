"""The replica's wire formats: strict request parsing and the answers' JSON (pure functions).

``/infer`` takes exactly ``{"request_id": str (1..128 chars), "task_id": str}``. The
OpenAI-compatible ``/v1/chat/completions`` takes the usual chat body; sampling controls are
accepted only at values that mean greedy decoding, since that is all a replica does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from nscas.canonical import loads_strict
from nscas.errors import InvalidInput, StrictJSONError

MAX_REQUEST_ID = 128
"""Longest request id (and ``Idempotency-Key``) in characters."""
CHAT_ROLES = ("system", "user", "assistant")


class RequestRejected(InvalidInput):
    """A request the replica refuses, with the HTTP ``status`` to answer (4xx or 503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True, kw_only=True)
class InferRequest:
    request_id: str
    """The client's id for this request; retries reuse it."""
    task_id: str
    """A task id of the replica's committed task set."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    messages: tuple[tuple[str, str], ...]
    """(role, content) of each message, in order."""
    max_tokens: int
    """New tokens at most (the replica's default where the body gives none)."""
    stream: bool
    """Answer as server-sent events."""
    include_usage: bool
    """With ``stream``: send a last chunk carrying the token counts."""

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def parse_json_body(data: bytes) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN or Infinity; 400 otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRejected(400, "the body is not UTF-8 text") from None
    try:
        return loads_strict(text)
    except StrictJSONError as exc:
        raise RequestRejected(400, f"the body is not JSON: {exc.reason}") from None


def parse_infer(value: Any) -> InferRequest:
    """The ``/infer`` body, checked member by member (unknown task ids are checked later)."""
    if not isinstance(value, dict):
        raise RequestRejected(400, f"the body must be a JSON object, not {_json_type(value)}")
    expected = {"request_id", "task_id"}
    missing, unknown = sorted(expected - set(value)), sorted(set(value) - expected)
    if missing or unknown:
        parts = ([f"missing key(s) {missing}"] if missing else []) + (
            [f"unknown key(s) {[_short(k) for k in unknown]}"] if unknown else [])
        raise RequestRejected(400, "; ".join(parts) + "; expected exactly request_id, task_id")
    request_id, task_id = value["request_id"], value["task_id"]
    check_request_id(request_id, "request_id")
    if not isinstance(task_id, str):
        raise RequestRejected(400, f"task_id must be a string, not {_json_type(task_id)}")
    return InferRequest(request_id=request_id, task_id=task_id)


def check_request_id(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RequestRejected(400, f"{name} must be a string, not {_json_type(value)}")
    if not 1 <= len(value) <= MAX_REQUEST_ID:
        raise RequestRejected(
            400, f"{name} must be 1 to {MAX_REQUEST_ID} characters long, not {len(value)}")
    return value


# Members an OpenAI client may send, and the values that leave decoding greedy.
_GREEDY_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "temperature": (None, 0, 0.0), "top_p": (None, 1, 1.0), "n": (None, 1),
    "stop": (None,), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logprobs": (None, False), "top_logprobs": (None,), "logit_bias": (None,),
    "tools": (None,), "tool_choice": (None, "none"), "response_format": (None,),
}
_FREE = {"model", "user", "seed", "metadata", "store", "parallel_tool_calls"}


def parse_chat(value: Any, *, default_max_tokens: int, limit: int) -> ChatRequest:
    """A chat completion body; anything this greedy replica would not honour is a 400."""
    if not isinstance(value, dict):
        raise RequestRejected(400, f"the body must be a JSON object, not {_json_type(value)}")
    known = {"messages", "max_tokens", "max_completion_tokens", "stream", "stream_options"}
    unknown = sorted(set(value) - known - set(_GREEDY_DEFAULTS) - _FREE)
    if unknown:
        raise RequestRejected(400, f"unknown key(s) {[_short(k) for k in unknown]}")
    for key, allowed in _GREEDY_DEFAULTS.items():
        if key in value and not any(_same(value[key], a) for a in allowed):
            raise RequestRejected(
                400, f"{key}={_short(json.dumps(value[key]))} is not supported: this replica "
                     "decodes greedily (one choice, no sampling, no stop strings)")
    if "model" in value and not isinstance(value["model"], str):
        raise RequestRejected(400, "model must be a string")
    messages = _messages(value.get("messages"))
    max_tokens = value.get("max_completion_tokens", value.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not _is_int(max_tokens) or not 1 <= max_tokens <= limit:
        raise RequestRejected(400, f"max_tokens must be an integer from 1 to {limit}")
    stream = value.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestRejected(400, "stream must be true or false")
    options = value.get("stream_options")
    include_usage = False
    if options is not None:
        if (not isinstance(options, dict) or set(options) - {"include_usage"}
                or not isinstance(options.get("include_usage", False), bool)):
            raise RequestRejected(400, "stream_options may only hold include_usage (a boolean)")
        include_usage = options.get("include_usage", False)
    return ChatRequest(messages=messages, max_tokens=max_tokens, stream=stream,
                       include_usage=include_usage)


def _messages(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise RequestRejected(400, "messages must be a non-empty array")
    out = []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise RequestRejected(400, f"messages[{index}] must be an object with role and "
                                       "content")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise RequestRejected(400, f"messages[{index}].role must be one of {CHAT_ROLES}")
        if isinstance(content, list):  # OpenAI content parts: only text parts mean anything here
            if not all(isinstance(p, dict) and p.get("type") == "text" and set(p) == {"type", "text"}
                       and isinstance(p["text"], str) for p in content):
                raise RequestRejected(400, f"messages[{index}].content parts must be text parts")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestRejected(400, f"messages[{index}].content must be a string")
        out.append((role, content))
    return tuple(out)


def infer_answer(*, request_id: str, task_id: str, model_digest: str, generation: Any,
                 cached: bool) -> dict[str, Any]:
    """The ``/infer`` answer: the generation, echoing the request, task and model digest."""
    return {"request_id": request_id, "task_id": task_id, "model_digest": model_digest,
            "output_ids": list(generation.output_ids), "text": generation.text,
            "cached": cached, "prompt_tokens": len(generation.prompt_ids),
            "ended_with_eos": generation.ended_with_eos,
            "hit_token_limit": generation.hit_token_limit, "seconds": generation.seconds}


def chat_answer(*, completion_id: str, request_id: str | None, model_digest: str,
                generation: Any, cached: bool) -> dict[str, Any]:
    """A ``chat.completion`` object; ``nscas`` carries what OpenAI's format has no place for."""
    return {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()),
        "model": model_digest,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": generation.text},
                     "finish_reason": _finish(generation), "logprobs": None}],
        "usage": _usage(generation),
        "nscas": {"request_id": request_id, "model_digest": model_digest,
                  "output_ids": list(generation.output_ids), "cached": cached},
    }


def chat_chunks(*, completion_id: str, model_digest: str, generation: Any, tokenizer: Any,
                include_usage: bool) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects whose content deltas join to the full answer text."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                "model": model_digest,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""}, None)
    for piece in text_deltas(generation, tokenizer):
        yield chunk({"content": piece}, None)
    yield chunk({}, _finish(generation))
    if include_usage:
        yield {"id": completion_id, "object": "chat.completion.chunk", "created": created,
               "model": model_digest, "choices": [], "usage": _usage(generation)}


def text_deltas(generation: Any, tokenizer: Any) -> Iterator[str]:
    """One piece per token where the text grows by whole characters; joined, exactly the text.

    Byte-level tokens can split a character, so a piece is sent only once the decoded prefix
    is a prefix of the final text; what is left goes out last.
    """
    ids = list(generation.output_ids)
    if generation.ended_with_eos:
        ids = ids[:-1]
    text, sent = generation.text, ""
    for end in range(1, len(ids) + 1):
        prefix = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if len(prefix) > len(sent) and text.startswith(prefix) and prefix.startswith(sent):
            yield prefix[len(sent):]
            sent = prefix
    if len(text) > len(sent):
        yield text[len(sent):]


def _finish(generation: Any) -> str:
    return "stop" if generation.ended_with_eos else "length"


def _usage(generation: Any) -> dict[str, int]:
    prompt, completion = len(generation.prompt_ids), len(generation.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _same(value: Any, allowed: Any) -> bool:
    # JSON true is not 1: compare types as well as values.
    return type(value) is type(allowed) and value == allowed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    names: Mapping[type, str] = {dict: "an object", list: "an array", str: "a string",
                                 bool: "a boolean", int: "a number", float: "a number",
                                 type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
