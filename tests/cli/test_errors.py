"""Bad input: exit 2, one line on stderr naming what is wrong, no traceback, nothing written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import blake3
import pytest

from nscas.objects.digests import Digest
from nscas.store.opening import open_store

from .conftest import Nscas, assert_user_error, snapshot


@pytest.fixture
def two_blobs(store: Path) -> tuple[Digest, Digest]:
    with open_store(store) as s:
        return s.put_bytes(b"first blob\n"), s.put_bytes(b"second blob\n")


def colliding_pair() -> tuple[bytes, bytes, str]:
    """Two byte strings whose BLAKE3 IDs share their first 8 hex digits.

    A birthday search: among ~10^5 short strings two share 32 bits with high probability
    (about 130 000 tries, a fraction of a second), so the ambiguous path is exercised for real.
    """
    seen: dict[str, bytes] = {}
    i = 0
    while True:
        data = b"ambiguous-%d" % i
        prefix = blake3.blake3(data).hexdigest()[:8]
        if prefix in seen:
            return seen[prefix], data, prefix
        seen[prefix] = data
        i += 1


def test_add_missing_path_adds_nothing(nscas: Nscas, store: Path, checkpoint: Path,
                                       tmp_path: Path) -> None:
    before = snapshot(store)
    r = nscas("add", str(checkpoint), str(tmp_path / "nope"), str(tmp_path / "gone.bin"))
    assert_user_error(r, "no such file or directory", str(tmp_path / "nope"), str(tmp_path / "gone.bin"))
    assert snapshot(store) == before


def test_add_ref_with_two_paths(nscas: Nscas, store: Path, checkpoint: Path) -> None:
    before = snapshot(store)
    r = nscas("add", str(checkpoint), str(checkpoint / "config.json"), "--ref", "experiments/x")
    assert_user_error(r, "--ref names one object, but 2 paths were given")
    assert snapshot(store) == before


def test_add_invalid_ref_name(nscas: Nscas, store: Path, checkpoint: Path) -> None:
    before = snapshot(store)
    assert_user_error(nscas("add", str(checkpoint), "--ref", "../escape"), "invalid ref name '../escape'")
    assert snapshot(store) == before


@pytest.mark.parametrize("bad", ["blake3:xyz", "blake3:1234567", "blake3:ABCDEF0123",
                                 "blake3:" + "0" * 65, "12345678:"])
def test_invalid_id(nscas: Nscas, store: Path, two_blobs: object, bad: str) -> None:
    before = snapshot(store)
    assert_user_error(nscas("show", bad), f"invalid object ID or prefix {bad!r}")
    assert snapshot(store) == before


def test_unknown_prefix(nscas: Nscas, store: Path, two_blobs: tuple[Digest, Digest]) -> None:
    absent = next(p for p in ("00000000", "ffffffff") if not any(d.hex.startswith(p) for d in two_blobs))
    assert_user_error(nscas("cat", absent), f"not found: object with ID prefix {absent}")


@pytest.mark.parametrize("name", ["experiments/none", "1234567", "ABCDEF0123"])
def test_unknown_ref(nscas: Nscas, name: str) -> None:
    # Too short or not lowercase to be a prefix, these read as ref names.
    assert_user_error(nscas("show", name), f"not found: ref {name!r}")


def test_ambiguous_prefix_lists_candidates(nscas: Nscas, store: Path) -> None:
    a, b, prefix = colliding_pair()
    with open_store(store) as s:
        ids = sorted([s.put_bytes(a), s.put_bytes(b)])
    assert ids[0].hex[:8] == ids[1].hex[:8] == prefix
    before = snapshot(store)
    for command in ("show", "cat"):
        line = assert_user_error(nscas(command, prefix), f"ambiguous ID prefix {prefix!r} matches 2 objects")
        assert f"{ids[0]}, {ids[1]}" in line
    # One more digit that tells them apart resolves to exactly one.
    longer = next(ids[0].hex[:n] for n in range(9, 65) if ids[0].hex[:n] != ids[1].hex[:n])
    assert nscas("cat", longer).stdout_bytes in (a, b)
    assert snapshot(store) == before


def test_ref_cas_conflict_names_both_values(nscas: Nscas, store: Path,
                                            two_blobs: tuple[Digest, Digest]) -> None:
    first, second = two_blobs
    assert nscas("ref", "set", "experiments/best", str(first), "--expect", "none").exit_code == 0
    before = snapshot(store)
    r = nscas("ref", "set", "experiments/best", str(second), "--expect", str(second))
    assert_user_error(r, f"ref 'experiments/best' is {first}, not {second} as expected")
    r = nscas("ref", "set", "experiments/best", str(second), "--expect", "none")
    assert_user_error(r, f"ref 'experiments/best' is {first}, not unset as expected")
    assert snapshot(store) == before
    r = nscas("ref", "set", "experiments/best", str(second), "--expect", first.hex[:10], "--json")
    assert r.json() == {"name": "experiments/best", "old": str(first), "new": str(second)}


def test_tags_never_move(nscas: Nscas, store: Path, two_blobs: tuple[Digest, Digest]) -> None:
    first, second = two_blobs
    assert nscas("ref", "set", "tags/v1", str(first)).exit_code == 0
    assert nscas("ref", "set", "tags/v1", str(first)).exit_code == 0  # same value: not a move
    before = snapshot(store)
    r = nscas("ref", "set", "tags/v1", str(second))
    assert_user_error(r, f"tag 'tags/v1' is already set to {first}; tags never move")
    assert snapshot(store) == before


def test_ref_set_unknown_target(nscas: Nscas, store: Path) -> None:
    before = snapshot(store)
    assert_user_error(nscas("ref", "set", "experiments/x", "blake3:" + "ab" * 32),
                      f"not found: blake3:{'ab' * 32}")
    assert snapshot(store) == before


def test_get_refuses_to_overwrite(nscas: Nscas, store: Path, two_blobs: tuple[Digest, Digest],
                                  tmp_path: Path) -> None:
    dest = tmp_path / "taken.txt"
    dest.write_bytes(b"precious")
    r = nscas("get", str(two_blobs[0]), str(dest))
    assert_user_error(r, f"destination {dest} already exists; nscas never overwrites")
    assert dest.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "taken.txt"]


def test_store_of_a_newer_schema(nscas: Nscas, store: Path) -> None:
    con = sqlite3.connect(store / "nscas.db")
    con.execute("UPDATE alembic_version SET version_num = 'zzzz_future'")
    con.commit()
    con.close()
    before = snapshot(store)
    for args in (["log"], ["init", str(store)], ["add", str(store / "nscas.db")]):
        line = assert_user_error(nscas(*args), "schema version 'zzzz_future', newer than this nscas knows")
        assert line.endswith("upgrade nscas")
    assert snapshot(store) == before


def test_no_store_found(nscas: Nscas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", str(tmp_path))
    assert_user_error(nscas("log", use_store=False),
                      f"no nscas store in {empty.resolve()} or its parents up to {tmp_path.resolve()}")
    assert list(empty.iterdir()) == []


def test_the_search_for_a_store_stops_at_a_ceiling(nscas: Nscas, store: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is ``project/.nscas``: found from below it, unless a ceiling lies between."""
    project = store.parent
    deeper = project / "a" / "b"
    deeper.mkdir(parents=True)
    monkeypatch.chdir(deeper)
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    for ceiling in (str(project), f"relative/path:{project}", f"{project / 'x'}:{project}"):
        monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", ceiling)
        assert nscas("log", use_store=False).exit_code == 0
    for ceiling in (str(project / "a"), f"{deeper}:{project}"):
        monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", ceiling)
        stop = Path(ceiling.split(":")[0]).resolve()
        assert_user_error(nscas("log", use_store=False), f"its parents up to {stop} (the ceiling")
    assert list(deeper.iterdir()) == []


def test_os_errors_are_one_line_too(nscas: Nscas, two_blobs: tuple[Digest, Digest],
                                    tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    r = nscas("get", str(two_blobs[0]), str(blocker / "below"))
    assert_user_error(r, f"File exists: {blocker}", code=1)
    assert blocker.read_bytes() == b""
