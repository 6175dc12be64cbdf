"""The training document schedule (docs/experiment.md §3) and checks of hash-chained journals.

Journal chain, version 1 (the training code writes journals this way):

1. A journal blob (what a ``journal/1`` record's ``entries`` links) is UTF-8 text with one
   entry per line. Every line ends with a single ``\\n``; there are no blank lines and no
   ``\\r``. An empty journal is the empty blob.
2. Each line is exactly ``rfc8785.dumps(entry)`` for one JSON object ``entry``: the stored
   line bytes are the RFC 8785 canonical form of the whole entry, ``hash`` included.
3. Every entry has the members ``prev`` and ``hash``:
   - ``hash`` is the lowercase SHA-256 hex of ``rfc8785.dumps(entry without "hash")``, so it
     covers ``prev`` and every other member;
   - ``prev`` is ``null`` in the first entry and the previous line's ``hash`` in every other.
4. The ``journal/1`` record's ``head`` is the ``hash`` of the last entry (``null`` when the
   journal is empty). ``head`` is what catches a removed last line.
5. Step entries are the entries with a ``step`` member; other entries (events such as a
   checkpoint or a digest agreement) may sit between them and are chained the same way. A
   step entry has ``step`` (0-based update index, consecutive), ``documents`` (the global
   batch of that step as schedule indices, in schedule order, identical on every rank),
   ``seconds`` (wall seconds of the update), and ``loss``, ``targets``, ``weighted_targets``,
   ``lr``, ``grad_norm``, ``bytes_communicated``.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import rfc8785

from ..core.errors import InvalidArgument, LogFormatError, RecordParseError
from ..core.results import Check
from ..records.reading import parse_json

_UNSET: Any = object()
_MAX_SHOWN = 10


def document_schedule(seed: int, documents: int, steps: int, batch: int) -> list[list[int]]:
    """Batches of document indices: shuffle ``range(documents)`` with ``Random(seed)`` as
    often as needed, concatenate, keep ``steps * batch`` indices, chunk by ``batch``."""
    for name, value in (("documents", documents), ("steps", steps), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(name, f"expected a positive integer, found {value!r}")
    g = random.Random(seed)
    order: list[int] = []
    while len(order) < steps * batch:
        epoch = list(range(documents))
        g.shuffle(epoch)
        order.extend(epoch)
    return [order[i * batch:(i + 1) * batch] for i in range(steps)]


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical entry without its ``hash`` member (rule 3)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def _lines(data: bytes) -> list[bytes]:
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _read_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(entry, problem); entry is None when the line cannot be read at all."""
    try:
        value = parse_json(line, what="journal line", jcs=True)
    except RecordParseError as exc:
        return None, exc.why
    if not isinstance(value, dict):
        return None, "not a JSON object"
    try:
        canonical = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        return None, f"cannot be canonicalised: {exc}"
    return value, None if canonical == line else "not in RFC 8785 canonical form"


def read_journal(data: bytes) -> list[Mapping[str, Any]]:
    """The entries of a journal blob; raises ``LogFormatError`` listing every unreadable line.

    Only readability is checked here; ``check_journal`` checks the chain.
    """
    entries: list[Mapping[str, Any]] = []
    problems: list[tuple[int, str]] = []
    for number, line in enumerate(_lines(data), start=1):
        entry, problem = _read_line(line)
        if entry is None:
            problems.append((number, problem or "unreadable"))
        else:
            entries.append(entry)
    if problems:
        raise LogFormatError("journal", problems)
    return entries


def check_journal(data: bytes, *, head: str | None = _UNSET,
                  name: str = "journal") -> list[Check]:
    """Every finding about a journal blob: line format, hash chain, and (if given) ``head``.

    Checks: ``<name>.lines`` (rules 1-2), ``<name>.chain`` (rule 3), ``<name>.head`` (rule 4).
    """
    format_problems: list[str] = []
    chain_problems: list[str] = []
    if data and not data.endswith(b"\n"):
        format_problems.append("last line does not end with a newline")
    previous: str | None = None
    previous_known = True
    last_hash: str | None = None
    lines = _lines(data)
    for number, line in enumerate(lines, start=1):
        if b"\r" in line or not line:
            format_problems.append(f"line {number}: blank or holds a carriage return")
        entry, problem = _read_line(line)
        if problem:
            format_problems.append(f"line {number}: {problem}")
        if entry is None:
            chain_problems.append(f"line {number}: unreadable, its links cannot be checked")
            previous_known, last_hash = False, None
            continue
        stated = entry.get("hash")
        try:
            recomputed = entry_hash(entry)
        except rfc8785.CanonicalizationError as exc:
            recomputed = None
            chain_problems.append(f"line {number}: cannot hash the entry: {exc}")
        if "prev" not in entry or "hash" not in entry:
            chain_problems.append(f"line {number}: lacks 'prev' or 'hash'")
        if recomputed is not None and stated != recomputed:
            chain_problems.append(f"line {number}: 'hash' does not match the entry's content")
        if not previous_known:
            chain_problems.append(f"line {number}: 'prev' cannot be checked, the line before "
                                  "is unreadable")
        elif entry.get("prev") != previous:
            expected = "null" if previous is None else f"the hash of line {number - 1}"
            chain_problems.append(f"line {number}: 'prev' is not {expected}")
        # Chain on the stated hash: a line whose own hash is wrong is reported once, above,
        # and the next line is judged on what it links to.
        previous, previous_known = stated if isinstance(stated, str) else None, True
        last_hash = previous
    checks = [
        _problems_check(f"{name}.lines", format_problems, recomputed=len(lines)),
        _problems_check(f"{name}.chain", chain_problems, recomputed=last_hash),
    ]
    if head is not _UNSET:
        checks.append(Check.verdict(
            f"{name}.head", head == last_hash and previous_known, claimed=head,
            recomputed=last_hash, message="head is not the hash of the journal's last entry"))
    return checks


def _problems_check(name: str, problems: list[str], *, recomputed: Any = None) -> Check:
    shown = "; ".join(problems[:_MAX_SHOWN])
    more = f" (and {len(problems) - _MAX_SHOWN} more)" if len(problems) > _MAX_SHOWN else ""
    return Check.verdict(name, not problems, recomputed=recomputed, message=shown + more)


def step_entries(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The step entries of a journal (rule 5), in journal order."""
    return [e for e in entries if "step" in e]


def check_step_documents(entries: Sequence[Mapping[str, Any]], schedule: Sequence[Sequence[int]],
                         *, ids: Sequence[Any] | None = None, first_step: int = 0,
                         name: str = "journal") -> list[Check]:
    """Check that step entries run ``first_step, first_step + 1, ...`` through the whole
    schedule and that each step's ``documents`` equal its scheduled batch.

    When the journal records document ids instead of indices, pass ``ids`` (the training
    documents in index order) and the schedule is mapped through it before comparing.
    """
    steps = step_entries(entries)
    numbers = [e.get("step") for e in steps]
    expected_numbers = list(range(first_step, first_step + len(schedule)))
    checks = [Check.verdict(f"{name}.steps", numbers == expected_numbers,
                            claimed=len(numbers), recomputed=len(expected_numbers),
                            message=f"step numbers are not {first_step}..."
                                    f"{first_step + len(schedule) - 1} in order")]
    wrong: list[str] = []
    for entry in steps:
        step = entry.get("step")
        index = step - first_step if isinstance(step, int) and not isinstance(step, bool) else -1
        if not 0 <= index < len(schedule):
            wrong.append(f"step {step!r}: not in the schedule")
            continue
        batch = list(schedule[index])
        expected = [ids[i] for i in batch] if ids is not None else batch
        if entry.get("documents") != expected:
            wrong.append(f"step {step}: documents differ from the schedule")
    checks.append(_problems_check(f"{name}.documents", wrong, recomputed=len(steps)))
    return checks


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateTimes:
    """Update-time summary over a journal's step entries."""

    count: int
    """Number of step entries."""
    total: float
    """Sum of their ``seconds``."""
    median: float
    """``statistics.median`` of their ``seconds``."""


def update_times(entries: Sequence[Mapping[str, Any]], *, key: str = "seconds") -> UpdateTimes:
    """Sum and median of the step entries' update seconds."""
    seconds = []
    for entry in step_entries(entries):
        value = entry.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(f"journal {key!r}",
                                  f"step {entry.get('step')!r} has {value!r}, not a number")
        seconds.append(float(value))
    if not seconds:
        raise InvalidArgument("journal", "no step entries")
    return UpdateTimes(count=len(seconds), total=math.fsum(seconds), median=statistics.median(seconds))
