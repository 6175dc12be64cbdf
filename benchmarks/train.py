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

Both sides use --threads torch threads per rank. The first --warmup-steps updates of every run
are dropped; --steps updates are timed. Peak memory is CUDA max allocated (CPU: peak RSS), the
largest over the ranks. With ``--deterministic both`` every side runs with deterministic
algorithms on and off, and the table shows the cost of the setting.

Examples:
    .venv/bin/python benchmarks/train.py --preset llama-tiny --device cpu --world 1 \\
        --steps 12 --warmup-steps 2 --length 256
    python3 benchmarks/train.py --preset smollm2-1.7b --device cuda --world 2 \\
        --steps 10 --warmup-steps 3 --length 1024 --deterministic both
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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
    parser.add_argument("--world", type=int, choices=(1, 2), default=1)
    parser.add_argument("--steps", type=int, default=12, help="timed updates per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed updates first")
    parser.add_argument("--length", type=int, default=256, help="tokens per document")
    parser.add_argument("--batch", type=int, default=8, help="global batch (documents)")
    parser.add_argument("--deterministic", choices=("both", "on", "off"), default="both")
    parser.add_argument("--bare", choices=("both", "per-document", "batched"), default="both")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every side, alternated")
    parser.add_argument("--vocab", type=int, default=None,
                        help="embedding rows (default 2,048; smollm2-1.7b is fixed at 49,152)")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation seed")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 0 or args.length < 4 or args.repeats < 1:
        parser.error("need --steps >= 1, --warmup-steps >= 0, --length >= 4, --repeats >= 1")
    if args.batch % args.world:
        parser.error(f"--batch {args.batch} is not divisible by --world {args.world}")
    if args.device == "cuda" and args.world > _cuda_count():
        parser.error(f"--world {args.world} needs {args.world} visible GPUs")

    settings = ("on", "off") if args.deterministic == "both" else (args.deterministic,)
    modes = ("per-document", "batched") if args.bare == "both" else (args.bare,)
    total = args.warmup_steps + args.steps
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="nscas-train-bench-") as tmp:
        root = Path(tmp)
        tokenizer, base, parameters, vocab = build_inputs(root, args)
        documents = root / "documents.jsonl"
        write_documents(documents, synthetic_documents(args.batch * total, args.length, vocab))
        runs: dict[str, list[Measured]] = {}
        for repeat in range(args.repeats):
            # Alternate the sides so both see the same background load on a shared machine.
            for setting in settings:
                m = run_nscas(root / f"nscas-{setting}-{repeat}", args, base=base,
                              tokenizer=tokenizer, documents=documents, setting=setting)
                runs.setdefault(m.label, []).append(m)
                for mode in modes:
                    m = run_bare(root / f"bare-{mode}-{setting}-{repeat}", args, base=base,
                                 documents=documents, setting=setting, mode=mode)
                    runs.setdefault(m.label, []).append(m)
    columns = [pool(label, measured) for label, measured in runs.items()]
    report(args, columns, parameters=parameters, vocab=vocab, settings=settings, modes=modes)
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


def run_nscas(out: Path, args: argparse.Namespace, *, base: Path, tokenizer: Path,
              documents: Path, setting: str) -> Measured:
    total = args.warmup_steps + args.steps
    params = TrainParams(
        steps=total, batch=args.batch, checkpoint_steps=(total,), max_length=args.length,
        world=args.world, device=args.device, deterministic=setting == "on",
        schedule_seed=SCHEDULE_SEED,
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
    measured = Measured(
        label=f"nscas {setting}", seconds=tuple(seconds), periods=tuple(periods),
        peak_memory_bytes=max(r.peak_memory_bytes for r in outcome.results),
        tokens_per_update=steps[-1]["tokens"], first_loss=steps[args.warmup_steps]["loss"],
    )
    shutil.rmtree(out)  # a 1.7B checkpoint is tens of GB
    return measured


def run_bare(out: Path, args: argparse.Namespace, *, base: Path, documents: Path,
             setting: str, mode: str) -> Measured:
    total = args.warmup_steps + args.steps
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(args.world), "--nnodes", "1",
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
    ranks = [json.loads((out / f"bare-rank{r}.json").read_text()) for r in range(args.world)]
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


def report(args: argparse.Namespace, columns: list[Measured], *, parameters: int, vocab: int,
           settings: tuple[str, ...], modes: tuple[str, ...]) -> None:
    print(f"model: {args.preset}, {parameters:,} parameters (vocabulary {vocab:,}); "
          f"device {args.device}; world {args.world}; torch threads {args.threads} per rank")
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
    by_label = {c.label: c for c in columns}
    for setting in settings:
        nscas = by_label[f"nscas {setting}"]
        for mode in modes:
            bare = by_label[f"bare/{'doc' if mode == 'per-document' else 'batch'} {setting}"]
            print(f"nscas / {bare.label}: median update {nscas.median / bare.median:.3f}x, "
                  f"fastest update {nscas.fastest / bare.fastest:.3f}x, "
                  f"median period {nscas.period / bare.period:.3f}x (target: update <= 1.05x)")
    if len(settings) == 2:
        for side in ("nscas", *(f"bare/{'doc' if m == 'per-document' else 'batch'}" for m in modes)):
            on, off = by_label[f"{side} on"], by_label[f"{side} off"]
            print(f"deterministic cost, {side}: on / off = {on.median / off.median:.3f}x median "
                  f"update, {on.fastest / off.fastest:.3f}x fastest update")
    print("period: wall time between the ends of consecutive updates, bookkeeping included "
          "(nscas: journal fsync, progress line; both: loss all-reduce and read-back)")


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _memory(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


if __name__ == "__main__":
    main()
