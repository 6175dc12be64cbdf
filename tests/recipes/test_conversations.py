"""Replay and retention conversation blobs: validation and the offline stand-in set."""

from __future__ import annotations

import json

import pytest

from nscas.errors import InvalidInput
from nscas.recipes.common.conversations import (
    ConversationError,
    conversations_jsonl,
    standin_conversations,
    validate_conversations,
)

USER = {"role": "user", "content": "Hi"}
ASSISTANT = {"role": "assistant", "content": "Hello."}
SYSTEM = {"role": "system", "content": "Be brief."}


def _blob(*records: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_valid_conversations_round_trip() -> None:
    records = [
        {"id": "a", "messages": [USER, ASSISTANT]},
        {"id": "b", "messages": [SYSTEM, USER, ASSISTANT, USER, ASSISTANT]},
        {"id": "c", "messages": [USER, ASSISTANT], "standin": True},
    ]
    assert validate_conversations(_blob(*records)) == records
    assert validate_conversations(conversations_jsonl(records)) == records
    assert validate_conversations(b"") == []


@pytest.mark.parametrize(("record", "match"), [
    ({"id": "x", "messages": [USER]}, "at least one user turn and one assistant turn"),
    ({"id": "x", "messages": [SYSTEM, USER]}, "at least one user turn"),
    ({"id": "x", "messages": [USER, ASSISTANT, USER]}, "must end with an assistant turn"),
    ({"id": "x", "messages": [ASSISTANT, USER]}, "message 0 has role 'assistant', expected 'user'"),
    ({"id": "x", "messages": [USER, USER, ASSISTANT]}, "message 1 has role 'user'"),
    ({"id": "x", "messages": [USER, SYSTEM, ASSISTANT]}, "message 1 has role 'system'"),
    ({"id": "x", "messages": [USER, {"role": "assistant", "content": ""}]}, "non-empty string"),
    ({"id": "x", "messages": [USER, {"role": "assistant", "content": 3}]}, "non-empty string"),
    ({"id": "x", "messages": [USER, {"role": "assistant"}]}, "exactly 'role' and 'content'"),
    ({"id": "x", "messages": [USER, {**ASSISTANT, "name": "bot"}]}, "exactly 'role'"),
    ({"id": "x", "messages": []}, "non-empty list"),
    ({"id": "x"}, "non-empty list"),
    ({"id": "x", "messages": [USER, ASSISTANT], "source": "web"}, r"unknown key\(s\) \['source'\]"),
    ({"id": "x", "messages": [USER, ASSISTANT], "standin": "yes"}, "'standin' must be"),
])
def test_bad_conversation_names_line_and_id(record: dict, match: str) -> None:
    good = {"id": "ok", "messages": [USER, ASSISTANT]}
    with pytest.raises(ConversationError, match=match) as info:
        validate_conversations(_blob(good, record))
    assert info.value.line == 2 and info.value.conversation_id == "x"
    assert "line 2 (id 'x')" in str(info.value)


@pytest.mark.parametrize(("data", "match"), [
    (b'{"id": "a"\n', "line 1: not JSON"),
    (b"[]\n", "line 1: expected a JSON object"),
    (b'{"id": 5, "messages": []}\n', "line 1: 'id' must be a non-empty string"),
    (b"\n", "line 1: not JSON"),
    (_blob({"id": "a", "messages": [USER, ASSISTANT]}).rstrip(b"\n"), "line 1: .*lacks"),
    (_blob({"id": "a", "messages": [USER, ASSISTANT]}) * 2, "line 2 .*id repeats line 1"),
])
def test_bad_lines(data: bytes, match: str) -> None:
    with pytest.raises(ConversationError, match=match):
        validate_conversations(data)


def test_not_utf8() -> None:
    with pytest.raises(InvalidInput, match="not UTF-8"):
        validate_conversations(b"\xff\n")


def _texts(records: list[dict]) -> list[str]:
    return [m["content"] for r in records for m in r["messages"]]


def test_standins_are_valid_labelled_and_deterministic() -> None:
    replay = standin_conversations("replay", 256, 7)
    retention = standin_conversations("retention", 128, 7)
    assert len(replay) == 256 and len(retention) == 128
    for records in (replay, retention):
        assert validate_conversations(conversations_jsonl(records)) == records
        assert all(r["standin"] is True for r in records)
        assert len(set(_texts(records))) == len(_texts(records))  # no text repeats
    assert replay[0]["id"] == "standin-replay-0000"
    assert retention[127]["id"] == "standin-retention-0127"
    assert not {r["id"] for r in replay} & {r["id"] for r in retention}
    assert not set(_texts(replay)) & set(_texts(retention))
    assert standin_conversations("replay", 256, 7) == replay
    assert standin_conversations("replay", 10, 7) == replay[:10]
    assert standin_conversations("replay", 10, 8) != replay[:10]
    # Varied: several templates and some multi-turn conversations.
    assert any(len(r["messages"]) > 2 for r in replay)
    starts = {r["messages"][0]["content"].split()[0] for r in replay}
    assert {"What", "How", "Which", "Put"} <= starts


def test_standins_never_share_texts_across_seeds() -> None:
    replay = standin_conversations("replay", 64, 1)
    retention = standin_conversations("retention", 64, 2)
    assert not set(_texts(replay)) & set(_texts(retention))


@pytest.mark.parametrize(("args", "match"), [
    (("training", 3, 1), "kind"), (("replay", -1, 1), "count"), (("replay", 3, "1"), "seed"),
])
def test_standin_arguments(args: tuple, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        standin_conversations(*args)
