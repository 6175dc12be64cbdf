"""Recipe ``prepare`` through the runner: its claims against its own outputs, and bad input."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.errors import ConfigError
from nscas.objects.digests import Digest
from nscas.runs.runner import StepFailed, StepResult, run_file
from nscas.store.writer import Store, init_store
from tests.runner.helpers import (
    PREPARE_RECIPE,
    PREPARE_STEP,
    TINY_COUNTS,
    TOKENIZER_STEP,
    snapshot,
    write,
)

FAMILIES = ("lookup", "filter", "total", "sort")
VISIBLE = {"lookup": ("id", "city", "units"), "filter": ("id", "status"),
           "total": ("id", "units", "price"), "sort": ("id", "priority")}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, StepResult]]]:
    """A store that ran prepare and the tokenizer once at the tiny sizes."""
    directory = tmp_path_factory.mktemp("prepare")
    store = init_store(directory)
    results = run_file(store, write(directory, "p.toml", PREPARE_STEP + TOKENIZER_STEP))
    yield store, {r.step: r for r in results}
    store.close()


@pytest.fixture
def store(home: tuple[Store, dict[str, StepResult]]) -> Store:
    return home[0]


@pytest.fixture
def prepared(home: tuple[Store, dict[str, StepResult]]) -> StepResult:
    return home[1]["prepare"]


def tasks(store: Store, result: StepResult, name: str) -> tuple[dict[str, Any], list[dict]]:
    """The tasks/1 record of an output and its parsed JSONL lines."""
    record = store.get_record(result.outputs[name])
    data = store.get_bytes(Digest.parse(record["records"]))
    assert data.endswith(b"\n")
    return record, [json.loads(line) for line in data.decode().splitlines()]


def identity(line: dict[str, Any]) -> str:
    text = json.dumps({"task": line["task"], "prompt": line["prompt"]}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_counts_and_family_balance(store: Store, prepared: StepResult) -> None:
    assert prepared.claims["counts"] == TINY_COUNTS
    by_family = prepared.claims["counts_by_family"]
    for role, n in TINY_COUNTS.items():
        assert by_family[role] == {f: n // 4 for f in FAMILIES}
        record, lines = tasks(store, prepared, role)
        assert record["count"] == n and len(lines) == n
        assert dict(Counter(line["task"]["family"] for line in lines)) == by_family[role]
        # family = FAMILIES[index % 4]: the lines come in generation order
        assert [line["task"]["family"] for line in lines] == [FAMILIES[i % 4] for i in range(n)]


def test_variants_2_and_3_only_in_test(store: Store, prepared: StepResult) -> None:
    assert prepared.claims["counts_by_variant"] == {
        "test": {"0": 4, "1": 4, "2": 4, "3": 4},
        "dev": {"0": 4, "1": 4},
        "train": {"0": 16, "1": 16},
    }
    for role in TINY_COUNTS:
        _, lines = tasks(store, prepared, role)
        counted = Counter(str(line["task"]["variant"]) for line in lines)
        assert dict(sorted(counted.items())) == prepared.claims["counts_by_variant"][role]


def test_records_lines_and_ids(store: Store, prepared: StepResult) -> None:
    prompts: dict[str, str] = {}
    for role in TINY_COUNTS:
        record, lines = tasks(store, prepared, role)
        assert record["role"] == role and record["seed"] == 2026091301
        assert record["ids"] == [line["id"] for line in lines]
        for line in lines:
            assert list(line) == ["id", "task", "prompt", "target", "weight"]
            assert set(line["task"]) == {"family", "rows", "query", "variant"}
            assert line["weight"] == (8 if role == "train" else 1)
            assert line["id"] == identity(line)
            fields = VISIBLE[line["task"]["family"]]
            visible = [{k: row[k] for k in fields} for row in line["task"]["rows"]]
            assert line["prompt"].endswith("\nRecords:\n" + json.dumps(visible,
                                                                         separators=(",", ":")))
            assert line["task"]["query"] in line["prompt"]
            assert isinstance(json.loads(line["target"]), dict)
            assert prompts.setdefault(line["prompt"], role) == role  # no prompt in two roles


def test_damaged_control(store: Store, prepared: StepResult) -> None:
    record, train = tasks(store, prepared, "train")
    damaged_record, damaged = tasks(store, prepared, "damaged")
    hit = {t for t in record["ids"] if int(t, 16) % 4 == 0}
    assert 0 < len(hit) < len(train)
    assert prepared.claims["damaged_count"] == len(hit)
    assert damaged_record["control"] == "damaged" and damaged_record["ids"] == record["ids"]
    for clean, bad in zip(train, damaged, strict=True):
        assert {k: v for k, v in clean.items() if k != "target"} == \
               {k: v for k, v in bad.items() if k != "target"}
        assert (clean["target"] != bad["target"]) == (clean["id"] in hit)


def test_replay_and_retention_stand_ins_are_labelled(store: Store, prepared: StepResult) -> None:
    assert (prepared.claims["replay_count"], prepared.claims["retention_count"]) == (8, 4)
    for kind, n in (("replay", 8), ("retention", 4)):
        record, lines = tasks(store, prepared, kind)
        assert record["standin"] is True and "stand-in" in record["note"]
        assert record["count"] == n == len(lines)
        assert record["ids"] == [line["id"] for line in lines]
        for line in lines:
            assert line["standin"] is True and line["weight"] == 1
            roles = [m["role"] for m in line["messages"]]
            assert roles[-1] == "assistant"
            assert roles == ["user", "assistant"] * (len(roles) // 2)
    commitment = store.get_record(prepared.outputs["prepared"])
    assert commitment["subjects"] == {**{k: str(v) for k, v in prepared.outputs.items()
                                        if k != "prepared"},
                                      "wordings": commitment["subjects"]["wordings"]}


def test_supplied_replay_is_used_as_given(store: Store, tmp_path: Path) -> None:
    convo = {"id": "c1", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello."}]}
    blob = store.put_bytes((json.dumps(convo) + "\n").encode())
    path = write(tmp_path, "replay.toml", PREPARE_RECIPE + f"""replay_weight = 3
[inputs]
replay = "{blob}"
""")
    [result] = run_file(store, path)
    record, lines = tasks(store, result, "replay")
    assert record["standin"] is False and "note" not in record
    assert lines == [{**convo, "weight": 3}]
    assert result.claims["replay_count"] == 1


def test_target_counts_with_a_tokenizer(home: tuple[Store, dict[str, StepResult]],
                                        tmp_path: Path) -> None:
    store, steps = home
    tokenizer = steps["tokenizer"].outputs["tokenizer"]
    path = write(tmp_path, "tok.toml", PREPARE_RECIPE + f'[inputs]\ntokenizer = "{tokenizer}"\n')
    [result] = run_file(store, path)
    assert result.outputs == steps["prepare"].outputs  # a tokenizer changes claims only
    claims = result.claims
    for arm in ("clean", "damaged"):
        assert claims[f"{arm}.targets"] > 0
        assert claims[f"{arm}.targets"] < claims[f"{arm}.weighted_targets"] \
            < 8 * claims[f"{arm}.targets"]
    assert claims["damaged.targets"] > claims["clean.targets"]  # damage lengthens answers


# --- bad input ------------------------------------------------------------------------------


def default_wordings() -> dict[str, Any]:
    from nscas.recipes.common.tasks import default_wordings_bytes

    return json.loads(default_wordings_bytes())


def fails(store: Store, tmp_path: Path, inputs: dict[str, Digest], params: str = "") -> str:
    """Run prepare on ``inputs``; it must fail with a stored failed receipt. Its error."""
    lines = "".join(f'{k} = "{v}"\n' for k, v in inputs.items())
    path = write(tmp_path, "bad.toml", PREPARE_RECIPE + params + "[inputs]\n" + lines)
    with pytest.raises(StepFailed) as err:
        run_file(store, path)
    receipt = store.get_record(err.value.receipt)
    assert receipt["status"] == "failed" and receipt["error"] == err.value.error
    return err.value.error


def wordings_blob(store: Store, change: Any) -> Digest:
    value = default_wordings()
    change(value["wordings"])
    return store.put_bytes(json.dumps(value).encode())


def test_wordings_missing_a_family(store: Store, tmp_path: Path) -> None:
    blob = wordings_blob(store, lambda w: w.pop("total"))
    assert fails(store, tmp_path, {"wordings": blob}) == (
        "wording object: wordings['total']: missing")


def test_wordings_with_the_wrong_number_of_wordings(store: Store, tmp_path: Path) -> None:
    blob = wordings_blob(store, lambda w: w["sort"].pop())
    assert fails(store, tmp_path, {"wordings": blob}) == (
        "wording object: wordings['sort']: expected a list of exactly 4 strings")


def test_wording_without_the_query_placeholder(store: Store, tmp_path: Path) -> None:
    blob = wordings_blob(store, lambda w: w["lookup"].__setitem__(2, "Find the record."))
    assert fails(store, tmp_path, {"wordings": blob}) == (
        "wording object: wordings['lookup'][2]: lacks the '{q}' placeholder for the query id, "
        "which a lookup instruction must name")


def conversations(store: Store, *records: dict[str, Any]) -> Digest:
    return store.put_bytes("".join(json.dumps(r) + "\n" for r in records).encode())


GOOD = {"id": "ok", "messages": [{"role": "user", "content": "a"},
                                 {"role": "assistant", "content": "b"}]}


def test_replay_that_does_not_alternate(store: Store, tmp_path: Path) -> None:
    bad = {"id": "twice", "messages": [{"role": "user", "content": "a"},
                                       {"role": "user", "content": "b"},
                                       {"role": "assistant", "content": "c"}]}
    blob = conversations(store, GOOD, bad)
    assert fails(store, tmp_path, {"replay": blob}) == (
        "conversations line 2 (id 'twice'): message 1 has role 'user', expected 'assistant'")


def test_retention_that_does_not_end_with_the_assistant(store: Store, tmp_path: Path) -> None:
    bad = {"id": "open", "messages": [{"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"},
                                      {"role": "user", "content": "c"}]}
    blob = conversations(store, bad)
    assert fails(store, tmp_path, {"retention": blob}) == (
        "conversations line 1 (id 'open'): must end with an assistant turn")


def test_replay_that_is_not_jsonl(store: Store, tmp_path: Path) -> None:
    blob = store.put_bytes(b'{"id": "x"}\nnot json\n')
    assert fails(store, tmp_path, {"replay": blob}).startswith("conversations line 1 (id 'x'): ")
    blob = store.put_bytes(b"not json\n")
    assert fails(store, tmp_path, {"replay": blob}).startswith("conversations line 1: not JSON")


def test_document_longer_than_max_length_names_the_task(
        home: tuple[Store, dict[str, StepResult]], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from nscas.recipes.common.tokenise import encode_document

    store, steps = home
    tree = steps["tokenizer"].outputs["tokenizer"]
    store.materialise(tree, tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    _, train = tasks(store, steps["prepare"], "train")
    lengths = [len(encode_document(tokenizer, line, max_length=10**6).input_ids) for line in train]
    limit = max(lengths) - 1
    first_too_long = train[next(i for i, n in enumerate(lengths) if n > limit)]["id"]
    error = fails(store, tmp_path, {"tokenizer": tree}, params=f"max_length = {limit}\n")
    assert error == (f"document {first_too_long}: {max(lengths)} tokens, longer than "
                     f"max_length {limit} (no truncation)")


@pytest.mark.parametrize(("key", "value"), [
    ("grounded_weight", 0), ("grounded_weight", 17), ("replay_weight", 0), ("replay_weight", 17),
])
def test_weights_outside_1_to_16_are_refused_before_running(
        store: Store, tmp_path: Path, key: str, value: int) -> None:
    path = write(tmp_path, "w.toml", PREPARE_RECIPE + f"{key} = {value}\n")
    before = snapshot(store)
    with pytest.raises(ConfigError) as err:
        run_file(store, path)
    assert err.value.message == (f"{path}: params: {key} must be between 1 and 16, "
                                 f"got {value}")
    assert snapshot(store) == before


def test_weights_at_the_bounds_are_accepted(store: Store, tmp_path: Path) -> None:
    path = write(tmp_path, "w.toml", PREPARE_RECIPE + "grounded_weight = 16\nreplay_weight = 1\n")
    [result] = run_file(store, path)
    _, train = tasks(store, result, "train")
    assert {line["weight"] for line in train} == {16}


def test_wordings_that_name_the_query_in_lookup_only(store: Store, tmp_path: Path) -> None:
    """The published wording object names the query id in its lookup instructions only: such
    an object is accepted, its prompts and identities follow the rules, and the independent
    verifier regenerates the same task sets from it."""
    from nscas.verifiers.verify import verify

    value = default_wordings()
    for family in ("filter", "total", "sort"):
        value["wordings"][family] = [f"{family} wording {n}, no query id." for n in range(4)]
    blob = store.put_bytes(json.dumps(value).encode())
    path = write(tmp_path, "lookup-only.toml",
                 PREPARE_RECIPE + f'[inputs]\nwordings = "{blob}"\n')
    (result,) = run_file(store, path)
    for role in ("test", "dev", "train"):
        record, lines = tasks(store, result, role)
        assert record["ids"] == [identity(line) for line in lines]
        for line in lines:
            family, query = line["task"]["family"], line["task"]["query"]
            instruction = value["wordings"][family][line["task"]["variant"]]
            assert line["prompt"].startswith(value["header"] + instruction.replace("{q}", query))
    report = verify(str(result.receipt), store=store.root)
    assert report.ok, [c for c in report.checks if c.status == "failed"]
