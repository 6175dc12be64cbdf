"""Records nest at most 64 levels deep (docs/format.md §2.3), as the verifiers read them: a
deeper value or deeper bytes are refused with one error, not a RecursionError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nscas.errors import RecordError
from nscas.objects import canonical
from nscas.store.writer import init_store


def _nested(levels: int) -> dict[str, Any]:
    """A tree/1-free record value whose objects nest ``levels`` deep."""
    inner: dict[str, Any] = {}
    for _ in range(levels - 2):
        inner = {"a": inner}
    return {"nscas": "tree/1", "entries": {}, "x": inner} if levels > 1 else {}


@pytest.mark.parametrize("levels", [65, 1000, 50_000])
def test_a_too_deep_value_is_refused_before_anything_recurses(levels: int) -> None:
    with pytest.raises(RecordError, match="at most 64 levels"):
        canonical.encode(_nested(levels))


def test_sixty_four_levels_encode_and_decode() -> None:
    value = _nested(64)
    assert canonical.value_depth(value) == 64
    assert canonical.decode(canonical.encode(value)) == value


@pytest.mark.parametrize("levels", [65, 50_000])
def test_too_deep_bytes_are_refused(levels: int) -> None:
    data = ('{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)).encode()
    with pytest.raises(RecordError, match="deeper than 64"):
        canonical.decode(data)


def test_the_store_refuses_a_too_deep_record_and_keeps_nothing(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    try:
        before = store.log(limit=10)
        with pytest.raises(RecordError, match="at most 64 levels"):
            store.put_record({"nscas": "tree/1", "entries": {}, **{"x": _nested(70)}})
        assert store.log(limit=10) == before
    finally:
        store.close()
