"""The local BPE tokenizer: determinism, special tokens, the chat template, AutoTokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from nscas.errors import DestinationExists, InvalidInput
from nscas.recipes.tokenizer.bpe import (
    CHAT_TEMPLATE,
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    train_tokenizer,
)


def corpus(n: int = 150, seed: int = 0) -> list[str]:
    """Prompt-like texts with JSON records and compact JSON answers."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        rows = [
            {"id": f"{chr(65 + rng.randrange(26))}{rng.randrange(100, 1000)}",
             "city": rng.choice(["Oslo", "Lima", "Kyoto", "Accra"]),
             "units": rng.randrange(20)}
            for _ in range(5)
        ]
        texts.append("Answer with one JSON object. Find the record.\nRecords:\n"
                     + json.dumps(rows, separators=(",", ":")))
        texts.append(json.dumps({"city": rows[0]["city"], "units": rows[0]["units"]},
                                separators=(",", ":")))
    return texts


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(corpus(), vocab_size=400, out_dir=tmp_path_factory.mktemp("t") / "tok")


@pytest.fixture(scope="module")
def tok(tok_dir: Path):
    return AutoTokenizer.from_pretrained(tok_dir)


def test_same_inputs_give_identical_files(tok_dir: Path, tmp_path: Path) -> None:
    shuffled = corpus()
    random.Random(7).shuffle(shuffled)
    again = train_tokenizer(shuffled, vocab_size=400, out_dir=tmp_path / "again")
    names = sorted(p.name for p in tok_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "tokenizer.json" in names
    for name in names:
        assert (tok_dir / name).read_bytes() == (again / name).read_bytes(), name
    other = train_tokenizer(corpus(seed=1), vocab_size=400, out_dir=tmp_path / "other")
    assert (other / "tokenizer.json").read_bytes() != (tok_dir / "tokenizer.json").read_bytes()


def test_vocabulary_and_special_tokens(tok) -> None:
    assert len(tok) == 400
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert tok.convert_tokens_to_ids(token) == expected_id
        assert tok(token, add_special_tokens=False)["input_ids"] == [expected_id]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.bos_token is None
    ids = tok("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1 and ids.count(2) == 1
    # nothing is added around a plain encoding
    assert tok("hi", add_special_tokens=True)["input_ids"] == tok(
        "hi", add_special_tokens=False)["input_ids"]


def test_byte_level_round_trip(tok) -> None:
    text = 'Tokyo → 東京 {"units":17} naïve 🙂\n\ttabs  and  spaces '
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_chat_template_renders_chatml(tok) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
    ]
    full = tok.apply_chat_template(messages, tokenize=False)
    assert full == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
                    "<|im_start|>assistant\nA1<|im_end|>\n")
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert tok.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("answer", ['{"ids":[]}', " leading space", "\n\nnewlines", "", "东京"])
def test_prompt_rendering_is_a_prefix_of_the_full_rendering(tok, answer: str) -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": answer},
    ]
    full = tok.apply_chat_template(messages, tokenize=False)
    for k in (1, 3):
        prompt = tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
        assert full.startswith(prompt)
        assert full[len(prompt):].startswith(messages[k]["content"] + "<|im_end|>\n")
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        assert full_ids[: len(prompt_ids)] == prompt_ids


def test_saved_directory_loads_with_autotokenizer(tok_dir: Path, tok) -> None:
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tok_dir.iterdir()}
    text = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_bad_inputs_are_refused(tmp_path: Path, tok_dir: Path) -> None:
    with pytest.raises(InvalidInput, match="at least 259"):
        train_tokenizer(corpus(), vocab_size=MIN_VOCAB_SIZE - 1, out_dir=tmp_path / "a")
    with pytest.raises(InvalidInput, match="at least one text"):
        train_tokenizer([], vocab_size=400, out_dir=tmp_path / "b")
    with pytest.raises(InvalidInput, match="item 1"):
        train_tokenizer(["a", 3], vocab_size=400, out_dir=tmp_path / "c")  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="not one string"):
        train_tokenizer("abc", vocab_size=400, out_dir=tmp_path / "d")
    with pytest.raises(DestinationExists):
        train_tokenizer(corpus(), vocab_size=400, out_dir=tok_dir)
    assert not any((tmp_path / name).exists() for name in "abcd")
