"""A generation stops at an end-of-turn token or at max_new_tokens: a cut answer is a finding."""

from __future__ import annotations

from typing import Any

from verifiers.evaluation.scoring import GENERATION_KEYS, Scored, generation_checks

EOT = 2


def _line(output: list[int], *, ended: bool, limit: bool) -> dict[str, Any]:
    return {"id": "t", "prompt_ids": [1], "output_ids": output, "text": "",
            "ended_with_eos": ended, "hit_token_limit": limit}


def _problems(line: dict[str, Any], max_new_tokens: int = 4) -> str:
    scored = Scored(ids=["t"], families=[], variants=[], results=[], generations=[line],
                    prompts=["p"])
    (check, *_) = generation_checks(scored, max_new_tokens=max_new_tokens, tokenizer=None,
                                    eos={EOT}, name="evaluate.x.answers", keys=GENERATION_KEYS)
    assert check.name == "evaluate.x.answers.generations"
    return "" if check.status == "passed" else check.message


def test_answers_that_stop_by_the_rule_pass() -> None:
    assert _problems(_line([5, 6, EOT], ended=True, limit=False)) == ""
    assert _problems(_line([5, 6, 7, 8], ended=False, limit=True)) == ""


def test_a_cut_answer_is_named() -> None:
    message = _problems(_line([5, 6], ended=False, limit=False))
    assert "stops after 2 tokens, neither at an end-of-turn token nor at max_new_tokens (4)" \
        in message


def test_contradicting_flags_and_overlong_answers_are_named() -> None:
    assert "hit_token_limit contradicts" in _problems(_line([5, 6], ended=False, limit=True))
    assert "exceed max_new_tokens" in _problems(_line([5, 6, 7, 8, 9], ended=False, limit=False))
