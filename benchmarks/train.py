"""nscas ``train`` against a bare PyTorch loop of the same shape, side by side.

Builds everything in a temporary directory: a seeded model of --preset saved as an HF directory
(with a small local tokenizer, which only the directory format needs), and synthetic
full-length documents (random token ids, the second half labelled, weight 1). Then runs

* nscas: the training worker path, ``run_training`` with a ``WorkerSpec`` (torchrun, journals,
  parameter digests, a checkpoint after the last update only), reading each update's seconds
  from rank 0's journal and the wall time between updates from its progress lines;
* bare: benchmarks/bare_loop.py through torchrun, the same model, documents, batch order,
  AdamW, clipping, autocast and DDP, with none of the bookkeeping, in two shapes: one forward
  per document with ``no_sync`` accumulation as nscas does (``bare/doc``), and the local
  documents stacked into one forward (``bare/batch``).

nscas's ``micro_batch`` (--micro-batch) sets how many of a rank's documents go through one
pass: 1 (the published method) has bare/doc's shape, ``all`` bare/batch's. --world takes several
values: every world runs on the same inputs, and a last table shows how much faster the largest
is than the smallest, column by column. --bucket-mb takes several values of nscas's
``bucket_mb`` (one nscas column each where world > 1).

Both sides use --threads torch threads per rank. The first --warmup-steps updates of every run
are dropped; --steps updates are timed. Peak memory is CUDA max allocated (CPU: peak RSS), the
largest over the ranks. With ``--deterministic both`` every side runs with deterministic
algorithms on and off, and the table shows the cost of the setting.

``--sync diloco --inner-steps H ...`` runs instead, on the same inputs and for the same
documents, nscas synchronous (ddp) at every --world, and DiLoCo (docs/experiment.md §3.13) at
every world above one and every H, deterministic off unless --deterministic on, and prints
one table side by side: median inner update, median outer step, bytes rank 0 put into
all-reduces (the journals' payload bytes), bytes the host's network interfaces sent during the
run (/proc/net/dev: every rank and all traffic, as the published run reported them; ranks on
one host send over loopback, NCCL too with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), and the
wall time of the training loop.

Examples:
    .venv/bin/python benchmarks/train.py --preset llama-tiny --device cpu --world 1 2 \
        --sync diloco --inner-steps 2 4 --steps 8 --warmup-steps 0 --length 128
    .venv/bin/python benchmarks/train.py --preset llama-tiny --device cpu --world 1 \\
        --steps 12 --warmup-steps 2 --length 256
    python3 benchmarks/train.py --preset smollm2-1.7b --device cuda --world 1 2 \\
        --steps 10 --warmup-steps 3 --length 1024 --micro-batch all --bare batched
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nscas.recipes.init.presets import PRESETS, build_model, parameter_count, save_hf_dir
from nscas.recipes.tokenizer.bpe import train_tokenizer
from nscas.recipes.train.config import TrainParams, WorkerSpec
from nscas.recipes.train.documents import IGNORE, TrainDocument, write_documents
from nscas.recipes.train.journal import effective_steps, read_journal
from nscas.recipes.train.launch import StepProgress, run_training

BARE_LOOP = Path(__file__).with_name("bare_loop.py")
SCHEDULE_SEED = 20260913
TOKENIZER_TEXTS = [f"record {i} city Oslo units {i * 7 % 20} price {i % 19}" for i in range(40)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """One side's timed updates (pooled over repeats) and what else it reported."""

    label: str
    """Column heading: side and deterministic setting."""
    seconds: tuple[float, ...]
    """Per-update seconds of the timed updates (rank 0)."""
    periods: tuple[float, ...]
    """Wall seconds from the end of one update's bookkeeping to the end of the next's."""
    peak_memory_bytes: int
    """Largest peak over the ranks and the repeats."""
    tokens_per_update: int
    first_loss: float
    """Loss of the first timed update (the same work gives the same loss on both sides)."""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def fastest(self) -> float:
        return min(self.seconds)

    @property
    def period(self) -> float:
        return statistics.median(self.periods) if self.periods else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama-tiny")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--world", type=int, choices=(1, 2), nargs="+", default=[1],
                        help="ranks; several values run one after another on the same inputs "
                             "and add a speed-up table")
    parser.add_argument("--steps", type=int, default=12, help="timed updates per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed updates first")
    parser.add_argument("--length", type=int, default=256, help="tokens per document")
    parser.add_argument("--batch", type=int, default=8, help="global batch (documents)")
    parser.add_argument("--deterministic", choices=("both", "on", "off"), default="both")
    parser.add_argument("--bare-deterministic", choices=("same", "off"), default="same",
                        help="'off': the bare loop runs with determinism off only")
    parser.add_argument("--micro-batch", default="1",
                        help="nscas's micro_batch: documents per pass on a rank, or 'all' (a "
                             "rank's whole share, the shape of bare/batch); 1 is the published "
                             "method")
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[25],
                        help="nscas's bucket_mb; several values give several nscas columns "
                             "(world > 1)")
    parser.add_argument("--bare", choices=("both", "per-document", "batched"), default="both")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every side, alternated")
    parser.add_argument("--vocab", type=int, default=None,
                        help="embedding rows (default 2,048; smollm2-1.7b is fixed at 49,152)")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation seed")
    parser.add_argument("--store", type=Path, default=None,
                        help="with --model and --documents: take the model and documents from "
                             "this store instead of building a preset and random documents")
    parser.add_argument("--model", help="a checkpoint in --store (ID or ref), the base model")
    parser.add_argument("--documents", nargs="+", default=None, metavar="SET",
                        help="train and replay sets in --store (IDs or refs), tokenised as the "
                             "train recipe does, weights as published (8 grounded, 1 replay)")
    parser.add_argument("--fast", type=int, default=None, metavar="MICRO_BATCH",
                        help="also run nscas with this micro_batch, without and with compile "
                             "(deterministic off), against the published one pass per document")
    parser.add_argument("--sync", choices=("ddp", "diloco"), default="ddp",
                        help="diloco: the synchronous-vs-DiLoCo table instead (see above)")
    parser.add_argument("--inner-steps", type=int, nargs="+", default=[8],
                        help="DiLoCo's H values for --sync diloco")
    args = parser.parse_args()
    if args.sync == "diloco" and any(
            h < 1 or (args.warmup_steps + args.steps) % h for h in args.inner_steps):
        parser.error("every --inner-steps must divide --warmup-steps + --steps")
    if args.steps < 1 or args.warmup_steps < 0 or args.length < 4 or args.repeats < 1:
        parser.error("need --steps >= 1, --warmup-steps >= 0, --length >= 4, --repeats >= 1")
    for world in args.world:
        if args.batch % world:
            parser.error(f"--batch {args.batch} is not divisible by --world {world}")
        if args.device == "cuda" and world > _cuda_count():
            parser.error(f"--world {world} needs {world} visible GPUs")
    if args.bare_deterministic == "off" and args.deterministic == "on":
        parser.error("--bare-deterministic off needs --deterministic off or both")
    if (args.store is None) != (args.model is None) or (args.model is None) != (args.documents is None):
        parser.error("--store, --model and --documents go together")
    if args.micro_batch != "all" and not (args.micro_batch.isdigit() and int(args.micro_batch)):
        parser.error(f"--micro-batch must be a positive integer or 'all', not {args.micro_batch!r}")

    settings = ("on", "off") if args.deterministic == "both" else (args.deterministic,)
    bare_settings = ("off",) if args.bare_deterministic == "off" else settings
    modes = ("per-document", "batched") if args.bare == "both" else (args.bare,)
    total = args.warmup_steps + args.steps
    load_before = os.getloadavg()[0]
    tables: dict[int, list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="nscas-train-bench-") as tmp:
        root = Path(tmp)
        documents = root / "documents.jsonl"
        if args.store is not None:
            tokenizer, base, parameters, vocab, docs = stored_inputs(root, args)
            args.length = max(len(d.input_ids) for d in docs)
            args.preset = f"{args.model} (from the store)"
            write_documents(documents, docs)
        else:
            tokenizer, base, parameters, vocab = build_inputs(root, args)
            write_documents(documents, synthetic_documents(args.batch * total, args.length, vocab))
        if args.sync == "diloco":
            sync_table(args, [run_sync(root / f"sync-{w}-{h}", args, world=w, inner_steps=h,
                                       base=base, tokenizer=tokenizer, documents=documents)
                              for w in args.world for h in (None, *args.inner_steps)
                              if h is None or w > 1], parameters=parameters)
            return
        for world in args.world:
            buckets = args.bucket_mb if world > 1 else args.bucket_mb[:1]
            runs: dict[str, list[Measured]] = {}
            for repeat in range(args.repeats):
                # Alternate the sides so both see the same background load on a shared machine.
                for setting in settings:
                    for bucket in buckets:
                        m = run_nscas(root / f"nscas-{world}-{setting}-{bucket}-{repeat}", args,
                                      world=world, bucket_mb=bucket, base=base,
                                      tokenizer=tokenizer, documents=documents, setting=setting,
                                      label_bucket=len(buckets) > 1)
                        runs.setdefault(m.label, []).append(m)
                    if args.fast is not None and setting == settings[-1]:
                        for compiled in (False, True):
                            m = run_nscas(root / f"fast-{world}-{compiled}-{repeat}", args,
                                          world=world, bucket_mb=buckets[0], base=base,
                                          tokenizer=tokenizer, documents=documents,
                                          setting=setting, label_bucket=False,
                                          micro_batch=args.fast, compiled=compiled)
                            runs.setdefault(m.label, []).append(m)
                    if setting not in bare_settings:
                        continue
                    for mode in modes:
                        m = run_bare(root / f"bare-{world}-{mode}-{setting}-{repeat}", args,
                                     world=world, base=base, documents=documents,
                                     setting=setting, mode=mode)
                        runs.setdefault(m.label, []).append(m)
            tables[world] = [pool(label, measured) for label, measured in runs.items()]
            report(args, tables[world], world=world, parameters=parameters, vocab=vocab)
            print()
    if len(tables) > 1:
        speed_up(tables)
    print(f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs")


def build_inputs(root: Path, args: argparse.Namespace) -> tuple[Path, Path, int, int]:
    """(tokenizer dir, base model dir, parameters, embedding rows), built on the CPU."""
    tokenizer = train_tokenizer(TOKENIZER_TEXTS, vocab_size=300, out_dir=root / "tokenizer")
    fixed = PRESETS[args.preset].vocab_size
    vocab = args.vocab or fixed or 2048
    model = build_model(args.preset, vocab_size=vocab, seed=args.seed)
    _tensors, parameters = parameter_count(model)
    vocab = model.config.vocab_size
    base = save_hf_dir(model, tokenizer, root / "base")
    del model
    return tokenizer, base, parameters, vocab


def synthetic_documents(count: int, length: int, vocab: int) -> list[TrainDocument]:
    """``count`` documents of ``length`` random token ids; the second half is labelled."""
    rng = random.Random(SCHEDULE_SEED)
    docs = []
    for i in range(count):
        ids = tuple(rng.randrange(3, vocab) for _ in range(length))
        labels = tuple(IGNORE if p < length // 2 else t for p, t in enumerate(ids))
        docs.append(TrainDocument(id=f"synthetic-{i:05d}", input_ids=ids, labels=labels, weight=1))
    return docs


def stored_inputs(root: Path, args: argparse.Namespace
                  ) -> tuple[Path, Path, int, int, list[TrainDocument]]:
    """(tokenizer dir, base dir, parameters, embedding rows, documents) from a store: the
    checkpoint materialised, the sets tokenised with its chat template as ``train`` does."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from nscas.objects.digests import Digest
    from nscas.recipes.common.tokenise import encode_document, end_of_turn
    from nscas.store.opening import open_store

    with open_store(args.store, readonly=True) as store:
        record = store.get_record(store.resolve(args.model))
        base = root / "base"
        store.materialise(Digest.parse(record["files"]), base)
        tokenizer_dir = root / "tokenizer"
        tokenizer_dir.mkdir()
        for f in base.iterdir():
            if f.suffix != ".safetensors" and f.name not in ("config.json", "generation_config.json"):
                shutil.copyfile(f, tokenizer_dir / f.name)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        turn = end_of_turn(tokenizer)
        docs = []
        for name in args.documents:
            tasks = store.get_record(store.resolve(name))
            weight = 1 if tasks.get("role") == "replay" else 8
            lines = store.get_bytes(Digest.parse(tasks["records"])).decode().splitlines()
            for line in lines:
                rec = json.loads(line)
                enc = encode_document(tokenizer, rec, max_length=4096, turn=turn)
                docs.append(TrainDocument.from_encoded(rec["id"], enc, weight=weight))
    parameters = 0
    rows = 0
    for path in base.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is no mapping
                shape = f.get_slice(key).get_shape()
                parameters += int(np.prod(shape))
                if "embed_tokens" in key:
                    rows = shape[0]
    return tokenizer_dir, base, parameters, rows, docs


def run_nscas(out: Path, args: argparse.Namespace, *, world: int, bucket_mb: int, base: Path,
              tokenizer: Path, documents: Path, setting: str, label_bucket: bool,
              micro_batch: int | None = None, compiled: bool = False) -> Measured:
    total = args.warmup_steps + args.steps
    local = args.batch // world
    if micro_batch is None:
        micro_batch = local if args.micro_batch == "all" else min(int(args.micro_batch), local)
    params = TrainParams(
        steps=total, batch=args.batch, checkpoint_steps=(total,), max_length=args.length,
        world=world, device=args.device, deterministic=setting == "on",
        schedule_seed=SCHEDULE_SEED, bucket_mb=bucket_mb, micro_batch=min(micro_batch, local),
        compile=compiled,
    )
    spec = WorkerSpec(base_dir=str(base), documents=(str(documents),), output_dir=str(out),
                      tokenizer_dir=str(tokenizer), params=params)
    arrivals: dict[int, float] = {}

    def arrived(progress: StepProgress) -> None:
        arrivals[progress.step] = time.perf_counter()

    outcome = run_training(spec, on_progress=arrived, env=thread_env(args.threads))
    steps = effective_steps(read_journal(outcome.journals[0]).entries)
    seconds = [e["seconds"] for e in steps[args.warmup_steps:]]
    periods = [arrivals[s] - arrivals[s - 1] for s in range(args.warmup_steps + 1, total + 1)
               if s - 1 in arrivals and s in arrivals]
    fast = f" mb{params.micro_batch}{'+c' if compiled else ''}" if params.micro_batch > 1 and (
        args.fast is not None) else ""
    measured = Measured(
        label=f"nscas{fast} {setting}" + (f" b{bucket_mb}" if label_bucket else ""),
        seconds=tuple(seconds), periods=tuple(periods),
        peak_memory_bytes=max(r.peak_memory_bytes for r in outcome.results),
        tokens_per_update=steps[-1]["tokens"], first_loss=steps[args.warmup_steps]["loss"],
    )
    shutil.rmtree(out)  # a 1.7B checkpoint is tens of GB
    return measured


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncMeasured:
    """One run of the synchronous-vs-DiLoCo table (rank 0's journal and result)."""

    label: str
    world: int
    inner: float
    """Median inner (or synchronous) update seconds over the timed updates."""
    outer: float | None
    """Median outer-step seconds (DiLoCo only)."""
    outer_steps: int
    bytes_sent: int
    """Bytes rank 0 put into all-reduces over the whole run (journal payload bytes)."""
    wire_bytes: int | None
    """Bytes every network interface of this host sent during the run, all ranks and all
    traffic (rendezvous, control group, checkpoints' gathers) together, from /proc/net/dev:
    what the published run reported; None where the counters cannot be read."""
    wall: float
    """The training loop's wall time (loading excluded; checkpoints and digests included)."""
    loss: float
    """Rank 0's loss of the last update."""


def run_sync(out: Path, args: argparse.Namespace, *, world: int, inner_steps: int | None,
             base: Path, tokenizer: Path, documents: Path) -> SyncMeasured:
    from nscas.recipes.train.journal import effective_outer_steps

    total = args.warmup_steps + args.steps
    local = args.batch // world
    micro = local if args.micro_batch == "all" else min(int(args.micro_batch), local)
    diloco = {"sync": "diloco", "inner_steps": inner_steps} if inner_steps else {}
    params = TrainParams(
        steps=total, batch=args.batch, checkpoint_steps=(total,), max_length=args.length,
        world=world, device=args.device, deterministic=args.deterministic == "on",
        schedule_seed=SCHEDULE_SEED, micro_batch=micro, **diloco,
    )
    spec = WorkerSpec(base_dir=str(base), documents=(str(documents),), output_dir=str(out),
                      tokenizer_dir=str(tokenizer), params=params)
    before = interface_tx_bytes()
    outcome = run_training(spec, env=thread_env(args.threads))
    after = interface_tx_bytes()
    entries = read_journal(outcome.journals[0]).entries
    steps = effective_steps(entries)
    outer = effective_outer_steps(entries)
    lead = min(outcome.results, key=lambda r: r.rank)
    measured = SyncMeasured(
        label=f"diloco H={inner_steps}" if inner_steps else "ddp", world=world,
        inner=statistics.median(e["seconds"] for e in steps[args.warmup_steps:]),
        outer=statistics.median(e["seconds"] for e in outer) if outer else None,
        outer_steps=len(outer), bytes_sent=lead.bytes_communicated,
        wire_bytes=None if before is None or after is None else after - before,
        wall=lead.loop_seconds, loss=steps[-1]["loss"],
    )
    shutil.rmtree(out)
    return measured


def interface_tx_bytes() -> int | None:
    """Bytes sent so far by every network interface of this host (loopback included: ranks on
    one host talk over it, NCCL too when P2P and shared memory are disabled), or None where
    /proc/net/dev cannot be read."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return None
    # "  lo: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...": field 8 after the colon.
    return sum(int(line.split(":", 1)[1].split()[8]) for line in lines if ":" in line)


def sync_table(args: argparse.Namespace, rows: list[SyncMeasured], *, parameters: int) -> None:
    total = args.warmup_steps + args.steps
    print(f"model: {args.preset}, {parameters:,} parameters; device {args.device}; "
          f"{total} updates x {args.batch} documents x {args.length} tokens per run; torch "
          f"threads {args.threads} per rank; deterministic {args.deterministic}")
    one = next((r for r in rows if r.world == 1 and r.label == "ddp"), None)
    print(f"{'run':<16}{'world':>6}{'update s':>11}{'outer s':>10}{'outer':>7}"
          f"{'bytes sent':>15}{'interfaces':>15}{'wall s':>9}{'vs 1 rank':>10}"
          f"{'last loss':>11}")
    for r in rows:
        outer = f"{r.outer:.4f}" if r.outer is not None else "-"
        ratio = f"{one.wall / r.wall:.2f}x" if one is not None else "-"
        wire = f"{r.wire_bytes:,}" if r.wire_bytes is not None else "-"
        print(f"{r.label:<16}{r.world:>6}{r.inner:>11.4f}{outer:>10}{r.outer_steps:>7}"
              f"{r.bytes_sent:>15,}{wire:>15}{r.wall:>9.2f}{ratio:>10}{r.loss:>11.5f}")
    print("update s: median inner update (rank 0); bytes sent: payload bytes rank 0 put into "
          "all-reduces; interfaces: bytes this host's network interfaces sent during the run "
          "(/proc/net/dev, all ranks and all traffic; other traffic on the host counts too); "
          "wall: training loop; vs 1 rank: one rank's wall / this wall")


def run_bare(out: Path, args: argparse.Namespace, *, world: int, base: Path, documents: Path,
             setting: str, mode: str) -> Measured:
    total = args.warmup_steps + args.steps
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(world), "--nnodes", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "0",
        str(BARE_LOOP), "--model-dir", str(base), "--documents", str(documents),
        "--steps", str(total), "--batch", str(args.batch), "--device", args.device,
        "--mode", mode, "--deterministic", setting, "--threads", str(args.threads),
        "--schedule-seed", str(SCHEDULE_SEED), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, **thread_env(args.threads)}
    if setting == "on" and args.device == "cuda":
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bare loop failed ({done.returncode}):\n{done.stderr[-4000:]}")
    ranks = [json.loads((out / f"bare-rank{r}.json").read_text()) for r in range(world)]
    first = ranks[0]
    if first["threads"] != args.threads:
        raise SystemExit(f"bare loop ran {first['threads']} threads, not {args.threads}")
    measured = Measured(
        label=f"bare/{'doc' if mode == 'per-document' else 'batch'} {setting}",
        seconds=tuple(first["seconds"][args.warmup_steps:]),
        # periods[i] ends update i + 2 (1-based); keep those that end a timed update.
        periods=tuple(first["periods"][max(args.warmup_steps - 1, 0):]),
        peak_memory_bytes=max(r["peak_memory_bytes"] for r in ranks),
        tokens_per_update=first["tokens"][-1], first_loss=first["losses"][args.warmup_steps],
    )
    shutil.rmtree(out)
    return measured


def pool(label: str, measured: list[Measured]) -> Measured:
    """One column from the repeats of one side: all timed updates, the largest peak."""
    return Measured(
        label=label,
        seconds=tuple(s for m in measured for s in m.seconds),
        periods=tuple(p for m in measured for p in m.periods),
        peak_memory_bytes=max(m.peak_memory_bytes for m in measured),
        tokens_per_update=measured[0].tokens_per_update,
        first_loss=measured[0].first_loss,
    )


def report(args: argparse.Namespace, columns: list[Measured], *, world: int, parameters: int,
           vocab: int) -> None:
    print(f"model: {args.preset}, {parameters:,} parameters (vocabulary {vocab:,}); "
          f"device {args.device}; world {world}; torch threads {args.threads} per rank; "
          f"nscas micro_batch {args.micro_batch}")
    precision = "FP32 parameters, BF16 autocast" if args.device == "cuda" else "FP32 throughout"
    print(f"global batch {args.batch} x {args.length} tokens; {precision}; "
          f"{args.warmup_steps} warm-up + {args.steps} timed updates per run; "
          f"{args.repeats} run(s) per column")
    print()
    width = 16
    print(f"{'':<26}" + "".join(f"{c.label:>{width}}" for c in columns))
    rows = [
        ("median update s", lambda c: f"{c.median:.4f}"),
        ("median period s", lambda c: f"{c.period:.4f}"),
        ("tokens/s", lambda c: f"{c.tokens_per_update / c.median:,.0f}"),
        ("peak memory", lambda c: _memory(c.peak_memory_bytes)),
        ("loss, 1st timed update", lambda c: f"{c.first_loss:.8f}"),
        ("fastest update s", lambda c: f"{c.fastest:.4f}"),
        ("slowest update s", lambda c: f"{max(c.seconds):.4f}"),
    ]
    for name, cell in rows:
        print(f"{name:<26}" + "".join(f"{cell(c):>{width}}" for c in columns))
    print()
    nscas = [c for c in columns if c.label.startswith("nscas")]
    bare = [c for c in columns if c.label.startswith("bare")]
    for ours in nscas:
        for theirs in bare:
            if _setting(ours) == _setting(theirs):
                print(f"{ours.label} / {theirs.label}: median update "
                      f"{ours.median / theirs.median:.3f}x, fastest update "
                      f"{ours.fastest / theirs.fastest:.3f}x, median period "
                      f"{ours.period / theirs.period:.3f}x (target: update <= 1.05x)")
    published = next((c for c in columns if c.label.startswith("nscas ")
                      and _setting(c) == "on"), None)
    if published is not None:
        for fast in columns:
            if " mb" in fast.label:
                print(f"{published.label} (published method) / {fast.label}: "
                      f"{published.median / fast.median:.2f}x faster per update (target >= 5x)")
    by_label = {c.label: c for c in columns}
    for off in columns:
        on = by_label.get(off.label.replace(" off", " on", 1))
        if _setting(off) == "off" and on is not None:
            side = off.label.replace(" off", "", 1)
            print(f"deterministic cost, {side}: on / off = {on.median / off.median:.3f}x median "
                  f"update, {on.fastest / off.fastest:.3f}x fastest update")
    print("period: wall time between the ends of consecutive updates, bookkeeping included "
          "(nscas: journal fsync, progress line; both: loss all-reduce and read-back)")


def speed_up(tables: dict[int, list[Measured]]) -> None:
    """Every column present at the fewest and the most ranks: how much faster the most run."""
    low, high = min(tables), max(tables)
    at_low = {c.label: c for c in tables[low]}
    print(f"speed-up, {high} ranks vs {low} (median update; fastest update), target >= 1.8x:")
    for column in tables[high]:
        # A bucket size names an nscas column only where there are several ranks.
        other = at_low.get(re.sub(r" b\d+$", "", column.label))
        if other is not None:
            print(f"  {column.label:<18} {other.median / column.median:.3f}x "
                  f"({other.fastest / column.fastest:.3f}x)")
    print()


def _setting(column: Measured) -> str:
    """``on`` or ``off``: the deterministic setting a column's label names."""
    return column.label.split()[1]


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _memory(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


if __name__ == "__main__":
    main()
