"""The ``codecs`` section of benchmarks/store.py: chunk codecs on a real fine-tune (issue 41).

A seed checkpoint (an HF directory of FP32 safetensors, e.g. SmolLM2-135M from
scripts/get-smollm2 then ``nscas get``) and a child trained from it for a few CPU updates here
(AdamW, lr 3e-5, random tokens: every weight moves, as in a real fine-tune). Side by side:

  dense    stored/raw of the seed in a fresh store vs the reference methods over the same
           tensors (zstd-3; byte planes then zstd-3)
  child    stored/raw of the child put with the seed as its base vs the reference method
           (XOR with the parent's tensor, byte planes, zstd-3 over each tensor)
  bf16     the same two for the seed and the child saved in BF16
  push     bytes a push of the child sends to a store that holds the seed / raw child
  get      nscas get of the delta-coded child vs the same child stored raw (speed ratio, wall
           and CPU), and a checkpoint load (get, then safetensors' load_file) the same way,
           with load_file's part of it apart; and the decoding alone: every leaf of the
           weights read one at a time

The reference methods are computed here with numpy and zstandard alone, not the store's code.
"""

from __future__ import annotations

import json
import resource
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from nscas.objects import codecs
from nscas.objects.digests import Digest
from nscas.remotes.transfer import transfer
from nscas.store.usage import usage
from nscas.store.writer import Store, init_store

_WIDTH = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}


def train_child(seed: Path, out: Path, *, steps: int, dtype: str = "float32") -> None:
    """A few AdamW updates of ``seed`` on random tokens, saved to ``out`` (safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(seed, torch_dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    vocab = model.config.vocab_size
    for _ in range(steps):
        ids = torch.randint(0, vocab, (2, 64))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    _copy_side_files(seed, out)


def cast(seed: Path, out: Path, dtype: str) -> None:
    """``seed`` saved again in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(seed, torch_dtype=torch.float32)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    _copy_side_files(seed, out)


def _copy_side_files(seed: Path, out: Path) -> None:
    for f in seed.iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)


def tensors(path: Path) -> Iterator[tuple[str, str, bytes]]:
    """(name, dtype, bytes) of each tensor of a safetensors file."""
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    for name, info in sorted(header.items()):
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        yield name, info["dtype"], raw[8 + hlen + start:8 + hlen + end]


def _planes(data: bytes, w: int) -> bytes:
    n = len(data) - len(data) % w
    arr = np.frombuffer(data, np.uint8)
    return arr[:n].reshape(-1, w).T.tobytes() + data[n:]


def reference(path: Path, parent: Path | None) -> dict[str, float]:
    """The issue's reference ratios over the tensors of ``path``: zstd-3, planes + zstd-3 and,
    with ``parent``, XOR with its same tensor + planes + zstd-3."""
    cctx = zstandard.ZstdCompressor(level=3)
    theirs = {name: data for name, _, data in tensors(parent)} if parent is not None else {}
    raw = z = p = x = 0
    for name, dtype, data in tensors(path):
        w = _WIDTH.get(dtype, 1)
        raw += len(data)
        z += len(cctx.compress(data))
        p += len(cctx.compress(_planes(data, w)))
        other = theirs.get(name)
        if other is not None and len(other) == len(data):
            resid = (np.frombuffer(data, np.uint8) ^ np.frombuffer(other, np.uint8)).tobytes()
            x += len(cctx.compress(_planes(resid, w)))
        else:
            x += len(cctx.compress(_planes(data, w)))
    return {"raw": raw, "zstd": z / raw, "planes": p / raw, "xor": x / raw}


def _file_usage(store: Store, tree: Digest, name: str) -> tuple[int, int]:
    entry = store.get_record(tree)["entries"][name]
    u = usage(store, Digest.parse(entry["id"]))
    return u.raw, u.stored


def _put(store: Store, tree: Path, base: Digest | None = None) -> tuple[Digest, float]:
    t0 = time.perf_counter()
    oid = store.put_tree(tree, base=base)
    return oid, time.perf_counter() - t0


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_codecs(work: Path, seed: Path, *, steps: int, runs: int) -> dict[str, Any]:
    """Every ratio of the section, printed side by side; returned for --json."""
    out: dict[str, Any] = {}
    child = work / "child-f32"
    if not child.exists():
        t = _timed(lambda: train_child(seed, child, steps=steps))
        print(f"trained the child: {steps} AdamW updates on CPU in {t:.0f} s")
    bf_seed, bf_child = work / "seed-bf16", work / "child-bf16"
    if not bf_seed.exists():
        cast(seed, bf_seed, "bfloat16")
    if not bf_child.exists():
        cast(child, bf_child, "bfloat16")
    weights = "model.safetensors"
    print("\n## codecs: stored / raw of the tensors (lower is better)")
    print(f"{'checkpoint':<22}{'nscas':>8}{'ref zstd-3':>12}{'ref planes':>12}"
          f"{'ref XOR':>10}{'nscas/ref':>11}")
    for label, parent_dir, child_dir in (("F32", seed, child), ("BF16", bf_seed, bf_child)):
        root = work / f"store-{label}"
        shutil.rmtree(root, ignore_errors=True)
        store = init_store(root)
        try:
            base, t_base = _put(store, parent_dir)
            tuned, t_child = _put(store, child_dir, base)
            dense_raw, dense_stored = _file_usage(store, base, weights)
            child_raw, child_stored = _file_usage(store, tuned, weights)
        finally:
            store.close()
        ref_dense = reference(parent_dir / weights, None)
        ref_child = reference(child_dir / weights, parent_dir / weights)
        dense, delta = dense_stored / dense_raw, child_stored / child_raw
        print(f"{label + ' dense base':<22}{dense:>8.3f}{ref_dense['zstd']:>12.3f}"
              f"{ref_dense['planes']:>12.3f}{'':>10}{dense / ref_dense['planes']:>11.3f}")
        print(f"{label + ' child (delta)':<22}{delta:>8.3f}{ref_child['zstd']:>12.3f}"
              f"{ref_child['planes']:>12.3f}{ref_child['xor']:>10.3f}"
              f"{delta / ref_child['xor']:>11.3f}")
        out[label] = {"dense": dense, "child": delta, "ref_dense": ref_dense,
                      "ref_child": ref_child, "raw_bytes": child_raw,
                      "put_seconds": {"base": t_base, "child": t_child}}
        print(f"  (put of the base {t_base:.1f} s, of the child {t_child:.1f} s, "
              f"{child_raw >> 20} MiB of tensors)")
    out["push"] = _push(work, seed, child)
    out["get"] = _get(work, seed, child, runs=runs)
    summary(out)
    return out


def _push(work: Path, seed: Path, child: Path) -> dict[str, float]:
    a_root, b_root = work / "push-a", work / "push-b"
    for r in (a_root, b_root):
        shutil.rmtree(r, ignore_errors=True)
    a, b = init_store(a_root), init_store(b_root)
    try:
        base = a.put_tree(seed)
        tuned = a.put_tree(child, base=base)
        transfer(a, b, str(base))
        sent = transfer(a, b, str(tuned)).bytes_sent
        raw = usage(a, tuned).raw
    finally:
        a.close()
        b.close()
    print(f"\npush of the child to a store holding its parent: {sent >> 20} MiB sent of "
          f"{raw >> 20} MiB raw = {sent / raw:.3f}")
    return {"sent": sent, "raw": raw, "ratio": sent / raw}


def _cpu() -> float:
    """User + system seconds of this process, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _get(work: Path, seed: Path, child: Path, *, runs: int) -> dict[str, float]:
    """nscas get (materialise) of the delta-coded child vs the same child stored raw, and a
    checkpoint load (materialise, then safetensors' load_file of its weights), wall and CPU."""
    from safetensors.numpy import load_file

    delta_root, raw_root = work / "get-delta", work / "get-raw"
    for r in (delta_root, raw_root):
        shutil.rmtree(r, ignore_errors=True)
    ds, rs = init_store(delta_root), init_store(raw_root)
    real = codecs.choose
    try:
        base = ds.put_tree(seed)
        tuned = ds.put_tree(child, base=base)
        codecs.choose = lambda data, **_: ("raw", data)  # type: ignore[assignment]
        try:
            plain = rs.put_tree(child)
        finally:
            codecs.choose = real  # type: ignore[assignment]
        assert plain == tuned
        times: dict[str, list[tuple[float, float]]] = {
            f"{op} {label}": [] for op in ("get", "load", "load_file", "decode")
            for label in ("delta", "raw")}
        for i in range(runs):  # interleaved
            for op in ("get", "load"):
                for label, store in (("delta", ds), ("raw", rs)):
                    dest = work / f"got-{label}-{i}"
                    shutil.rmtree(dest, ignore_errors=True)
                    t0, c0 = time.perf_counter(), _cpu()
                    store.materialise(tuned, dest)
                    if op == "load":
                        t1, c1 = time.perf_counter(), _cpu()
                        load_file(dest / "model.safetensors")  # the load's own part, apart
                        times[f"load_file {label}"].append(
                            (time.perf_counter() - t1, _cpu() - c1))
                    times[f"{op} {label}"].append((time.perf_counter() - t0, _cpu() - c0))
                    shutil.rmtree(dest)
        for _ in range(runs):  # what decoding costs, without a get's threads, hash and writes
            for label, store in (("delta", ds), ("raw", rs)):
                times[f"decode {label}"].append(_decode_serially(store, tuned))
    finally:
        ds.close()
        rs.close()
    med = {k: (sorted(w for w, _ in v)[len(v) // 2], sorted(c for _, c in v)[len(v) // 2])
           for k, v in times.items()}
    out: dict[str, float] = {}
    print(f"\n{'child, median of ' + str(runs):<26}{'wall s':>8}{'CPU s':>8}")
    for key, (wall, cpu) in med.items():
        print(f"{key:<26}{wall:>8.2f}{cpu:>8.2f}")
        out[f"{key.replace(' ', '_')}_s"], out[f"{key.replace(' ', '_')}_cpu_s"] = wall, cpu
    for op in ("get", "load", "decode"):
        out[f"{op}_speed"] = med[f"{op} raw"][0] / med[f"{op} delta"][0]
        out[f"{op}_cpu_speed"] = med[f"{op} raw"][1] / med[f"{op} delta"][1]
        print(f"{op} of the delta-coded child: {out[f'{op}_speed']:.2f}x the speed of raw "
              f"(wall), {out[f'{op}_cpu_speed']:.2f}x (CPU)")
    return out


def _decode_serially(store: Store, tree: Digest) -> tuple[float, float]:
    """(wall, CPU) of reading every leaf of the tree's weights file one after the other, each
    checked against its ID (``read_leaf``, what a get's decoding threads run)."""
    entry = store.get_record(tree)["entries"]["model.safetensors"]
    leaves = list(store.leaves(Digest.parse(entry["id"])))
    t0, c0 = time.perf_counter(), _cpu()
    for leaf in leaves:
        store.read_leaf(*leaf)
    return time.perf_counter() - t0, _cpu() - c0


def summary(out: dict[str, Any]) -> None:
    """Every target of issue 41 beside its measured ratio, from one run."""
    print("\n## codecs: targets (issue 41), this run")
    rows = [("F32 dense base stored / raw", out["F32"]["dense"], "<= 0.86"),
            ("F32 child / reference XOR", out["F32"]["child"] / out["F32"]["ref_child"]["xor"],
             "<= 0.95"),
            ("BF16 dense base stored / raw", out["BF16"]["dense"], "<= 0.86"),
            ("BF16 child / reference XOR",
             out["BF16"]["child"] / out["BF16"]["ref_child"]["xor"], "<= 0.95"),
            ("push of the child: sent / raw", out["push"]["ratio"], "<= 0.65"),
            ("get: speed delta / raw (wall)", out["get"]["get_speed"], ">= 0.7"),
            ("get: speed delta / raw (CPU)", out["get"]["get_cpu_speed"], ""),
            ("load: speed delta / raw (wall)", out["get"]["load_speed"], ">= 0.7"),
            ("load: speed delta / raw (CPU)", out["get"]["load_cpu_speed"], "")]
    for label, value, target in rows:
        print(f"{label:<34}{value:>8.3f}  {target}")
