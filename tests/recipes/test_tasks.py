"""Grounded tasks of docs/experiment.md §1: draw order, balance, identities, targets and damage."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from nscas.errors import InvalidInput, RecipeError
from nscas.recipes.common import tasks as T
from nscas.recipes.common.checker import check

SEED = 2026091301
PLAIN = T.parse_wordings({"header": "H:", "wordings": {
    f: ["{q} a", "{q} b", "{q} c", "{q} d"] for f in T.FAMILIES}})


@pytest.fixture(scope="module")
def default_all() -> dict[str, list[T.Task]]:
    return T.generate_all(T.DEFAULT_COUNTS, SEED, T.default_wordings())


# --- draw order: known cases ---------------------------------------------------------------


def test_one_case_derived_step_by_step() -> None:
    """Re-derive train case 6 with the bare algorithm of docs/experiment.md §1, draw by draw."""
    rng = random.Random(int(hashlib.sha256(b"2026091301:train:6").hexdigest(), 16))
    numbers = rng.sample(range(100, 1000), 5)
    rows = []
    for number in numbers:
        letter = chr(65 + rng.randrange(26))
        city = rng.choice(("Oslo", "Lima", "Kyoto", "Accra", "Perth", "Riga", "Bern", "Suva"))
        units, price = rng.randrange(0, 20), rng.randrange(1, 20)
        status = rng.choice(("ready", "pending", "closed"))
        rows.append({"id": letter + str(number), "city": city, "units": units, "price": price,
                     "status": status, "priority": rng.randrange(1, 10)})
    query = rng.choice(rows)["id"]  # 6 % 5 != 0, so a present id is drawn
    expected = {"family": "total", "rows": rows, "query": query, "variant": (6 // 4) % 2}
    assert T.make_case(SEED, "train", 6) == expected


GOLDEN = {
    # (role, index): (rows as (id, city, units, price, status, priority), query, variant, target)
    ("train", 6): ([("D319", "Riga", 1, 9, "ready", 7), ("G478", "Lima", 11, 19, "pending", 6),
                    ("H441", "Kyoto", 13, 13, "pending", 8), ("C691", "Riga", 19, 2, "closed", 8),
                    ("A527", "Accra", 13, 13, "closed", 1)],
                   "H441", 1, '{"total":594}'),  # 9 + 209 + 169 + 38 + 169
    ("test", 3): ([("U687", "Kyoto", 7, 5, "closed", 2), ("X278", "Perth", 1, 7, "pending", 6),
                   ("T638", "Bern", 9, 1, "pending", 8), ("Q352", "Suva", 4, 1, "closed", 6),
                   ("E277", "Bern", 10, 2, "pending", 2)],
                  "X278", 0, '{"ids":["T638","Q352"]}'),  # priority 6 tie: Q352 < X278
    ("test", 4): ([("C398", "Oslo", 0, 5, "pending", 7), ("Z327", "Perth", 15, 8, "pending", 8),
                   ("V662", "Perth", 19, 5, "ready", 6), ("Z297", "Suva", 12, 7, "pending", 5),
                   ("O756", "Suva", 4, 2, "closed", 9)],
                  "C398", 1, '{"city":"Oslo","units":0}'),
    ("dev", 1): ([("X483", "Suva", 2, 4, "ready", 3), ("F246", "Kyoto", 6, 17, "ready", 4),
                  ("D912", "Bern", 19, 8, "ready", 7), ("T696", "Riga", 7, 14, "pending", 4),
                  ("P319", "Oslo", 0, 10, "closed", 2)],
                 "P319", 0, '{"ids":["D912","F246","X483"]}'),
    ("test", 20): ([("N970", "Accra", 13, 2, "pending", 7), ("J610", "Kyoto", 9, 12, "ready", 9),
                    ("E224", "Kyoto", 4, 13, "ready", 1), ("A249", "Accra", 14, 10, "ready", 1),
                    ("K547", "Lima", 9, 1, "closed", 2)],
                   "Z000", 1, '{"city":null,"units":null}'),
}


@pytest.mark.parametrize("key", list(GOLDEN))
def test_golden_cases(key: tuple[str, int]) -> None:
    role, index = key
    rows, query, variant, target = GOLDEN[key]
    case = T.make_case(SEED, role, index)
    names = ("id", "city", "units", "price", "status", "priority")
    expected_rows = [dict(zip(names, r, strict=True)) for r in rows]
    assert case == {"family": T.FAMILIES[index % 4], "rows": expected_rows,
                    "query": query, "variant": variant}
    assert list(case) == ["family", "rows", "query", "variant"]
    assert T.compact(T.target_value(case)) == target


def test_prompt_and_identity_golden() -> None:
    task = T.make_task(SEED, "train", 6, PLAIN)
    assert task.prompt == (
        'H:H441 b\nRecords:\n[{"id":"D319","units":1,"price":9},{"id":"G478","units":11,'
        '"price":19},{"id":"H441","units":13,"price":13},{"id":"C691","units":19,"price":2},'
        '{"id":"A527","units":13,"price":13}]')
    form = json.dumps({"task": task.case, "prompt": task.prompt}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert task.id == hashlib.sha256(form.encode()).hexdigest()
    assert task.id == "78d805e1df6c3906cc24dcf1a8f809fbf0ab25f72998203001dcb5dee2ffbdc1"


def test_visible_fields_per_family() -> None:
    for index, fields in enumerate((["id", "city", "units"], ["id", "status"],
                                    ["id", "units", "price"], ["id", "priority"])):
        task = T.make_task(SEED, "dev", index, PLAIN)
        visible = json.loads(task.prompt.split("\nRecords:\n", 1)[1])
        assert [list(row) for row in visible] == [fields] * 5


def test_instructions_with_literal_braces_and_non_ascii() -> None:
    wordings = T.parse_wordings({"header": "Réponds.\n", "wordings": {
        f: ['Give {"city": x} for {q} ({q}).'] * 4 for f in T.FAMILIES}})
    task = T.make_task(SEED, "test", 4, wordings)
    assert task.prompt.startswith('Réponds.\nGive {"city": x} for C398 (C398).\nRecords:\n')


# --- whole roles --------------------------------------------------------------------------


def test_family_and_variant_balance(default_all: dict[str, list[T.Task]]) -> None:
    test, dev, train = default_all["test"], default_all["dev"], default_all["train"]
    assert [len(test), len(dev), len(train)] == [256, 64, 768]
    assert T.counts_by(test, "family") == {"lookup": 64, "filter": 64, "total": 64, "sort": 64}
    assert T.counts_by(test, "variant") == {"0": 64, "1": 64, "2": 64, "3": 64}
    assert T.counts_by(dev, "variant") == {"0": 32, "1": 32}
    assert T.counts_by(train, "variant") == {"0": 384, "1": 384}
    assert T.counts_by(train, "family") == {f: 192 for f in T.FAMILIES}
    # Every (family, variant) pair of the test set is equally represented.
    pairs = [(t.family, t.variant) for t in test]
    assert all(pairs.count((f, v)) == 16 for f in T.FAMILIES for v in range(4))
    for role, tasks in default_all.items():
        assert [t.index for t in tasks] == list(range(len(tasks)))
        assert all(t.role == role and t.family == t.case["family"] for t in tasks)
    with pytest.raises(InvalidInput, match="field"):
        T.counts_by(test, "role")


def test_absent_id_every_fifth_index(default_all: dict[str, list[T.Task]]) -> None:
    for tasks in default_all.values():
        for t in tasks:
            ids = [row["id"] for row in t.case["rows"]]
            if t.index % 5 == 0:
                assert t.case["query"] == "Z000" and "Z000" not in ids
                if t.family == "lookup":
                    assert t.target == '{"city":null,"units":null}'
            else:
                assert t.case["query"] in ids


def test_targets_follow_the_rules(default_all: dict[str, list[T.Task]]) -> None:
    for t in default_all["test"]:
        rows, target = t.case["rows"], json.loads(t.target)
        assert t.target == json.dumps(target, separators=(",", ":"))
        if t.family == "lookup":
            match = [r for r in rows if r["id"] == t.case["query"]]
            expected = {"city": match[0]["city"], "units": match[0]["units"]} if match else {
                "city": None, "units": None}
            assert target == expected and list(target) == ["city", "units"]
        elif t.family == "filter":
            assert target == {"ids": sorted(r["id"] for r in rows if r["status"] == "ready")}
        elif t.family == "total":
            assert target == {"total": sum(r["units"] * r["price"] for r in rows)}
        elif t.family == "sort":
            top = max(r["priority"] for r in rows)
            first = min(r["id"] for r in rows if r["priority"] == top)
            rest = [r for r in rows if r["id"] != first]
            top = max(r["priority"] for r in rest)
            second = min(r["id"] for r in rest if r["priority"] == top)
            assert target == {"ids": [first, second]}
        assert check(t.target, t.target).correct


def test_prompts_do_not_repeat_and_ids_are_unique(default_all: dict[str, list[T.Task]]) -> None:
    everything = [t for tasks in default_all.values() for t in tasks]
    assert len({t.prompt for t in everything}) == len(everything)
    assert len({t.id for t in everything}) == len(everything)


def test_repeated_prompt_across_roles_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    original = T.case_rng
    monkeypatch.setattr(T, "case_rng", lambda seed, role, index: original(seed, "test", index))
    with pytest.raises(RecipeError, match=r"dev task 0 .* repeats test task 0"):
        T.generate_all({"test": 2, "dev": 2, "train": 0}, SEED, PLAIN)


def test_determinism() -> None:
    first = T.generate_role("dev", 16, SEED, PLAIN)
    assert [t.id for t in first] == [t.id for t in T.generate_role("dev", 16, SEED, PLAIN)]
    other = T.generate_role("dev", 16, SEED + 1, PLAIN)
    assert not {t.id for t in first} & {t.id for t in other}


@pytest.mark.parametrize(("args", "match"), [
    (("exam", 4, SEED), "role"), (("dev", -1, SEED), "count"), (("dev", 2, "7"), "seed"),
    (("dev", True, SEED), "count"),
])
def test_generate_role_refuses_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        T.generate_role(*args, PLAIN)


def test_generate_all_needs_exactly_the_three_roles() -> None:
    with pytest.raises(InvalidInput, match="roles"):
        T.generate_all({"test": 1, "dev": 1}, SEED, PLAIN)


# --- the damaged control ------------------------------------------------------------------


def test_damaged_control(default_all: dict[str, list[T.Task]]) -> None:
    clean = default_all["train"]
    damaged = T.damaged_tasks(clean)
    flagged = [t for t in clean if int(t.id, 16) % 4 == 0]
    # With nscas's default wordings; the published wordings gave 203 of 768.
    assert len(flagged) == 204
    changed = 0
    for before, after in zip(clean, damaged, strict=True):
        assert (after.id, after.prompt, after.case, after.index) == (
            before.id, before.prompt, before.case, before.index)
        if T.is_damaged(before.id):
            changed += 1
            assert after.target != before.target
            assert check(after.target, before.target).reason == "wrong_schema_or_value"
        else:
            assert after is before
    assert changed == 204


@pytest.mark.parametrize(("family", "target", "damaged"), [
    ("lookup", '{"city":"Oslo","units":0}', '{"city":"Oslo","units":1}'),
    ("lookup", '{"city":null,"units":null}', '{"city":null,"units":1}'),
    ("total", '{"total":594}', '{"total":595}'),
    ("filter", '{"ids":[]}', '{"ids":["Z000"]}'),
    ("filter", '{"ids":["A1","B2"]}', '{"ids":["A1","B2","Z000"]}'),
    ("sort", '{"ids":["T638","Q352"]}', '{"ids":["T638","Q352","Z000"]}'),
])
def test_damage_rules(family: str, target: str, damaged: str) -> None:
    assert T.damage_target(family, target) == damaged


# --- wordings -----------------------------------------------------------------------------


def _wordings(**changes: object) -> dict:
    value = {"header": "H", "wordings": {f: ["{q}"] * 4 for f in T.FAMILIES}}
    value.update(changes)
    return value


@pytest.mark.parametrize(("value", "match"), [
    ([], "JSON object"),
    (_wordings(header=3), "'header'"),
    (_wordings(extra=1), r"unknown key\(s\) \['extra'\]"),
    (_wordings(wordings={f: ["{q}"] * 4 for f in T.FAMILIES[:3]}),
     r"wordings\['sort'\]: missing"),
    (_wordings(wordings={**{f: ["{q}"] * 4 for f in T.FAMILIES}, "count": ["{q}"] * 4}),
     "unknown family"),
    (_wordings(wordings={**{f: ["{q}"] * 4 for f in T.FAMILIES}, "filter": ["{q}"] * 3}),
     r"wordings\['filter'\]: expected a list of exactly 4"),
    (_wordings(wordings={**{f: ["{q}"] * 4 for f in T.FAMILIES},
                             "lookup": ["{q}", "{q}", "no placeholder", "{q}"]}),
     r"wordings\['lookup'\]\[2\]: lacks the '\{q\}'"),
    (_wordings(wordings={**{f: ["{q}"] * 4 for f in T.FAMILIES}, "lookup": ["{q}"] * 3 + [7]}),
     r"wordings\['lookup'\]\[3\]: expected a string"),
])
def test_wording_validation_names_the_fault(value: object, match: str) -> None:
    with pytest.raises(T.WordingError, match=match):
        T.parse_wordings(value)


def test_the_query_id_is_required_in_lookup_instructions_only() -> None:
    # As in the published wording object: only the lookup instructions name the query id.
    texts = {"lookup": ["Find {q}.", "Look up {q}.", "Which is {q}?", "Report {q}."],
             "filter": ["List the ready ids.", "Ready ones?", "Ids ready.", "Ready, please."],
             "total": ["Sum units times price.", "Total?", "Invoice value.", "Add it up."],
             "sort": ["Top two by priority.", "Most urgent two.", "Rank, top two.", "Two first."]}
    wordings = T.parse_wordings(_wordings(wordings=texts))
    assert wordings.instructions["filter"][0] == "List the ready ids."
    # {q} stays allowed outside lookup: the default wordings use it everywhere.
    assert T.parse_wordings(_wordings(wordings={f: ["{q}"] * 4 for f in T.FAMILIES}))


def test_default_wordings() -> None:
    wordings = T.default_wordings()
    assert T.parse_wordings(json.loads(T.default_wordings_bytes())) == wordings
    assert T.parse_wordings(wordings.to_json()) == wordings
    for family in T.FAMILIES:
        texts = wordings.instructions[family]
        assert len(set(texts)) == 4  # the held-out variants 2 and 3 are really different
    with pytest.raises(T.WordingError, match="not UTF-8 JSON"):
        T.parse_wordings_bytes(b"\xff")


# --- records ------------------------------------------------------------------------------


def test_records_jsonl_round_trip() -> None:
    tasks = T.generate_role("dev", 5, SEED, PLAIN)
    data = T.records_jsonl(tasks, 8)
    assert data == T.records_jsonl(tasks, 8)
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6
    first = json.loads(lines[0])
    assert list(first) == ["id", "task", "prompt", "target", "weight"]
    assert first["task"] == tasks[0].case and first["weight"] == 8
    assert lines[0] == json.dumps(tasks[0].to_record(8), separators=(",", ":")).encode()
    assert T.read_records(data) == [t.to_record(8) for t in tasks]
    tampered = data.replace(b'"H:', b'"h:', 1)
    with pytest.raises(InvalidInput, match=r"line 1: id .* does not match"):
        T.read_records(tampered)


def test_to_record_copies_and_checks_weight() -> None:
    task = T.make_task(SEED, "dev", 0, PLAIN)
    record = task.to_record(1)
    record["task"]["rows"].clear()
    assert len(task.case["rows"]) == 5
    for bad in (0, -1, True, float("nan"), float("inf"), "8"):
        with pytest.raises(InvalidInput, match="weight"):
            task.to_record(bad)  # type: ignore[arg-type]
