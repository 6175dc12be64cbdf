"""The report's parameter comparison at the SmolLM2-135M scale, on the CPU.

Builds (once, in ``--workdir``) a store holding five checkpoints of SmolLM2-135M's shapes (30
layers, hidden 576, intermediate 1536, 9 heads, 3 KV heads, vocabulary 49152, tied embeddings;
134.5M FP32 parameters, 538 MB each) with random weights: a seed and four trained arms (the
seed plus small noise in every tensor). Then times the eight comparisons the 135M pipeline's
report makes (each arm against the seed, each clean arm against each damaged one), CPU time
(user + sys of this process) and wall, medians of ``--runs``:

- ``one pair at a time``: ``compare_params`` per pair, as the report did;
- ``all pairs at once``: ``compare_pairs`` (each checkpoint read once), with ``--threads``.

Both must give the same sums, bit for bit; the script checks that. Results go to
docs/benchmarks.md by hand, with the command line::

    .venv/bin/python benchmarks/report_parameters.py --workdir /tmp/report-bench --threads 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from nscas.models.checkpoints import put_checkpoint
from nscas.models.distance import ParamsDiff, compare_params
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import Store, init_store

LAYERS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 30, 576, 1536, 9, 3, 49152
ARMS = ("clean-3e-5", "damaged-3e-5", "clean-3e-4", "damaged-3e-4")


def shapes() -> dict[str, tuple[int, ...]]:
    """SmolLM2-135M's tensors (LlamaForCausalLM, tied embeddings: no lm_head)."""
    kv = HIDDEN // HEADS * KV_HEADS
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN),
                                       "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                p + "self_attn.k_proj.weight": (kv, HIDDEN),
                p + "self_attn.v_proj.weight": (kv, HIDDEN),
                p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
                p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
                p + "input_layernorm.weight": (HIDDEN,),
                p + "post_attention_layernorm.weight": (HIDDEN,)}
    return out


def build(workdir: Path) -> dict[str, Digest]:
    """The params/1 IDs of the seed and the four arms, stored once in ``workdir``."""
    ids = workdir / "params.txt"
    if ids.exists():
        return {k: Digest.parse(v) for k, v in
                (line.split() for line in ids.read_text().splitlines())}
    store = init_store(workdir)
    rng = np.random.default_rng(20260913)
    seed = {n: (rng.standard_normal(s, dtype=np.float32) * np.float32(0.02))
            for n, s in shapes().items()}
    out = {}
    try:
        for arm in ("seed", *ARMS):
            tensors = seed if arm == "seed" else {
                n: v + rng.standard_normal(v.shape, dtype=np.float32) * np.float32(1e-4)
                for n, v in seed.items()}
            folder = workdir / "model"
            folder.mkdir()
            save_file(tensors, str(folder / "model.safetensors"))
            checkpoint = put_checkpoint(store, folder, step=0, parent=None)
            shutil.rmtree(folder)
            out[arm] = Digest.parse(store.get_record(checkpoint)["params"])
    finally:
        store.close()
    ids.write_text("".join(f"{k} {v}\n" for k, v in out.items()))
    return out


def pairs(ids: dict[str, Digest]) -> list[tuple[Digest, Digest]]:
    """(baseline, candidate) of the report's comparisons, in its order."""
    out = [(ids["seed"], ids[arm]) for arm in ARMS]
    for clean in ("clean-3e-5", "clean-3e-4"):
        out += [(ids[damaged], ids[clean]) for damaged in ("damaged-3e-5", "damaged-3e-4")]
    return out


def timed(work: Callable[[], list[ParamsDiff]], runs: int) -> tuple[float, float,
                                                                     list[ParamsDiff]]:
    cpu, wall = [], []
    result: list[ParamsDiff] = []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), os.times()
        result = work()
        c1 = os.times()
        wall.append(time.perf_counter() - t0)
        cpu.append(c1.user - c0.user + c1.system - c0.system)
    return statistics.median(cpu), statistics.median(wall), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True,
                        help="where the store is built (2.7 GB), and found again")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", choices=("one", "all"), help="time one way only")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    todo = pairs(build(args.workdir))
    store: Store = open_store(args.workdir)
    results = {}
    try:
        if args.only != "all":
            results["one pair at a time"] = timed(
                lambda: [compare_params(store, b, c) for b, c in todo], args.runs)
        if args.only != "one":
            from nscas.models.distance import compare_pairs

            results[f"all pairs at once, {args.threads} threads"] = timed(
                lambda: compare_pairs(store, todo, threads=args.threads), args.runs)
    finally:
        store.close()
    for name, (cpu, wall, _) in results.items():
        print(f"{len(todo)} comparisons of 134.5M FP32 parameters, {name}: "
              f"CPU {cpu:.1f} s, wall {wall:.1f} s (medians of {args.runs})")
    diffs = [r[2] for r in results.values()]
    if len(diffs) == 2:
        same = all(a.tensors == b.tensors for a, b in zip(*diffs, strict=True))
        print("bit-identical sums:", same)


if __name__ == "__main__":
    main()
