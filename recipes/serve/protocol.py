"""The replica's wire formats: strict request parsing and the answers' JSON (pure functions).

``/infer`` takes exactly ``{"request_id": str (1..128 chars), "task_id": str}``. The
OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` take the usual bodies:
greedy decoding unless ``temperature`` is above 0, then sampling with ``top_p`` from a
generator seeded by ``seed``; ``stop`` strings; ``max_tokens``. Members OpenAI defines that
this replica does not implement are accepted only at their default values; anything else is
a 400. Every refusal, on every route, is OpenAI's error object:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nscas.errors import InvalidInput, StrictJSONError
from nscas.objects.canonical import loads_strict

MAX_REQUEST_ID = 128
"""Longest request id (and ``Idempotency-Key``) in characters."""
CHAT_ROLES = ("system", "user", "assistant")
MAX_STOP = 4
"""Stop strings per request at most (as OpenAI)."""
MAX_STOP_CHARS = 200
"""Longest stop string in characters."""
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
"""Seeds a torch generator takes: any integer of 64 bits, signed or unsigned."""
MAX_TEMPERATURE = 2.0
MIN_SAMPLING_TEMPERATURE = 0.01
"""A temperature below this (0 included) decodes greedily: sampling there is the argmax but
for ties, and dividing the logits by a tiny temperature (1e-45) overflows them to infinity."""
MAX_BODY_DEPTH = 32
"""Deepest nesting of arrays and objects in a request body."""
MAX_INTEGER_DIGITS = 40
"""Longest integer in a request body that is read as a number (2**128 has 39 digits): a
longer one is a ``TooLongInteger``, which every numeric member refuses by name."""


@dataclass(frozen=True, slots=True)
class TooLongInteger:
    """An integer of a request body too long to be any member's value (never converted)."""

    digits: int

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _body_int(text: str) -> int | TooLongInteger:
    digits = len(text) - text.startswith("-")
    return int(text) if digits <= MAX_INTEGER_DIGITS else TooLongInteger(digits)


class RequestRejected(InvalidInput):
    """A request the replica refuses: the HTTP ``status`` (4xx or 503), OpenAI's error
    ``code`` and the body member at fault (``param``), if one is."""

    def __init__(self, status: int, message: str, *, code: str = "invalid_request",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param


def error_body(status: int, message: str, *, code: str, param: str | None = None
               ) -> dict[str, Any]:
    """OpenAI's error object, which its clients raise with ``message``."""
    kind = ("invalid_request_error" if status < 500 else
            "service_unavailable_error" if status == 503 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True, slots=True, kw_only=True)
class InferRequest:
    request_id: str
    """The client's id for this request; retries reuse it."""
    task_id: str
    """A task id of the replica's committed task set."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How a request's tokens are chosen: the argmax at temperature 0 (the default)."""

    temperature: float = 0.0
    """Below ``MIN_SAMPLING_TEMPERATURE`` (0 included) greedy decoding; from it to 2,
    softmax(logits / temperature) is sampled."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the most likely tokens holding this much probability."""
    seed: int | None = None
    """The generator's seed; None draws one (the answer names it)."""

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_SAMPLING_TEMPERATURE


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationParams:
    """What a completion request asks of generation, common to chat and text completions."""

    model: str | None
    """The model the client named, if it named one."""
    max_tokens: int
    """New tokens at most (the replica's default where the body gives none)."""
    stop: tuple[str, ...]
    """The answer ends before the first of these strings (finish reason ``stop``)."""
    sampling: Sampling
    stream: bool
    """Answer as server-sent events, each piece of text as it is generated."""
    include_usage: bool
    """With ``stream``: send a last chunk carrying the token counts."""

    def fingerprint(self) -> list[Any]:
        """What, besides the prompt, makes two requests the same request (the retry cache)."""
        s = self.sampling
        return [self.max_tokens, list(self.stop), s.temperature, s.top_p, s.seed]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    messages: tuple[tuple[str, str], ...]
    """(role, content) of each message, in order."""
    params: GenerationParams

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True, slots=True, kw_only=True)
class TextRequest:
    prompt: str
    """The prompt, tokenized as it stands (no chat template)."""
    params: GenerationParams


def parse_json_body(data: bytes) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN or Infinity, no integer too long to
    read, nested at most ``MAX_BODY_DEPTH`` deep, every string valid Unicode (no lone
    surrogate from a ``\\ud800`` escape); 400 otherwise, before anything else sees it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRejected(400, "the body is not UTF-8 text", code="invalid_json") from None
    try:
        value = loads_strict(text, max_depth=MAX_BODY_DEPTH, parse_int=_body_int)
    except StrictJSONError as exc:
        raise RequestRejected(400, f"the body is not JSON: {exc.reason}",
                              code="invalid_json") from None
    where = _not_unicode(value)
    if where is not None:
        raise RequestRejected(400, f"{where} is not valid Unicode text (a lone surrogate)",
                              code="invalid_value", param=where)
    return value


def _not_unicode(value: Any) -> str | None:
    """The path of the first string (or key) in ``value`` that is not valid Unicode."""
    pending: list[tuple[str, Any]] = [("body", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                return path
        elif isinstance(item, dict):
            for key, member in item.items():
                if not _is_unicode(key):
                    return f"{path} key {_short(ascii(key))}"
                # A key is shown as text only if printable: the reason stays one line.
                shown = _short(key if key.isprintable() else ascii(key))
                pending.append((shown if path == "body" else f"{path}.{shown}", member))
        elif isinstance(item, list):
            pending.extend((f"{path}[{i}]", member) for i, member in enumerate(item))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_infer(value: Any) -> InferRequest:
    """The ``/infer`` body, checked member by member (unknown task ids are checked later)."""
    _object(value)
    expected = {"request_id", "task_id"}
    missing, unknown = sorted(expected - set(value)), sorted(set(value) - expected)
    if missing or unknown:
        parts = ([f"missing key(s) {missing}"] if missing else []) + (
            [f"unknown key(s) {[_short(k) for k in unknown]}"] if unknown else [])
        raise RequestRejected(400, "; ".join(parts) + "; expected exactly request_id, task_id",
                              code="unknown_parameter" if unknown else "missing_parameter")
    request_id, task_id = value["request_id"], value["task_id"]
    check_request_id(request_id, "request_id")
    if not isinstance(task_id, str):
        raise RequestRejected(400, f"task_id must be a string, not {_json_type(task_id)}",
                              code="invalid_type", param="task_id")
    return InferRequest(request_id=request_id, task_id=task_id)


def check_request_id(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RequestRejected(400, f"{name} must be a string, not {_json_type(value)}",
                              code="invalid_type", param=name)
    if not _is_unicode(value):
        raise RequestRejected(400, f"{name} is not valid Unicode text", code="invalid_value",
                              param=name)
    if not 1 <= len(value) <= MAX_REQUEST_ID:
        raise RequestRejected(
            400, f"{name} must be 1 to {MAX_REQUEST_ID} characters long, not {len(value)}",
            code="invalid_value", param=name)
    return value


# Members OpenAI defines that this replica does not implement: accepted at these values only.
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
}
_CHAT_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY, "logprobs": (None, False), "top_logprobs": (None,), "tools": (None, []),
    "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
    "parallel_tool_calls": (None, True, False), "modalities": (None, ["text"]),
}
_TEXT_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY, "logprobs": (None,), "echo": (None, False), "suffix": (None,),
    "best_of": (None, 1),
}
_FREE = {"user", "metadata", "store"}
"""Members that only label a request: accepted whatever they hold."""
_PARAMS = {"model", "max_tokens", "stop", "temperature", "top_p", "seed", "stream",
           "stream_options"}


def parse_chat(value: Any, *, default_max_tokens: int, limit: int) -> ChatRequest:
    """A chat completion body; anything this replica would not honour is a 400."""
    _object(value)
    _members(value, {"messages", "max_completion_tokens"}, _CHAT_DEFAULT_ONLY)
    tokens = "max_tokens"
    if "max_completion_tokens" in value and value["max_completion_tokens"] is not None:
        value = {**value, "max_tokens": value["max_completion_tokens"]}
        tokens = "max_completion_tokens"  # a refusal names the member the client sent
    return ChatRequest(messages=_messages(value.get("messages")),
                       params=_params(value, default_max_tokens, limit, tokens))


def parse_text_completion(value: Any, *, default_max_tokens: int, limit: int) -> TextRequest:
    """A (legacy) text completion body: one prompt string, no chat template."""
    _object(value)
    _members(value, {"prompt"}, _TEXT_DEFAULT_ONLY)
    prompt = value.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one prompt is that prompt
    if not isinstance(prompt, str) or not prompt:
        raise RequestRejected(400, "prompt must be a non-empty string", code="invalid_value",
                              param="prompt")
    return TextRequest(prompt=prompt, params=_params(value, default_max_tokens, limit))


def _members(value: dict[str, Any], own: set[str], default_only: Mapping[str, Any]) -> None:
    unknown = sorted(set(value) - own - _PARAMS - set(default_only) - _FREE)
    if unknown:
        raise RequestRejected(400, f"unknown key(s) {[_short(k) for k in unknown]}",
                              code="unknown_parameter", param=_short(unknown[0]))
    for key, allowed in default_only.items():
        if key in value and not any(_same(value[key], a) for a in allowed):
            raise RequestRejected(
                400, f"{key}={_shown(value[key])} is not supported by this replica "
                     f"(only {' or '.join(json.dumps(a) for a in allowed)})",
                code="unsupported_parameter", param=key)


def _params(value: dict[str, Any], default_max_tokens: int, limit: int,
            tokens: str = "max_tokens") -> GenerationParams:
    model = value.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("model", "must be a string", model)
    max_tokens = value.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not _is_int(max_tokens) or not 1 <= max_tokens <= limit:
        raise _invalid(tokens, f"must be an integer from 1 to {limit}", max_tokens)
    stream = value.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream", "must be true or false", stream)
    options = value.get("stream_options")
    include_usage = False
    if options is not None:
        if (not isinstance(options, dict) or set(options) - {"include_usage"}
                or not isinstance(options.get("include_usage", False), bool)):
            raise _invalid("stream_options", "may only hold include_usage (a boolean)", options)
        include_usage = options.get("include_usage", False)
    return GenerationParams(model=model, max_tokens=max_tokens, stop=_stop(value.get("stop")),
                            sampling=_sampling(value), stream=bool(stream),
                            include_usage=include_usage)


def _stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else [] if value is None else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(
            isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stops):
        raise _invalid("stop", f"must be a string or a list of at most {MAX_STOP} strings, each "
                               f"of 1 to {MAX_STOP_CHARS} characters", value)
    return tuple(stops)


def _sampling(value: dict[str, Any]) -> Sampling:
    temperature, top_p, seed = value.get("temperature"), value.get("top_p"), value.get("seed")
    if temperature is not None and not (_is_number(temperature)
                                        and 0 <= temperature <= MAX_TEMPERATURE):
        raise _invalid("temperature", f"must be a number from 0 to {MAX_TEMPERATURE:g}",
                       temperature)
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise _invalid("top_p", "must be a number above 0 and at most 1", top_p)
    if seed is not None and not (_is_int(seed) and SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        raise _invalid("seed", "must be an integer of at most 64 bits", seed)
    return Sampling(temperature=float(temperature or 0), top_p=float(1 if top_p is None
                                                                      else top_p), seed=seed)


def _messages(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _invalid("messages", "must be a non-empty array", value)
    out = []
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise RequestRejected(400, f"{param} must be an object with role and content",
                                  code="invalid_value", param=param)
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise RequestRejected(400, f"{param}.role must be one of {CHAT_ROLES}",
                                  code="invalid_value", param=f"{param}.role")
        if isinstance(content, list):  # OpenAI content parts: only text parts mean anything here
            if not all(isinstance(p, dict) and p.get("type") == "text" and set(p) == {"type", "text"}
                       and isinstance(p["text"], str) for p in content):
                raise RequestRejected(400, f"{param}.content parts must be text parts",
                                      code="invalid_value", param=f"{param}.content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestRejected(400, f"{param}.content must be a string", code="invalid_type",
                                  param=f"{param}.content")
        out.append((role, content))
    return tuple(out)


def _invalid(param: str, rule: str, value: Any) -> RequestRejected:
    return RequestRejected(400, f"{param} {rule}, not {_shown(value)}",
                           code="invalid_value", param=param)


def _object(value: Any) -> None:
    if not isinstance(value, dict):
        raise RequestRejected(400, f"the body must be a JSON object, not {_json_type(value)}",
                              code="invalid_type")


def _same(value: Any, allowed: Any) -> bool:
    # JSON true is not 1: compare types as well as values.
    return type(value) is type(allowed) and value == allowed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A member's value as a refusal quotes it (short; a too-long integer by its length)."""
    return _short(json.dumps(value, default=repr))


def _json_type(value: Any) -> str:
    names: Mapping[type, str] = {dict: "an object", list: "an array", str: "a string",
                                 bool: "a boolean", int: "a number", float: "a number",
                                 type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
