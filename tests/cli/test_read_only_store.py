"""A store on a read-only mount: every read command works, every write says the store is
read-only in one line (exit 2). Mounted for real, in a namespace of the test's own: the tests
run as root, which a chmod would not stop."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.runs.runner import run_file
from nscas.store.writer import Store, init_store
from tests.runner.helpers import PREPARE_RECIPE, write

from . import mounted
from .conftest import Result, assert_user_error, snapshot

pytestmark = pytest.mark.skipif(not mounted.usable(), reason="needs unshare -m and mount (root)")


def _result(raw: dict[str, Any]) -> Result:
    return Result(exit_code=raw["exit_code"], stdout=raw["stdout"], stderr=raw["stderr"],
                  stdout_bytes=raw["stdout"].encode())


def read_only(directory: Path, *commands: list[str], cwd: Path | None = None) -> list[Result]:
    """Each nscas command run with ``directory`` bind-mounted read-only over itself."""
    steps: list[dict[str, Any]] = [{"mount": ["--bind", "-o", "ro", str(directory), str(directory)]}]
    steps += [{"nscas": ["--store", str(directory), *c], "cwd": str(cwd or directory)}
              for c in commands]
    return [_result(r) for r in mounted.run(steps)]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A closed store holding a blob, a tree and a receipt (a tiny prepare run), and their IDs."""
    directory = tmp_path_factory.mktemp("ro")
    store = init_store(directory)
    try:
        (directory / "files").mkdir()
        (directory / "files" / "a.txt").write_text("hello\n")
        blob = store.put_file(directory / "files" / "a.txt")
        tree = store.put_tree(directory / "files")
        store.ref_set("x", blob)
        [step] = run_file(store, write(directory, "prepare.toml", PREPARE_RECIPE))
        ids = {"blob": str(blob), "tree": str(tree), "receipt": str(step.receipt)}
    finally:
        store.close()
    assert not (directory / ".nscas" / "nscas.db-shm").exists()  # closed cleanly: no -shm
    yield directory / ".nscas", ids


def test_every_read_command_works_on_a_read_only_store(
        project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, ids = project
    before = snapshot(root)
    out = tmp_path / "out"
    commands = {
        "log": ["log"], "show": ["show", ids["tree"]], "cat": ["cat", "x"],
        "get": ["get", ids["tree"], str(out / "tree")], "lineage": ["lineage", ids["receipt"]],
        "ref list": ["ref", "list"], "ref log": ["ref", "log"], "fsck": ["fsck", "--full"],
        "export": ["export", ids["receipt"], str(out / "bundle")],
        "verify": ["verify", ids["receipt"]], "gc --dry-run": ["gc", "--dry-run"],
        "init": ["init"],
    }
    results = dict(zip(commands, read_only(root, *commands.values(), cwd=tmp_path), strict=True))
    for name, r in results.items():
        assert r.exit_code == 0, (name, r.stderr)
        assert "Traceback" not in r.stderr and "read-only" not in r.stderr, (name, r.stderr)
    assert results["cat"].stdout == "hello\n"
    assert ids["receipt"] in results["log"].stdout
    assert "x" in results["ref list"].stdout and ids["blob"] in results["ref log"].stdout
    assert results["fsck"].stdout.startswith("ok: ")
    assert (out / "tree" / "a.txt").read_text() == "hello\n"
    assert (out / "bundle" / "SHA256SUMS").is_file()
    assert "already" in results["init"].stdout
    assert snapshot(root) == before


def test_every_write_says_the_store_is_read_only(project: tuple[Path, dict[str, str]],
                                                 tmp_path: Path) -> None:
    root, ids = project
    (tmp_path / "new.txt").write_text("new\n")
    recipe = write(tmp_path, "prepare.toml", PREPARE_RECIPE.replace("replay_count = 8",
                                                                    "replay_count = 9"))
    before = snapshot(root)
    commands = [["add", str(tmp_path / "new.txt")], ["ref", "set", "y", ids["blob"]],
                ["run", str(recipe)], ["gc", "--min-age", "0"], ["init", "--upgrade"],
                ["init", str(root), "--upgrade"]]
    for r in read_only(root, *commands, cwd=tmp_path):
        assert_user_error(r, f"the store at {root} is read-only")
    assert snapshot(root) == before


def test_a_live_writers_commits_are_read_through_its_shm(store: Path) -> None:
    # A writer holds the store open (its -shm and -wal exist, the commits still in the WAL):
    # a reader on a read-only view of the same files sees them.
    with Store(store) as writer:
        writer.ref_set("live", writer.put_bytes(b"committed, not yet checkpointed"))
        assert (store / "nscas.db-shm").exists() and (store / "nscas.db-wal").stat().st_size > 0
        [refs] = read_only(store, ["ref", "list"])
    assert refs.exit_code == 0, refs.stderr
    assert "live" in refs.stdout


def test_commits_left_in_the_wal_without_its_shm_are_refused_not_ignored(
        store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / ".nscas"
    with Store(store) as writer:
        writer.ref_set("live", writer.put_bytes(b"only in the WAL"))
        copy.mkdir(parents=True)
        for name in ("nscas.db", "nscas.db-wal"):  # as a crash and a copy would leave them
            shutil.copyfile(store / name, copy / name)
        shutil.copytree(store / "data", copy / "data")
    [r] = read_only(copy, ["ref", "list"])
    assert_user_error(r, f"the store at {copy} is read-only", "nscas.db-wal")
