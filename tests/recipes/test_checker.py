"""The strict checker of docs/experiment.md §1: a truth table of answers against targets."""

from __future__ import annotations

import pytest

from nscas.errors import InvalidInput
from nscas.recipes.common.checker import MAX_ANSWER_BYTES, CheckResult, check

LOOKUP = '{"city":"Oslo","units":365}'
IDS = '{"ids":["A100","B200"]}'
NULLS = '{"city":null,"units":null}'

CORRECT = ("correct", True, True)
WRONG = ("wrong_schema_or_value", False, True)
INVALID = ("invalid_json_object", False, False)

TABLE = [
    # (answer, target, expected)
    (LOOKUP, LOOKUP, CORRECT),
    ('{"units": 365, "city": "Oslo"}', LOOKUP, CORRECT),  # key order is free
    ('  \n\t{"city":"Oslo","units":365}\r\n ', LOOKUP, CORRECT),  # JSON whitespace around
    ('{"city":"Oslo","units":365.0}', LOOKUP, WRONG),  # 365.0 is not 365
    ('{"city":"Oslo","units":3.65e2}', LOOKUP, WRONG),
    ('{"city":"Oslo","units":"365"}', LOOKUP, WRONG),
    ('{"city":"Oslo","units":366}', LOOKUP, WRONG),
    ('{"city":"oslo","units":365}', LOOKUP, WRONG),
    ('{"city":"Oslo"}', LOOKUP, WRONG),  # missing key
    ('{"city":"Oslo","units":365,"note":"x"}', LOOKUP, WRONG),  # extra key
    ('{"city":"Oslo","units":true}', '{"city":"Oslo","units":1}', WRONG),  # true is not 1
    ('{"city":"Oslo","units":1}', '{"city":"Oslo","units":true}', WRONG),
    ('{"city":"Oslo","units":0}', '{"city":"Oslo","units":false}', WRONG),
    (NULLS, NULLS, CORRECT),
    ('{"city":"null","units":null}', NULLS, WRONG),
    ('{"city":null,"units":0}', NULLS, WRONG),
    ('{"city":"","units":null}', NULLS, WRONG),
    (IDS, IDS, CORRECT),
    ('{"ids":["B200","A100"]}', IDS, WRONG),  # order of ids matters
    ('{"ids":["A100","B200","Z000"]}', IDS, WRONG),
    ('{"ids":[]}', '{"ids":[]}', CORRECT),
    ('{"ids":{}}', '{"ids":[]}', WRONG),
    ('{"ids":[["A100"],"B200"]}', IDS, WRONG),
    ('{"a":{"b":[1,2.0]}}', '{"a":{"b":[1,2.0]}}', CORRECT),
    ('{"a":{"b":[1,2]}}', '{"a":{"b":[1,2.0]}}', WRONG),  # type strict inside lists
    ('{"a":{"b":1,"c":1}}', '{"a":{"b":1}}', WRONG),  # extra key inside objects
    ('{"city":"Oslo","city":"Oslo","units":365}', LOOKUP, INVALID),  # duplicate keys
    ('{"a":{"b":1,"b":1}}', '{"a":{"b":1}}', INVALID),  # duplicates nested
    ('{"total":NaN}', '{"total":1}', INVALID),
    ('{"total":Infinity}', '{"total":1}', INVALID),
    ('{"total":-Infinity}', '{"total":1}', INVALID),
    ('{"total":1e400}', '{"total":1}', INVALID),  # overflows to Infinity
    ('{"total":-1e999}', '{"total":1}', INVALID),
    ('```json\n{"city":"Oslo","units":365}\n```', LOOKUP, INVALID),  # Markdown fence
    ('The answer is {"city":"Oslo","units":365}', LOOKUP, INVALID),
    ('{"city":"Oslo","units":365} done', LOOKUP, INVALID),
    ('{"city":"Oslo","units":365}{}', LOOKUP, INVALID),
    ("{'city':'Oslo','units':365}", LOOKUP, INVALID),
    ('{"city":"Oslo","units":365,}', LOOKUP, INVALID),
    ('\u00a0{"city":"Oslo","units":365}', LOOKUP, INVALID),  # not JSON whitespace
    ('\ufeff{"city":"Oslo","units":365}', LOOKUP, INVALID),  # byte-order mark
    ('[{"city":"Oslo","units":365}]', LOOKUP, INVALID),  # not an object
    ('"text"', LOOKUP, INVALID),
    ("365", '{"total":365}', INVALID),
    ("null", LOOKUP, INVALID),
    ("", LOOKUP, INVALID),
    ("   ", LOOKUP, INVALID),
    ('{"city":"Os\ud800","units":365}', LOOKUP, INVALID),  # lone surrogate: not UTF-8
]


@pytest.mark.parametrize(("answer", "target", "expected"), TABLE)
def test_truth_table(answer: str, target: str, expected: tuple[str, bool, bool]) -> None:
    result = check(answer, target)
    assert (result.reason, result.correct, result.valid_json_object) == expected


def test_size_limit_is_in_utf8_bytes() -> None:
    target = '{"note":"x"}'
    frame = len('{"note":""}')
    pairs = (MAX_ANSWER_BYTES - frame) // 2  # 16,378 two-byte characters plus one "x"
    at_limit = '{"note":"' + "é" * pairs + 'x"}'
    assert len(at_limit.encode()) == MAX_ANSWER_BYTES
    assert check(at_limit, target).reason == "wrong_schema_or_value"
    over = '{"note":"' + "é" * (pairs + 1) + '"}'
    assert len(over.encode()) == MAX_ANSWER_BYTES + 1
    assert len(over) < MAX_ANSWER_BYTES  # characters would pass; bytes do not
    assert check(over, target).reason == "invalid_json_object"
    padded = '{"note":"x"}' + " " * (MAX_ANSWER_BYTES - 12 + 1)  # whitespace counts too
    assert check(padded, target).reason == "invalid_json_object"
    assert check(padded[:-1], target).reason == "correct"


def test_deep_nesting_is_refused_the_same_way_at_any_stack_depth() -> None:
    deep = '{"a":' + "[" * 5000 + "]" * 5000 + "}"
    assert check(deep, '{"a":[]}').reason == "invalid_json_object"
    shallow = '{"a":' + "[" * 10 + "]" * 10 + "}"
    assert check(shallow, '{"a":[]}').reason == "wrong_schema_or_value"
    # Brackets inside strings are text, not nesting.
    text = '{"a":"' + "[" * 5000 + '"}'
    assert check(text, '{"a":"x"}').reason == "wrong_schema_or_value"


def test_result_shape() -> None:
    result = check(LOOKUP, LOOKUP)
    assert result == CheckResult(correct=True, valid_json_object=True, reason="correct")
    assert result.to_dict() == {"correct": True, "valid_json_object": True, "reason": "correct"}
    with pytest.raises(AttributeError):
        result.correct = False  # type: ignore[misc]


@pytest.mark.parametrize("target", ["", "[1]", '{"a":1,"a":2}', '{"a":NaN}', "not json"])
def test_bad_target_is_an_error(target: str) -> None:
    with pytest.raises(InvalidInput, match="target"):
        check("{}", target)
