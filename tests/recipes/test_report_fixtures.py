"""A complete, hand-built experiment for the report tests, without torch.

``prepare`` and ``commit`` run for real; checkpoints, training, evaluation and serving
receipts are built through the store API with chosen retained data, so every number the
report prints can be computed by hand here. Imported by the other ``test_report_*`` files.

The test set has 16 tasks: index i is family ``FAMILIES[i % 4]`` and variant ``(i // 4) % 4``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nscas.models.paired import contract, paired, retention
from nscas.objects.digests import Digest
from nscas.recipes.commit.recipe import RECIPE as COMMIT
from nscas.recipes.common.checker import check
from nscas.recipes.prepare.recipe import RECIPE as PREPARE
from nscas.recipes.report.recipe import RECIPE as REPORT
from nscas.recipes.serve.metrics import serving_claims
from nscas.recipes.train.journal import entry_hash
from nscas.runs.config import StepConfig
from nscas.runs.runner import StepResult, run_step
from nscas.store.writer import Store

CORRECT: dict[str, set[int]] = {
    "seed": {0, 4},
    "clean-single": {0, 1, 3, 4, 5, 7, 8, 9, 12, 13, 15},
    "damaged-single": {0, 1, 5, 8, 12, 13},
    "clean-pair": {0, 1, 3, 4, 5, 7, 8, 9, 12, 14},
}
"""Which test indices each arm answers correctly."""
SCRIPT_ANSWER = '<script>alert("owned")</script>'
"""The seed's answer to task 2: model output that must never run on the page."""
RETENTION = {
    "seed": [2.0, 2.5, 3.0, 3.5],
    "clean-single": [1.9, 2.6, 2.9, 3.4],
    "damaged-single": [2.1, 2.6, 3.1, 3.6],
    "clean-pair": [1.99, 2.48, 2.99, 3.48],
}
STEP_SECONDS = {
    "clean-single": [[1.0, 2.0, 3.0, 10.0]],
    "damaged-single": [[1.0, 1.0, 1.0, 1.0]],
    "clean-pair": [[4.0, 5.0, 6.0, 7.0], [4.1, 5.1, 6.1, 7.1]],
}
BYTES_PER_STEP = {"clean-single": 0, "damaged-single": 0, "clean-pair": 1000}
WALL_SECONDS = {"prepare": 60, "commit": 1, "train": 600, "evaluate": 120, "serve": 300}
"""Receipt wall times by recipe (started 2026-09-13T10:00:00Z)."""


SEED_WEIGHTS = {"model.embed_tokens.weight": [1.0, 2.0, 3.0, 4.0],
                "model.layers.0.mlp.weight": [0.5, -0.5, 1.0],
                "model.layers.1.mlp.weight": [2.0, 0.0, -2.0]}
CHANGES: dict[str, dict[str, tuple[int, float]]] = {
    "clean-single": {"model.layers.0.mlp.weight": (0, 0.25)},
    "damaged-single": {"model.embed_tokens.weight": (3, -1.0)},
    "clean-pair": {"model.layers.0.mlp.weight": (0, 0.25),
                   "model.layers.1.mlp.weight": (2, 0.125)},
}
"""(index, added value) per changed tensor of each trained arm (the parameters part)."""


def wrong_answer(index: int) -> str:
    """Even indices: not JSON (invalid); odd: a JSON object with the wrong schema."""
    return "the answer is 42" if index % 2 == 0 else '{"wrong": true}'


@dataclass(frozen=True, slots=True, kw_only=True)
class Experiment:
    store: Store
    inputs: dict[str, Digest]
    """The report's inputs by name."""
    prepare: StepResult
    checkpoints: dict[str, Digest]
    tests: list[dict[str, Any]] = field(default_factory=list)


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()


def _times(recipe: str) -> tuple[str, str]:
    return ("2026-09-13T10:00:00.000000+00:00",
            f"2026-09-13T10:{WALL_SECONDS[recipe] // 60:02d}:{WALL_SECONDS[recipe] % 60:02d}"
            ".000000+00:00")


def receipt(store: Store, recipe: str, *, inputs: Mapping[str, Digest], params: dict[str, Any],
            outputs: Mapping[str, Digest], claims: Mapping[str, Any], verifier: str,
            journals: tuple[Digest, ...] = (), status: str = "succeeded") -> Digest:
    code = store.put_record({"nscas": "tree/1", "entries": {}})
    action = store.put_record({"nscas": "action/1", "recipe": f"{recipe}@1", "code": str(code),
                               "inputs": {k: str(v) for k, v in sorted(inputs.items())},
                               "params": params})
    env = store.put_record({
        "nscas": "environment/1", "python": "3.12.0", "platform": "Linux-test", "host": "host-a",
        "packages": {}, "torch": {"version": "2.13.0"}, "determinism": {},
        "devices": [{"type": "cpu", "name": "x86_64", "count": 2}]})
    started, finished = _times(recipe)
    record: dict[str, Any] = {
        "nscas": "receipt/1", "action": str(action), "environment": str(env),
        "outputs": {k: str(v) for k, v in outputs.items()}, "journals": [str(j) for j in journals],
        "claims": {k: {"value": v, "verifier": verifier} for k, v in claims.items()},
        "started": started, "finished": finished, "status": status}
    if status == "failed":
        record["error"] = "it broke"
    return store.put_record(record)


def weights(arm: str) -> dict[str, np.ndarray]:
    """Each arm's tensors: the seed's ``SEED_WEIGHTS`` plus the arm's ``CHANGES``."""
    out = {name: np.array(values, dtype="<f4") for name, values in SEED_WEIGHTS.items()}
    for name, (index, delta) in CHANGES.get(arm, {}).items():
        out[name][index] += np.float32(delta)
    return out


def checkpoint(store: Store, tmp: Path, arm: str, parent: Digest | None) -> Digest:
    tensors = {name: {"dtype": "F32", "shape": list(a.shape),
                      "data": str(store.put_bytes(a.tobytes()))}
               for name, a in weights(arm).items()}
    params = store.put_record({"nscas": "params/1", "tensors": tensors})
    folder = tmp / f"ckpt-{arm}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"arm": arm}))
    files = store.put_tree(folder)
    return store.put_record({"nscas": "checkpoint/1", "files": str(files), "params": str(params),
                             "step": 0 if parent is None else 4,
                             "parent": str(parent) if parent else None})


def journal(store: Store, rank: int, world: int, seconds: list[float], per_step: int) -> Digest:
    entries: list[dict[str, Any]] = []
    prev = None

    def add(entry: dict[str, Any]) -> None:
        nonlocal prev
        chained = {**entry, "prev": prev}
        chained["hash"] = entry_hash(chained)
        entries.append(chained)
        prev = chained["hash"]

    add({"event": "agreed", "rank": rank, "step": 0, "parameters": "aa" * 32})
    for step, s in enumerate(seconds, start=1):
        add({"rank": rank, "step": step, "loss": 3.0 - 0.5 * step, "targets": 10,
             "weighted_targets": 50, "lr": 0.001, "grad_norm": 1.0, "documents": ["d"],
             "indices": [0], "tokens": 100, "seconds": s, "bytes_communicated": per_step})
    add({"event": "agreed", "rank": rank, "step": len(seconds), "parameters": "bb" * 32})
    blob = store.put_bytes(b"".join(
        json.dumps(e, sort_keys=True, separators=(",", ":")).encode() + b"\n" for e in entries))
    return store.put_record({"nscas": "journal/1", "rank": rank, "world": world,
                             "entries": str(blob), "head": prev})


def train_claims(store: Store, ckpt: Digest, seconds: list[float], per_step: int) -> dict[str, Any]:
    ordered = sorted(seconds)
    return {"parameter_digest": store.get_record(ckpt)["params"], "updates": len(seconds),
            "update_seconds": sum(seconds),
            "median_update_seconds": (ordered[1] + ordered[2]) / 2,
            "loop_seconds": sum(seconds) + 5.0, "peak_memory_bytes": 123456,
            "bytes_communicated": per_step * len(seconds), "targets": 40,
            "weighted_targets": 200, "tokens_per_second": 400 / sum(seconds),
            # The journals' losses 3.0 - 0.5 * step: 2.5, 2.0, 1.5, 1.0 over four steps.
            "first_loss": 2.5, "last_loss": 3.0 - 0.5 * len(seconds),
            "mean_loss": 3.0 - 0.25 * (len(seconds) + 1)}


def request_log(tasks: list[str]) -> bytes:
    """Four requests per phase; in ``failure`` requests 0 and 2 are refused once, then retried."""
    lines = []

    def add(phase: str, i: int, attempt: int, start: float, end: float, ok: bool) -> None:
        lines.append({"request_id": f"run-{phase}-{i}", "task_id": tasks[i], "phase": phase,
                      "attempt": attempt, "endpoint": f"http://127.0.0.1:{9000 + attempt}",
                      "start": start, "end": end, "wall_start": 1e9 + start,
                      "wall_end": 1e9 + end, "ok": ok, "status": 200 if ok else None,
                      "error": None if ok else "connection refused",
                      "output_ids": [i, 7] if ok else None, "cached": False if ok else None})

    for i in range(4):
        add("single", i, 1, float(i), i + 1.0 + 0.1 * i, True)
    for i in range(4):
        add("pair", i, 1, 10.0 + i // 2, 11.0 + i // 2, True)
    for i in range(4):
        start = 20.0 + i // 2
        if i % 2 == 0:
            add("failure", i, 1, start, start + 0.01, False)
            add("failure", i, 2, start + 0.01, start + 1.0, True)
        else:
            add("failure", i, 1, start, start + 1.0, True)
    return _jsonl(lines)


def build(store: Store, tmp: Path, *, override: Mapping[tuple[str, str], Any] | None = None,
          drop: frozenset[tuple[str, str]] = frozenset()) -> Experiment:
    """The whole experiment; ``override`` replaces claims: {(input name, claim): value};
    ``drop`` leaves claims out: {(input name, claim)} (a receipt from before the claim)."""
    override = dict(override or {})

    def claims_of(name: str, claims: dict[str, Any]) -> dict[str, Any]:
        return {c: v for c, v in {**claims, **{c: v for (n, c), v in override.items()
                                               if n == name}}.items() if (name, c) not in drop}

    prep = run_step(store, PREPARE, StepConfig(
        name="prepare", recipe="prepare", inputs={}, outputs={},
        params={"counts": {"test": 16, "dev": 8, "train": 32}, "replay_count": 8,
                "retention_count": 4}), {}, where="test")
    out = prep.outputs
    ckpts = {"seed": checkpoint(store, tmp, "seed", None)}
    inputs: dict[str, Digest] = {"prepare": prep.receipt}
    for arm, seconds in STEP_SECONDS.items():
        ckpts[arm] = checkpoint(store, tmp, arm, ckpts["seed"])
        world = len(seconds)
        journals = tuple(journal(store, r, world, s, BYTES_PER_STEP[arm])
                         for r, s in enumerate(seconds))
        docs = out["damaged"] if arm.startswith("damaged") else out["train"]
        inputs[f"train.{arm}"] = receipt(
            store, "train", inputs={"base": ckpts["seed"], "documents": docs,
                                    "replay": out["replay"]},
            params={"world": world, "device": "cpu", "nnodes": 1, "steps": 4},
            outputs={"checkpoint": ckpts[arm]}, journals=journals, verifier="journals",
            claims=claims_of(f"train.{arm}", train_claims(store, ckpts[arm], seconds[0],
                                                          BYTES_PER_STEP[arm])))
    commit = run_step(store, COMMIT, StepConfig(
        name="commit", recipe="commit", params={}, outputs={},
        inputs={"prepared": str(out["prepared"]), **{a: str(c) for a, c in ckpts.items()}}),
        {"prepared": out["prepared"], **ckpts}, where="test")
    inputs["commit"] = commit.receipt
    tests = [json.loads(line) for line in store.get_bytes(
        Digest.parse(store.get_record(out["test"])["records"])).decode().splitlines()]
    probes = store.get_record(out["retention"])["ids"]
    outcomes: dict[str, list[tuple[str, bool]]] = {}
    for arm, correct in CORRECT.items():
        texts = [t["target"] if i in correct else wrong_answer(i) for i, t in enumerate(tests)]
        if arm == "seed":
            texts[2] = SCRIPT_ANSWER
        results = [check(text, t["target"]) for text, t in zip(texts, tests, strict=True)]
        outcomes[arm] = [(t["id"], r.correct) for t, r in zip(tests, results, strict=True)]
        gens = [{"id": t["id"], "prompt_ids": [1], "output_ids": [2], "text": text,
                 "ended_with_eos": True, "hit_token_limit": False}
                for t, text in zip(tests, texts, strict=True)]
        timings = [{"id": t["id"], "seconds": 0.1, "tokens_per_second": 10.0} for t in tests]
        checks = [{"id": t["id"], "family": t["task"]["family"], "variant": t["task"]["variant"],
                   **r.to_dict()} for t, r in zip(tests, results, strict=True)]
        losses = [{"id": p, "loss": x} for p, x in zip(probes, RETENTION[arm], strict=True)]
        claims = score_claims(checks, RETENTION[arm])
        arm_inputs = {"model": ckpts[arm], "tasks": out["test"],
                      "commitment": commit.outputs["commitment"], "retention": out["retention"]}
        if arm != "seed":
            arm_inputs["baseline"] = inputs["evaluate.seed"]
            claims.update(versus_claims(outcomes["seed"], outcomes[arm], probes, arm))
        inputs[f"evaluate.{arm}"] = receipt(
            store, "evaluate", inputs=arm_inputs, params={"max_new_tokens": 96, "device": "cpu"},
            outputs={"generations": store.put_bytes(_jsonl(gens)),
                     "checks": store.put_bytes(_jsonl(checks)),
                     "retention": store.put_bytes(_jsonl(losses)),
                     "timings": store.put_bytes(_jsonl(timings))},
            claims=claims_of(f"evaluate.{arm}", claims), verifier="answers")
    log = request_log(store.get_record(out["dev"])["ids"])
    inputs["serve"] = receipt(
        store, "serve", inputs={"model": ckpts["clean-pair"], "tasks": out["dev"],
                                "commitment": commit.outputs["commitment"]},
        params={"replicas": 2, "requests": 4, "concurrency": 2, "device": "cpu"},
        outputs={"requests": store.put_bytes(log)}, verifier="throughput",
        claims=claims_of("serve", serving_claims(log)))
    return Experiment(store=store, inputs=inputs, prepare=prep, checkpoints=ckpts, tests=tests)


def score_claims(checks: list[dict[str, Any]], losses: list[float]) -> dict[str, Any]:
    by_family: dict[str, int] = {}
    by_variant: dict[str, int] = {}
    for c in checks:
        by_family[c["family"]] = by_family.get(c["family"], 0) + c["correct"]
        by_variant[str(c["variant"])] = by_variant.get(str(c["variant"]), 0) + c["correct"]
    return {"documents": len(checks), "correct": sum(c["correct"] for c in checks),
            "valid_json_objects": sum(c["valid_json_object"] for c in checks),
            "correct_by_family": by_family, "correct_by_variant": by_variant,
            "retention_mean_loss": sum(losses) / len(losses)}


def versus_claims(seed: list[tuple[str, bool]], arm: list[tuple[str, bool]], probes: list[str],
                  name: str) -> dict[str, Any]:
    cmp = paired(seed, arm)
    ret = retention(list(zip(probes, RETENTION["seed"], strict=True)),
                    list(zip(probes, RETENTION[name], strict=True)))
    verdict = contract(cmp.gain, cmp.test.p, ret.upper)
    return {"wins": cmp.wins, "losses": cmp.losses, "accuracy_gain": float(cmp.gain),
            "exact_one_sided_p": cmp.test.p_float, "retention_mean_change": ret.mean,
            "retention_standard_error": ret.se, "retention_upper": ret.upper,
            "retention_improved": ret.improved, "retention_worsened": ret.worsened,
            "contract": {k: v["passed"] for k, v in verdict.items() if k != "passed"}}


def run_report(exp: Experiment, *, params: dict[str, Any] | None = None,
               inputs: Mapping[str, Digest] | None = None, rerun: bool = False) -> StepResult:
    chosen = dict(exp.inputs if inputs is None else inputs)
    step = StepConfig(name="report", recipe="report", inputs={k: str(v) for k, v in chosen.items()},
                      params=params or {}, outputs={})
    return run_step(exp.store, REPORT, step, chosen, where="test", rerun=rerun)


def report_files(exp: Experiment, result: StepResult, dest: Path) -> Path:
    exp.store.materialise(result.outputs["report"], dest)
    return dest
