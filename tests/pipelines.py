"""Pipeline files for tests: the tiny prepare → tokenizer → init → commit chain and the
evaluate and serve steps that follow it, rendered as TOML text for ``run_file``, and
``run_pipeline`` to run one in a fresh store.

Each test file picks its own sizes and steps; these builders only keep the wiring (which step
output feeds which input) in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store, init_store


def run_pipeline(root: Path, text: str, *, name: str = "pipeline.toml"
                 ) -> tuple[Store, dict[str, StepResult]]:
    """Write ``text`` to ``root/name``, make a fresh store at ``root`` and run every step.

    Returns the open store (the caller closes it) and step name -> result.
    """
    (root / name).write_text(text)
    store = init_store(root)
    return store, {r.step: r for r in run_file(store, root / name)}


def _value(value: Any) -> str:
    # JSON strings, integers and booleans are also valid TOML; dicts become inline tables.
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def step(name: str, recipe: str, *, inputs: Mapping[str, str] | None = None,
         params: Mapping[str, Any] | None = None,
         outputs: Mapping[str, str] | None = None) -> str:
    """One ``[[step]]`` table; empty sections are left out."""
    lines = ["[[step]]", f'name = "{name}"', f'recipe = "{recipe}"']
    for key, table in (("inputs", inputs), ("params", params), ("outputs", outputs)):
        if table:
            lines.append(f"{key} = {_value(table)}")
    return "\n".join(lines) + "\n"


def prepare_step(*, test: int = 8, dev: int = 4, train: int = 8, replay: int = 4,
                 retention: int = 4, outputs: Mapping[str, str] | None = None) -> str:
    """The ``prepare`` step with these split sizes."""
    return step("prepare", "prepare", outputs=outputs, params={
        "counts": {"test": test, "dev": dev, "train": train},
        "replay_count": replay, "retention_count": retention})


def tokenizer_step(*, vocab: int = 512) -> str:
    """The ``tokenizer`` step, trained on the prepared data."""
    return step("tokenizer", "tokenizer", inputs={"prepared": "step.prepare.prepared"},
                params={"vocab_size": vocab})


def init_step(*, preset: str | None = None, outputs: Mapping[str, str] | None = None) -> str:
    """The ``init`` step (the recipe's default preset unless ``preset`` is given)."""
    return step("init", "init", inputs={"tokenizer": "step.tokenizer.tokenizer"},
                params={"preset": preset} if preset else None, outputs=outputs)


def commit_step() -> str:
    """The ``commit`` step over the prepared data and the seed checkpoint."""
    return step("commit", "commit",
                inputs={"prepared": "step.prepare.prepared", "seed": "step.init.checkpoint"})


def tiny_pipeline(*, test: int = 8, dev: int = 4, train: int = 8, replay: int = 4,
                  retention: int = 4, vocab: int = 512, preset: str | None = None) -> str:
    """prepare → tokenizer → init → commit; add evaluate or serve steps after it."""
    return (prepare_step(test=test, dev=dev, train=train, replay=replay, retention=retention)
            + tokenizer_step(vocab=vocab) + init_step(preset=preset) + commit_step())


def evaluate_step(name: str, *, tasks: str = "test", commitment: bool = True,
                  retention: bool = True, baseline: str | None = None, **params: Any) -> str:
    """An ``evaluate`` of the seed checkpoint on prepare's ``tasks`` split; ``baseline`` names
    an earlier evaluate step to compare against."""
    inputs = {"model": "step.init.checkpoint", "tasks": f"step.prepare.{tasks}"}
    if commitment:
        inputs["commitment"] = "step.commit.commitment"
    if retention:
        inputs["retention"] = "step.prepare.retention"
    if baseline:
        inputs["baseline"] = f"step.{baseline}.receipt"
    return step(name, "evaluate", inputs=inputs, params=params)


def serve_step(name: str = "serve", *, tasks: str = "dev", **params: Any) -> str:
    """A ``serve`` benchmark of the seed checkpoint on prepare's ``tasks`` split."""
    return step(name, "serve", params=params, inputs={
        "model": "step.init.checkpoint", "tasks": f"step.prepare.{tasks}",
        "commitment": "step.commit.commitment"})
