"""Hash-chained journals: durable appends, tamper detection, torn lines, resume bookkeeping."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import rfc8785

from nscas.errors import RecipeError
from nscas.recipes.train.journal import Journal, effective_steps, read_journal


def _expected_hash(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def _write(path: Path, entries: list[dict]) -> None:
    with Journal(path) as journal:
        for entry in entries:
            journal.append(entry)


def test_entries_are_chained_by_sha256_of_their_canonical_json(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    _write(path, [{"step": 1, "loss": 2.5, "rank": 0}, {"step": 2, "loss": 2.25, "rank": 0}])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["prev"] is None
    assert lines[1]["prev"] == lines[0]["hash"]
    assert [e["hash"] for e in lines] == [_expected_hash(e) for e in lines]
    state = read_journal(path)
    assert state.head == lines[1]["hash"] and not state.dropped_partial
    # Reopening continues the chain from the last entry.
    _write(path, [{"step": 3, "loss": 2.0, "rank": 0}])
    third = json.loads(path.read_text().splitlines()[2])
    assert third["prev"] == lines[1]["hash"] and third["hash"] == _expected_hash(third)


def test_edits_and_deletions_break_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    _write(path, [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)])
    lines = path.read_text().splitlines()

    edited = json.loads(lines[1])
    edited["loss"] = 0.1
    path.write_text("\n".join([lines[0], json.dumps(edited), lines[2]]) + "\n")
    with pytest.raises(RecipeError, match="line 2 has a wrong hash"):
        read_journal(path)

    path.write_text("\n".join([lines[0], lines[2]]) + "\n")
    with pytest.raises(RecipeError, match="line 2 does not continue the hash chain"):
        read_journal(path)


def test_a_torn_last_line_is_cut_and_the_chain_continues(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    _write(path, [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"step":3,"lo')  # a crash in mid-write
    journal = Journal(path)
    assert journal.dropped_partial and len(journal.entries) == 2
    journal.append({"event": "resume", "from_step": 2})
    journal.close()
    assert path.read_bytes().startswith(whole)
    state = read_journal(path)
    assert len(state.entries) == 3 and not state.dropped_partial


def test_entries_may_not_bring_their_own_chain_members(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl") as journal, pytest.raises(RecipeError):
        journal.append({"step": 1, "hash": "0" * 64})


def test_effective_steps_drop_work_redone_after_a_resume() -> None:
    entries = [
        {"event": "agreed", "step": 0},
        {"step": 1, "seconds": 1.0},
        {"step": 2, "seconds": 2.0},
        {"step": 3, "seconds": 3.0},  # lost: the run died before checkpointing it
        {"event": "resume", "from_step": 2},
        {"step": 3, "seconds": 30.0},
        {"step": 4, "seconds": 40.0},
    ]
    assert [(e["step"], e["seconds"]) for e in effective_steps(entries)] == [
        (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)
    ]
