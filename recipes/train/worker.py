"""One training rank, as started by PyTorch's launcher::

    python -m torch.distributed.run ... -m nscas.recipes.train.worker SPEC.json

It reads the spec (``train-spec/1``), joins the process group, loads the base model (or the
last checkpoint of an interrupted run of the same spec), trains, and writes its journal and
result into the output directory. Failures are written to ``error-rank{r}.json`` for the
launcher to report; nothing is printed but rank 0's progress lines.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nscas.errors import InvalidInput, RecipeError
from nscas.recipes.common.digests import sha256_stream
from nscas.recipes.common.lifetime import exit_with_owner
from nscas.recipes.init.presets import load_hf_dir
from nscas.recipes.train import checkpoints as ckpt
from nscas.recipes.train.config import WorkerSpec
from nscas.recipes.train.diloco import OuterStep
from nscas.recipes.train.documents import TrainDocument, read_documents
from nscas.recipes.train.events import CheckpointReady, StepProgress, WorkerEvent, event_line
from nscas.recipes.train.exchange import broadcast_object, parameter_digest, restore_rng_state
from nscas.recipes.train.journal import (
    Journal,
    effective_outer_steps,
    effective_steps,
    loss_claims,
)
from nscas.recipes.train.loop import (
    Placement,
    StepRecord,
    configure_determinism,
    make_optimizer,
    run_loop,
)
from nscas.recipes.train.protocol import (
    RankError,
    RankResult,
    error_path,
    journal_path,
    result_path,
)

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS needs a fixed workspace for deterministic results (set before CUDA starts)."""
CUDA_RANK_THREADS = 4
"""torch's intra-op CPU threads in a CUDA rank (unless ``OMP_NUM_THREADS`` is set): it does
none of the training's arithmetic on the CPU, only host work between updates (the parameter
digest's hashing, checkpoint writes), and several ranks or runs on one host would otherwise
each start a pool of one thread per core."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    exit_with_owner()  # the rank's parent is torchrun; its owner is the `nscas run` behind it
    rank = int(os.environ.get("RANK", "0"))
    output_dir: Path | None = None
    try:
        if len(args) != 1:
            raise InvalidInput("usage: python -m nscas.recipes.train.worker SPEC.json")
        spec = WorkerSpec.read(Path(args[0]))
        output_dir = Path(spec.output_dir)
        train_rank(spec, rank=rank, world=int(os.environ["WORLD_SIZE"]),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        return 0
    except Exception as exc:  # every failure is recorded for the launcher, then the rank exits
        if output_dir is not None and output_dir.is_dir():
            _record_error(output_dir, rank, exc)
        else:
            sys.stderr.write(f"rank {rank}: {exc}\n")
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def default_backend(device: torch.device, world: int) -> str:
    """The default group's backend: NCCL where gradients cross GPUs, else gloo.

    One rank communicates nothing on its device (DDP and the loss all-reduce need two), and an
    NCCL communicator would only add its watchdog threads beside a launch-bound loop that the
    bare PyTorch loop runs without them.
    """
    return "nccl" if device.type == "cuda" and world > 1 else "gloo"


def train_rank(spec: WorkerSpec, *, rank: int, world: int, local_rank: int,
               emit: Callable[[WorkerEvent], None] | None = None,
               rendezvous: Mapping[str, Any] | None = None) -> None:
    """Everything one rank does, from joining the process group to writing its result.
    Rank 0's events go to ``emit`` (default: its progress lines on stdout); the group meets
    as ``rendezvous`` says (``init_process_group``'s store, rank and world size: one rank in
    its caller's process), else as torch's launcher set it up in the environment."""
    send = emit or _emit
    params = spec.params
    if world != params.world:
        raise RecipeError(f"launched with {world} ranks but params.world is {params.world}")
    device = select_device(params.device, local_rank, deterministic=params.deterministic)
    configure_determinism(deterministic=params.deterministic)
    # Seeds offset by rank: nothing random is shared between ranks by accident.
    torch.manual_seed(params.schedule_seed + rank)

    backend = default_backend(device, world)
    dist.init_process_group(
        backend,
        timeout=timedelta(seconds=params.timeout_seconds),
        device_id=device if backend == "nccl" else None,
        **(rendezvous or {}),
    )
    control = dist.new_group(
        backend="gloo", timeout=timedelta(seconds=params.checkpoint_timeout_seconds)
    )
    place = Placement(rank=rank, world=world, device=device, control=control)
    output_dir = Path(spec.output_dir)

    # Rank 0 alone looks at the output directory and hashes the inputs; the others follow it.
    decided: tuple[int, str] | None = None
    if rank == 0:
        identity = _identity(spec)
        ckpt.claim_output_dir(output_dir, identity)
        ckpt.discard_partial(output_dir)
        done = ckpt.completed_checkpoints(output_dir)
        decided = (done[-1].step if done else 0, identity)
    start_step, identity = broadcast_object(decided, group=control)

    docs = read_documents([Path(p) for p in spec.documents], max_length=params.max_length)
    source = ckpt.paths_for(output_dir, start_step).hf_dir if start_step else Path(spec.base_dir)
    model, _tokenizer = load_hf_dir(source, dtype=torch.float32, device=device)
    if device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        # After loading, so that everything computed on the CPU is computed as before.
        torch.set_num_threads(min(torch.get_num_threads(), CUDA_RANK_THREADS))
    # nn.Module's __getattr__ types every attribute Tensor | Module; this one is an int.
    _check_vocabulary(docs, model.get_input_embeddings().num_embeddings)  # type: ignore[arg-type]
    if params.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    optimizer = make_optimizer(model, params)
    outer = OuterStep(model, params, world=world) if params.diloco else None

    if start_step and start_step < params.steps:  # the final checkpoint has no resume state
        state = ckpt.read_state(ckpt.paths_for(output_dir, start_step), device=device)
        if state.get("world") != world or state.get("identity") != identity:
            raise RecipeError(f"checkpoint at step {start_step} in {output_dir} belongs to another run")
        if outer is not None:
            _resume_outer(state, outer, model, optimizer, rank=rank, step=start_step)
        else:
            optimizer.load_state_dict(state["optimizer"])
        restore_rng_state(state["rng"][rank], device)
    announced: list[int] = []  # rank 0's checkpoints told to the recipe, which stores them
    if rank == 0:
        for completed in ckpt.completed_checkpoints(output_dir):
            send(CheckpointReady(step=completed.step, hf_dir=completed.hf_dir,
                                 state_file=completed.state_file, resumed=True))
            announced.append(completed.step)

    def write(step: int, rng: list[dict[str, Any]], inner: list[Any] | None
              ) -> ckpt.CheckpointPaths:
        state: dict[str, Any] = {"optimizer": optimizer.state_dict(), "rng": rng,
                                 "world": world, "identity": identity}
        if outer is not None:
            # Every rank's own inner optimizer, the outer SGD's momentum, and θ_outer's
            # digest (θ_outer is the checkpoint's weights: every rank adopted it).
            state["inner_optimizers"] = inner
            state["outer"] = {"optimizer": outer.state_dict(),
                              "parameters": parameter_digest(model).hex()}
        published = (ckpt.published_state(model, optimizer, rng, step=step, world=world)
                     if step in params.publish_state else None)
        if spec.stored_before_next:
            # However slowly the recipe stores, the work area never holds a third checkpoint.
            ckpt.await_stored(output_dir, announced, timeout=params.checkpoint_timeout_seconds)
        return ckpt.write_checkpoint(
            output_dir, step, model=model, tokenizer_dir=Path(spec.tokenizer_dir),
            # Nothing resumes a finished run: its work area holds no 2W of resume state for it.
            state=None if step == params.steps else state, published=published,
        )

    def announce(step: int, hf_dir: Path, state_file: Path) -> None:
        announced.append(step)
        send(CheckpointReady(step=step, hf_dir=hf_dir, state_file=state_file, resumed=False))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    reporter = _Reporter(params.steps, emit=send if rank == 0 else None)
    with Journal(journal_path(output_dir, rank)) as journal:
        if start_step or journal.entries:
            # An earlier session of this run left a journal: say where this one takes over.
            journal.append({"event": "resume", "rank": rank, "from_step": start_step,
                            "dropped_partial_line": journal.dropped_partial})
        started = time.perf_counter()
        run_loop(
            model, docs, params, place=place, optimizer=optimizer, start_step=start_step,
            journal=journal, write_checkpoint=write, on_step=reporter.step, on_checkpoint=announce,
            outer=outer,
        )
        loop_seconds = time.perf_counter() - started
        result = _result(
            journal, place=place, loop_seconds=loop_seconds,
            sha256=sha256_stream(model) if rank == 0 else None, resumed_from=start_step or None,
        )
    result.write(result_path(output_dir, rank))


def _resume_outer(state: dict[str, Any], outer: OuterStep, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, *, rank: int, step: int) -> None:
    """A diloco rank's resume: its own inner optimizer, the outer momentum, and θ_outer from
    the loaded weights, which must be the θ_outer the state names."""
    saved = state.get("outer")
    inner = state.get("inner_optimizers")
    if not isinstance(saved, dict) or not isinstance(inner, list) or len(inner) <= rank:
        raise RecipeError(f"checkpoint at step {step} holds no diloco outer state")
    if parameter_digest(model).hex() != saved["parameters"]:
        raise RecipeError(f"checkpoint at step {step}: its weights are not the θ_outer its "
                          "state names")
    optimizer.load_state_dict(inner[rank])
    outer.load_state_dict(saved["optimizer"])


class _Reporter:
    """Rank 0's progress lines: step, loss, tokens per second and an ETA."""

    def __init__(self, steps: int, *, emit: Callable[[WorkerEvent], None] | None) -> None:
        self.steps = steps
        self.seconds: list[float] = []
        self.emit = emit

    def step(self, record: StepRecord) -> None:
        self.seconds.append(record.seconds)
        if self.emit is None:
            return
        mean = sum(self.seconds) / len(self.seconds)
        self.emit(StepProgress(
            step=record.step,
            steps=self.steps,
            loss=record.loss,
            tokens_per_second=record.tokens / record.seconds if record.seconds else 0.0,
            eta_seconds=mean * (self.steps - record.step),
        ))


def _result(
    journal: Journal, *, place: Placement, loop_seconds: float, sha256: str | None,
    resumed_from: int | None,
) -> RankResult:
    steps = effective_steps(journal.entries)
    outer = effective_outer_steps(journal.entries)
    agreed = [e for e in journal.entries if e.get("event") == "agreed"]
    seconds = [e["seconds"] for e in steps]
    # diloco: the outer steps' time and bytes belong to the updates too.
    update_seconds = sum(seconds) + sum(e["seconds"] for e in outer)
    tokens = sum(e["tokens"] for e in steps)
    if place.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(place.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return RankResult(
        rank=place.rank,
        world=place.world,
        updates=len(steps),
        update_seconds=update_seconds,
        median_update_seconds=statistics.median(seconds) if seconds else 0.0,
        loop_seconds=loop_seconds,
        peak_memory_bytes=peak,
        bytes_communicated=(sum(e["bytes_communicated"] for e in steps)
                            + sum(e["bytes_sent"] for e in outer)),
        outer_steps=len(outer),
        targets=sum(e["targets"] for e in steps),
        weighted_targets=sum(e["weighted_targets"] for e in steps),
        tokens=tokens,
        tokens_per_second=tokens / update_seconds if update_seconds else 0.0,
        **loss_claims([e["loss"] for e in steps]),
        parameter_blake3=agreed[-1]["parameters"],
        sha256_stream=sha256,
        journal=str(journal.path),
        journal_head=journal.head or "",
        resumed_from=resumed_from,
        host=socket.gethostname(),
    )


def select_device(name: str, local_rank: int, *, deterministic: bool) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if deterministic:
        # Deterministic cuBLAS needs a small fixed workspace, which also makes its products
        # slower: set only when asked for (a worker started by hand may lack the launcher's).
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE  # the spec's, not a caller's
    if not torch.cuda.is_available():
        raise InvalidInput("train param device is 'cuda' but no CUDA device is available here")
    if local_rank >= torch.cuda.device_count():
        raise InvalidInput(
            f"local rank {local_rank} needs a GPU but only {torch.cuda.device_count()} are visible"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _identity(spec: WorkerSpec) -> str:
    """Names the run for resume checks: its result-deciding params and its inputs."""
    values: dict[str, Any] = {"params": spec.params.identity()}
    if spec.run_key is not None:
        return ckpt.run_identity({**values, "run_key": spec.run_key}, [])
    files = [Path(p) for p in spec.documents]
    for folder in (Path(spec.base_dir), Path(spec.tokenizer_dir)):
        files.extend(sorted(p for p in folder.rglob("*") if p.is_file()))
    return ckpt.run_identity(values, files)


def _check_vocabulary(docs: list[TrainDocument], rows: int) -> None:
    for doc in docs:
        if max(doc.input_ids) >= rows or max(doc.labels) >= rows:
            raise InvalidInput(
                f"document {doc.id!r} holds a token id beyond the model's {rows} embedding rows"
            )


def _emit(event: WorkerEvent) -> None:
    sys.stdout.write(event_line(event) + "\n")
    sys.stdout.flush()


def _record_error(output_dir: Path, rank: int, exc: BaseException) -> None:
    RankError(
        rank=rank,
        kind=type(exc).__name__,
        message=str(exc) or type(exc).__name__,
        input_error=isinstance(exc, InvalidInput),
        secondary=isinstance(exc, dist.DistError) or _is_peer_failure(exc),
        time=time.time(),
        traceback="".join(traceback.format_exception(exc)),
    ).write(error_path(output_dir, rank))


def _is_peer_failure(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("connection closed", "connection reset", "timed out", "broken pipe")
    )


if __name__ == "__main__":
    sys.exit(main())
