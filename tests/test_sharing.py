"""The suite's shared builds: built once, a failure reported to every later ask, a deadline."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.sharing import built_once
from tests.waiting import DeadlinePassed, deadline


def test_a_build_runs_once_and_each_ask_gets_its_own_copy(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(where: Path) -> int:
        calls.append(where)
        (where / "made").write_text("x")
        return 7

    name = f"once-{tmp_path.name}"
    first, value = built_once(tmp_path_factory, name, build)
    second, again = built_once(tmp_path_factory, name, build)
    assert (value, again, len(calls)) == (7, 7, 1)
    assert first != second and (first / "made").read_text() == (second / "made").read_text() == "x"


def test_a_build_that_failed_reports_its_error_and_is_not_built_again(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(where: Path) -> int:
        calls.append(where)
        raise ValueError("the demo's train step exited 1")

    name = f"failing-{tmp_path.name}"
    with pytest.raises(ValueError, match="exited 1"):
        built_once(tmp_path_factory, name, build)
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception, match="exited 1") as later:
            built_once(tmp_path_factory, name, build)
        assert f"building shared-{name} failed (once" in str(later.value)
    assert len(calls) == 1


def test_a_deadline_stops_work_that_runs_past_it() -> None:
    never = threading.Event()
    with pytest.raises(DeadlinePassed, match=r"building x took over 0\.2 s"), \
            deadline(0.2, "building x"):
        never.wait()
    with deadline(60, "quick work"):
        pass  # a block that ends in time leaves no timer behind
    assert not never.is_set()
