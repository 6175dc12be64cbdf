"""The end-of-turn token comes from the chat template, not from ``eos_token`` (docs/format.md
§6.9): ChatML (SmolLM2, Qwen), Llama 3 and Gemma templates on tiny local tokenizers, the labels
and stop ids built from it, templates refused, and the verifiers deriving the same token."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nscas.recipes.common.generate import stop_ids
from nscas.recipes.common.tokenise import (
    IGNORE_INDEX,
    DocumentError,
    TemplateError,
    encode_document,
    end_of_turn,
)
from nscas.verifiers.tasks.chat import TemplateError as VerifierTemplateError
from nscas.verifiers.tasks.chat import end_of_turn_text

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
GEMMA = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
NO_TURN_END = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}assistant: {% endif %}")
TWO_TOKENS = QWEN.replace("'<|im_end|>' + '\n'", "'<|im_end|><|endoftext|>'")


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    template: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    turn_end: str


FAMILIES = {
    # SmolLM2 as transformers reads its GGUF file: eos named <|im_start|>.
    "smollm2": Family(template=SMOLLM2, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                      bos=None, eos="<|im_start|>", turn_end="<|im_end|>"),
    "qwen": Family(template=QWEN, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                   bos=None, eos="<|endoftext|>", turn_end="<|im_end|>"),
    "llama3": Family(template=LLAMA3, specials=("<|begin_of_text|>", "<|end_of_text|>",
                                                "<|start_header_id|>", "<|end_header_id|>",
                                                "<|eot_id|>"),
                     bos="<|begin_of_text|>", eos="<|end_of_text|>", turn_end="<|eot_id|>"),
    "gemma": Family(template=GEMMA, specials=("<pad>", "<eos>", "<bos>", "<start_of_turn>",
                                              "<end_of_turn>"),
                    bos="<bos>", eos="<eos>", turn_end="<end_of_turn>"),
}
TEXTS = ["Hi there, how are you?", "Hello! I am fine.", "Return the city of record K417.",
         '{"city":"Oslo","units":3}', "You are a helpful AI assistant named SmolLM"] * 4


def build(directory: Path, family: Family, *, template: str | None = None) -> Path:
    """A byte-level BPE tokenizer with the family's special tokens and chat template, saved as
    a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, template)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=family.eos,
                                   bos_token=family.bos)
    fast.chat_template = template if template is not None else family.template
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Family, Path]:
    name = request.param
    return name, FAMILIES[name], build(tmp_path_factory.mktemp(name), FAMILIES[name])


def test_the_turn_end_is_the_templates_not_the_eos(family) -> None:
    _, fam, directory = family
    tok = AutoTokenizer.from_pretrained(directory)
    turn = end_of_turn(tok)
    assert turn.token == fam.turn_end
    assert turn.id == tok.convert_tokens_to_ids(fam.turn_end)
    if fam.eos != fam.turn_end:
        assert tok.eos_token_id != turn.id
    assert stop_ids(tok) == {turn.id, tok.eos_token_id}


def test_labels_end_at_the_turn_end_token(family) -> None:
    *_, directory = family
    tok = AutoTokenizer.from_pretrained(directory)
    turn = end_of_turn(tok)
    answer = '{"city":"Oslo","units":3}'
    encoded = encode_document(tok, {"id": "d", "prompt": "Return the city.", "target": answer},
                              max_length=1024)
    labelled = [i for i, label in enumerate(encoded.labels) if label != IGNORE_INDEX]
    assert labelled == list(range(labelled[0], labelled[-1] + 1))  # one run
    assert encoded.input_ids[labelled[-1]] == turn.id
    assert tok.decode([encoded.input_ids[i] for i in labelled[:-1]]) == answer
    assert encode_document(tok, {"id": "d", "prompt": "Return the city.", "target": answer},
                           max_length=1024, turn=turn) == encoded


def test_the_verifier_derives_the_same_token_on_its_own(family) -> None:
    _, fam, directory = family
    tok = AutoTokenizer.from_pretrained(directory)
    specials = {name: getattr(tok, name) for name in ("bos_token", "eos_token")
                if getattr(tok, name) is not None}
    text = end_of_turn_text(fam.template, specials)
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids
    assert (text, ids) == (fam.turn_end, [end_of_turn(tok).id])


@pytest.mark.parametrize(("template", "why"), [
    (NO_TURN_END, "nothing closes an assistant turn"),
    (TWO_TOKENS, "which is 2 tokens, not one"),
    ("{{ raise_exception('no chat here') }}", "cannot render a probe conversation"),
])
def test_a_template_without_one_end_of_turn_token_is_refused(
        tmp_path: Path, template: str, why: str) -> None:
    tok = AutoTokenizer.from_pretrained(build(tmp_path, FAMILIES["qwen"], template=template))
    with pytest.raises(TemplateError) as caught:
        end_of_turn(tok)
    assert why in caught.value.message and "\n" not in caught.value.message
    with pytest.raises(TemplateError):
        encode_document(tok, {"id": "d", "prompt": "p", "target": "t"}, max_length=1024)
    with pytest.raises(TemplateError):
        stop_ids(tok)
    if template != TWO_TOKENS:  # two tokens is found by the tokenizer, not the text
        with pytest.raises(VerifierTemplateError):
            end_of_turn_text(template, {})


def test_an_answer_missing_its_turn_end_names_the_token(tmp_path: Path) -> None:
    # A template that drops the turn end after an assistant message with a marker in it.
    template = QWEN.replace("message['content'] + '<|im_end|>'",
                            "message['content'] + ('' if 'DROP' in message['content'] "
                            "else '<|im_end|>')")
    tok = AutoTokenizer.from_pretrained(build(tmp_path, FAMILIES["qwen"], template=template))
    with pytest.raises(DocumentError, match=re.escape(
            "not followed by the end-of-turn token '<|im_end|>'")):
        encode_document(tok, {"id": "d", "prompt": "p", "target": "DROP"}, max_length=1024)
