"""Start the training ranks through PyTorch's own launcher and follow them.

``run_training`` writes the worker spec into the output directory, runs
``python -m torch.distributed.run ... -m nscas.recipes.train.worker SPEC.json`` as a child
process group, turns rank 0's progress lines into callbacks (on the caller's thread), and on
failure stops every rank and raises one error naming the rank that failed first. One rank on
the CPU (``trains_here``) runs in the caller's process instead: the same worker code, the
same results, without two interpreters' start and imports.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from nscas.errors import InvalidInput, RecipeError
from nscas.recipes.common.lifetime import child_env
from nscas.recipes.train.checkpoints import CheckpointPaths, completed_checkpoints
from nscas.recipes.train.config import TrainParams, WorkerSpec
from nscas.recipes.train.events import (
    CheckpointReady,
    StepProgress,
    WorkerEvent,
    parse_event_line,
)
from nscas.recipes.train.protocol import (
    RankError,
    RankResult,
    error_path,
    result_path,
    spec_path,
)

WORKER_MODULE = "nscas.recipes.train.worker"
STOP_GRACE_SECONDS = 15.0
"""How long the launcher gets to exit after SIGTERM before SIGKILL."""
RANK_SHUTDOWN_SECONDS = 5
"""How long the launcher gives its ranks after SIGTERM before it SIGKILLs them; shorter
than ``STOP_GRACE_SECONDS`` so no rank outlives a killed launcher (ranks run in their own
sessions, out of reach of a signal to the launcher's process group). Passed through the
environment: the ``--shutdown-timeout`` option is missing from older torch releases."""
_POLL_SECONDS = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainOutcome:
    """A finished run on this node: its ranks' results and rank 0's checkpoints."""

    output_dir: Path
    results: tuple[RankResult, ...]
    """Results of the ranks that ran on this node, by rank."""
    checkpoints: tuple[CheckpointPaths, ...]
    """Every complete checkpoint in the output directory, by step (the last is final)."""
    journals: tuple[Path, ...]
    """Journal files of this node's ranks, by rank."""


def launcher_command(spec_file: Path, params: TrainParams, *, python: str = sys.executable) -> list[str]:
    """The ``torch.distributed.run`` command line that starts this node's ranks."""
    return [
        python, "-m", "torch.distributed.run",
        "--nproc-per-node", str(params.nproc_per_node),
        "--nnodes", str(params.nnodes),
        "--node-rank", str(params.node_rank),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", params.rdzv_endpoint,
        "--max-restarts", "0",
        "-m", WORKER_MODULE, str(spec_file),
    ]  # fmt: skip


def check_devices(params: TrainParams) -> None:
    """Refuse a device this machine does not have, before any rank starts."""
    if params.device != "cuda":
        return
    if not torch.cuda.is_available():
        raise InvalidInput("train param device is 'cuda' but no CUDA device is available here")
    if torch.cuda.device_count() < params.nproc_per_node:
        raise InvalidInput(
            f"{params.nproc_per_node} ranks per node need as many GPUs, "
            f"but {torch.cuda.device_count()} are visible"
        )


def run_training(
    spec: WorkerSpec,
    *,
    on_progress: Callable[[StepProgress], None] | None = None,
    on_checkpoint: Callable[[CheckpointReady], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> TrainOutcome:
    """Train as ``spec`` says and return this node's results.

    ``on_checkpoint`` is called once per complete checkpoint (after a resume, first for those
    the interrupted run left), ``on_progress`` once per update. ``env`` adds environment
    variables for the ranks. Raises ``InvalidInput`` for refused input and ``RecipeError``
    for anything else; in both cases no rank is left running.
    """
    params = spec.params
    check_devices(params)
    for path in (spec.base_dir, spec.tokenizer_dir):
        if not Path(path).is_dir():
            raise InvalidInput(f"train input directory {path} does not exist")
    for path in spec.documents:
        if not Path(path).is_file():
            raise InvalidInput(f"train document file {path} does not exist")
    output_dir = Path(spec.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(params.world):
        # Leftovers of an interrupted session would be mistaken for this one's.
        error_path(output_dir, rank).unlink(missing_ok=True)
        result_path(output_dir, rank).unlink(missing_ok=True)
    spec_file = spec_path(output_dir)
    spec.write(spec_file)

    environment = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(RANK_SHUTDOWN_SECONDS),
        **child_env(),  # every rank ends with this process, even when it is SIGKILLed
        **(env or {}),
    }
    if params.deterministic and params.device == "cuda":
        environment["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    seen: set[int] = set()

    def dispatch(event: WorkerEvent | None) -> None:
        if isinstance(event, StepProgress) and on_progress is not None:
            on_progress(event)
        elif isinstance(event, CheckpointReady) and event.step not in seen:
            seen.add(event.step)
            if on_checkpoint is not None:
                on_checkpoint(event)

    if trains_here(params):
        _train_here(spec, dispatch=dispatch, threads=environment.get("OMP_NUM_THREADS"))
    else:
        returncode, stderr_tail = _supervise(
            launcher_command(spec_file, params), env=environment,
            dispatch=lambda line: dispatch(parse_event_line(line)),
            output_dir=output_dir, world=params.world, timeout=params.timeout_seconds,
        )
        if returncode != 0:
            raise _failure(output_dir, params.world, returncode, stderr_tail)

    results = tuple(
        RankResult.read(result_path(output_dir, r))
        for r in range(params.world)
        if result_path(output_dir, r).exists()
    )
    if not results:
        raise RecipeError(f"training finished but no rank wrote a result in {output_dir}")
    return TrainOutcome(
        output_dir=output_dir,
        results=results,
        checkpoints=tuple(completed_checkpoints(output_dir)),
        journals=tuple(Path(r.journal) for r in results),
    )


def trains_here(params: TrainParams) -> bool:
    """Whether ``run_training`` runs the rank in its own process: one rank on this host's
    CPU communicates with no one, so torch's launcher and a rank process (an interpreter, its
    imports of torch and transformers: seconds) buy it nothing. Several ranks and GPUs go
    through the launcher (a GPU rank sets up CUDA for determinism before CUDA starts, which
    a process that may have used CUDA already cannot promise)."""
    return params.world == 1 and params.nnodes == 1 and params.device == "cpu"


class _CallerRaised(Exception):
    """An exception of the caller's own callback, carried out of the rank unchanged."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(str(raised))
        self.raised = raised


def _train_here(spec: WorkerSpec, *, dispatch: Callable[[WorkerEvent], None],
                threads: str | None) -> None:
    """Rank 0 of 1 in this process, as the launcher's rank process would run it: the thread
    count of the rank's environment (else one per core, a fresh torch's), its errors as the
    launcher reports a rank's, the caller's callbacks' own exceptions unchanged; torch's
    process-wide settings that the rank changes are put back after it."""
    from nscas.recipes.train.worker import train_rank

    def emit(event: WorkerEvent) -> None:
        try:
            dispatch(event)
        except BaseException as exc:
            raise _CallerRaised(exc) from exc

    saved_threads = torch.get_num_threads()
    saved_deterministic = torch.are_deterministic_algorithms_enabled()
    saved_rng = torch.random.get_rng_state()
    torch.set_num_threads(int(threads) if threads and threads.isdigit()
                          else len(os.sched_getaffinity(0)))
    try:
        train_rank(spec, rank=0, world=1, local_rank=0, emit=emit,
                   rendezvous={"store": HashStore(), "rank": 0, "world_size": 1})
    except _CallerRaised as caller:
        raise caller.raised from None
    except InvalidInput as exc:
        raise InvalidInput(f"training failed on rank 0: {exc.message}") from None
    except Exception as exc:  # a rank's failure, reported as the launcher reports one
        raise RecipeError(f"training failed on rank 0: {str(exc) or type(exc).__name__}") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(saved_threads)
        torch.use_deterministic_algorithms(saved_deterministic)
        torch.random.set_rng_state(saved_rng)


def _supervise(
    command: list[str],
    *,
    env: Mapping[str, str],
    dispatch: Callable[[str], None],
    output_dir: Path,
    world: int,
    timeout: int,
) -> tuple[int, str]:
    """Run the launcher; returns its exit code and the tail of its stderr.

    Once any rank has recorded a failure, the launcher gets the process-group timeout (plus a
    grace period) to take the others down; after that the whole process group is killed.
    """
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env),
        start_new_session=True, text=True, bufsize=1,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    tail: deque[str] = deque(maxlen=400)
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, lines.put, True), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, tail.append, False), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline: float | None = None
    stdout_open = True
    try:
        while stdout_open or proc.poll() is None:
            try:
                line = lines.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                line = ""
            if line is None:
                stdout_open = False
            elif line:
                dispatch(line.rstrip("\n"))
            if deadline is None and any(error_path(output_dir, r).exists() for r in range(world)):
                deadline = time.monotonic() + timeout + STOP_GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline and proc.poll() is None:
                _stop(proc)
    finally:
        if proc.poll() is None:
            _stop(proc)
        for reader in readers:
            reader.join(timeout=STOP_GRACE_SECONDS)
    return proc.returncode, "".join(tail)


def _pump(stream: IO[str], put: Callable[[str | None], None], mark_end: bool) -> None:
    for line in stream:
        put(line)
    if mark_end:
        put(None)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the launcher's process group, SIGKILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, STOP_GRACE_SECONDS)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


_FAILED_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _failure(output_dir: Path, world: int, returncode: int, stderr_tail: str) -> Exception:
    """One error for a failed run, naming the rank that failed first.

    A rank's own report of refused input or a failure counts first; then a rank that died
    without a report (killed, crashed); a rank that only saw a peer vanish comes last.
    """
    errors = [e for r in range(world) if (e := RankError.read(error_path(output_dir, r)))]
    primary = sorted((e for e in errors if not e.secondary), key=lambda e: e.time)
    if primary:
        first = primary[0]
        kind = InvalidInput if first.input_error else RecipeError
        return kind(f"training failed on rank {first.rank}: {first.message}")
    reported = {e.rank for e in errors}
    died = [(int(r), int(code)) for r, code in _FAILED_RANK.findall(stderr_tail)]
    silent = [(r, code) for r, code in died if r not in reported]
    if silent:
        # The launcher stops the survivors with SIGTERM, and which exit it lists first is a
        # race: a rank that died of anything else is the one that failed.
        rank, code = min(silent, key=lambda rc: rc[1] == -signal.SIGTERM)
        how = _describe_exit(code)
        return RecipeError(
            f"training rank {rank} died ({how}) without reporting an error; the other ranks "
            "were stopped"
        )
    if errors:
        first = min(errors, key=lambda e: e.time)
        return RecipeError(f"training failed on rank {first.rank}: {first.message}")
    last = stderr_tail.strip().splitlines()[-1:] or ["no output"]
    return RecipeError(f"training launcher exited with code {returncode}: {last[0]}")


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"
