"""Document tokenisation (docs/experiment.md §3): labels, targets, no truncation, prompt consistency."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoTokenizer

from nscas.errors import RecipeError
from nscas.recipes.common.tokenise import (
    IGNORE_INDEX,
    DocumentError,
    DocumentTooLong,
    Encoded,
    encode_document,
    encode_prompt,
    retention_loss,
    token_loss_sum,
)
from nscas.recipes.init.presets import build_model
from nscas.recipes.tokenizer.bpe import train_tokenizer

PROMPT = 'Return the city.\nRecords:\n[{"id":"K417","city":"Oslo","units":3}]'
TARGET = '{"city":"Oslo","units":3}'


def _texts() -> list[str]:
    rng = random.Random(3)
    out = []
    for _ in range(100):
        row = {"id": f"K{rng.randrange(100, 1000)}", "city": rng.choice(["Oslo", "Lima"]),
               "units": rng.randrange(20)}
        out.append("Return the city.\nRecords:\n" + json.dumps([row], separators=(",", ":")))
        out.append(json.dumps({"city": row["city"], "units": row["units"]},
                              separators=(",", ":")))
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    path = train_tokenizer(_texts(), vocab_size=384, out_dir=tmp_path_factory.mktemp("t") / "tok")
    return AutoTokenizer.from_pretrained(path)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def labelled_runs(encoded: Encoded) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of labelled positions."""
    runs, start = [], None
    for i, label in enumerate([*encoded.labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_grounded_task_labels_exactly_the_answer_and_end_of_turn(tok) -> None:
    record = {"id": "t1", "prompt": PROMPT, "target": TARGET, "weight": 8, "task": {}}
    encoded = encode_document(tok, record, max_length=1024)
    prompt_ids = ids(tok, f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n")
    answer_ids = [*ids(tok, TARGET), tok.eos_token_id]
    tail = ids(tok, "\n")
    assert list(encoded.input_ids) == prompt_ids + answer_ids + tail
    assert list(encoded.labels) == ([IGNORE_INDEX] * len(prompt_ids) + answer_ids
                                    + [IGNORE_INDEX] * len(tail))
    assert encoded.targets == len(answer_ids)
    assert tok.decode([t for t in encoded.labels if t != IGNORE_INDEX]) == TARGET + "<|im_end|>"
    assert encode_prompt(tok, PROMPT) == prompt_ids
    with pytest.raises(AttributeError):
        encoded.targets = 0  # type: ignore[misc]


def test_conversation_with_several_assistant_turns(tok) -> None:
    record = {"id": "c1", "weight": 1, "messages": [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Where?"},
        {"role": "assistant", "content": '{"city":"Lima"}'},
        {"role": "user", "content": "How many?"},
        {"role": "assistant", "content": '{"units":7}'},
    ]}
    encoded = encode_document(tok, record, max_length=1024)
    runs = labelled_runs(encoded)
    assert [tok.decode(list(encoded.input_ids[a:b])) for a, b in runs] == [
        '{"city":"Lima"}<|im_end|>', '{"units":7}<|im_end|>']
    assert encoded.targets == sum(b - a for a, b in runs)
    assert all(encoded.labels[i] == encoded.input_ids[i] for a, b in runs for i in range(a, b))
    # each run ends at the first end-of-turn token after it starts
    for a, b in runs:
        assert encoded.input_ids[b - 1] == tok.eos_token_id
        assert tok.eos_token_id not in encoded.input_ids[a : b - 1]
    # the unlabelled rest is exactly the template around the answers
    unlabelled = "".join(
        tok.decode([t]) for t, label in zip(encoded.input_ids, encoded.labels, strict=True)
        if label == IGNORE_INDEX)
    assert unlabelled == ("<|im_start|>system\nAnswer in JSON.<|im_end|>\n<|im_start|>user\n"
                          "Where?<|im_end|>\n<|im_start|>assistant\n\n<|im_start|>user\n"
                          "How many?<|im_end|>\n<|im_start|>assistant\n\n")


def test_labels_stop_at_the_first_end_of_turn(tok) -> None:
    record = {"id": "e1", "prompt": "p", "target": "a<|im_end|>b", "weight": 1}
    encoded = encode_document(tok, record, max_length=1024)
    (start, end), = labelled_runs(encoded)
    assert tok.decode(list(encoded.input_ids[start:end])) == "a<|im_end|>"
    assert encoded.targets == end - start


@pytest.mark.parametrize("target", [" spaced", "\n\nlines", "", "naïve 🙂"])
def test_encode_prompt_is_a_prefix_of_the_document(tok, target: str) -> None:
    encoded = encode_document(tok, {"id": "p", "prompt": PROMPT, "target": target},
                              max_length=1024)
    prompt_ids = encode_prompt(tok, PROMPT)
    assert list(encoded.input_ids[: len(prompt_ids)]) == prompt_ids
    assert all(label == IGNORE_INDEX for label in encoded.labels[: len(prompt_ids)])
    assert encoded.labels[len(prompt_ids)] != IGNORE_INDEX
    assert encoded.targets == len(ids(tok, target)) + 1


def test_too_long_is_an_error_naming_id_and_length(tok) -> None:
    record = {"id": "long-doc-42", "prompt": PROMPT, "target": TARGET}
    length = len(encode_document(tok, record, max_length=10_000).input_ids)
    assert encode_document(tok, record, max_length=length).targets > 0
    with pytest.raises(DocumentTooLong) as info:
        encode_document(tok, record, max_length=length - 1)
    assert isinstance(info.value, RecipeError)
    assert "long-doc-42" in str(info.value) and str(length) in str(info.value)
    assert (info.value.doc_id, info.value.length, info.value.max_length) == (
        "long-doc-42", length, length - 1)


@pytest.mark.parametrize("record, match", [
    ({"id": "m1", "prompt": "p"}, "prompt"),
    ({"id": "m2", "messages": []}, "non-empty"),
    ({"id": "m3", "messages": [{"role": "tool", "content": "x"}]}, "message 0"),
    ({"id": "m4", "messages": [{"role": "user", "content": 5}]}, "message 0"),
    ({"id": "m5", "messages": [{"role": "user", "content": "only a question"}]}, "no assistant"),
    ({"id": "m6", "messages": [{"role": "user", "content": "q"}], "prompt": "p"}, "both"),
])
def test_malformed_records_name_the_document(tok, record: dict, match: str) -> None:
    with pytest.raises(DocumentError, match=match) as info:
        encode_document(tok, record, max_length=1024)
    assert record["id"] in str(info.value)


def test_retention_loss_is_the_mean_over_labelled_tokens(tok) -> None:
    torch.set_num_threads(1)
    model = build_model("llama-tiny", vocab_size=len(tok), seed=5)
    model.train()
    encoded = encode_document(tok, {"id": "r", "prompt": PROMPT, "target": TARGET},
                              max_length=1024)
    loss = retention_loss(model, encoded)
    assert model.training  # mode handed back
    with torch.no_grad():
        model.eval()
        input_ids = torch.tensor([encoded.input_ids])
        logits = model(input_ids=input_ids).logits[0].double()
    # by hand: position t predicts token t+1 wherever token t+1 is labelled
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = [-log_probs[t - 1, encoded.labels[t]].item()
              for t in range(1, len(encoded.labels)) if encoded.labels[t] != IGNORE_INDEX]
    assert len(picked) == encoded.targets
    assert loss == pytest.approx(sum(picked) / len(picked), rel=1e-5)
    # an untrained model is near uniform over the vocabulary
    assert loss == pytest.approx(torch.log(torch.tensor(float(len(tok)))).item(), rel=0.05)
    total = token_loss_sum(model(input_ids=input_ids).logits, torch.tensor([encoded.labels]))
    assert total.dtype == torch.float32
    assert total.item() / encoded.targets == pytest.approx(loss, rel=1e-6)

