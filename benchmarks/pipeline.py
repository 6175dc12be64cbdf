"""Pipeline scheduling benchmark: the demo pipeline run with ``--jobs`` against one step at a time.

Each run goes into a new store of its own (nothing cached), the two runs one after the other in
one invocation: ``--jobs 1`` (one step at a time, in ``nscas run``'s process), then ``--jobs N``. Printed side by side: both wall times, the critical path (the longest chain of
steps, from the scheduled run's own step times), and the two ratios the issue asks for:
scheduled wall / critical path, and sequential wall / scheduled wall; then where the
scheduled wall went outside the steps (``timeline``). Results go to docs/benchmarks.md by
hand, with the command line.

    .venv/bin/python benchmarks/pipeline.py [--jobs N | --as-written] [--file FILE]
        [--setup 'scripts/get-smollm2 && scripts/get-sharegpt'] [--workdir DIR]
        [--scheduled-only]

``--setup`` runs a shell command in each new store's directory (``NSCAS_STORE`` set) before
its run, untimed: a pipeline whose inputs are refs (a model, a corpus) gets them there.
``--as-written`` runs the scheduled side with no ``--jobs`` at all: what the file and the
machine give by default. ``--workdir`` keeps both stores (for a ``verify`` afterwards).
``--scheduled-only`` runs the scheduled side alone (where the sequential run does not fit the
time there is): its ratio to the critical path, and no sequential ratio.
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
from nscas.runs.config import load_run_file
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
    began, clock = time.monotonic(), time.time()
    lines: list[tuple[float, str]] = []  # each stdout line with when it came, from the start
    with (store_dir / "run.stderr").open("w") as err:
        child = subprocess.Popen([sys.executable, "-m", "nscas.cli", "run", str(file), "--json",
                                  *extra], cwd=store_dir, stdout=subprocess.PIPE, stderr=err,
                                 text=True)
        assert child.stdout is not None
        for line in child.stdout:
            lines.append((time.monotonic() - began, line))
        child.wait()
    wall = time.monotonic() - began
    (store_dir / "run.stdout").write_text("".join(line for _, line in lines))  # kept with --workdir
    if child.returncode != 0:
        sys.exit(f"nscas run {' '.join(extra)} failed:\n{(store_dir / 'run.stderr').read_text()}")
    if "--jobs" in extra and extra[extra.index("--jobs") + 1] == "1":
        return wall, []  # one step at a time: its --json is the results list, no events
    out = "".join(line for _, line in lines).strip()
    if out.startswith("["):  # run as written: the results list, in run order, no job times
        return wall, [{"event": "cached" if r["cached"] else "done", "step": r["step"],
                       "receipt": r["receipt"]} for r in json.loads(out)]
    return wall, [{**json.loads(line), "at": at, "clock": clock}
                  for at, line in lines if line.strip()]


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def critical_path(file: Path, seconds: dict[str, float]) -> tuple[float, list[str]]:
    """The longest chain of steps by these step times, and its steps."""
    spec = load_run_file(file)
    best: dict[str, tuple[float, list[str]]] = {}
    for step in spec.steps:  # in dependency order
        before = max((best[d] for d in step.upstream), default=(0.0, []), key=lambda b: b[0])
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
        ready = max((ends[d] for d in step.upstream), default=0.0)
        slot = min(range(slots), key=lambda i: max(free[i], ready))
        start = max(free[slot], ready)
        ends[step.name] = free[slot] = start + seconds.get(step.name, 0.0)
    return max(ends.values(), default=0.0)


def core_seconds_bound(path: float, seconds: dict[str, float], cores: dict[str, int],
                       machine: int) -> float:
    """The shortest any schedule of these step times can be on ``machine`` cores: the critical
    path, or the steps' core-seconds (each step's time by the cores it was given) spread over
    every core with none idle, whichever is longer."""
    work = sum(seconds.get(step, 0.0) * n for step, n in cores.items())
    return max(path, work / machine)


def granted_cores(devices: str) -> int:
    """The CPU cores a ``running`` event's ``devices`` names (``cpu 0-3,6, gpu 0``)."""
    where = devices.split(", gpu")[0].removeprefix("cpu ").strip()
    count = 0
    for part in where.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1 if low else 0
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEMO)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--as-written", action="store_true",
                        help="the scheduled run without --jobs: the file's and the machine's default")
    parser.add_argument("--setup", help="shell command run in each new store before its run")
    parser.add_argument("--workdir", type=Path, help="keep the two stores here (must not exist)")
    parser.add_argument("--scheduled-only", action="store_true",
                        help="no sequential run (and so no sequential / scheduled ratio)")
    args = parser.parse_args()
    args.file = args.file.resolve()
    scheduled_args = [] if args.as_written else ["--jobs", str(args.jobs)]
    with tempfile.TemporaryDirectory(prefix="nscas-bench-pipeline-") as tmp:
        root = args.workdir.resolve() if args.workdir else Path(tmp)
        seq_dir, job_dir = root / "sequential", root / "jobs"
        seq_dir.mkdir(parents=True)
        job_dir.mkdir()
        sequential = None
        if not args.scheduled_only:
            sequential, _ = _run(seq_dir, args.file, args.setup, "--jobs", "1")
            print(f"sequential run done: {sequential:.1f} s", flush=True)
        scheduled, events = _run(job_dir, args.file, args.setup, *scheduled_args)
        with Store(job_dir / ".nscas") as store:  # each step's own time, from its receipt
            inside, spans = {}, {}
            for e in events:
                if e["event"] in ("done", "cached"):
                    rec = store.get_record(Digest.parse(str(e["receipt"])))
                    inside[str(e["step"])] = (_time(rec["finished"]) - _time(rec["started"])
                                              if e["event"] == "done" else 0.0)
                    if e["event"] == "done" and "clock" in e:
                        spans[str(e["step"])] = (_time(rec["started"]) - float(str(e["clock"])),
                                                 _time(rec["finished"]) - float(str(e["clock"])))
    seconds = {str(e["step"]): float(e["seconds"]) for e in events  # type: ignore[arg-type]
               if e["event"] in ("done", "cached") and "seconds" in e} or dict(inside)
    path, chain = critical_path(args.file, seconds)
    own, own_chain = critical_path(args.file, inside)
    jobs = "as written" if args.as_written else f"--jobs {args.jobs}"
    print(f"machine: {len(os.sched_getaffinity(0))} CPU cores; {jobs}; "
          f"{args.file.relative_to(REPO) if args.file.is_relative_to(REPO) else args.file}")
    print(f"{'sequential wall':<28}" + ("  not run" if sequential is None else f"{sequential:9.1f} s"))
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
    cores = {str(e["step"]): granted_cores(str(e["devices"])) for e in events
             if e["event"] == "running" and "devices" in e}
    if cores:
        machine = len(os.sched_getaffinity(0))
        floor = core_seconds_bound(path, seconds, cores, machine)
        print(f"{'core-seconds bound':<28}{floor:9.1f} s  (no schedule of these step times on "
              f"{machine} cores is shorter: their core-seconds over the cores, or the critical "
              f"path; {floor / path:.2f}x the critical path)")
    if sequential is not None:
        print(f"{'sequential / scheduled':<28}{sequential / scheduled:9.2f}x")
    print("step times (scheduled run): " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()))
    if spans:
        timeline(args.file, events, spans, scheduled)


def timeline(file: Path, events: list[dict[str, object]],
             spans: dict[str, tuple[float, float]], wall: float) -> None:
    """Where the scheduled run's wall time went outside its steps, from when each ``--json``
    event reached this process and each receipt's ``started``/``finished`` (seconds from the
    run's start): the run's start and planning, each step's wait from its inputs being ready
    (and a slot free) to its job starting, the job's own start before its recipe ran and its
    end after, and the run's end after its last step."""
    spec = load_run_file(file)
    at: dict[tuple[str, str], float] = {}
    for e in events:
        at.setdefault((str(e["event"]), str(e.get("step", ""))), float(str(e["at"])))
    planned = min(t for (kind, _), t in at.items() if kind == "waiting")
    last = max(t for (kind, _), t in at.items() if kind in ("done", "cached"))
    print(f"{'start to first event':<28}{planned:9.2f} s  (nscas run's start and planning)")
    print(f"{'step':<18}{'ready':>7}{'running':>9}{'started':>9}{'finished':>9}{'done':>7}"
          f"{'wait':>7}{'job start':>10}{'job end':>8}")
    ends: dict[str, float] = {}
    for step in spec.steps:
        name = step.name
        if ("done", name) not in at or name not in spans:
            continue
        ready = max((ends[d] for d in step.upstream if d in ends), default=planned)
        running, done = at[("running", name)], at[("done", name)]
        started, finished = spans[name]
        ends[name] = done
        print(f"{name:<18}{ready:7.2f}{running:9.2f}{started:9.2f}{finished:9.2f}{done:7.2f}"
              f"{running - ready:7.2f}{started - running:10.2f}{done - finished:8.2f}")
    print(f"{'last step to exit':<28}{wall - last:9.2f} s")


if __name__ == "__main__":
    main()
