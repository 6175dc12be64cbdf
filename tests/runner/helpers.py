"""Shared by the runner and recipe tests: tiny pipeline files and a store that ran them once."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store, init_store

TINY_COUNTS = {"test": 16, "dev": 8, "train": 32}
PREPARE_STEP = """
[[step]]
name = "prepare"
recipe = "prepare"
[step.params]
counts = { test = 16, dev = 8, train = 32 }
replay_count = 8
retention_count = 4
[step.outputs]
prepared = "coop/prepared"
"""
TOKENIZER_STEP = """
[[step]]
name = "tokenizer"
recipe = "tokenizer"
inputs = { prepared = "step.prepare.prepared" }
params = { vocab_size = 512 }
"""
INIT_STEP = """
[[step]]
name = "init"
recipe = "init"
inputs = { tokenizer = "step.tokenizer.tokenizer" }
params = { preset = "llama-tiny" }
outputs = { checkpoint = "coop/seed" }
"""
PIPELINE = PREPARE_STEP + TOKENIZER_STEP + INIT_STEP
"""prepare -> tokenizer -> init at the sizes the tests use (a few seconds on one core)."""
PREPARE_RECIPE = """
recipe = "prepare"
[params]
counts = { test = 16, dev = 8, train = 32 }
replay_count = 8
retention_count = 4
"""
"""A recipe file giving the same prepare action as the pipeline's first step."""


CHAIN = """
[[step]]
name = "a"
recipe = "probe"
params = { label = "a" }
[[step]]
name = "b"
recipe = "probe"
inputs = { source = "step.a.seen" }
[[step]]
name = "c"
recipe = "probe"
inputs = { source = "step.b.seen", first = "step.a.receipt" }
"""
"""a -> b -> c of the probe recipe (tests/runner/probe_recipe.py); c also reads a's receipt."""
RECEIPT = {"nscas": "receipt/1", "action": "blake3:" + "1" * 64,
           "environment": "blake3:" + "2" * 64, "outputs": {}, "journals": [], "claims": {},
           "started": "t", "finished": "t", "status": "succeeded"}
"""A schema-valid receipt/1 to vary one member of."""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def run_pipeline(directory: Path) -> tuple[Store, list[StepResult]]:
    """A new store in ``directory`` that has run ``PIPELINE`` once."""
    store = init_store(directory)
    return store, run_file(store, write(directory, "pipeline.toml", PIPELINE))


def copy_store(source: Path, dest: Path) -> Store:
    """An independent copy of the closed store whose ``.nscas`` lies in ``source``."""
    shutil.copytree(source / ".nscas", dest / ".nscas")
    return Store(dest / ".nscas")


def snapshot(store: Store) -> tuple[dict[str, int], int]:
    """What a run writes: object and ref counts, and ref-log length."""
    return store.counts(), len(store.ref_log())


def opened(home: Path) -> Store:
    """The store of a ``home`` fixture's directory."""
    return Store(home / ".nscas")
