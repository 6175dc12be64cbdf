"""Serving throughput: two replicas against one, model instances, and dynamic batching.

Builds everything it needs in a temporary store: a checkpoint (a seeded llama preset with a
tokenizer trained on the prompts, or --model-dir, an HF directory whose tokenizer has a chat
template), a dev set of grounded tasks, and four real replica processes on 127.0.0.1
(``python -m nscas.recipes.serve.replica_main``), then drives them with the serve recipe's load client:

1. replicas: each of two replicas alone against both together, all without batching
   (max_batch 1), so the only difference is the second replica (target: the pair at least
   1.9x the requests/s of the faster replica alone). Concurrency 4 by default: at 2, the
   client's routing rule (request i to replica i mod 2) puts both requests in flight on one
   replica, leaving the other idle, whenever answers of different lengths let one worker
   overtake the other; that measures the rule, not the second replica (the published run,
   at 2, got 1.67x). In the same runs, one process holding --instances (2) model instances
   (``serve-model --instances``: a copy of the model, a generation thread and on CUDA a
   stream each, on the first replica's GPU) against the first replica, one instance alone,
   with the same client and requests (target: at least 1.5x). Two processes on one GPU take
   turns on it; the kernels of one process's streams can run side by side;
2. batching: one replica at concurrency 8 with max_batch 1 against one with max_batch 8
   (target: at least 3x requests/s, and the same tokens for every task).

For every run it also prints each replica's occupancy, from the client's log: the share of
the run's wall time in which the replica had an attempt open, and busy seconds per attempt;
and, from the replica's ``/stats``, the seconds it spent generating per attempt and per output
token. Where two replicas fall short of twice one, this tells a replica left idle by the
routing rule (busy share well below 100 %) from one that serves more slowly beside the other
(more milliseconds per token than alone), slower generation from time lost outside it, and
a slower replica from one that was given longer answers. The service time of each pair
replica's tasks, as it served them alone and in the pair, tells a replica that slows beside
the other from one that is slower on its own.

Each comparison runs --runs times, reversing the order of its sides every other run; the
tables show medians. On CUDA each replica gets its own GPU through CUDA_VISIBLE_DEVICES
(replica k on GPU k mod the GPU count, counted from --first-gpu). The batched replica is
started only after the replicas comparison, on the first replica's GPU (idle while it runs).
On H200s, when it was started together with the pair, the first replica decoded about 10 %
faster than the second, alone on its GPU, and the one-replica side was the faster replica.
Why is not known: ``--idle-beside first|second``, which keeps a warmed-up copy of the batched
replica idle beside one of the pair (started after the pair), did not reproduce it.

Examples:
    .venv/bin/python benchmarks/serve.py --device cpu
    python3 benchmarks/serve.py --device cuda --preset llama-small
    python3 benchmarks/serve.py --device cuda --model-dir path/to/hf-model
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nscas.models.checkpoints import put_checkpoint
from nscas.recipes.common import tasks as T
from nscas.recipes.serve.client import Attempt, LoadPlan, first_failure, run_phase
from nscas.recipes.serve.metrics import phase_numbers
from nscas.recipes.serve.processes import ReplicaGroup, ReplicaOptions, replica_command
from nscas.store.writer import init_store


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    store_path: Path
    checkpoint: str
    tasks: str
    model_digest: str
    task_ids: tuple[str, ...]
    described: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Occupancy:
    """How one replica spent one run."""

    attempts: int
    tokens: int
    """Output tokens of its successful attempts: the work it did."""
    busy_share: float
    """Share of the run's wall time in which it had an attempt open."""
    busy_seconds: float
    """Seconds in which it had an attempt open."""
    generating_seconds: float
    """Seconds it spent inside generation (its ``/stats``)."""

    def describe(self) -> str:
        per_token = self.generating_seconds / self.tokens * 1e3 if self.tokens else 0.0
        return (f"{self.attempts} attempts, {self.tokens} tokens, busy {self.busy_share:.0%}, "
                f"{self.busy_seconds / self.attempts:.3f} s per attempt "
                f"({self.generating_seconds / self.attempts:.3f} s generating, "
                f"{per_token:.2f} ms per token)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """Every run of one side of a comparison."""

    label: str
    numbers: tuple[dict[str, Any], ...]
    outputs: dict[str, tuple[int, ...]]
    """Task id -> output ids of the last run."""
    occupancy: tuple[dict[str, Occupancy], ...]
    """Per run: endpoint -> how that replica spent the run; see ``occupancy``."""
    service: tuple[dict[str, tuple[str, float]], ...]
    """Per run: task id -> (endpoint, service seconds); see ``service_times``."""
    endpoints: tuple[str, ...] = ()
    """The replicas this side sent its requests to."""

    def median(self, key: str) -> float:
        return statistics.median(n[key] for n in self.numbers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model-dir", type=Path, help="an HF model directory (with tokenizer)")
    parser.add_argument("--preset", default="llama-tiny", help="model preset without --model-dir")
    parser.add_argument("--sharpen", type=float, default=6.0,
                        help="scale a built model's matrices so prompts get distinct answers")
    parser.add_argument("--requests", type=int, default=32, help="requests per measurement")
    parser.add_argument("--runs", type=int, default=3, help="runs per side (median)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per replica (per instance)")
    parser.add_argument("--instances", type=int, default=2,
                        help="model instances of the one-process side of the replicas "
                             "comparison")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8, help="max_batch of the batched replica")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--pair-concurrency", type=int, default=4)
    parser.add_argument("--batch-concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up requests per replica (default: every task once, so that "
                             "on CUDA no prompt shape is first seen while measured)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for ready")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                        help="CUDA replicas: BF16 autocast, or FP32 without TF32")
    parser.add_argument("--cuda-graphs", choices=("on", "off"), default="on",
                        help="CUDA replicas: replay each decoding step as a CUDA graph")
    parser.add_argument("--first-gpu", type=int, default=0,
                        help="CUDA: the GPU of the first (and the batched) replica; the second "
                             "replica takes the next one")
    parser.add_argument("--log-dir", type=Path,
                        help="also write each measured run's request log there (JSONL, as the "
                             "serve recipe's requests output), to study per-task times later")
    parser.add_argument("--idle-beside", choices=("none", "first", "second"), default="none",
                        help="keep a copy of the batched replica (max_batch --batch, warmed "
                             "up, then idle) beside the first or second replica (on its GPU "
                             "under CUDA) during the replicas comparison, to see what such a "
                             "neighbour does to a replica's speed")
    parser.add_argument("--pin", type=int, default=0, metavar="N",
                        help="keep each replica on N CPUs of its own per instance "
                             "(serve-model --cpus); 0: let the OS place them")
    parser.add_argument("--only", choices=("replicas", "batching"),
                        help="run one of the two comparisons (default: both)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="nscas-bench-serve-") as tmp:
        served = prepare(Path(tmp), args)
        gpus = _gpu_count() if args.device == "cuda" else 0
        # In starting order: the pair, the instances replica, the idle one if any, the batched.
        cpus = _cpu_sets(args.pin, [1, 1, args.instances, 1]
                         + ([1] if args.idle_beside != "none" else []))
        with ReplicaGroup(Path(tmp)) as group:
            def start(max_batch: int, gpu: int, instances: int = 1) -> Any:
                options = ReplicaOptions(threads=args.threads, instances=instances,
                                         max_batch=max_batch,
                                         max_wait_ms=args.max_wait_ms,
                                         max_new_tokens=args.max_new_tokens, device=args.device,
                                         precision=args.precision,
                                         cuda_graphs=args.cuda_graphs == "on",
                                         cpus=cpus[len(group.replicas)])
                env = {"CUDA_VISIBLE_DEVICES": str(gpu % gpus)} if gpus else None
                return group.start(replica_command(served.checkpoint, store_path=served.store_path,
                                                   tasks=served.tasks, options=options), env=env)

            note("starting two replicas")
            base = args.first_gpu
            first, second = group.wait_ready([start(1, base), start(1, base + 1)],
                                             timeout=args.timeout,
                                             model_digest=served.model_digest)
            note(f"replicas ready at {first} {second}")
            # Only once the pair is ready (see --idle-beside): a neighbour started together
            # with the first replica once made it decode faster.
            (multi,) = group.wait_ready([start(1, base, args.instances)], timeout=args.timeout,
                                        model_digest=served.model_digest)
            note(f"{args.instances} instances of one replica at {multi}")
            if args.idle_beside != "none":
                gpu = base if args.idle_beside == "first" else base + 1
                (idle,) = group.wait_ready([start(args.batch, gpu)], timeout=args.timeout,
                                           model_digest=served.model_digest)
                note(f"idle replica beside the {args.idle_beside} one at {idle}")
                asyncio.run(warm_up(args, served, (idle,)))
            replicas = batching = None
            spread = ""
            if args.only != "batching":
                replicas = asyncio.run(measure_replicas(args, served, first, second, multi))
                spread = _instance_rows(multi)
            if args.only != "replicas":
                note("starting the batched replica")
                (batched,) = group.wait_ready([start(args.batch, base)], timeout=args.timeout,
                                              model_digest=served.model_digest)
                note(f"batched replica ready at {batched}")
                batching = asyncio.run(measure_batching(args, served, first, batched))
            sizes, decoding = _replica_stats(first if batching is None else batched)
    print(f"model: {served.described}; device {args.device}"
          + (f" ({gpus} GPUs, {args.precision}, first replica on GPU "
             f"{args.first_gpu % gpus})" if gpus
             else f"; torch threads per replica {args.threads}") + f"; decoding: {decoding}")
    print("replica CPUs: " + ("any" if not args.pin else " / ".join(str(c) for c in cpus)))
    if args.idle_beside != "none":
        where = f" (on GPU {(base + (args.idle_beside == 'second')) % gpus})" if gpus else ""
        print(f"an idle max_batch {args.batch} replica, warmed up, beside the {args.idle_beside} "
              f"replica during the replicas comparison{where}")
    print(f"{args.requests} requests per run; max_new_tokens {args.max_new_tokens}; "
          f"median of {args.runs} runs; {os.cpu_count()} CPU cores")
    if replicas is not None:
        print()
        table(f"1. replicas (max_batch 1, concurrency {args.pair_concurrency})", replicas[:3],
              target=1.9,
              notes=[f"service time, {line}" for line in service_by_pair_replica(replicas[:3])])
        print()
        where = f" on GPU {args.first_gpu % gpus}" if gpus else ""
        table(f"1b. model instances: one process{where}, max_batch 1, concurrency "
              f"{args.pair_concurrency}", (replace(replicas[0], label="one instance"),
                                            replicas[3]), target=1.5,
              notes=[f"requests per instance (warm-up included): {spread}"])
    if batching is not None:
        print()
        table(f"2. dynamic batching (one replica, concurrency {args.batch_concurrency})",
              batching, target=3.0)
        print(f"batches of the max_batch {args.batch} replica, warm-up included (size: count): "
              + ", ".join(f"{k}: {v}" for k, v in sizes.items()))


def prepare(tmp: Path, args: argparse.Namespace) -> Served:
    """A store holding the checkpoint and a dev set of ``args.requests`` grounded tasks."""
    import torch

    torch.set_num_threads(max(1, args.threads))
    dev = T.generate_role("dev", args.requests, T.DEFAULT_SEED, T.default_wordings())
    if args.model_dir is not None:
        model_dir, described = args.model_dir, str(args.model_dir)
    else:
        from nscas.recipes.init.presets import save_hf_dir

        model, tok_dir = sharpened_model(tmp, args.preset, args.sharpen, dev)
        model_dir = save_hf_dir(model, tok_dir, tmp / "model")
        scalars = sum(p.numel() for p in model.parameters())
        described = f"{args.preset} (seeded, x{args.sharpen:g}), {scalars:,} parameters"
    with init_store(tmp) as store:
        checkpoint = put_checkpoint(store, model_dir, step=0, parent=None)
        records = store.put_bytes(T.records_jsonl(dev, 1))
        tasks = store.put_record({"nscas": "tasks/1", "role": "dev", "records": str(records),
                                  "count": len(dev), "ids": [t.id for t in dev]})
        return Served(store_path=store.root, checkpoint=str(checkpoint), tasks=str(tasks),
                      model_digest=store.get_record(checkpoint)["params"],
                      task_ids=tuple(t.id for t in dev), described=described)


def sharpened_model(tmp: Path, preset: str, sharpen: float, tasks: Sequence[Any]
                    ) -> tuple[Any, Path]:
    """A seeded ``preset`` model (seed 0) whose matrices are scaled by ``sharpen``, so that
    prompts get distinct answers, and the directory of a tokenizer trained on ``tasks``."""
    import torch
    from transformers import AutoTokenizer

    from nscas.recipes.init.presets import build_model
    from nscas.recipes.tokenizer.bpe import train_tokenizer

    tok_dir = train_tokenizer([t.prompt for t in tasks] + [t.target for t in tasks],
                              vocab_size=2048, out_dir=tmp / "tokenizer")
    with torch.no_grad():
        model = build_model(preset, vocab_size=len(AutoTokenizer.from_pretrained(tok_dir)),
                            seed=0)
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(sharpen)
    return model, tok_dir


async def measure_replicas(args: argparse.Namespace, served: Served, first: str, second: str,
                           multi: str) -> tuple[Side, ...]:
    """Each replica alone, both together, and the replica of several instances (max_batch 1
    each), in that order."""
    await warm_up(args, served, (first, second, multi))
    return await compare(args, served, "replicas", (
        ("replica 1 alone", [first], args.pair_concurrency),
        ("replica 2 alone", [second], args.pair_concurrency),
        ("two replicas", [first, second], args.pair_concurrency),
        (f"{args.instances} instances", [multi], args.pair_concurrency)))


async def measure_batching(args: argparse.Namespace, served: Served, first: str, batched: str
                           ) -> tuple[Side, ...]:
    """The first replica (max_batch 1) against the batched one, at the same concurrency."""
    await warm_up(args, served, (batched,))
    return await compare(args, served, "batching", (
        ("max_batch 1", [first], args.batch_concurrency),
        (f"max_batch {args.batch}", [batched], args.batch_concurrency)))


async def _phase(served: Served, endpoints: Sequence[str], concurrency: int, run_id: str,
                 task_ids: Sequence[str]) -> list[Attempt]:
    attempts = await run_phase(LoadPlan(
        phase="pair", run_id=run_id, endpoints=tuple(endpoints), task_ids=tuple(task_ids),
        model_digest=served.model_digest, concurrency=concurrency, attempts=1))
    failure = first_failure(attempts)
    if failure is not None:
        raise SystemExit(f"benchmark request failed: {failure}")
    return attempts


async def warm_up(args: argparse.Namespace, served: Served, endpoints: Sequence[str]) -> None:
    warm = served.task_ids if args.warmup is None else served.task_ids[: args.warmup]
    note(f"warming up {len(endpoints)} replica(s) with {len(warm)} requests each")
    for endpoint in endpoints:
        await _phase(served, [endpoint], args.batch_concurrency, f"warm-{endpoint}", warm)


async def compare(args: argparse.Namespace, served: Served, tag: str,
                  setups: Sequence[tuple[str, list[str], int]]) -> tuple[Side, ...]:
    """Every side (label, endpoints, concurrency) sends every task once per run, ``args.runs``
    runs, the sides' order reversed every other run so that all meet the same drift in
    background load."""
    count = len(setups)
    numbers: list[list[dict[str, Any]]] = [[] for _ in setups]
    outputs: list[dict[str, tuple[int, ...]]] = [{} for _ in setups]
    busy: list[list[dict[str, Occupancy]]] = [[] for _ in setups]
    service: list[list[dict[str, tuple[str, float]]]] = [[] for _ in setups]
    for run in range(args.runs):
        note(f"{tag}: run {run + 1} of {args.runs}")
        for side in range(count) if run % 2 == 0 else reversed(range(count)):
            label, endpoints, concurrency = setups[side]
            before = await _generate_seconds(endpoints)
            attempts = await _phase(served, endpoints, concurrency, f"{tag}{run}s{side}",
                                    served.task_ids)
            after = await _generate_seconds(endpoints)
            if args.log_dir is not None:
                _write_log(args.log_dir / f"{tag}-run{run + 1}-{label}.jsonl".replace(" ", "-"),
                           attempts)
            numbers[side].append(phase_numbers([a.to_json() for a in attempts]))
            outputs[side] = {a.task_id: a.output_ids for a in attempts if a.ok}
            busy[side].append(occupancy(attempts, {e: after[e] - before[e] for e in after}))
            service[side].append(service_times(attempts))
    return tuple(Side(label=setups[i][0], numbers=tuple(numbers[i]), outputs=outputs[i],
                      occupancy=tuple(busy[i]), service=tuple(service[i]),
                      endpoints=tuple(setups[i][1]))
                 for i in range(count))


def occupancy(attempts: Sequence[Attempt], generate_seconds: dict[str, float]
              ) -> dict[str, Occupancy]:
    """Endpoint -> how that replica spent one run.

    A replica is busy while at least one attempt sent to it is open. With max_batch 1 it
    serves one at a time, so busy seconds per attempt is its service time as the client sees
    it, and the idle share is time the routing left it without work. ``generate_seconds``
    (endpoint -> seconds the replica itself spent generating during the run, from its
    ``/stats``) tells slower generation from time lost on the wire or in the server's loop,
    and per output token, a slower replica from one given longer answers.
    """
    wall = max(a.end for a in attempts) - min(a.start for a in attempts)
    out = {}
    for endpoint in sorted({a.endpoint for a in attempts}):
        mine = [a for a in attempts if a.endpoint == endpoint]
        spans = sorted((a.start, a.end) for a in mine)
        busy, open_start, open_end = 0.0, spans[0][0], spans[0][1]
        for start, end in spans[1:]:
            if start > open_end:
                busy += open_end - open_start
                open_start, open_end = start, end
            else:
                open_end = max(open_end, end)
        busy += open_end - open_start
        out[endpoint] = Occupancy(
            attempts=len(mine), tokens=sum(len(a.output_ids or ()) for a in mine),
            busy_share=busy / wall if wall > 0 else 0.0, busy_seconds=busy,
            generating_seconds=generate_seconds[endpoint])
    return out


def service_times(attempts: Sequence[Attempt]) -> dict[str, tuple[str, float]]:
    """Task id -> (endpoint, seconds the replica spent serving it), for max_batch 1 replicas.

    A replica serving one request at a time in arrival order starts a request when it arrives
    or when the one before it ends, whichever is later: its service time is its end minus
    that. Unlike latency it leaves out time spent queued, so it can be compared between a
    phase where a replica has a queue and one where it has none.
    """
    out = {}
    for endpoint in {a.endpoint for a in attempts}:
        previous_end = float("-inf")
        for a in sorted((a for a in attempts if a.endpoint == endpoint), key=lambda a: a.end):
            out[a.task_id] = (endpoint, a.end - max(a.start, previous_end))
            previous_end = a.end
    return out


def service_by_pair_replica(sides: Sequence[Side]) -> list[str]:
    """Per replica of the pair (the last side): the mean service seconds of the tasks it
    serves there, when it served them on its own (its side alone) and in the pair, every run
    of each side.

    A replica that is slower on its own is slower in both; one that slows down beside the
    other has the larger mean in the pair.
    """
    *alone, pair = sides
    routes = {task: endpoint for run in pair.service for task, (endpoint, _) in run.items()}
    lines = []
    for endpoint in sorted(set(routes.values())):
        own = [side for side in alone if side.endpoints == (endpoint,)]
        tasks = {t for t, e in routes.items() if e == endpoint}
        alone_s = [seconds for side in own for run in side.service
                   for t, (_, seconds) in run.items() if t in tasks]
        pair_s = [seconds for run in pair.service for t, (_, seconds) in run.items()
                  if t in tasks]
        if alone_s and pair_s:
            a, b = statistics.fmean(alone_s), statistics.fmean(pair_s)
            lines.append(f"port {endpoint.rsplit(':', 1)[-1]}: its {len(tasks)} tasks take "
                         f"{a:.4f} s each when it serves alone, {b:.4f} s in the pair "
                         f"({b / a - 1:+.1%})")
    return lines


def table(title: str, sides: Sequence[Side], *, target: float, notes: Sequence[str] = ()
          ) -> None:
    """Medians of every side, each run's occupancy, ``notes``, and a verdict comparing the
    last side with the fastest other."""
    *baselines, tested = sides
    print(title)
    print(f"{'':<24}" + "".join(f"{side.label:>18}" for side in sides))
    for key, label, fmt in (("requests_per_second", "requests/s", "{:.2f}"),
                            ("wall_seconds", "wall seconds", "{:.2f}"),
                            ("median_latency_seconds", "median latency s", "{:.3f}"),
                            ("p95_latency_seconds", "p95 latency s", "{:.3f}")):
        print(f"{label:<24}" + "".join(f"{fmt.format(side.median(key)):>18}" for side in sides))
    for side in sides:
        runs = ", ".join(f"{n['requests_per_second']:.2f}" for n in side.numbers)
        print(f"requests/s of each run, {side.label}: {runs}")
    for side in sides:
        for run, per_endpoint in enumerate(side.occupancy, 1):
            cells = "; ".join(f"port {endpoint.rsplit(':', 1)[-1]} {spent.describe()}"
                              for endpoint, spent in per_endpoint.items())
            print(f"run {run}, {side.label}: {cells}")
    for line in notes:
        print(line)
    baseline = max(baselines, key=lambda side: side.median("requests_per_second"))
    ratio = tested.median("requests_per_second") / baseline.median("requests_per_second")
    verdict = "met" if ratio >= target else "NOT met"
    faster = ", the faster" if len(baselines) > 1 else ""
    print(f"ratio ({tested.label} / {baseline.label}{faster}): {ratio:.2f}x "
          f"(target >= {target:g}x: {verdict})")
    same = sum(all(side.outputs.get(t) == want for side in baselines)
               for t, want in tested.outputs.items())
    print(f"outputs identical: {'yes' if same == len(tested.outputs) else 'no'} "
          f"({same}/{len(tested.outputs)} tasks)")


_STARTED = time.monotonic()


def note(message: str) -> None:
    """A progress line on stderr, so a slow or stopped run shows how far it got."""
    sys.stderr.write(f"[{time.monotonic() - _STARTED:7.1f} s] {message}\n")
    sys.stderr.flush()


def _replica_stats(endpoint: str) -> tuple[dict[str, int], str]:
    """Batch size -> how many batches the replica at ``endpoint`` ran, and how it decodes
    (its ``GET /stats``)."""
    import httpx

    with httpx.Client(trust_env=False, timeout=10.0) as client:
        stats = client.get(f"{endpoint}/stats").json()
    return dict(stats["batch_sizes"]), stats["decoding"]


def _instance_rows(endpoint: str) -> str:
    """How many requests each instance of the replica at ``endpoint`` generated, and in how
    many seconds (its ``GET /stats``)."""
    import httpx

    with httpx.Client(trust_env=False, timeout=10.0) as client:
        stats = client.get(f"{endpoint}/stats").json()
    return ", ".join(f"instance {i['index']} {i['rows']} in {i['generate_seconds']:.2f} s"
                     for i in stats["instances"])


def _write_log(path: Path, attempts: Sequence[Attempt]) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(a.to_json(), sort_keys=True) + "\n" for a in attempts),
                    encoding="utf-8")


async def _generate_seconds(endpoints: Sequence[str]) -> dict[str, float]:
    """Endpoint -> the seconds that replica has spent generating so far (its ``GET /stats``)."""
    import httpx

    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        return {e: float((await client.get(f"{e}/stats")).json()["generate_seconds"])
                for e in endpoints}


def _cpu_sets(per_instance: int, instances: Sequence[int]) -> list[str | None]:
    """Disjoint CPU lists (``serve-model --cpus``), one per replica, ``per_instance`` CPUs for
    each of its ``instances[k]`` model instances, or None each when not pinning. The first
    usable CPU is left to the load client when there are enough."""
    if per_instance <= 0:
        return [None] * len(instances)
    usable = sorted(os.sched_getaffinity(0))
    needed = per_instance * sum(instances)
    if len(usable) < needed:
        raise SystemExit(f"--pin {per_instance}: {len(instances)} replicas need {needed} CPUs, "
                         f"this process may use {len(usable)}")
    start = 1 if len(usable) > needed else 0
    ends = [start + per_instance * sum(instances[: k + 1]) for k in range(len(instances))]
    return [",".join(str(c) for c in usable[end - per_instance * n: end])
            for end, n in zip(ends, instances, strict=True)]


def _gpu_count() -> int:
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("--device cuda: no CUDA device is visible")
    return count


if __name__ == "__main__":
    main()
