"""Recipe ``serve``: replicas of one checkpoint under load, in three phases (docs/experiment.md §5).

The recipe starts ``replicas`` replica processes of the checkpoint (port 0, the store the run
uses, ``instances`` model instances each), waits until each answers ready with the
checkpoint's parameter digest, warms each up (unmeasured, unlogged), then runs three phases
in this order, with fresh request ids ``<run id>-<phase>-<index>`` for the first ``requests``
task ids of the dev set:
``single`` (replica 0 alone), ``pair`` (every replica), ``failure`` (every endpoint, the last
replica stopped by SIGTERM beforehand). Every process it started is stopped when it ends,
on error as well.

Output ``requests``: the JSONL log, one line per attempt. Claims (verifier ``throughput``)
are computed from that log alone by ``metrics.serving_claims``, whose docstring defines
them; in particular ``failure_retries`` counts the failure phase's successful attempts with
an attempt number above 1: requests first sent to the stopped replica and then answered
by a survivor under the same request id.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.runs.recipe import (
    BundleRole,
    Claim,
    InputSpec,
    Recipe,
    RecipeResult,
    RunContext,
    blob_part,
)

from .client import Attempt, LoadPlan, first_failure, run_phase
from .metrics import log_jsonl, read_log, serving_claims
from .processes import ReplicaGroup, ReplicaOptions, replica_command, replica_environment
from .replica import MAX_INSTANCES

VERSION = "1"
VERIFIER = "throughput"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeParams:
    replicas: int = 2
    """Replica processes (at least 2): ``single`` uses the first, ``pair`` all of them."""
    requests: int = 32
    """Requests per phase: the first this many dev task ids, one request each."""
    concurrency: int = 2
    """Requests in flight at once."""
    attempts: int = 2
    """Attempts per request at most (a retry goes to the next endpoint)."""
    warmup: int = 4
    """Unmeasured warm-up requests per replica before the first phase."""
    timeout: float = 600.0
    """Seconds to wait for every replica to answer ready. Each loads and checks its model
    first, which on a busy machine takes minutes: a replica that is still starting is not a
    failure; one that exits is, at once."""
    request_timeout: float = 300.0
    """Seconds one attempt may take before it counts as failed."""
    threads: int = 1
    """torch threads per model instance of a replica."""
    instances: int = 1
    """Model instances per replica process (1 to 8), each with its own generation thread and,
    on CUDA, its own stream; a replica hands each request to the one with the fewest in
    flight. Answers are the same for any number."""
    max_batch: int = 1
    """Most requests a replica generates as one batch. 1 by default (the published report
    measured no batching): every answer then comes from a one-row batch of the same shape in
    every phase, so batching cannot break ``identical_outputs`` (under BF16 on CUDA a batch's
    shape can flip a near-tie between two logits)."""
    max_wait_ms: float = 5.0
    """How long an open batch waits for its next request, in milliseconds."""
    max_new_tokens: int = 96
    """New tokens per answer (greedy)."""
    device: str = "cpu"
    """``cpu``, or ``cuda`` with replica k on the k-th GPU this step was given."""
    precision: str = "bf16"
    """On CUDA: ``bf16`` autocast, or ``fp32`` (no autocast, no TF32) so that batching cannot
    move a token; on CPU both are FP32."""

    def validate(self) -> str | None:
        if self.replicas < 2:
            return f"replicas must be at least 2 (the pair and failure phases), got {self.replicas}"
        for name in ("requests", "concurrency", "attempts", "threads", "max_batch",
                     "max_new_tokens"):
            if getattr(self, name) < 1:
                return f"{name} must be at least 1, got {getattr(self, name)}"
        if not 1 <= self.instances <= MAX_INSTANCES:
            return f"instances must be from 1 to {MAX_INSTANCES}, got {self.instances}"
        if self.warmup < 0 or self.max_wait_ms < 0:
            return "warmup and max_wait_ms must not be negative"
        if self.timeout <= 0 or self.request_timeout <= 0:
            return "timeout and request_timeout must be positive"
        if self.device not in ("cpu", "cuda"):
            return f"device must be cpu or cuda, got {self.device!r}"
        if self.precision not in ("bf16", "fp32"):
            return f"precision must be bf16 or fp32, got {self.precision!r}"
        return None


def run(ctx: RunContext) -> RecipeResult:
    p: ServeParams = ctx.params
    store = ctx.store
    model, tasks = ctx.inputs["model"], ctx.inputs["tasks"]
    model_digest = store.get_record(model)["params"]
    if "commitment" in ctx.inputs:
        _check_commitment(store.get_record(ctx.inputs["commitment"]), ctx.inputs["commitment"],
                          model)
    task_ids = store.get_record(tasks)["ids"]
    if len(task_ids) < p.requests:
        raise RecipeError(f"the dev set {tasks} holds {len(task_ids)} tasks; "
                          f"requests = {p.requests} needs that many")
    measured = tuple(task_ids[: p.requests])
    run_id = ctx.action.short if ctx.action is not None else "serve"
    options = ReplicaOptions(threads=p.threads, instances=p.instances, max_batch=p.max_batch,
                             max_wait_ms=p.max_wait_ms, max_new_tokens=p.max_new_tokens,
                             device=p.device, precision=p.precision)
    argv = replica_command(str(model), store_path=ctx.store_path, tasks=str(tasks),
                           options=options)
    ctx.progress.start(None, f"starting {p.replicas} replicas")
    with ReplicaGroup(ctx.workdir) as group:
        started = [group.start(argv, env=replica_environment(p.device, k, os.environ))
                   for k in range(p.replicas)]
        endpoints = tuple(group.wait_ready(started, timeout=p.timeout,
                                           model_digest=model_digest))
        ctx.progress.note(f"replicas ready at {', '.join(endpoints)}")
        attempts = asyncio.run(_measure(group, started, endpoints, measured, run_id,
                                        model_digest, p, ctx))
    log = log_jsonl(attempts)
    requests = store.put_bytes(log)
    claims = {name: Claim(value=value, verifier=VERIFIER)
              for name, value in serving_claims(log).items()}
    return RecipeResult(outputs={"requests": requests}, claims=claims)


async def _measure(group: ReplicaGroup, started: list[Any], endpoints: tuple[str, ...],
                   task_ids: tuple[str, ...], run_id: str, model_digest: str, p: ServeParams,
                   ctx: RunContext) -> list[Attempt]:
    def plan(phase: str, on: tuple[str, ...], ids: tuple[str, ...]) -> LoadPlan:
        return LoadPlan(phase=phase, run_id=run_id, endpoints=on, task_ids=ids,
                        model_digest=model_digest, concurrency=p.concurrency,
                        attempts=p.attempts, timeout=p.request_timeout)

    if p.warmup:
        ctx.progress.note(f"warming up each replica with {p.warmup} request(s)")
        warm_ids = tuple(task_ids[i % len(task_ids)] for i in range(p.warmup))
        for k, endpoint in enumerate(endpoints):
            warm = await run_phase(plan(f"warmup{k}", (endpoint,), warm_ids))
            failure = first_failure(warm)
            if failure is not None:
                raise RecipeError(f"a warm-up request to replica {k} failed: {failure}")
    phases = (("single", endpoints[:1]), ("pair", endpoints), ("failure", endpoints))
    ctx.progress.start(len(phases), "measuring")
    attempts: list[Attempt] = []
    for phase, on in phases:
        if phase == "failure":
            # Stopped before the phase: its endpoint refuses connections, as published.
            await asyncio.to_thread(group.stop, started[-1])
        attempts += await run_phase(plan(phase, on, task_ids))
        ctx.progress.advance(1, phase=phase)
    return attempts


def _check_commitment(record: dict[str, Any], commitment: Digest, model: Digest) -> None:
    if record.get("nscas") != "commitment/1":
        raise RecipeError(f"input commitment {commitment} is not a commitment/1 record")
    if str(model) not in record["subjects"].values():
        raise RecipeError(f"commitment {commitment} does not name the model {model} among its "
                          "subjects; serve only a committed candidate")


REPRODUCIBLE = ("request_id", "task_id", "phase", "attempt", "ok", "status", "output_ids",
                "cached")
"""The members of a request log line that a rerun must reproduce: not the times, nor the
endpoint (a port the system picks) or the error text that names it."""


def reproducible_log(data: bytes) -> list[list[Any]]:
    """A request log's reproducible part: those members of each attempt, in request order."""
    lines = [[a.get(k) for k in REPRODUCIBLE] for a in read_log(data)]
    return sorted(lines, key=lambda line: (str(line[0]), str(line[3])))


RECIPE = Recipe(
    name="serve",
    version=VERSION,
    params=ServeParams,
    inputs={
        "model": InputSpec(kind="checkpoint/1", doc="the checkpoint to serve"),
        "tasks": InputSpec(kind="tasks/1", doc="the committed dev set; requests use its first ids"),
        "commitment": InputSpec(kind="commitment/1", required=False,
                                doc="a commitment that must name the model among its subjects"),
    },
    outputs=("requests",),
    run=run,
    measurements={"requests": blob_part(reproducible_log)},
    bundle=BundleRole(folder="serving"),
    doc="Serve a checkpoint from replicas in three phases (single, pair, failure) and "
        "measure throughput, latency, retries and output identity from the request log.",
)
