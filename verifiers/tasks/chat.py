"""The chat template of a checkpoint, rendered by the verifiers themselves (docs/experiment.md §3).

A prompt is given to a model as one user turn followed by the generation prompt, rendered
with the checkpoint's own chat template (``chat_template.jinja``, else the ``chat_template``
string of ``tokenizer_config.json``) and tokenised without adding special tokens (the template
writes them). Templates are Jinja; they render here in Jinja's immutable sandbox with the
options Hugging Face templates are written for (``trim_blocks``, ``lstrip_blocks``, loop
controls), so the verifier reaches the same token ids as the recipe without its code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ..core.errors import RecordParseError, VerifierError
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
MAX_TEMPLATE_BYTES = 1 << 20


class TemplateError(VerifierError):
    """A chat template that cannot be read or rendered."""

    def __init__(self, why: str) -> None:
        super().__init__(f"chat template: {why}")


def _raise(message: str) -> None:
    raise TemplateError(str(message))


def template_source(objects: Objects, entries: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The template text of a checkpoint's ``files`` entries and the special tokens it may
    name (``bos_token``, ``eos_token``, ...) from tokenizer_config.json."""
    config: Any = {}
    if CONFIG_FILE in entries:
        try:
            config = parse_json(objects.bytes(entries[CONFIG_FILE]["id"]), what=CONFIG_FILE)
        except (Unusable, RecordParseError) as exc:
            raise TemplateError(f"{CONFIG_FILE} is unusable ({exc})") from None
    if not isinstance(config, dict):
        config = {}
    text: Any = None
    if TEMPLATE_FILE in entries:
        data = objects.bytes(entries[TEMPLATE_FILE]["id"])
        if len(data) > MAX_TEMPLATE_BYTES:
            raise TemplateError(f"{TEMPLATE_FILE} is over {MAX_TEMPLATE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TemplateError(f"{TEMPLATE_FILE} is not UTF-8") from None
    else:
        text = config.get("chat_template")
    if not isinstance(text, str):
        raise TemplateError("the checkpoint has no chat template (no chat_template.jinja and no "
                            "chat_template string in tokenizer_config.json)")
    specials = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            specials[name] = token
    return text, specials


@lru_cache(maxsize=16)  # keyed by the template text itself, so never stale
def _compile(template: str) -> Callable[..., str]:
    """The template compiled once (each evaluation, replay and selection of one checkpoint asks
    again), rendering ``(messages, add_generation_prompt, **specials)`` to text; raises
    ``TemplateError``."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    try:
        compiled = env.from_string(template)
    except (JinjaError, RecursionError) as exc:
        raise TemplateError(f"cannot be compiled ({exc})") from None

    def render(**context: Any) -> str:
        try:
            return compiled.render(**context)
        except (JinjaError, RecursionError, TypeError, ValueError) as exc:
            raise TemplateError(f"cannot be rendered ({exc})") from None
    return render


def prompt_renderer(template: str, specials: Mapping[str, str]) -> Callable[[str], str]:
    """A function giving the text a model is given for a prompt: one user turn and the
    generation prompt. The template is compiled once; raises ``TemplateError``."""
    compiled = _compile(template)

    def render(prompt: str) -> str:
        return compiled(messages=[{"role": "user", "content": prompt}],
                        add_generation_prompt=True, **specials)
    return render


def conversation_renderer(template: str, specials: Mapping[str, str]
                          ) -> Callable[[list[dict[str, str]]], str]:
    """A function giving the text of a whole conversation (``{"role", "content"}`` messages),
    as training renders a document (no generation prompt); raises ``TemplateError``."""
    compiled = _compile(template)
    return lambda messages: compiled(messages=messages, add_generation_prompt=False, **specials)


def turns_renderer(template: str, specials: Mapping[str, str]
                   ) -> Callable[[list[dict[str, str]], bool], str]:
    """``(messages, generation_prompt) -> text``: any prefix of a conversation, with or
    without the generation prompt (where an answer starts); raises ``TemplateError``."""
    compiled = _compile(template)
    return lambda messages, prompt: compiled(messages=messages, add_generation_prompt=prompt,
                                             **specials)


PROBE_USER = "Hi"
PROBE_ANSWER = "Hello"
"""The probe conversation of docs/format.md §6.9."""


def end_of_turn_text(template: str, specials: Mapping[str, str]) -> str:
    """The text that closes an assistant turn (docs/format.md §6.9): what the template writes
    after the probe answer, whitespace stripped, once the generation prompt of the probe's
    user turn is known to be a prefix of the whole rendering. Raises ``TemplateError``."""
    compiled = _compile(template)
    user = [{"role": "user", "content": PROBE_USER}]
    prompt = compiled(messages=user, add_generation_prompt=True, **specials)
    full = compiled(messages=[*user, {"role": "assistant", "content": PROBE_ANSWER}],
                    add_generation_prompt=False, **specials)
    if not full.startswith(prompt):
        raise TemplateError("the generation prompt is not a prefix of the rendered conversation")
    tail = full[len(prompt):]
    at = tail.rfind(PROBE_ANSWER)
    if at < 0:
        raise TemplateError("the probe answer does not appear after the generation prompt")
    closing = tail[at + len(PROBE_ANSWER):].strip()
    if not closing:
        raise TemplateError("nothing closes an assistant turn")
    return closing


def end_of_turn(objects: Objects, entries: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    """``{"token", "id"}`` of a checkpoint's end-of-turn token, derived from its own template
    and its ``tokenizers`` tokenizer; raises ``TemplateError`` unless it is one token."""
    closing = end_of_turn_text(*template_source(objects, entries))
    ids = list(tokenizer.encode(closing, add_special_tokens=False).ids)
    if len(ids) != 1:
        raise TemplateError(f"an assistant turn is closed by {closing!r}, which is {len(ids)} "
                            "tokens, not one")
    return {"token": closing, "id": ids[0]}
