"""Recipe ``conversations`` rechecked: the selection redone from the corpus bytes and params.

An independent implementation of docs/experiment.md §2.1 (the verifiers import no nscas
code): the corpus is a JSON array read element by element up to the end of the data or the
first element that is not JSON; elements are checked in a fixed order of reasons; eligible
conversations are walked in ascending SHA-256 of ``"<seed>:<id>"``; each is measured by the
tokenizer input's own chat template and ``tokenizer.json`` (rendered as in ``chat``). When
the corpus or the tokenizer is present the selection is rebuilt and the outputs must be its
bytes; whatever the corpus, every output conversation is checked for shape, disjointness and
length.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import VerifierError
from ..core.results import Check, Needs
from ..records.closure import Objects, Unusable
from .chat import conversation_renderer, template_source

REASONS = ("not_object", "bad_id", "duplicate_id", "bad_turns", "other_role", "empty_text",
           "not_alternating", "too_few_turns")
REJECTIONS = ("same_thread", "repeated_prompt", "too_long")
CORPUS_CLAIMS = ("entries", "complete", "unread_bytes", "skipped", "eligible", "considered",
                 "rejected")
OUTPUT_CLAIMS = ("replay_count", "retention_count", "replay_tokens", "retention_tokens")
PARAMS = ("seed", "replay_count", "retention_count", "max_length", "min_turns")
_WHITESPACE = " \t\n\r"
_PART = re.compile(r"(.+)_(\d+)")
_SHOWN = 5


class SelectionError(VerifierError):
    """The corpus or the run's params cannot give a selection."""


def _object(pairs: list[tuple[str, Any]]) -> Any:
    # A repeated key makes the object invalid (None is never a valid element or turn).
    return dict(pairs) if len({k for k, _ in pairs}) == len(pairs) else None


def _skip_ws(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def corpus_elements(data: bytes) -> tuple[list[Any], bool, int]:
    """(the array's readable elements, whether it closed, bytes left unread)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SelectionError("the corpus is not UTF-8") from None
    decoder = json.JSONDecoder(object_pairs_hook=_object)
    at = _skip_ws(text, 0)
    if not text.startswith("[", at):
        raise SelectionError("the corpus is not a JSON array")
    at = _skip_ws(text, at + 1)
    if text.startswith("]", at):
        if _skip_ws(text, at + 1) != len(text):
            raise SelectionError("data follows the corpus array")
        return [], True, 0
    elements: list[Any] = []
    while True:
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return elements, False, len(text[at:].encode("utf-8"))
        sep = _skip_ws(text, end)
        if sep >= len(text) or text[sep] not in ",]":
            return elements, False, len(text[at:].encode("utf-8"))
        elements.append(value)
        if text[sep] == "]":
            if _skip_ws(text, sep + 1) != len(text):
                raise SelectionError("data follows the corpus array")
            return elements, True, 0
        at = _skip_ws(text, sep + 1)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _has_id(e: Any) -> bool:
    return (isinstance(e, dict) and "id" in e and "conversations" in e
            and isinstance(e["id"], str) and 1 <= len(e["id"]) <= 256 and _encodable(e["id"]))


def _why_not(e: Any, counts: Mapping[str, int], min_turns: int) -> str | None:
    if not (isinstance(e, dict) and "id" in e and "conversations" in e):
        return "not_object"
    if not _has_id(e):
        return "bad_id"
    if counts[e["id"]] != 1:
        return "duplicate_id"
    turns = e["conversations"]
    if not isinstance(turns, list):
        return "bad_turns"
    for t in turns:
        if not (isinstance(t, dict) and sorted(t) == ["from", "value"]
                and isinstance(t["from"], str) and isinstance(t["value"], str)):
            return "bad_turns"
    if any(t["from"] not in ("human", "gpt") for t in turns):
        return "other_role"
    if any(t["value"].strip() == "" or not _encodable(t["value"]) for t in turns):
        return "empty_text"
    if len(turns) == 0 or len(turns) % 2 == 1 or any(
            t["from"] != ("gpt" if i % 2 else "human") for i, t in enumerate(turns)):
        return "not_alternating"
    return "too_few_turns" if len(turns) < 2 * min_turns else None


def eligible(elements: list[Any], min_turns: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The eligible conversations in prepare's format (corpus order) and the skips by reason."""
    counts: dict[str, int] = {}
    for e in elements:
        if _has_id(e):
            counts[e["id"]] = counts.get(e["id"], 0) + 1
    skipped = dict.fromkeys(REASONS, 0)
    out = []
    for e in elements:
        reason = _why_not(e, counts, min_turns)
        if reason is not None:
            skipped[reason] += 1
            continue
        role = {"human": "user", "gpt": "assistant"}
        out.append({"id": e["id"], "messages": [{"role": role[t["from"]], "content": t["value"]}
                                                for t in e["conversations"]]})
    return out, {k: v for k, v in skipped.items() if v}


def _thread(conversation_id: str) -> str:
    match = _PART.fullmatch(conversation_id)
    return conversation_id if match is None else match.group(1)


def reselect(candidates: list[dict[str, Any]], params: Mapping[str, Any],
             length: Callable[[list[dict[str, str]]], int]) -> dict[str, Any]:
    """The two sets and the walk's counts, as the recipe must have found them."""
    seed, want_replay, want_retention = (params["seed"], params["replay_count"],
                                         params["retention_count"])
    walk = sorted(candidates, key=lambda c: (
        hashlib.sha256(f"{seed}:{c['id']}".encode()).digest(), c["id"]))
    sets: dict[str, list[dict[str, Any]]] = {"replay": [], "retention": []}
    tokens = {"replay": 0, "retention": 0}
    rejected = dict.fromkeys(REJECTIONS, 0)
    threads: set[str] = set()
    prompts: set[str] = set()
    considered = 0
    for c in walk:
        if len(sets["replay"]) >= want_replay and len(sets["retention"]) >= want_retention:
            break
        considered += 1
        first = c["messages"][0]["content"]
        if _thread(c["id"]) in threads:
            rejected["same_thread"] += 1
        elif first in prompts:
            rejected["repeated_prompt"] += 1
        else:
            n = length(c["messages"])
            if n > params["max_length"]:
                rejected["too_long"] += 1
                continue
            threads.add(_thread(c["id"]))
            prompts.add(first)
            kind = "replay" if len(sets["replay"]) < want_replay else "retention"
            sets[kind].append(c)
            tokens[kind] += n
    if len(sets["replay"]) < want_replay or len(sets["retention"]) < want_retention:
        raise SelectionError("the corpus cannot fill the sets the params ask for, yet the run "
                             "succeeded")
    return {"sets": sets, "considered": considered, "rejected": rejected,
            "replay_tokens": tokens["replay"], "retention_tokens": tokens["retention"],
            "replay_count": want_replay, "retention_count": want_retention}


def conversation_lines(records: list[dict[str, Any]]) -> bytes:
    """Compact JSON lines, ASCII escapes, as prepare reads them."""
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def measurer(objects: Objects, tokenizer_input: str) -> Callable[[list[dict[str, str]]], int]:
    """Token count of a conversation under the tokenizer input's template and tokenizer.json
    (the input is a tokenizer tree/1 or a checkpoint/1's files); raises ``Unusable`` or
    ``VerifierError`` when it has neither."""
    from tokenizers import Tokenizer  # heavy; only when a selection is verified

    record = objects.record(tokenizer_input)
    tree = (objects.record_of(record["files"], "tree/1") if record["nscas"] == "checkpoint/1"
            else objects.record_of(tokenizer_input, "tree/1"))
    entries = tree["entries"]
    if "tokenizer.json" not in entries:
        raise SelectionError("the tokenizer input holds no tokenizer.json")
    try:
        tokenizer = Tokenizer.from_str(objects.bytes(entries["tokenizer.json"]["id"]).decode())
    except Exception as exc:  # the Rust library raises bare Exception for a file it cannot parse
        raise SelectionError(f"tokenizer.json cannot be read ({exc})") from None
    render = conversation_renderer(*template_source(objects, entries))
    return lambda messages: len(tokenizer.encode(render(messages), add_special_tokens=False).ids)


def _lines(data: bytes, what: str) -> list[Any]:
    try:
        text = data.decode("utf-8")
        if text and not text.endswith("\n"):
            raise ValueError("the last line lacks its newline")
        return [json.loads(line) for line in text.split("\n")[:-1]]
    except (UnicodeDecodeError, ValueError) as exc:
        raise SelectionError(f"{what} is not JSON lines ({exc})") from None


def _shape(records: list[dict[str, Any]], what: str) -> list[str]:
    problems = []
    for n, r in enumerate(records, start=1):
        ms = r.get("messages") if isinstance(r, dict) else None
        if not (isinstance(r, dict) and set(r) == {"id", "messages"} and isinstance(r["id"], str)
                and isinstance(ms, list) and ms and len(ms) % 2 == 0 and all(
                    isinstance(m, dict) and set(m) == {"role", "content"}
                    and m["role"] == ("assistant" if i % 2 else "user")
                    and isinstance(m["content"], str) and m["content"].strip()
                    for i, m in enumerate(ms))):
            problems.append(f"{what} line {n} is not a user/assistant conversation")
    return problems


def check_selection(objects: Objects, *, name: str, params: Mapping[str, Any],
                    inputs: Mapping[str, str], outputs: Mapping[str, str],
                    values: dict[str, Any], not_rechecked: dict[str, tuple[Needs, str]]
                    ) -> list[Check]:
    """Checks of a conversations run; fills ``values`` with recomputed claims and
    ``not_rechecked`` with the claims the absent corpus leaves unrecomputed (and why)."""
    checks: list[Check] = []
    bad = [k for k in PARAMS if not (isinstance(params.get(k), int)
                                     and not isinstance(params.get(k), bool))]
    if bad:
        return [Check.failed(f"{name}.selection", f"params {bad} are not integers")]
    sets = {kind: _lines(objects.bytes(outputs[kind]), kind) for kind in ("replay", "retention")}
    length = measurer(objects, inputs["tokenizer"])
    problems = [p for kind, recs in sets.items() for p in _shape(recs, kind)]
    if not problems:
        ids = [r["id"] for recs in sets.values() for r in recs]
        threads = [_thread(i) for i in ids]
        firsts = [r["messages"][0]["content"] for recs in sets.values() for r in recs]
        for what, items in (("id", ids), ("thread", threads), ("first prompt", firsts)):
            if len(set(items)) != len(items):
                problems.append(f"a {what} occurs twice across the two sets")
        sizes = {kind: [length(r["messages"]) for r in recs] for kind, recs in sets.items()}
        long = [f"{kind} {r['id']} ({n} tokens)" for kind, recs in sets.items()
                for r, n in zip(recs, sizes[kind], strict=True) if n > params["max_length"]]
        if long:
            problems.append(f"longer than max_length {params['max_length']}: "
                            + ", ".join(long[:_SHOWN]))
        for kind in ("replay", "retention"):
            values[f"{kind}_count"] = len(sets[kind])
            values[f"{kind}_tokens"] = sum(sizes[kind])
            if len(sets[kind]) != params[f"{kind}_count"]:
                problems.append(f"{kind} holds {len(sets[kind])}, the params ask for "
                                f"{params[f'{kind}_count']}")
    checks.append(Check.verdict(f"{name}.sets", not problems, message="; ".join(problems),
                                recomputed={k: len(v) for k, v in sets.items()}))
    try:
        corpus = objects.bytes(inputs["corpus"])
    except Unusable as exc:
        if exc.needs is None:
            raise
        for claim in CORPUS_CLAIMS:
            not_rechecked[claim] = (exc.needs, f"the corpus {inputs['corpus']} is not here: "
                                               f"{exc.why}")
        checks.append(Check.skipped(f"{name}.reselected", "the corpus is omitted, so the "
                                    "selection is not redone", needs=exc.needs))
        return checks
    elements, complete, unread = corpus_elements(corpus)
    candidates, skipped = eligible(elements, params["min_turns"])
    redone = reselect(candidates, params, length)
    values.update({"entries": len(elements), "complete": complete, "unread_bytes": unread,
                   "skipped": skipped, "eligible": len(candidates),
                   "considered": redone["considered"], "rejected": redone["rejected"]})
    differ = [kind for kind in ("replay", "retention")
              if objects.bytes(outputs[kind]) != conversation_lines(redone["sets"][kind])]
    checks.append(Check.verdict(
        f"{name}.reselected", not differ, recomputed=redone["considered"],
        message=f"output(s) {differ} are not the selection the corpus and params give"))
    return checks

