"""A tiny checkpoint and dev set in a real store, and real replica processes on 127.0.0.1.

The model is llama-tiny with seeded random weights and a tokenizer trained on the prompts.
Its matrices are scaled up six-fold: at the stock initialisation every prompt gets the same
run of newlines, which would let a test of "same outputs" pass by accident; sharpened, each
prompt gets its own varied answer, with logit gaps far above float noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.recipes.common import tasks as T
from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
from nscas.store.writer import init_store
from tests.waiting import STARTUP

TASKS = 24
MAX_NEW_TOKENS = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What the fixture stored: a checkpoint, its parameter digest and a dev set."""

    store_path: Path
    checkpoint: Digest
    model_digest: str
    tasks: Digest
    task_ids: tuple[str, ...]
    prompts: dict[str, str]
    """Task id -> prompt text."""
    model_dir: Path
    """The HF directory that was stored (for one-at-a-time reference generation)."""


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    import torch

    from nscas.recipes.init.presets import build_model, save_hf_dir
    from nscas.recipes.tokenizer.bpe import train_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("serve")
    dev = T.generate_role("dev", TASKS, T.DEFAULT_SEED, T.default_wordings())
    tok_dir = train_tokenizer([t.prompt for t in dev] + [t.target for t in dev],
                              vocab_size=600, out_dir=root / "tokenizer")
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tok_dir))
    with torch.no_grad():
        model = build_model("llama-tiny", vocab_size=vocab, seed=7)
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(6)
    model_dir = save_hf_dir(model, tok_dir, root / "model")
    store = init_store(root)
    try:
        checkpoint = put_checkpoint(store, model_dir, step=0, parent=None)
        records = store.put_bytes(T.records_jsonl(dev, 1))
        tasks = store.put_record({"nscas": "tasks/1", "role": "dev", "records": str(records),
                                  "count": len(dev), "ids": [t.id for t in dev]})
        digest = store.get_record(checkpoint)["params"]
    finally:
        store.close()
    return Served(store_path=store.root, checkpoint=checkpoint, model_digest=digest,
                  tasks=tasks, task_ids=tuple(t.id for t in dev),
                  prompts={t.id: t.prompt for t in dev}, model_dir=model_dir)


def start_replicas(group: ReplicaGroup, served: Served, count: int, *, timeout: float = STARTUP,
                   **options: object) -> list[str]:
    """Start ``count`` replicas of the fixture's checkpoint in ``group``; their endpoints."""
    opts = ReplicaOptions(**{"max_new_tokens": MAX_NEW_TOKENS, **options})  # type: ignore[arg-type]
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks), options=opts)
    started = [group.start(argv) for _ in range(count)]
    return group.wait_ready(started, timeout=timeout, model_digest=served.model_digest)


@pytest.fixture(scope="module")
def replica(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One replica process shared by a test module; its endpoint."""
    with ReplicaGroup(tmp_path_factory.mktemp("replica")) as group:
        yield start_replicas(group, served, 1)[0]
