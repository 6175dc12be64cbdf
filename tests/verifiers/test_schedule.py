"""The document schedule and the journal hash chain."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nscas.verifiers.core.errors import InvalidArgument, LogFormatError
from nscas.verifiers.training.schedule import (
    check_journal,
    check_step_documents,
    document_schedule,
    entry_hash,
    read_journal,
    update_times,
)


def test_published_schedule_first_batch_and_one_epoch() -> None:
    schedule = document_schedule(20260913, 1024, 128, 8)
    assert schedule[0] == [475, 164, 110, 140, 483, 798, 431, 397]
    assert len(schedule) == 128 and all(len(b) == 8 for b in schedule)
    flat = [i for batch in schedule for i in batch]
    assert sorted(flat) == list(range(1024))


def test_schedule_reshuffles_past_one_epoch() -> None:
    schedule = document_schedule(3, 10, 3, 4)
    flat = [i for batch in schedule for i in batch]
    assert sorted(flat[:10]) == list(range(10))
    counts = Counter(flat)
    assert sum(counts.values()) == 12 and max(counts.values()) == 2
    assert document_schedule(3, 10, 3, 4) == schedule


@pytest.mark.parametrize("args", [(0, 3, 4), (10, 0, 4), (10, 3, -1), (10, 3, True)])
def test_schedule_rejects_bad_sizes(args) -> None:
    with pytest.raises(InvalidArgument):
        document_schedule(1, *args)


def make_journal(bodies: list[dict[str, Any]]) -> tuple[bytes, str | None]:
    """Write entries the way the module docstring defines (independently of entry_hash)."""
    lines, prev = [], None
    for body in bodies:
        entry = dict(body, prev=prev)
        entry["hash"] = hashlib.sha256(rfc8785.dumps(entry)).hexdigest()
        lines.append(rfc8785.dumps(entry) + b"\n")
        prev = entry["hash"]
    return b"".join(lines), prev


SCHEDULE = document_schedule(20260913, 1024, 4, 8)


def step_bodies() -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = [{"event": "start", "world": 1}]
    for step, batch in enumerate(SCHEDULE):
        bodies.append({"step": step, "documents": batch, "loss": 1.5 - step / 10,
                       "seconds": [1.0, 3.0, 2.0, 10.0][step], "targets": 40})
    bodies.append({"event": "checkpoint", "step_count": 4})
    return bodies


def statuses(checks) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def lines_of(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def test_valid_journal_passes() -> None:
    data, head = make_journal(step_bodies())
    checks = check_journal(data, head=head)
    assert statuses(checks) == {"journal.lines": "passed", "journal.chain": "passed",
                                "journal.head": "passed"}
    entries = read_journal(data)
    assert entry_hash(entries[-1]) == head
    assert all(c.status == "passed" for c in check_step_documents(entries, SCHEDULE))


def test_empty_journal() -> None:
    assert all(c.status == "passed" for c in check_journal(b"", head=None))
    assert statuses(check_journal(b"", head="0" * 64))["journal.head"] == "failed"


def test_edited_line_is_detected() -> None:
    data, head = make_journal(step_bodies())
    lines = lines_of(data)
    lines[2] = lines[2].replace(b'"loss":1.4', b'"loss":0.4')
    checks = check_journal(b"".join(lines), head=head)
    assert statuses(checks)["journal.chain"] == "failed"
    assert "line 3: 'hash' does not match" in next(
        c.message for c in checks if c.name == "journal.chain")


def test_edited_line_with_recomputed_hash_breaks_the_next_link() -> None:
    bodies = step_bodies()
    data, head = make_journal(bodies)
    forged = dict(read_journal(data)[2], loss=0.01)
    forged.pop("hash")
    forged["hash"] = hashlib.sha256(rfc8785.dumps(forged)).hexdigest()
    lines = lines_of(data)
    lines[2] = rfc8785.dumps(forged) + b"\n"
    checks = check_journal(b"".join(lines), head=head)
    message = next(c.message for c in checks if c.name == "journal.chain")
    assert message == "line 4: 'prev' is not the hash of line 3"


def test_removed_middle_line_is_detected() -> None:
    data, head = make_journal(step_bodies())
    lines = lines_of(data)
    del lines[2]
    checks = check_journal(b"".join(lines), head=head)
    assert statuses(checks)["journal.chain"] == "failed"
    steps = check_step_documents(read_journal(b"".join(lines)), SCHEDULE)
    assert statuses(steps) == {"journal.steps": "failed", "journal.documents": "passed"}


def test_removed_last_line_is_caught_by_head() -> None:
    data, head = make_journal(step_bodies())
    truncated = b"".join(lines_of(data)[:-1])
    assert statuses(check_journal(truncated, head=head)) == {
        "journal.lines": "passed", "journal.chain": "passed", "journal.head": "failed"}


def test_reordered_pair_is_detected() -> None:
    data, head = make_journal(step_bodies())
    lines = lines_of(data)
    lines[2], lines[3] = lines[3], lines[2]
    checks = check_journal(b"".join(lines), head=head)
    message = next(c.message for c in checks if c.name == "journal.chain")
    assert "line 3:" in message and "line 4:" in message and "line 5:" in message


def test_format_findings_are_all_reported() -> None:
    data, head = make_journal(step_bodies())
    lines = lines_of(data)
    lines[1] = lines[1].replace(b'{"documents"', b'{ "documents"')  # not canonical
    lines[4] = b"not json\n"
    messy = b"".join(lines).rstrip(b"\n")
    checks = check_journal(messy, head=head)
    message = next(c.message for c in checks if c.name == "journal.lines")
    assert "last line does not end with a newline" in message
    assert "line 2: not in RFC 8785 canonical form" in message
    assert "line 5:" in message
    with pytest.raises(LogFormatError) as err:
        read_journal(messy)
    assert [line for line, _ in err.value.problems] == [5]


def test_step_documents_differ() -> None:
    bodies = step_bodies()
    bodies[2] = dict(bodies[2], documents=list(reversed(bodies[2]["documents"])))
    data, _ = make_journal(bodies)
    checks = check_step_documents(read_journal(data), SCHEDULE)
    assert statuses(checks) == {"journal.steps": "passed", "journal.documents": "failed"}
    assert next(c.message for c in checks if c.name == "journal.documents") == (
        "step 1: documents differ from the schedule")


def test_step_documents_by_id() -> None:
    ids = [f"doc{i:04d}" for i in range(1024)]
    bodies = [{"step": s, "documents": [ids[i] for i in b]} for s, b in enumerate(SCHEDULE)]
    data, _ = make_journal(bodies)
    assert all(c.status == "passed"
               for c in check_step_documents(read_journal(data), SCHEDULE, ids=ids))


def test_update_times_sum_and_median() -> None:
    data, _ = make_journal(step_bodies())
    times = update_times(read_journal(data))
    assert (times.count, times.total, times.median) == (4, 16.0, 2.5)
    with pytest.raises(InvalidArgument):
        update_times([{"step": 0, "seconds": "1"}])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 8), st.data())
def test_any_removal_or_swap_of_lines_is_detected(count, data) -> None:
    journal, head = make_journal([{"step": i, "x": i % 3} for i in range(count)])
    lines = lines_of(journal)
    i = data.draw(st.integers(0, count - 1))
    if data.draw(st.booleans()):
        del lines[i]
    else:
        j = data.draw(st.integers(0, count - 1).filter(lambda j: j != i))
        lines[i], lines[j] = lines[j], lines[i]
    checks = check_journal(b"".join(lines), head=head)
    assert any(c.status == "failed" for c in checks)
