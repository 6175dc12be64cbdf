"""evaluate's ``timings`` lines as the verifiers check them (``evaluation.timing_checks``):
one ``{id, seconds, tokens_per_second}`` line per generation in task order, each rate its
output tokens over its seconds; a tampered line is a finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nscas.store.writer import init_store
from nscas.verifiers.evaluation.scoring import (
    GENERATION_KEYS,
    TIMED_GENERATION_KEYS,
    Scored,
    generation_checks,
    generation_keys,
    timing_checks,
)
from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.store import StoreSource

GENERATIONS = [{"id": "t1", "output_ids": [1, 2, 3, 4]}, {"id": "t2", "output_ids": [5]}]
TIMINGS = [{"id": "t1", "seconds": 0.5, "tokens_per_second": 8.0},
           {"id": "t2", "seconds": 0.25, "tokens_per_second": 4.0}]


def status(tmp_path: Path, lines: list[dict[str, Any]]) -> str:
    with init_store(tmp_path) as store:
        blob = store.put_bytes("".join(json.dumps(x) + "\n" for x in lines).encode())
    scored = Scored(ids=["t1", "t2"], families=[], variants=[], results=[],
                    generations=GENERATIONS, prompts=["a", "b"])
    return timing_checks(Objects(StoreSource(tmp_path / ".nscas")), str(blob), scored,
                         "t").status


def test_honest_timings_pass(tmp_path: Path) -> None:
    assert status(tmp_path, TIMINGS) == "passed"


@pytest.mark.parametrize("tamper", [
    lambda t: t[0].update(tokens_per_second=9.0),
    lambda t: t[1].update(seconds=-1.0),
    lambda t: t[1].update(id="t3"),
    lambda t: t[0].update(extra=1),
    lambda t: t.reverse(),
    lambda t: t.pop(),
])
def test_tampered_timings_fail(tmp_path: Path, tamper: Any) -> None:
    lines = [dict(x) for x in TIMINGS]
    tamper(lines)
    assert status(tmp_path, lines) == "failed"


def test_the_version_decides_where_timings_are() -> None:
    # evaluate@1 carried each generation's timing in its line and had no timings output;
    # from evaluate@2 on the lines hold none and the timings are an output of their own.
    assert generation_keys({"recipe": "evaluate@1"}) == TIMED_GENERATION_KEYS
    assert generation_keys({"recipe": "evaluate@2"}) == GENERATION_KEYS
    assert not GENERATION_KEYS & {"seconds", "tokens_per_second"}


@pytest.mark.parametrize(("rate", "expected"), [(8.0, "passed"), (9.0, "failed")])
def test_an_evaluate_1_line_is_checked_with_its_own_timing(rate: float, expected: str) -> None:
    line = {"id": "t1", "prompt_ids": [7], "output_ids": [1, 2, 3, 4], "text": "x",
            "ended_with_eos": False, "hit_token_limit": True, "seconds": 0.5,
            "tokens_per_second": rate}  # stopped by the limit: a cut answer is its own finding
    scored = Scored(ids=["t1"], families=[], variants=[], results=[], generations=[line],
                    prompts=["a"])
    checks = generation_checks(scored, max_new_tokens=4, tokenizer=None, eos=set(), name="t",
                               keys=generation_keys({"recipe": "evaluate@1"}))
    assert checks[0].name == "t.generations"
    assert checks[0].status == expected
