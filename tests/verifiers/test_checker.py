"""The strict answer checker's truth table and the task rules of docs/experiment.md §1."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nscas.verifiers.core.errors import TaskError
from nscas.verifiers.tasks.checker import (
    MAX_ANSWER_BYTES,
    check_answer,
    check_task,
    compute_target,
    damaged_target,
    generate_case,
    is_damaged,
    target_text,
    task_identity,
    visible_records,
)

OK, BAD, INV = "correct", "wrong_schema_or_value", "invalid_json_object"

TRUTH_TABLE = [
    # (answer, target, reason)
    ('{"total": 365}', '{"total":365}', OK),
    (' \n\t{"total":365}\r\n ', '{"total":365}', OK),
    ('{"total": 365.0}', '{"total":365}', BAD),
    ('{"total": 365}', '{"total":365.0}', BAD),
    ('{"total": 3.65e2}', '{"total":365.0}', OK),
    ('{"total": true}', '{"total":1}', BAD),
    ('{"total": 1}', '{"total":true}', BAD),
    ('{"total": "365"}', '{"total":365}', BAD),
    ('{"total": 365, "note": "x"}', '{"total":365}', BAD),
    ("{}", '{"total":365}', BAD),
    ('{"city": null, "units": null}', '{"city":null,"units":null}', OK),
    ('{"units": null, "city": null}', '{"city":null,"units":null}', OK),
    ('{"city": null, "units": 0}', '{"city":null,"units":null}', BAD),
    ('{"ids": ["A1", "B2"]}', '{"ids":["A1","B2"]}', OK),
    ('{"ids": ["B2", "A1"]}', '{"ids":["A1","B2"]}', BAD),
    ('{"ids": []}', '{"ids":[]}', OK),
    ('{"ids": [1]}', '{"ids":[1.0]}', BAD),
    ('{"ids": {"a": 1}}', '{"ids":{"a":1.0}}', BAD),
    ('{"ids": ["A1", "B2", "Z000"]}', '{"ids":["A1","B2"]}', BAD),
    ('{"total": 1, "total": 1}', '{"total":1}', INV),
    ('{"total": NaN}', '{"total":1}', INV),
    ('{"total": Infinity}', '{"total":1}', INV),
    ('{"total": -Infinity}', '{"total":1}', INV),
    ('{"total": 1e400}', '{"total":1}', INV),
    ("[1]", '{"total":1}', INV),
    ('"total"', '{"total":1}', INV),
    ("null", '{"total":1}', INV),
    ("", '{"total":1}', INV),
    ("hello", '{"total":1}', INV),
    ('{"total": 1} thanks', '{"total":1}', INV),
    ('Answer: {"total": 1}', '{"total":1}', INV),
    ('```json\n{"total": 1}\n```', '{"total":1}', INV),
    ('{"total": 1}{"total": 1}', '{"total":1}', INV),
    ("{'total': 1}", '{"total":1}', INV),
    ('{"total": 1,}', '{"total":1}', INV),
]


@pytest.mark.parametrize("answer,target,reason", TRUTH_TABLE)
def test_truth_table(answer: str, target: str, reason: str) -> None:
    result = check_answer(answer, target)
    assert result.reason == reason
    assert result.correct == (reason == OK)
    assert result.valid_json_object == (reason != INV)
    assert result.to_dict() == {"correct": reason == OK, "valid_json_object": reason != INV,
                                "reason": reason}


def test_target_may_be_parsed_object() -> None:
    assert check_answer('{"total": 5}', {"total": 5}).correct
    assert not check_answer('{"total": 5.0}', {"total": 5}).correct


def test_size_limit_counts_utf8_bytes() -> None:
    body = '{"city":"é","units":null}'
    pad = MAX_ANSWER_BYTES - len(body.encode("utf-8"))
    at_limit = body + " " * pad
    assert len(at_limit.encode("utf-8")) == MAX_ANSWER_BYTES
    assert check_answer(at_limit, {"city": "é", "units": None}).correct
    over = body + " " * (pad + 1)
    assert check_answer(over, {"city": "é", "units": None}).reason == INV
    # 'é' is 2 bytes: the same character count fails once counted in bytes.
    assert len(at_limit) < MAX_ANSWER_BYTES


def test_lone_surrogate_is_not_valid_text() -> None:
    assert check_answer('{"a": "\ud800"}', {"a": "x"}).reason == INV


ROWS = [
    {"id": "K512", "city": "Oslo", "units": 3, "price": 7, "status": "ready", "priority": 4},
    {"id": "B130", "city": "Lima", "units": 0, "price": 2, "status": "closed", "priority": 9},
    {"id": "A777", "city": "Suva", "units": 12, "price": 1, "status": "ready", "priority": 9},
    {"id": "Q101", "city": "Bern", "units": 5, "price": 19, "status": "pending", "priority": 1},
    {"id": "C400", "city": "Riga", "units": 19, "price": 3, "status": "ready", "priority": 4},
]


def case(family: str, query: str = "A777") -> dict:
    return {"family": family, "rows": ROWS, "query": query, "variant": 0}


def test_targets_by_hand() -> None:
    assert compute_target(case("lookup")) == {"city": "Suva", "units": 12}
    assert compute_target(case("lookup", "Z000")) == {"city": None, "units": None}
    assert compute_target(case("filter")) == {"ids": ["A777", "C400", "K512"]}
    assert compute_target(case("total")) == {"total": 21 + 0 + 12 + 95 + 57}
    # priority 9 ties between A777 and B130, broken by id ascending.
    assert compute_target(case("sort")) == {"ids": ["A777", "B130"]}
    assert target_text(compute_target(case("lookup", "Z000"))) == '{"city":null,"units":null}'
    assert target_text(compute_target(case("lookup"))) == '{"city":"Suva","units":12}'


def test_filter_may_be_empty() -> None:
    rows = [dict(r, status="closed") for r in ROWS]
    assert compute_target({"family": "filter", "rows": rows, "query": "Z000"}) == {"ids": []}


def test_damaged_targets_by_hand_and_all_fail_the_checker() -> None:
    assert damaged_target(case("lookup")) == {"city": "Suva", "units": 13}
    assert damaged_target(case("lookup", "Z000")) == {"city": None, "units": 1}
    assert damaged_target(case("total")) == {"total": 186}
    assert damaged_target(case("filter")) == {"ids": ["A777", "C400", "K512", "Z000"]}
    assert damaged_target(case("sort")) == {"ids": ["A777", "B130", "Z000"]}
    for family in ("lookup", "filter", "total", "sort"):
        for query in ("A777", "Z000"):
            c = case(family, query)
            assert not check_answer(target_text(damaged_target(c)), compute_target(c)).correct


def test_damage_rule() -> None:
    assert is_damaged("0" * 63 + "4")
    assert is_damaged("f" * 62 + "00")
    assert not is_damaged("0" * 63 + "6")
    with pytest.raises(TaskError):
        is_damaged("not-hex")


def test_identity_serialisation_by_hand() -> None:
    c = case("lookup")
    prompt = "Find the record.\nRecords:\n[]"
    text = ('{"prompt":"Find the record.\\nRecords:\\n[]","task":{"family":"lookup",'
            '"query":"A777","rows":[' + ",".join(
                f'{{"city":"{r["city"]}","id":"{r["id"]}","price":{r["price"]},'
                f'"priority":{r["priority"]},"status":"{r["status"]}","units":{r["units"]}}}'
                for r in ROWS) + '],"variant":0}}')
    assert task_identity(c, prompt) == hashlib.sha256(text.encode()).hexdigest()
    # ensure_ascii: a non-ASCII prompt hashes its \\u escape, not its UTF-8 bytes.
    escaped = json.dumps({"task": c, "prompt": "é"}, sort_keys=True, separators=(",", ":"))
    assert "\\u00e9" in escaped
    assert task_identity(c, "é") == hashlib.sha256(escaped.encode()).hexdigest()


def test_visible_records_per_family() -> None:
    assert visible_records(case("sort")).startswith('\nRecords:\n[{"id":"K512","priority":4},')
    assert visible_records(case("lookup")).endswith('{"id":"C400","city":"Riga","units":19}]')
    assert '"status":"pending"' in visible_records(case("filter"))
    assert '"price":19' in visible_records(case("total"))


def test_generate_case_draw_rules() -> None:
    seen_prompts = set()
    for role, count in (("test", 256), ("dev", 64), ("train", 768)):
        for index in range(0, count, 37):
            c = generate_case(2026091301, role, index)
            assert list(c) == ["family", "rows", "query", "variant"]
            assert c["family"] == ("lookup", "filter", "total", "sort")[index % 4]
            assert c["variant"] == (index // 4) % (4 if role == "test" else 2)
            assert len(c["rows"]) == 5
            assert [list(r) for r in c["rows"]] == [
                ["id", "city", "units", "price", "status", "priority"]] * 5
            numbers = [int(r["id"][1:]) for r in c["rows"]]
            assert len(set(numbers)) == 5 and all(100 <= n < 1000 for n in numbers)
            if index % 5 == 0:
                assert c["query"] == "Z000"
            else:
                assert c["query"] in [r["id"] for r in c["rows"]]
            seen_prompts.add(visible_records(c))
    assert generate_case(2026091301, "dev", 3) == generate_case(2026091301, "dev", 3)
    assert generate_case(2026091301, "dev", 3) != generate_case(2026091302, "dev", 3)


def test_generate_case_snapshot() -> None:
    # Frozen output of the published draw order for one case; a change in draw order breaks it.
    c = generate_case(2026091301, "test", 1)
    assert c == SNAPSHOT


SNAPSHOT = {
    "family": "filter",
    "rows": [
        {"id": "U984", "city": "Lima", "units": 19, "price": 1, "status": "ready", "priority": 8},
        {"id": "R199", "city": "Bern", "units": 15, "price": 15, "status": "pending",
         "priority": 3},
        {"id": "J556", "city": "Suva", "units": 0, "price": 17, "status": "pending",
         "priority": 7},
        {"id": "X404", "city": "Oslo", "units": 8, "price": 1, "status": "closed", "priority": 7},
        {"id": "A572", "city": "Riga", "units": 14, "price": 15, "status": "pending",
         "priority": 9},
    ],
    "query": "R199",
    "variant": 0,
}


def test_check_task_reports_every_finding() -> None:
    c = case("total")
    prompt = "Sum it up." + visible_records(c)
    tid = task_identity(c, prompt)
    damaged = is_damaged(tid)
    target = '{"total":186}' if damaged else '{"total":185}'
    good = check_task(case=c, prompt=prompt, task_id=tid, target=target, damaged=damaged)
    assert all(ch.status == "passed" for ch in good), good
    expected_names = {"task.id", "task.prompt_records", "task.target", "task.damaged"}
    assert {ch.name for ch in good} == expected_names | ({"task.damaged_fails"} if damaged
                                                         else set())
    bad = check_task(case=c, prompt="Sum it up.", task_id="0" * 64, target='{"total": 185}',
                     damaged=False)
    failed = {ch.name for ch in bad if ch.status == "failed"}
    # wrong identity, prompt without records, non-compact target text, and the damage flag
    # (the all-zero id is divisible by 4).
    assert failed == {"task.id", "task.prompt_records", "task.target", "task.damaged"}


def test_unusable_case_raises() -> None:
    with pytest.raises(TaskError, match="family"):
        compute_target({"family": "median", "rows": []})
    with pytest.raises(TaskError, match="rows"):
        compute_target({"family": "total", "rows": "none"})


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=5), st.booleans(),
       st.sampled_from([None, 2]))
def test_any_serialisation_of_the_target_is_correct(target, ascii_only, indent) -> None:
    text = json.dumps(target, ensure_ascii=ascii_only, indent=indent)
    assert check_answer(f"\n {text} \t", target).correct


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=6), st.integers(-1000, 1000), min_size=1, max_size=5))
def test_integers_written_as_floats_are_wrong(target) -> None:
    as_floats = {k: float(v) for k, v in target.items()}
    result = check_answer(json.dumps(as_floats), target)
    assert result.reason == "wrong_schema_or_value"
