"""``benchmarks/pipeline.py``'s arithmetic: the critical path, the no-overhead schedule, the
cores a ``running`` event names and the core-seconds bound, on the benchmark's own small file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import load_benchmark

SMALL = Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline-small.toml"
bench = load_benchmark("pipeline")
TIMES = {"prepare": 1.0, "tokenizer": 2.0, "init": 3.0,
         "train-clean": 10.0, "train-damaged": 12.0, "train-clean-seed": 11.0}


def test_the_critical_path_is_the_longest_chain_of_step_times() -> None:
    seconds, chain = bench.critical_path(SMALL, TIMES)
    assert chain == ["prepare", "tokenizer", "init", "train-damaged"]
    assert seconds == pytest.approx(18.0)


def test_the_no_overhead_schedule_waits_for_a_free_slot() -> None:
    # Three trains after init: two slots run two at once, the third after the first ends.
    assert bench.slotted(SMALL, TIMES, 3) == pytest.approx(18.0)
    assert bench.slotted(SMALL, TIMES, 2) == pytest.approx(6.0 + 10.0 + 11.0)
    assert bench.slotted(SMALL, TIMES, 1) == pytest.approx(sum(TIMES.values()))


@pytest.mark.parametrize(("devices", "cores"), [
    ("cpu 0", 1), ("cpu 0-1", 2), ("cpu 0-3,6", 5), ("cpu 2,4-5, gpu 0", 3), ("cpu 0-15, gpu 0,1", 16),
])
def test_granted_cores_counts_the_ranges_a_running_event_names(devices: str, cores: int) -> None:
    assert bench.granted_cores(devices) == cores


def test_the_core_seconds_bound_is_the_work_over_the_cores_or_the_critical_path() -> None:
    cores = {step: 1 for step in TIMES} | {"train-damaged": 2}
    work = sum(TIMES.values()) + TIMES["train-damaged"]  # 51 core-seconds
    assert bench.core_seconds_bound(18.0, TIMES, cores, 2) == pytest.approx(work / 2)
    assert bench.core_seconds_bound(18.0, TIMES, cores, 16) == pytest.approx(18.0)
