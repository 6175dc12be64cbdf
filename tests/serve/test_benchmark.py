"""``benchmarks/serve.py``: its occupancy arithmetic, its CPU pinning plan, and one tiny real
run; ``benchmarks/decode.py``: one tiny run of each decoding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nscas.recipes.serve.client import Attempt
from tests.scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


bench = load_benchmark("serve")


def _attempt(endpoint: str, start: float, end: float, tokens: int = 1, task: str = "t"
             ) -> Attempt:
    return Attempt(request_id=f"r{start}", task_id=task, phase="pair", attempt=1,
                   endpoint=endpoint, start=start, end=end, wall_start=start, wall_end=end,
                   ok=True, status=200, error=None, output_ids=(1,) * tokens, cached=False)


def test_occupancy_counts_overlapping_attempts_once_and_gaps_as_idle() -> None:
    attempts = [
        _attempt("a", 0.0, 2.0, 10), _attempt("a", 1.0, 3.0, 20),  # overlap: busy 0-3
        _attempt("a", 5.0, 6.0, 5),  # idle 3-5
        _attempt("b", 0.0, 10.0, 40),  # the run's wall time is 0-10
    ]
    spent = bench.occupancy(attempts, {"a": 2.5, "b": 9.0})
    a, b = spent["a"], spent["b"]
    assert (a.attempts, a.tokens, a.busy_seconds, a.busy_share) == (3, 35, 4.0, 0.4)
    assert (b.attempts, b.tokens, b.busy_share) == (1, 40, 1.0)
    assert a.describe() == ("3 attempts, 35 tokens, busy 40%, 1.333 s per attempt "
                            "(0.833 s generating, 71.43 ms per token)")


def test_service_time_leaves_out_time_spent_queued() -> None:
    # Three requests sent together to one replica, served one after another; one more after a
    # pause, on another replica as well.
    attempts = [_attempt("a", 0.0, 1.0, task="x"), _attempt("a", 0.0, 3.0, task="y"),
                _attempt("a", 0.1, 3.5, task="z"), _attempt("a", 5.0, 5.25, task="w"),
                _attempt("b", 0.0, 0.75, task="v")]
    assert bench.service_times(attempts) == {
        "x": ("a", 1.0), "y": ("a", 2.0), "z": ("a", 0.5), "w": ("a", 0.25), "v": ("b", 0.75)}


def test_service_of_each_pair_replicas_tasks_alone_and_in_the_pair() -> None:
    def side(endpoints: tuple[str, ...], runs: list[dict[str, tuple[str, float]]]) -> object:
        return bench.Side(label="x", numbers=(), outputs={}, occupancy=(), service=tuple(runs),
                          endpoints=endpoints)

    # Replica a serves t1 in 2 s alone and in the pair; b, slower alone (3 s), slows further
    # in the pair. Each is compared with its own solo runs, not with the other's.
    a_alone = side(("a",), [{"t0": ("a", 1.0), "t1": ("a", 2.0)}] * 2)
    b_alone = side(("b",), [{"t0": ("b", 1.5), "t1": ("b", 2.0)}, {"t0": ("b", 1.5),
                                                                    "t1": ("b", 4.0)}])
    pair = side(("a", "b"), [{"t0": ("a", 1.0), "t1": ("b", 3.3)}] * 2)
    assert bench.service_by_pair_replica([a_alone, b_alone, pair]) == [
        "port a: its 1 tasks take 1.0000 s each when it serves alone, 1.0000 s in the pair "
        "(+0.0%)",
        "port b: its 1 tasks take 3.0000 s each when it serves alone, 3.3000 s in the pair "
        "(+10.0%)"]


def test_the_verdict_compares_the_pair_with_the_faster_replica_alone(capsys) -> None:
    def side(label: str, rates: list[float], outputs: dict[str, tuple[int, ...]]) -> object:
        numbers = tuple({"requests_per_second": r, "wall_seconds": 1.0,
                         "median_latency_seconds": 0.1, "p95_latency_seconds": 0.2}
                        for r in rates)
        return bench.Side(label=label, numbers=numbers, outputs=outputs, occupancy=(),
                          service=())

    same = {"t0": (1, 2), "t1": (3,)}
    sides = [side("replica 1 alone", [9.0, 10.0, 11.0], same),
             side("replica 2 alone", [10.0, 10.5, 12.0], same),
             side("two replicas", [19.0, 20.0, 21.0], same)]
    bench.table("replicas", sides, target=1.9, notes=["a note"])
    out = capsys.readouterr().out
    assert "a note\nratio (two replicas / replica 2 alone, the faster): 1.90x " \
           "(target >= 1.9x: met)\noutputs identical: yes (2/2 tasks)\n" in out
    sides[1] = side("replica 2 alone", [10.6, 10.6, 10.6], {"t0": (1, 2), "t1": (4,)})
    bench.table("replicas", sides, target=1.9)
    out = capsys.readouterr().out
    assert ("ratio (two replicas / replica 2 alone, the faster): 1.89x (target >= 1.9x: NOT met)"
            in out)
    assert "outputs identical: no (1/2 tasks)" in out
    bench.table("batching", [sides[0], sides[2]], target=3.0)
    assert "ratio (two replicas / replica 1 alone): 2.00x (target >= 3x: NOT met)" in \
        capsys.readouterr().out


def test_pinning_plan_gives_disjoint_cpus_and_refuses_too_few() -> None:
    usable = sorted(os.sched_getaffinity(0))
    assert bench._cpu_sets(0, [1, 1, 2]) == [None, None, None]
    if len(usable) >= 4:
        sets = bench._cpu_sets(1, [1, 2, 1])
        cpus = [[int(c) for c in text.split(",")] for text in sets]
        assert [len(c) for c in cpus] == [1, 2, 1]  # a replica of two instances gets two
        assert len({c for group in cpus for c in group}) == 4
        assert {c for group in cpus for c in group} <= set(usable)
    with pytest.raises(SystemExit, match=f"--pin {len(usable)}: 3 replicas need "
                                         f"{4 * len(usable)} CPUs"):
        bench._cpu_sets(len(usable), [1, 2, 1])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_tiny_run_prints_both_comparisons(tmp_path: Path) -> None:
    """The whole benchmark, tiny, with the idle replica beside the second (the run without it
    is the same code less that replica, so one run covers both)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--requests", "4", "--runs", "1",
         "--warmup", "1", "--max-new-tokens", "4", "--log-dir", str(tmp_path / "logs"),
         "--idle-beside", "second"], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    beside = ("an idle max_batch 8 replica, warmed up, beside the second replica during the "
              "replicas comparison\n")
    assert beside in out
    assert "idle replica beside the second one at http://127.0.0.1:" in done.stderr
    assert re.search(r"ratio \(two replicas / replica [12] alone, the faster\): ", out)
    assert out.count("service time, port ") == 2  # one line per replica of the pair
    assert "ratio (2 instances / one instance): " in out
    # Warm-up (1 request) and the run's 4, with 4 in flight: both instances generated.
    spread = re.search(r"requests per instance \(warm-up included\): instance 0 (\d+) in "
                       r"\d+\.\d\d s, instance 1 (\d+) in \d+\.\d\d s\n", out)
    assert spread is not None and int(spread[1]) + int(spread[2]) == 5 and int(spread[2]) > 0
    assert "ratio (max_batch 8 / max_batch 1): " in out
    assert out.count("outputs identical: yes (4/4 tasks)") == 3
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["batching-run1-max_batch-1.jsonl", "batching-run1-max_batch-8.jsonl",
                    "replicas-run1-2-instances.jsonl", "replicas-run1-replica-1-alone.jsonl",
                    "replicas-run1-replica-2-alone.jsonl", "replicas-run1-two-replicas.jsonl"]
    assert len((tmp_path / "logs" / logs[0]).read_text().splitlines()) == 4


@pytest.mark.parametrize("decoding", ["static", "dynamic"])
def test_decode_benchmark_runs_each_decoding(decoding: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("decode.py")), "--device", "cpu", "--preset",
         "llama-tiny", "--prompts", "3", "--warmup", "1", "--max-new-tokens", "4",
         "--decoding", decoding], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    number = r"\d+\.\d\d"
    assert re.fullmatch(f"CPU, {decoding}: ms per token median {number}, min {number}, "
                        f"max {number}; 3 prompts in {number} s\n", done.stdout), done.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT.with_name("decode.py")), "--pair"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "--pair needs --device cuda (one process per GPU)"
