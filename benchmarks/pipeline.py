"""Pipeline scheduling benchmark: the demo pipeline run with ``--jobs`` against one step at a time.

Each run goes into a new store of its own (nothing cached), the two runs one after the other in
one invocation: ``--jobs 1`` (one step at a time, in ``nscas run``'s process), then ``--jobs N``. Printed side by side: both wall times, the critical path (the longest chain of
steps, from the scheduled run's own step times), and the two ratios the issue asks for:
scheduled wall / critical path, and sequential wall / scheduled wall. Results go to
docs/benchmarks.md by hand, with the command line.

    .venv/bin/python benchmarks/pipeline.py [--jobs N | --as-written] [--file FILE]
        [--setup 'scripts/get-smollm2 && scripts/get-sharegpt'] [--workdir DIR]

``--setup`` runs a shell command in each new store's directory (``NSCAS_STORE`` set) before
its run, untimed: a pipeline whose inputs are refs (a model, a corpus) gets them there.
``--as-written`` runs the scheduled side with no ``--jobs`` at all: what the file and the
machine give by default. ``--workdir`` keeps both stores (for a ``verify`` afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from nscas.objects.digests import Digest
from nscas.runs.config import load_run_file, step_reference
from nscas.store.writer import Store

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "cooperative-learning" / "experiment.toml"


def _run(store_dir: Path, file: Path, setup: str | None,
         *extra: str) -> tuple[float, list[dict[str, object]]]:
    subprocess.run([sys.executable, "-m", "nscas.cli", "init"], cwd=store_dir, check=True,
                   capture_output=True)
    if setup:
        env = {**os.environ, "NSCAS_STORE": str(store_dir / ".nscas")}
        prepared = subprocess.run(["bash", "-c", setup], cwd=REPO, env=env, capture_output=True,
                                  text=True)
        if prepared.returncode != 0:
            sys.exit(f"--setup failed in {store_dir}:\n{prepared.stderr}")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nscas.cli", "run", str(file), "--json", *extra],
                          cwd=store_dir, capture_output=True, text=True)
    wall = time.monotonic() - began
    (store_dir / "run.stdout").write_text(done.stdout)  # kept with --workdir
    (store_dir / "run.stderr").write_text(done.stderr)
    if done.returncode != 0:
        sys.exit(f"nscas run {' '.join(extra)} failed:\n{done.stderr}")
    if "--jobs" in extra and extra[extra.index("--jobs") + 1] == "1":
        return wall, []  # one step at a time: its --json is the results list, no events
    out = done.stdout.strip()
    if out.startswith("["):  # run as written: the results list, in run order, no job times
        return wall, [{"event": "cached" if r["cached"] else "done", "step": r["step"],
                       "receipt": r["receipt"]} for r in json.loads(out)]
    return wall, [json.loads(line) for line in out.splitlines()]


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def critical_path(file: Path, seconds: dict[str, float]) -> tuple[float, list[str]]:
    """The longest chain of steps by these step times, and its steps."""
    spec = load_run_file(file)
    best: dict[str, tuple[float, list[str]]] = {}
    for step in spec.steps:  # in dependency order
        deps = {ref[0] for v in step.inputs.values() if (ref := step_reference(v)) is not None}
        before = max((best[d] for d in deps), default=(0.0, []), key=lambda b: b[0])
        best[step.name] = (before[0] + seconds.get(step.name, 0.0), [*before[1], step.name])
    return max(best.values(), key=lambda b: b[0])


def slotted(file: Path, seconds: dict[str, float], slots: int) -> float:
    """The wall time of these step times scheduled with no start-up cost at all: each step, in
    file order, starts when its upstream steps have ended and one of ``slots`` is free (the
    scheduler's own rule, for steps of one core each). More independent steps than slots make
    this longer than the critical path; the gap between it and the wall is the scheduler's."""
    spec = load_run_file(file)
    ends: dict[str, float] = {}
    free = [0.0] * slots
    for step in spec.steps:
        deps = {ref[0] for v in step.inputs.values() if (ref := step_reference(v)) is not None}
        ready = max((ends[d] for d in deps), default=0.0)
        slot = min(range(slots), key=lambda i: max(free[i], ready))
        start = max(free[slot], ready)
        ends[step.name] = free[slot] = start + seconds.get(step.name, 0.0)
    return max(ends.values(), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEMO)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--as-written", action="store_true",
                        help="the scheduled run without --jobs: the file's and the machine's default")
    parser.add_argument("--setup", help="shell command run in each new store before its run")
    parser.add_argument("--workdir", type=Path, help="keep the two stores here (must not exist)")
    args = parser.parse_args()
    args.file = args.file.resolve()
    scheduled_args = [] if args.as_written else ["--jobs", str(args.jobs)]
    with tempfile.TemporaryDirectory(prefix="nscas-bench-pipeline-") as tmp:
        root = args.workdir.resolve() if args.workdir else Path(tmp)
        seq_dir, job_dir = root / "sequential", root / "jobs"
        seq_dir.mkdir(parents=True)
        job_dir.mkdir()
        sequential, _ = _run(seq_dir, args.file, args.setup, "--jobs", "1")
        print(f"sequential run done: {sequential:.1f} s", flush=True)
        scheduled, events = _run(job_dir, args.file, args.setup, *scheduled_args)
        with Store(job_dir / ".nscas") as store:  # each step's own time, from its receipt
            inside = {}
            for e in events:
                if e["event"] in ("done", "cached"):
                    rec = store.get_record(Digest.parse(str(e["receipt"])))
                    inside[str(e["step"])] = (_time(rec["finished"]) - _time(rec["started"])
                                              if e["event"] == "done" else 0.0)
    seconds = {str(e["step"]): float(e["seconds"]) for e in events  # type: ignore[arg-type]
               if e["event"] in ("done", "cached") and "seconds" in e} or dict(inside)
    path, chain = critical_path(args.file, seconds)
    own, own_chain = critical_path(args.file, inside)
    jobs = "as written" if args.as_written else f"--jobs {args.jobs}"
    print(f"machine: {len(os.sched_getaffinity(0))} CPU cores; {jobs}; "
          f"{args.file.relative_to(REPO) if args.file.is_relative_to(REPO) else args.file}")
    print(f"{'sequential wall':<28}{sequential:9.1f} s")
    print(f"{'scheduled wall':<28}{scheduled:9.1f} s")
    print(f"{'critical path (scheduled)':<28}{path:9.1f} s  ({' -> '.join(chain)})")
    print(f"{'scheduled / critical path':<28}{scheduled / path:9.2f}x")
    print(f"{'critical path (receipts)':<28}{own:9.1f} s  ({' -> '.join(own_chain)}; "
          "each step's started..finished, without its job's start)")
    print(f"{'scheduled / that path':<28}{scheduled / own:9.2f}x")
    bound = slotted(args.file, seconds, min(args.jobs, len(os.sched_getaffinity(0))))
    print(f"{'no-overhead schedule':<28}{bound:9.1f} s  (these step times in "
          f"{min(args.jobs, len(os.sched_getaffinity(0)))} slots, nothing between steps)")
    print(f"{'scheduled / that':<28}{scheduled / bound:9.2f}x")
    print(f"{'sequential / scheduled':<28}{sequential / scheduled:9.2f}x")
    print("step times (scheduled run): " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()))


if __name__ == "__main__":
    main()
