"""Documents to token ids and labels (docs/experiment.md §3), and the per-token loss used everywhere.

A document renders with the tokenizer's chat template. Labels are -100 except the tokens of
each assistant answer through its first end-of-turn token. Where an answer starts is found by
encoding the conversation before it with the generation prompt, exactly as ``encode_prompt``
does at generation time, and requiring that encoding to be a prefix of the full one: training
and generation therefore see the same prompt tokens, or encoding fails loudly.

The end-of-turn token is the chat template's, never the tokenizer's ``eos_token`` (a GGUF
tokenizer may name ``<|im_start|>`` as its eos, and Llama 3's eos is not its ``<|eot_id|>``):
``end_of_turn`` renders a probe conversation and takes what closes the assistant turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from nscas.errors import RecipeError

IGNORE_INDEX = -100
"""The label of a token that is not trained on (PyTorch's cross-entropy default)."""
DEFAULT_MAX_LENGTH = 1024
ROLES = ("system", "user", "assistant")


class DocumentError(RecipeError):
    """A document cannot be encoded; ``doc_id`` names it."""

    def __init__(self, doc_id: str, message: str) -> None:
        super().__init__(f"document {doc_id}: {message}")
        self.doc_id = doc_id


class DocumentTooLong(DocumentError):
    """A document has more tokens than ``max_length``; nothing is ever truncated."""

    def __init__(self, doc_id: str, length: int, max_length: int) -> None:
        super().__init__(
            doc_id, f"{length} tokens, longer than max_length {max_length} (no truncation)"
        )
        self.length = length
        self.max_length = max_length


class TemplateError(RecipeError):
    """A chat template from which no single end-of-turn token can be derived; ``why`` says
    what the probe conversation showed."""

    def __init__(self, why: str) -> None:
        super().__init__(f"chat template: {why}")
        self.why = why


PROBE_USER = "Hi"
PROBE_ANSWER = "Hello"
"""The probe conversation ``end_of_turn`` renders (docs/format.md §6.9)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EndOfTurn:
    """The token that closes an assistant turn in a tokenizer's chat template."""

    token: str
    """Its text, as the template writes it (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``)."""
    id: int
    """Its token id."""

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "id": self.id}


def end_of_turn(tokenizer: Any) -> EndOfTurn:
    """The chat template's end-of-turn token: render one user turn with the generation prompt,
    and the same turn followed by the assistant answer ``PROBE_ANSWER``; the text the template
    writes after the answer, stripped of whitespace, must be exactly one token. Raises
    ``TemplateError`` otherwise."""
    from jinja2 import TemplateError as JinjaError

    user = [{"role": "user", "content": PROBE_USER}]
    try:
        prompt = _render(tokenizer, user, generation_prompt=True)
        full = _render(tokenizer, [*user, {"role": "assistant", "content": PROBE_ANSWER}],
                       generation_prompt=False)
    except (ValueError, TypeError, KeyError, JinjaError) as exc:  # none, or one that raises
        raise TemplateError(f"cannot render a probe conversation ({exc})") from None
    if not full.startswith(prompt):
        raise TemplateError("the generation prompt is not a prefix of the rendered conversation")
    tail = full[len(prompt):]
    at = tail.rfind(PROBE_ANSWER)
    if at < 0:
        raise TemplateError(f"the assistant answer {PROBE_ANSWER!r} does not appear after the "
                            "generation prompt")
    closing = tail[at + len(PROBE_ANSWER):].strip()
    if not closing:
        raise TemplateError("nothing closes an assistant turn, so no token can end one")
    ids = _encode_text(tokenizer, closing)
    if len(ids) != 1:
        raise TemplateError(f"an assistant turn is closed by {closing!r}, which is {len(ids)} "
                            "tokens, not one end-of-turn token")
    return EndOfTurn(token=closing, id=ids[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class Encoded:
    """One tokenised document."""

    input_ids: tuple[int, ...]
    """Token ids of the whole chat-template rendering."""
    labels: tuple[int, ...]
    """Same length as ``input_ids``: the id where trained on, ``IGNORE_INDEX`` elsewhere."""
    targets: int
    """Number of labelled tokens (the denominator of a mean loss)."""


def document_messages(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages of a record: a grounded task is one user turn and one assistant turn."""
    doc_id = str(record.get("id", "<no id>"))
    if "messages" in record:
        if "prompt" in record or "target" in record:
            raise DocumentError(doc_id, "has both messages and prompt/target")
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DocumentError(doc_id, "messages must be a non-empty list")
        result = []
        for index, message in enumerate(messages):
            if (not isinstance(message, Mapping) or message.get("role") not in ROLES
                    or not isinstance(message.get("content"), str)):
                raise DocumentError(
                    doc_id, f"message {index} must be {{role: one of {list(ROLES)}, content: str}}"
                )
            result.append({"role": message["role"], "content": message["content"]})
        return result
    prompt, target = record.get("prompt"), record.get("target")
    if not isinstance(prompt, str) or not isinstance(target, str):
        raise DocumentError(doc_id, "needs string 'prompt' and 'target', or 'messages'")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": target}]


def encode_document(tokenizer: Any, record: Mapping[str, Any], *, max_length: int,
                    turn: EndOfTurn | None = None) -> Encoded:
    """Token ids and labels of a grounded task line or a conversation record (docs/experiment.md §3).

    Labels run through the first ``turn`` token after each answer start; ``turn`` is the
    template's ``end_of_turn`` (derived here when not given: pass it when encoding many)."""
    doc_id = str(record.get("id", "<no id>"))
    messages = document_messages(record)
    turn = turn if turn is not None else end_of_turn(tokenizer)  # a broken template fails here
    input_ids = _encode_text(tokenizer, _render(tokenizer, messages, generation_prompt=False))
    if len(input_ids) > max_length:
        raise DocumentTooLong(doc_id, len(input_ids), max_length)

    labels = [IGNORE_INDEX] * len(input_ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt_ids = _encode_text(
            tokenizer, _render(tokenizer, messages[:index], generation_prompt=True)
        )
        start = len(prompt_ids)
        if input_ids[:start] != prompt_ids:
            raise DocumentError(
                doc_id, f"the generation prompt before message {index} does not encode to a "
                "prefix of the whole document; the chat template or tokenizer is inconsistent"
            )
        try:
            end = input_ids.index(turn.id, start)
        except ValueError:
            raise DocumentError(
                doc_id, f"assistant message {index} is not followed by the end-of-turn token "
                f"{turn.token!r}"
            ) from None
        labels[start : end + 1] = input_ids[start : end + 1]

    targets = sum(label != IGNORE_INDEX for label in labels)
    if targets == 0:
        raise DocumentError(doc_id, "has no assistant answer to train on")
    return Encoded(input_ids=tuple(input_ids), labels=tuple(labels), targets=targets)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids a model generates from: the prompt as a user turn plus the generation prompt."""
    return _encode_text(
        tokenizer, _render(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
    )


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """FP32 sum of next-token cross-entropy over labelled positions.

    ``logits`` is ``[..., seq, vocab]`` and ``labels`` ``[..., seq]``, unshifted: position t's
    logits predict label t+1, as in HF causal LMs.
    """
    shifted_logits = logits[..., :-1, :].float()
    shifted_labels = labels[..., 1:].to(shifted_logits.device)
    return F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.shape[-1]),
        shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``token_loss_sum`` of each row of a batch: ``[b, seq, vocab]`` and ``[b, seq]`` give
    ``[b]`` FP32 sums (padding labelled ``IGNORE_INDEX`` adds exactly zero)."""
    shifted_logits = logits[:, :-1, :].float()
    shifted_labels = labels[:, 1:].to(shifted_logits.device)
    per_token = F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.shape[-1]),
        shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return per_token.view(shifted_labels.shape).sum(dim=1)


def retention_loss(model: torch.nn.Module, encoded: Encoded) -> float:
    """Mean loss per labelled token of one document (FP32), without gradients.

    The model is put in eval mode for the forward pass and handed back in the mode it came in.
    """
    device = next(model.parameters()).device
    input_ids = torch.tensor([encoded.input_ids], dtype=torch.long, device=device)
    labels = torch.tensor([encoded.labels], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits = model(input_ids=input_ids).logits
            total = token_loss_sum(logits, labels)
    finally:
        model.train(was_training)
    return float(total.item()) / encoded.targets


def _render(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, generation_prompt: bool
            ) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )


def _encode_text(tokenizer: Any, text: str) -> list[int]:
    # The template already writes every special token; adding more would shift the labels.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
