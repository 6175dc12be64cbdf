"""A real pipeline run (prepare, tokenizer, init, commit, two evaluations) for the verify tests,
and helpers to tamper with its store the way a careful tamperer would: through the store API,
so every new object is well formed and integrity holds.

The tests build data with nscas core; only ``verifiers/`` must stay independent of it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nscas.digests import Digest
from nscas.runner import StepResult
from nscas.store import Store
from tests.pipelines import evaluate_step, run_pipeline, tiny_pipeline

PIPELINE = (tiny_pipeline(test=16, dev=8, train=32, replay=8)
            + evaluate_step("eval-seed", max_new_tokens=16)
            + evaluate_step("eval-again", baseline="eval-seed", max_new_tokens=16, batch_size=4))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """The store of one pipeline run and what each step made."""

    root: Path
    """The directory holding ``.nscas``."""
    store: Store
    steps: dict[str, StepResult]

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def receipt(self, step: str) -> str:
        return str(self.steps[step].receipt)

    def output(self, step: str, name: str) -> str:
        return str(self.steps[step].outputs[name])

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))

    def jsonl(self, oid: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in
                self.store.get_bytes(Digest.parse(oid)).decode().splitlines()]

    def put_jsonl(self, lines: list[dict[str, Any]]) -> str:
        text = "".join(json.dumps(x, separators=(",", ":"), ensure_ascii=False) + "\n"
                       for x in lines)
        return str(self.store.put_bytes(text.encode()))

    def reput(self, oid: str, **changes: Any) -> str:
        """A copy of record ``oid`` with members replaced, stored (a new ID)."""
        record = self.record(oid)
        record.update(changes)
        return str(self.store.put_record(record))

    def copy(self, dest: Path) -> Path:
        """A copy of the whole store directory, for tests that damage it."""
        shutil.copytree(self.store_dir, dest / ".nscas")
        return dest / ".nscas"


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("verify-pipeline")
    store, steps = run_pipeline(root, PIPELINE, name="eval.toml")
    yield Pipeline(root=root, store=store, steps=steps)
    store.close()
