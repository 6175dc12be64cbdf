"""A small but realistic published closure, built with the store API alone (no torch, no recipes).

Two checkpoints (a seed and a trained arm sharing one tensor and the config), tasks with their
JSONL, a prepare commitment naming the task sets, a commit naming both checkpoints by arm, a
training receipt with a hash-chained journal, and two evaluation receipts, the second citing
the first as its baseline. The target is the second evaluation's receipt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rfc8785
from safetensors.numpy import save_file

from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.store.writer import Store, init_store

ENVIRONMENT = {"nscas": "environment/1", "python": "3.11.7", "platform": "Linux-test",
               "packages": {"nscas": "0.1.0"}, "torch": None, "devices": [{"type": "cpu"}],
               "determinism": {}}


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """The source store and the IDs a test asserts on."""

    store: Store
    target: Digest
    seed: Digest
    trained: Digest
    train_receipt: Digest
    baseline: Digest
    weight_files: tuple[Digest, ...]
    tensors: tuple[Digest, ...]
    shared_tensor: Digest
    journal_entries: Digest


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in rows)


def _model_dir(path: Path, embed_seed: int) -> Path:
    path.mkdir()
    rng = np.random.default_rng(embed_seed)
    save_file({"embed.weight": rng.standard_normal((32, 64)).astype(np.float32),  # 8 KiB: a chunk
               "norm.weight": np.ones(8, dtype=np.float32)},  # the same in both checkpoints
              str(path / "model.safetensors"))
    (path / "config.json").write_text('{"hidden_size": 64, "model_type": "tiny"}\n')
    (path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}\n')
    return path


def _journal(store: Store) -> tuple[Digest, Digest]:
    entries, prev = [], None
    for step in range(2):
        entry = {"step": step, "loss": 2.5 - step, "prev": prev}
        entry["hash"] = hashlib.sha256(rfc8785.dumps(entry)).hexdigest()
        entries.append(entry)
        prev = entry["hash"]
    blob = store.put_bytes(jsonl(entries))
    return blob, store.put_record({"nscas": "journal/1", "rank": 0, "world": 1,
                                   "entries": str(blob), "head": prev})


def _receipt(store: Store, recipe: str, code: Digest, inputs: dict[str, Digest],
             outputs: dict[str, Digest], *, journals: tuple[Digest, ...] = (),
             claims: dict[str, Any] | None = None) -> Digest:
    started = "2025-01-01T00:00:00Z"
    action = store.put_record({"nscas": "action/1", "recipe": recipe, "code": str(code),
                               "inputs": {k: str(v) for k, v in inputs.items()}, "params": {}})
    return store.put_record({
        "nscas": "receipt/1", "action": str(action),
        "environment": str(store.put_record(ENVIRONMENT)),
        "outputs": {k: str(v) for k, v in outputs.items()}, "journals": [str(j) for j in journals],
        "claims": claims or {}, "started": started, "finished": started, "status": "succeeded"})


def build(root: Path) -> Published:
    store = init_store(root / "source")
    seed = put_checkpoint(store, _model_dir(root / "seed-model", 0), step=0, parent=None)
    trained = put_checkpoint(store, _model_dir(root / "trained-model", 1), step=2, parent=seed)
    src = root / "code"
    (src / "nscas/recipes/evaluate").mkdir(parents=True)
    (src / "nscas/recipes/evaluate/recipe.py").write_text("def run(ctx):\n    return None\n")
    code = store.put_tree(src)
    tasks = {}
    for role, n in (("test", 3), ("train", 2)):
        rows = [{"id": f"{role}-{i}", "prompt": f"question {i}", "target": {"answer": i}}
                for i in range(n)]
        records = store.put_bytes(jsonl(rows))
        tasks[role] = store.put_record({"nscas": "tasks/1", "role": role, "records": str(records),
                                        "count": n, "ids": [r["id"] for r in rows]})
    prepared = store.put_record({"nscas": "commitment/1", "purpose": "prepared inputs",
                                 "subjects": {k: str(v) for k, v in tasks.items()},
                                 "previous": None})
    commitment = store.put_record({"nscas": "commitment/1", "purpose": "candidates",
                                   "subjects": {"prepared": str(prepared), "seed": str(seed),
                                                "clean-single": str(trained)}, "previous": None})
    entries, journal = _journal(store)
    params = store.get_record(trained)["params"]
    train = _receipt(store, "train@1", code, {"base": seed, "tasks": tasks["train"]},
                     {"checkpoint": trained}, journals=(journal,),
                     claims={"parameter_digest": {"value": params, "verifier": "parameters"}})
    evaluations = {}
    for name, model in (("seed", seed), ("trained", trained)):
        ids = [f"test-{i}" for i in range(3)]
        gens = store.put_bytes(jsonl([{"id": i, "text": f"{name} says {i}"} for i in ids]))
        checks = store.put_bytes(jsonl([{"id": i, "correct": name == "trained"} for i in ids]))
        inputs = {"model": model, "tasks": tasks["test"], "commitment": commitment}
        if name == "trained":
            inputs["baseline"] = evaluations["seed"]
            inputs["training"] = train
        evaluations[name] = _receipt(store, "evaluate@2", code, inputs,
                                     {"generations": gens, "checks": checks},
                                     claims={"correct": {"value": 3 if name == "trained" else 0,
                                                         "verifier": "tasks"}})
    weight_files, tensors = [], []
    for ck in (seed, trained):
        tree = store.get_record(Digest.parse(store.get_record(ck)["files"]))
        weight_files.append(Digest.parse(tree["entries"]["model.safetensors"]["id"]))
        p = store.get_record(Digest.parse(store.get_record(ck)["params"]))
        tensors += [Digest.parse(t["data"]) for t in p["tensors"].values()]
    shared = Digest.parse(store.get_record(Digest.parse(params))["tensors"]["norm.weight"]["data"])
    return Published(store=store, target=evaluations["trained"], seed=seed, trained=trained,
                     train_receipt=train, baseline=evaluations["seed"],
                     weight_files=tuple(weight_files), tensors=tuple(sorted(set(tensors))),
                     shared_tensor=shared, journal_entries=entries)


@pytest.fixture(scope="session")
def _templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Published, Path]:
    """Built once: the published store (closed) and an empty store, copied by each test."""
    root = tmp_path_factory.mktemp("templates")
    pub = build(root)
    pub.store.close()
    init_store(root / "empty").close()
    return pub, root


@pytest.fixture
def published(_templates: tuple[Published, Path], tmp_path: Path) -> Published:
    """The published closure in a store of this test's own (it may be corrupted)."""
    pub, _root = _templates
    shutil.copytree(pub.store.root, tmp_path / "source" / ".nscas")
    store = Store(tmp_path / "source" / ".nscas")
    yield replace(pub, store=store)
    store.close()


@pytest.fixture
def fresh_store(_templates: tuple[Published, Path], tmp_path: Path) -> Store:
    shutil.copytree(_templates[1] / "empty" / ".nscas", tmp_path / "fresh" / ".nscas")
    store = Store(tmp_path / "fresh" / ".nscas")
    yield store
    store.close()


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by relative POSIX path."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}
