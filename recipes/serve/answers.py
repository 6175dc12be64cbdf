"""What a replica answers (docs/serving.md): the ``/infer`` answer, and OpenAI-shaped
completions, stream chunks and model lists, each with the ``nscas`` member of evidence that
OpenAI's format has no place for. Requests are parsed in ``protocol``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .decoding import Completion

FAILED = "the replica failed to answer this request"
"""What a request that failed unexpectedly is told (its 500, or a stream's last event)."""


def infer_answer(*, request_id: str, task_id: str, model_digest: str, generation: Any,
                 cached: bool) -> dict[str, Any]:
    """The ``/infer`` answer: the generation, echoing the request, task and model digest."""
    return {"request_id": request_id, "task_id": task_id, "model_digest": model_digest,
            "output_ids": list(generation.output_ids), "text": generation.text,
            "cached": cached, "prompt_tokens": len(generation.prompt_ids),
            "ended_with_eos": generation.ended_with_eos,
            "hit_token_limit": generation.hit_token_limit, "seconds": generation.seconds}


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What every OpenAI-shaped answer names: the served model and what it is in the store."""

    name: str
    """The served name: OpenAI's ``model`` member, and the id in ``/v1/models``."""
    checkpoint: str
    """The checkpoint's ID (``system_fingerprint``)."""
    model_digest: str
    """Its checked parameter digest."""
    created: int
    """When the replica started (Unix seconds), the model's ``created``."""

    def answers_to(self, model: str | None) -> bool:
        """Whether a request naming ``model`` is meant for this replica."""
        return model is None or model in (self.name, self.checkpoint, self.model_digest)


def models_list(served: Served) -> dict[str, Any]:
    """``GET /v1/models``: the one model this replica serves."""
    return {"object": "list", "data": [model_entry(served)]}


def model_entry(served: Served) -> dict[str, Any]:
    return {"id": served.name, "object": "model", "created": served.created,
            "owned_by": "nscas",
            "nscas": {"checkpoint": served.checkpoint, "model_digest": served.model_digest}}


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerHead:
    """What every object of one answer repeats (a stream's chunks included)."""

    kind: str
    """``chat`` or ``text``."""
    completion_id: str
    created: int
    served: Served

    def frame(self, *, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" \
            else "text_completion"
        return {"id": self.completion_id, "object": obj, "created": self.created,
                "model": self.served.name, "system_fingerprint": self.served.checkpoint}


def new_head(kind: str, completion_id: str, served: Served) -> AnswerHead:
    return AnswerHead(kind=kind, completion_id=completion_id, created=int(time.time()),
                      served=served)


def nscas_member(head: AnswerHead, completion: Completion, *, request_id: str | None,
                 cached: bool) -> dict[str, Any]:
    """What OpenAI's format has no place for: the evidence behind the text."""
    return {"request_id": request_id, "checkpoint": head.served.checkpoint,
            "model_digest": head.served.model_digest,
            "output_ids": list(completion.output_ids), "cached": cached,
            "seed": completion.seed, "first_token_time": completion.first_token_time,
            "last_token_time": completion.last_token_time}


def completion_answer(head: AnswerHead, completion: Completion, *, request_id: str | None,
                      cached: bool) -> dict[str, Any]:
    """A whole ``chat.completion`` or ``text_completion`` object."""
    if head.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                          "content": completion.text}}
    else:
        choice = {"index": 0, "text": completion.text}
    choice.update(finish_reason=completion.finish_reason, logprobs=None)
    return {**head.frame(chunk=False), "choices": [choice], "usage": usage(completion),
            "nscas": nscas_member(head, completion, request_id=request_id, cached=cached)}


def piece_chunk(head: AnswerHead, piece: str, *, first: bool = False) -> dict[str, Any]:
    """One chunk of a stream carrying ``piece`` (a chat's first also names the role)."""
    if head.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": piece} if first else {
            "content": piece}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
    else:
        choice = {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
    return {**head.frame(chunk=True), "choices": [choice]}


def finish_chunk(head: AnswerHead, completion: Completion, *, request_id: str | None,
                 cached: bool) -> dict[str, Any]:
    """A stream's chunk with the finish reason and the ``nscas`` member."""
    choice: dict[str, Any] = ({"index": 0, "delta": {}} if head.kind == "chat"
                              else {"index": 0, "text": "", "logprobs": None})
    choice["finish_reason"] = completion.finish_reason
    return {**head.frame(chunk=True), "choices": [choice],
            "nscas": nscas_member(head, completion, request_id=request_id, cached=cached)}


def usage_chunk(head: AnswerHead, completion: Completion) -> dict[str, Any]:
    """A stream's last chunk with ``stream_options.include_usage``: no choices, the usage."""
    return {**head.frame(chunk=True), "choices": [], "usage": usage(completion)}


def usage(completion: Completion) -> dict[str, int]:
    prompt, generated = completion.prompt_tokens, len(completion.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated}


def sse(value: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``value``."""
    return f"data: {json.dumps(value)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"
