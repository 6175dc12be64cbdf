"""IDs and ref names are taken exactly as given: whitespace around one is refused, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Nscas, assert_user_error, snapshot


@pytest.mark.parametrize("pad", [" {}", "{} ", "{}\n", "\t{}", " {} "])
@pytest.mark.parametrize("which", ["id", "prefix", "ref"])
def test_an_id_with_whitespace_around_it_is_refused(nscas: Nscas, store: Path, tmp_path: Path,
                                                    pad: str, which: str) -> None:
    (tmp_path / "a").write_text("a\n")
    [added] = nscas("add", str(tmp_path / "a"), "--ref", "exp/a", "--json").json()
    text = {"id": added["id"], "prefix": added["id"][7:19], "ref": "exp/a"}[which]
    given = pad.format(text)
    before = snapshot(store)
    for args in (("cat", given), ("show", given), ("lineage", given),
                 ("ref", "set", "exp/b", given), ("ref", "set", "exp/a", added["id"], "--expect", given)):
        line = assert_user_error(nscas(*args), "surrounding whitespace")
        assert repr(given) in line, line
    assert snapshot(store) == before
    assert nscas("cat", text).stdout == "a\n"
