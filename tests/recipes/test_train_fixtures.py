"""Tiny inputs for the training tests: a local BPE tokenizer, a seeded 2-layer Llama saved as an
HF directory, and synthetic tokenised documents. Imported by the other ``test_train_*`` files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nscas.recipes.init.presets import save_hf_dir
from nscas.recipes.tokenizer.bpe import train_tokenizer
from nscas.recipes.train.config import TrainParams, WorkerSpec
from nscas.recipes.train.documents import IGNORE, TrainDocument, write_documents

TEXTS = [f"record {i} city Oslo units {i * 7 % 20} price {i % 19}" for i in range(40)]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""Environment for launched ranks: one thread each on the shared test machine."""


def make_tokenizer(root: Path) -> Path:
    return train_tokenizer(TEXTS, vocab_size=300, out_dir=root / "tokenizer")


def make_base(root: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """A 2-layer, 32-wide Llama with the tokenizer's vocabulary, saved with save_hf_dir."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    return save_hf_dir(model, tokenizer_dir, root / f"base-{seed}")


def make_documents(count: int, *, seed: int, vocab: int = 259, weights: tuple[int, ...] = (8, 1),
                   grounded: int | None = None, lengths: tuple[int, int] = (12, 40)) -> list[TrainDocument]:
    """``count`` random documents; the first ``grounded`` get weights[0], the rest weights[1];
    the second half of each document is labelled (as an answer would be)."""
    rng = random.Random(seed)
    grounded = count * 3 // 4 if grounded is None else grounded
    docs = []
    for i in range(count):
        n = rng.randrange(*lengths)
        ids = tuple(rng.randrange(3, vocab) for _ in range(n))
        answer = n // 2
        labels = tuple(IGNORE if p < answer else t for p, t in enumerate(ids))
        docs.append(TrainDocument(id=f"doc-{i:04d}", input_ids=ids, labels=labels,
                                  weight=weights[0] if i < grounded else weights[1]))
    return docs


def make_spec(root: Path, *, docs: list[TrainDocument], base: Path, tokenizer: Path,
              out: str = "out", **params: object) -> WorkerSpec:
    path = root / f"documents-{out}.jsonl"
    write_documents(path, docs)
    return WorkerSpec(
        base_dir=str(base), tokenizer_dir=str(tokenizer), documents=(str(path),),
        output_dir=str(root / out), params=TrainParams(**params),
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(root, tokenizer dir, base model dir), shared by a test module."""
    root = tmp_path_factory.mktemp("train")
    tokenizer = make_tokenizer(root)
    return root, tokenizer, make_base(root, tokenizer)


def test_fixture_documents_are_trainable() -> None:
    docs = make_documents(8, seed=1)
    assert [d.weight for d in docs] == [8] * 6 + [1] * 2
    assert all(d.labels[0] == IGNORE and d.targets == len(d.labels) - len(d.labels) // 2 for d in docs)
