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
from typing import Any

from .closure import Objects, Unusable
from .errors import RecordParseError, VerifierError
from .records import parse_json

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


def prompt_renderer(template: str, specials: Mapping[str, str]) -> Callable[[str], str]:
    """A function giving the text a model is given for a prompt: one user turn and the
    generation prompt. The template is compiled once; raises ``TemplateError``."""
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

    def render(prompt: str) -> str:
        try:
            return compiled.render(messages=[{"role": "user", "content": prompt}],
                                   add_generation_prompt=True, **specials)
        except (JinjaError, RecursionError, TypeError, ValueError) as exc:
            raise TemplateError(f"cannot be rendered ({exc})") from None
    return render
