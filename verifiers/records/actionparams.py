"""The params of each recipe's action, as the verifiers know them (docs/format.md §6).

Every param of an action must be one this table knows for that recipe and version, with a
value of its documented type and range: an unknown param, or a value no run could have had
(``precision = "bf11"``, a negative count), is a finding. Each known param is then either
rechecked (a check of the recipe's own uses it: a changed value shows as a failed check) or
only a rerun could recheck it: optimizer settings, precision, batching and thread counts shape
the computation without leaving a trace in the retained evidence. Those are listed, with
their values, in one check per receipt skipped as needing a model run, so an auditor sees
exactly which inputs of the run were taken on trust.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.results import Check

Validator = Callable[[Any], bool]


def _int(lo: int = 0, hi: int | None = None) -> Validator:
    return lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo
                      and (hi is None or v <= hi))


def _num(lo: float = 0.0, hi: float | None = None, *, open_lo: bool = False) -> Validator:
    def check(v: Any) -> bool:
        if not isinstance(v, int | float) or isinstance(v, bool):
            return False
        return (v > lo if open_lo else v >= lo) and (hi is None or v <= hi)
    return check


def _one_of(*values: Any) -> Validator:
    return lambda v: isinstance(v, str) and v in values


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _text(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 256


_DEVICE = re.compile(r"cpu|cuda(?::\d{1,2})?")
_ENDPOINT = re.compile(r"[A-Za-z0-9.-]{1,253}:\d{1,5}")


def _device(v: Any) -> bool:
    return isinstance(v, str) and _DEVICE.fullmatch(v) is not None


def _endpoint(v: Any) -> bool:
    return (isinstance(v, str) and _ENDPOINT.fullmatch(v) is not None
            and int(v.rpartition(":")[2]) <= 65535)


def _betas(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_num(0.0, 1.0)(b) and b < 1 for b in v)


def _steps_list(v: Any) -> bool:
    return isinstance(v, list) and all(_int(1)(s) for s in v) and v == sorted(set(v))


def _counts(v: Any) -> bool:
    return (isinstance(v, dict) and set(v) == {"test", "dev", "train"}
            and all(_int(0, 1_000_000)(n) for n in v.values()))


@dataclass(frozen=True, slots=True)
class Param:
    valid: Validator
    rechecked: bool
    """True when a check of the recipe uses the value; False when only a rerun could."""


def _r(valid: Validator) -> Param:
    return Param(valid, True)


def _rerun(valid: Validator) -> Param:
    return Param(valid, False)


_EVALUATE: dict[str, Param] = {
    "max_new_tokens": _r(_int(1)), "device": _r(_device),
    "batch_size": _rerun(_int(1)), "precision": _rerun(_one_of("bf16", "fp32")),
    "threads": _rerun(_int()),
}

PARAMS: dict[str, dict[str, Param]] = {
    "prepare@1": {
        "counts": _r(_counts), "seed": _r(_int()), "grounded_weight": _r(_int(1)),
        "replay_weight": _r(_int(1)), "replay_count": _r(_int()),
        "retention_count": _r(_int()), "standin_seed": _r(_int()),
        # Documents longer than this are refused by tokenising them with a model's template.
        "max_length": _rerun(_int(1)),
    },
    "tokenizer@1": {"vocab_size": _rerun(_int(1))},
    "init@1": {"preset": _rerun(_one_of("llama-tiny", "llama-small", "smollm2-1.7b")),
               "seed": _rerun(_int())},
    "commit@1": {"experiment": _r(_text)},
    # Rechecked: every tensor of the checkpoint must be of this dtype (<run>.gguf.parameters).
    "convert-gguf@1": {"dtype": _r(_one_of("float32"))},
    "train@1": {
        "steps": _r(_int(1)), "batch": _r(_int(1)), "schedule_seed": _r(_int()),
        "lr": _r(_num(0.0, open_lo=True)), "warmup": _r(_int()),
        "checkpoint_steps": _r(_steps_list), "world": _r(_int(1)), "device": _r(_device),
        "nnodes": _r(_int(1)), "node_rank": _r(_int()),
        "betas": _rerun(_betas), "eps": _rerun(_num(0.0, open_lo=True)),
        "weight_decay": _rerun(_num()), "clip": _rerun(_num(0.0, open_lo=True)),
        # Bounded by the journals' weighted target counts, not fixed by them.
        "grounded_weight": _rerun(_int(1)), "replay_weight": _rerun(_int(1)),
        "max_length": _rerun(_int(1)), "deterministic": _rerun(_bool),
        "gradient_checkpointing": _rerun(_bool), "bucket_mb": _rerun(_int(1)),
        "micro_batch": _rerun(_int(1)), "compile": _rerun(_bool),
        "rdzv_endpoint": _rerun(_endpoint), "timeout_seconds": _rerun(_int(1)), "checkpoint_timeout_seconds": _rerun(_int(1)),
        # Which step entries carry a digest, and which checkpoints carry a state: both checked.
        "parameter_digests": _r(_int()), "publish_state": _r(_steps_list),
        # The outer-step shape is rechecked from the journals; the outer optimizer and the
        # inner one leave no trace but the numbers (docs/experiment.md §3.13).
        "sync": _r(_one_of("ddp", "diloco")), "inner_steps": _r(_int(1)),
        "outer_lr": _rerun(_num(0.0, open_lo=True)),
        "outer_momentum": _rerun(lambda v: _num(0.0, 1.0)(v) and v < 1),
        "optimizer": _rerun(_one_of("adamw", "sgd")),
    },
    "evaluate@1": _EVALUATE,
    "evaluate@2": _EVALUATE,  # the same params; its timings moved to an output of their own
    "serve@1": {
        "replicas": _r(_int(1)), "requests": _r(_int(1)), "attempts": _r(_int(1, 2)),
        "device": _r(_device), "max_new_tokens": _rerun(_int(1)),
        "concurrency": _rerun(_int(1)), "warmup": _rerun(_int()),
        "timeout": _rerun(_num(0.0, open_lo=True)),
        "request_timeout": _rerun(_num(0.0, open_lo=True)), "threads": _rerun(_int()),
        "max_batch": _rerun(_int(1)), "max_wait_ms": _rerun(_num()),
        "precision": _rerun(_one_of("bf16", "fp32")),
        # Model instances per replica process: which one generated leaves no trace.
        "instances": _rerun(_int(1, 8)),
    },
    "report@1": {"price_per_host_hour": _r(_num()), "title": _r(_text)},
    "report@2": {"price_per_host_hour": _r(_num()), "title": _r(_text)},  # adds index.html
    # The selection is redone from the corpus with every one of these.
    "conversations@1": {
        "seed": _r(_int()), "replay_count": _r(_int()), "retention_count": _r(_int()),
        "max_length": _r(_int(1)), "min_turns": _r(_int(1)),
    },
    # max_new_tokens bounds every answer and its flags; the rest shape only the output ids.
    "probes@1": {
        "max_new_tokens": _r(_int(1)), "batch_size": _rerun(_int(1)),
        "device": _rerun(_one_of("cpu", "cuda")), "precision": _rerun(_one_of("bf16", "fp32")),
    },
}
"""Known params per ``recipe@version``; a version not listed here is not verifiable."""


RULES: dict[str, tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...]] = {
    "train@1": (
        ("node_rank is below nnodes", lambda p: p["node_rank"] < p["nnodes"]),
        ("a single node rendezvous on loopback or any port",
         lambda p: p["nnodes"] > 1 or p["node_rank"] == 0),
        ("micro_batch is at most batch / world",
         lambda p: p["micro_batch"] * p["world"] <= p["batch"]),
        ("compile runs stacked passes (micro_batch 2 or more)",
         lambda p: not p["compile"] or p["micro_batch"] >= 2),
        ("checkpoint_steps lie within steps",
         lambda p: all(s <= p["steps"] for s in p["checkpoint_steps"])),
        ("publish_state names checkpoint steps",
         lambda p: all(s in p["checkpoint_steps"] or s == p["steps"]
                       for s in p["publish_state"])),
        ("a ddp run takes one inner step per update",
         lambda p: p["sync"] == "diloco" or p["inner_steps"] == 1),
        ("a diloco run's steps are a multiple of inner_steps",
         lambda p: p["sync"] != "diloco" or p["steps"] % p["inner_steps"] == 0),
        ("a diloco run's checkpoint steps are multiples of inner_steps",
         lambda p: p["sync"] != "diloco"
         or all(s % p["inner_steps"] == 0 for s in p["checkpoint_steps"])),
        ("a diloco run publishes no optimizer state",
         lambda p: p["sync"] != "diloco" or not p["publish_state"]),
    ),
}
"""Relations between valid params that every run of the recipe satisfies."""


def params_checks(name: str, recipe: str, params: Mapping[str, Any]) -> list[Check]:
    """``<name>.params``: every param known and valid; ``<name>.params.rerun``: the params
    only a rerun rechecks, with their values (skipped, needing a model run)."""
    table = PARAMS.get(recipe)
    if table is None:
        return [Check.failed(f"{name}.params", f"recipe version {recipe!r} is not one the "
                             f"verifiers know ({', '.join(sorted(PARAMS))})")]
    unknown = sorted(set(params) - set(table))
    invalid = sorted(k for k, v in params.items() if k in table and not table[k].valid(v))
    problems = ([f"unknown param(s) {unknown}"] if unknown else []) + (
        [f"value(s) no run could have: {', '.join(f'{k}={params[k]!r}' for k in invalid)}"]
        if invalid else [])
    if not problems:
        for rule, holds in RULES.get(recipe, ()):
            try:
                if not holds(params):
                    problems.append(f"breaks the rule: {rule}")
            except KeyError:  # a param left at its default: the rule's other side is unknown
                continue
    checks = [Check.verdict(f"{name}.params", not problems, recomputed=len(params),
                            message="; ".join(problems))]
    rerun = {k: params[k] for k in sorted(params) if k in table and not table[k].rechecked}
    if rerun:
        checks.append(Check.skipped(
            f"{name}.params.rerun", "these params shape the computation but leave no trace a "
            "verifier can recompute without rerunning it: " + ", ".join(sorted(rerun)),
            needs="model", claimed=rerun))
    return checks
