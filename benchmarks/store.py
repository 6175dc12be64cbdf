"""Store benchmark: nscas add / fsck / dedup / log / lineage against their natural baselines.

Every comparison is measured side by side in one invocation, runs interleaved, medians of
``--runs`` (at least 3). Results go to docs/benchmarks.md by hand, with the command line.

    .venv/bin/python benchmarks/store.py --dvc /tmp/dvc-venv/bin/dvc --json /tmp/bench.json

Sections (``--only`` picks some):
  add      1 GiB safetensors (64 tensors of 4M random F32): nscas add (CLI and library, durable)
           vs dvc add, dd conv=fsync (the durable-copy floor), b3sum, sha256sum
  fsck     (part of "add") nscas fsck --deep (every stored leaf once) and --full (whole
           objects: BLAKE3 + SHA-256) vs b3sum over the same bytes
  second   a second checkpoint with 90 % of the tensors unchanged: stored bytes and time
  records  log --limit 20 and lineage on stores of 100,000 and 1,000,000 records
  memory   peak RSS of adding a 4 GiB sparse safetensors file
  parts    what a put costs, part by part (read, hashes, zstd sample, fsync'ed write)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import rfc8785
import zstandard
from safetensors.numpy import save_file

from nscas.digests import Digest
from nscas.fsck import fsck
from nscas.lineage import lineage
from nscas.store import Store, init_store

REPO = Path(__file__).resolve().parents[1]
NSCAS = REPO / ".venv" / "bin" / "nscas"
TENSORS, FLOATS = 64, 4 << 20  # 64 x 16 MiB = 1 GiB
CHANGED = 6  # of 64 tensors changed in the second checkpoint: 90.6 % unchanged
MiB = 1 << 20
Sample = tuple[float, float]  # wall-clock seconds, CPU seconds (user + system, all threads)
Row = tuple[str, list[Sample], str]  # label, samples, note


# ----------------------------------------------------------------------------- plumbing

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work: Path = args.workdir
        self.results: dict[str, Any] = {"runs": args.runs, "cold": args.cold}
        self.can_drop = _try_drop_caches()

    def drop(self) -> None:
        if self.args.cold and self.can_drop:
            _try_drop_caches()

    def timed(self, cmd: list[str], *, cwd: Path | None = None) -> Sample:
        """Wall-clock and CPU seconds of one command (which must succeed)."""
        self.drop()
        c0 = _cpu(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, "DVC_NO_ANALYTICS": "1"})
        dt = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.decode()[-2000:]}")
        return dt, _cpu(resource.RUSAGE_CHILDREN) - c0

    def timed_call(self, fn: Callable[[], object]) -> Sample:
        self.drop()
        c0 = _cpu(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, _cpu(resource.RUSAGE_SELF) - c0

    def fresh(self, name: str) -> Path:
        d = self.work / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d


def _try_drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def median(xs: list[Sample], i: int = 0) -> float:
    return statistics.median(x[i] for x in xs)


def table(title: str, rows: list[Row], base: str | None = None) -> list[dict[str, Any]]:
    """Print medians (and ratios to the row labelled ``base``); return them for --json."""
    ref = next((s for label, s, _ in rows if label == base and s), None)
    print(f"\n## {title}\n")
    print("| command | wall s (median) | wall runs | ratio | CPU s (median) | CPU ratio | note |")
    print("|---|---:|---|---:|---:|---:|---|")
    out = []
    for label, samples, note in rows:
        if not samples:
            print(f"| {label} | - | skipped | - | - | - | {note} |")
            continue
        wall, cpu = median(samples), median(samples, 1)
        ratio = f"{wall / median(ref):.2f}" if ref else "-"
        cpu_ratio = f"{cpu / median(ref, 1):.2f}" if ref and median(ref, 1) > 0 else "-"
        runs = " ".join(f"{w:.3f}" for w, _ in samples)
        print(f"| {label} | {wall:.4f} | {runs} | {ratio} | {cpu:.3f} | {cpu_ratio} | {note} |")
        out.append({"command": label, "median_s": wall, "median_cpu_s": cpu,
                    "runs": samples, "note": note,
                    "ratio": wall / median(ref) if ref else None})
    return out


def data_bytes(store_dir: Path) -> int:
    return sum(p.stat().st_size for p in (store_dir / "data").rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- inputs

def make_checkpoint(path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tensors = {f"layers.{i:02d}.weight": rng.standard_normal(FLOATS, dtype=np.float32)
               for i in range(TENSORS)}
    save_file(tensors, str(path))


def make_second(first: Path, second: Path, seed: int = 1) -> None:
    """``first`` with CHANGED tensors (spread over the file) replaced by new random values."""
    shutil.copyfile(first, second)
    with first.open("rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(hlen))
    rng = np.random.default_rng(seed)
    with second.open("r+b") as f:
        for i in range(0, TENSORS, TENSORS // CHANGED)[:CHANGED]:
            start, end = header[f"layers.{i:02d}.weight"]["data_offsets"]
            f.seek(8 + hlen + start)
            f.write(rng.standard_normal((end - start) // 4, dtype=np.float32).tobytes())


def sparse_safetensors(path: Path, *, tensors: int, tensor_bytes: int) -> None:
    """Zeros with a few distinct bytes per tensor (each tensor differs, all compress)."""
    header = {f"t{i:03d}": {"dtype": "F32", "shape": [tensor_bytes // 4],
                            "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes]}
              for i in range(tensors)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + tensors * tensor_bytes)
        for i in range(tensors):
            f.seek(8 + len(raw) + i * tensor_bytes + 100)
            f.write(blake3.blake3(b"%d" % i).digest())


# ----------------------------------------------------------------------------- sections

def bench_add_fsck_second(b: Bench, f1: Path, f2: Path) -> None:
    runs = b.args.runs
    t: dict[str, list[Sample]] = {k: [] for k in (
        "cli", "lib", "dvc", "dd", "b3sum", "sha256sum", "cli2", "lib2", "dvc2",
        "fsck_cli", "fsck_lib", "fsck_full_lib", "py_b3", "b3sum_chunks")}
    stored2: list[float] = []
    b3sum = shutil.which("b3sum")
    nscas = [str(NSCAS), "--store"]
    # Each contender's output is removed just before the next one's timed write, so that every
    # write of 1 GiB starts with about as much memory freed moments ago. On a VM that hands
    # freed memory back to the host (virtio-balloon free page reporting, as on the benchmark
    # machine) touching pages freed seconds earlier costs a host fault each: writing 1 GiB into
    # the page cache then took 2.5 s of system time instead of 0.4 s, so the order of the
    # columns alone moved a column by a second.
    leftovers: list[Path] = []

    def ballast(mib: int) -> None:
        """Memory to free before the next timed write, when no contender's output is at hand."""
        path = b.work / f"ballast-{len(leftovers)}"
        subprocess.run(["dd", f"if={f1}", f"of={path}", "bs=1M", f"count={mib}", "status=none"],
                       check=True)
        leftovers.append(path)

    def release() -> None:
        for p in leftovers:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        leftovers.clear()

    ballast(1024)
    for run in range(runs):
        print(f"run {run + 1}/{runs}", file=sys.stderr)
        # nscas through its CLI: a fresh store; fsck while it holds the first checkpoint only
        # (the same bytes b3sum reads); then the second checkpoint into the same store.
        s = b.fresh("cli-store")
        subprocess.run([str(NSCAS), "init", str(s)], check=True, stdout=subprocess.DEVNULL)
        release()
        t["cli"].append(b.timed([*nscas, str(s), "add", str(f1)]))
        t["fsck_cli"].append(b.timed([*nscas, str(s), "fsck", "--deep"]))
        ballast(256)  # the second add writes 6 new tensors (96 MiB)
        release()
        t["cli2"].append(b.timed([*nscas, str(s), "add", str(f2)]))
        leftovers.append(s)
        # nscas as a library, in this process (no interpreter start-up).
        with init_store(b.fresh("lib-store")) as store:
            release()
            t["lib"].append(b.timed_call(lambda st=store: st.put_file(f1)))
            t["fsck_lib"].append(b.timed_call(lambda st=store: _fsck_ok(st)))
            t["fsck_full_lib"].append(b.timed_call(lambda st=store: _fsck_ok(st, full=True)))
            if b3sum:  # the store's chunk files, as b3sum reads them
                chunks = sorted(str(p) for p in (store.root / "data").rglob("*") if p.is_file())
                t["b3sum_chunks"].append(b.timed([b3sum, "--no-names", *chunks]))
            before = data_bytes(store.root)
            ballast(256)
            release()
            t["lib2"].append(b.timed_call(lambda st=store: st.put_file(f2)))
            stored2.append((data_bytes(store.root) - before) / f2.stat().st_size)
        leftovers.append(b.work / "lib-store")
        # dvc add in a throwaway repository (copying the file in is not timed).
        if b.args.dvc:
            dvc = str(b.args.dvc)
            repo = b.fresh("dvc-repo")
            subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=repo, check=True)
            subprocess.run([dvc, "config", "core.analytics", "false"], cwd=repo, check=True)
            shutil.copyfile(f1, repo / "model.safetensors")
            release()
            t["dvc"].append(b.timed([dvc, "add", "-q", "model.safetensors"], cwd=repo))
            shutil.copyfile(f2, repo / "model.next")
            os.replace(repo / "model.next", repo / "model.safetensors")  # frees the first copy
            t["dvc2"].append(b.timed([dvc, "add", "-q", "model.safetensors"], cwd=repo))
            leftovers.append(repo)
        copy = b.work / "dd-copy"
        release()
        t["dd"].append(b.timed(["dd", f"if={f1}", f"of={copy}", "bs=16M", "conv=fsync",
                                "status=none"]))
        leftovers.append(copy)
        if b3sum:
            t["b3sum"].append(b.timed([b3sum, str(f1)]))
        t["sha256sum"].append(b.timed(["sha256sum", str(f1)]))
        t["py_b3"].append(b.timed_call(
            lambda: blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(f1)))
    release()

    r = b.results
    r["add"] = table("1. add a 1 GiB safetensors file (64 x 16 MiB F32)", [
        ("dvc add", t["dvc"], "fresh repo; MD5, copy into the cache; no fsync"),
        ("nscas add (CLI)", t["cli"], "fresh store; durable: fsync'ed chunks, SQLite FULL"),
        ("nscas put_file (library)", t["lib"], "in-process: no interpreter start-up"),
        ("dd bs=16M conv=fsync", t["dd"], "durable-copy floor"),
        ("b3sum", t["b3sum"], "hash only" if b3sum else "b3sum not installed"),
        ("sha256sum (coreutils)", t["sha256sum"], "hash only"),
    ], base="dvc add" if b.args.dvc else "dd bs=16M conv=fsync")
    base = "b3sum FILE" if b3sum else "python blake3 AUTO update_mmap FILE"
    r["fsck"] = table("2. fsck --deep vs b3sum over the same bytes (store: first checkpoint)", [
        ("b3sum FILE", t["b3sum"], "the 1 GiB file"),
        ("b3sum CHUNK-FILES", t["b3sum_chunks"], "the store's 64 chunk files"),
        ("python blake3 AUTO update_mmap FILE", t["py_b3"], "in-process"),
        ("nscas fsck --deep (CLI)", t["fsck_cli"], "every stored leaf once; start-up included"),
        ("fsck(deep=True) (library)", t["fsck_lib"], "every stored leaf once, 2 threads"),
        ("fsck(full=True) (library)", t["fsck_full_lib"], "whole objects: BLAKE3 + SHA-256"),
    ], base=base)
    frac = statistics.median(stored2)
    r["second"] = table("3. second checkpoint, 90 % of tensors unchanged", [
        ("nscas put_file first (library)", t["lib"], ""),
        ("nscas put_file second (library)", t["lib2"], f"new bytes stored: {frac:.1%}"),
        ("nscas add first (CLI)", t["cli"], ""),
        ("nscas add second (CLI)", t["cli2"], ""),
        ("dvc add first", t["dvc"], ""),
        ("dvc add second", t["dvc2"], "hashes and copies the whole file again"),
    ], base="nscas put_file first (library)")
    r["second_stored_fraction"] = stored2
    print(f"\nsecond checkpoint: new chunk bytes / file size = {frac:.2%}; second/first: "
          f"library {median(t['lib2']) / median(t['lib']):.2f} wall, "
          f"{median(t['lib2'], 1) / median(t['lib'], 1):.2f} CPU; "
          f"CLI {median(t['cli2']) / median(t['cli']):.2f} wall, "
          f"{median(t['cli2'], 1) / median(t['cli'], 1):.2f} CPU")


def _fsck_ok(store: Store, *, full: bool = False) -> None:
    report = fsck(store, deep=True, full=full)
    if not report.ok or report.deep_bytes < TENSORS * FLOATS * 4:
        raise SystemExit(f"fsck found errors: {report.errors[:3]}")


def build_records(store: Store, total: int, state: dict[str, Any]) -> None:
    """Grow ``store`` to ``total`` records: groups of 10 training runs of 4 records each.

    Each run: action/1 (inputs.base = the previous checkpoint), checkpoint/1 (parent chain of
    10 per group), journal/1, receipt/1, plus one small blob. All share one code tree, one
    params record and one environment, so those have ever more parents.
    """
    if not state:
        blob = store.put_bytes(b"shared weights")
        tree = store.put_record({"nscas": "tree/1", "entries": {
            "model.safetensors": {"id": str(blob), "size": 14,
                                  "sha256": hashlib.sha256(b"shared weights").hexdigest()}}})
        params = store.put_record({"nscas": "params/1", "tensors": {
            "w": {"dtype": "U8", "shape": [14], "data": str(blob)}}})
        env = store.put_record({"nscas": "environment/1", "python": "3.11", "platform": "linux",
                                "packages": {}, "torch": None, "devices": [], "determinism": {}})
        state.update(tree=str(tree), params=str(params), env=str(env), run=0, records=3,
                     first_ckpt=None)
    batch: list[dict[str, Any]] = []
    prev: str | None = None
    while state["records"] < total:
        i = state["run"]
        step = i % 10
        if step == 0:
            prev = None
        blob = store.put_bytes(b"journal of run %d\n" % i)  # tiny: inline
        action = {"nscas": "action/1", "recipe": "train@1", "code": state["tree"],
                  "inputs": {"base": prev} if prev else {}, "params": {"run": i, "lr": 0.001}}
        ckpt = {"nscas": "checkpoint/1", "files": state["tree"], "params": state["params"],
                "step": step, "parent": prev, "run": i}
        journal = {"nscas": "journal/1", "rank": 0, "world": 1, "entries": str(blob),
                   "head": hashlib.sha256(b"%d" % i).hexdigest()}
        ids = [_id(action), _id(ckpt), _id(journal)]
        receipt = {"nscas": "receipt/1", "action": ids[0], "environment": state["env"],
                   "outputs": {"checkpoint": ids[1]}, "journals": [ids[2]],
                   "claims": {"loss": {"value": 1.0 / (i + 1), "verifier": "train-loss"}},
                   "started": "2025-01-01T00:00:00Z", "finished": "2025-01-01T00:01:00Z",
                   "status": "succeeded"}
        batch += [action, ckpt, journal, receipt]
        if step == 0 and state.get("probe_for") != total and state["records"] >= total // 2:
            state["probe_ckpt"], state["probe_for"] = ids[1], total  # a group's first, mid-store
        state["last_receipt"] = _id(receipt)
        prev = ids[1]
        state["run"] += 1
        state["records"] += 4
        if len(batch) >= 20_000:
            store.put_records(batch)
            batch = []
    if batch:
        store.put_records(batch)


def _id(value: dict[str, Any]) -> str:
    return "blake3:" + blake3.blake3(rfc8785.dumps(value)).hexdigest()


def bench_records(b: Bench) -> None:
    state: dict[str, Any] = {}
    d = b.fresh("records-store")
    store = init_store(d)
    out: dict[str, Any] = {}
    cli_floor: list[float] = []
    empty = b.fresh("empty-store")
    subprocess.run([str(NSCAS), "init", str(empty)], check=True, stdout=subprocess.DEVNULL)
    for _ in range(b.args.runs):
        cli_floor.append(b.timed([str(NSCAS), "--store", str(empty), "log", "--limit", "20"]))
    for total in b.args.records:
        t0 = time.perf_counter()
        build_records(store, total, state)
        built = time.perf_counter() - t0
        n = store.counts()["records"]
        print(f"store of {n} records built in {built:.0f} s", file=sys.stderr)
        receipt, env, probe = state["last_receipt"], state["env"], state["probe_ckpt"]
        queries: list[tuple[str, Callable[[], object], list[str]]] = [
            ("log --limit 20", lambda: store.log(limit=20), ["log", "--limit", "20"]),
            ("lineage RECEIPT (up, unbounded)",
             lambda r=receipt: lineage(store, Digest.parse(r)), ["lineage", receipt]),
            ("lineage ENV --down (200 shown)",
             lambda e=env: lineage(store, Digest.parse(e), direction="down"),
             ["lineage", env, "--down"]),
            ("lineage CKPT --down (its chain)",
             lambda p=probe: lineage(store, Digest.parse(p), direction="down"),
             ["lineage", probe, "--down"]),
        ]
        rows: list[Row] = []
        for label, fn, argv in queries:
            fn()  # warm the page cache once; then the measured runs
            rows.append((f"{label} (library)", [b.timed_call(fn) for _ in range(max(5, b.args.runs))], ""))
            rows.append((f"{label} (CLI)", [b.timed([str(NSCAS), "--store", str(d), *argv])
                                            for _ in range(b.args.runs)], ""))
        rows.append(("nscas log --limit 20 on an EMPTY store (CLI floor)", cli_floor, "start-up"))
        out[str(n)] = table(f"4. queries on a store of {n:,} records "
                            f"({(d / '.nscas' / 'nscas.db').stat().st_size / MiB:.0f} MiB database)",
                            rows)
        out[f"{n}_build_s"] = built
    store.close()
    sizes = [k for k in out if not k.endswith("_s")]
    if len(sizes) == 2:
        small, big = sizes
        print(f"\n## 4b. ratio {int(big):,} / {int(small):,} records (wall-clock medians)\n")
        print("| query | ratio |\n|---|---:|")
        for a, c in zip(out[small], out[big], strict=True):
            print(f"| {a['command']} | {c['median_s'] / a['median_s']:.2f} |")
        out["ratios"] = {a["command"]: c["median_s"] / a["median_s"]
                         for a, c in zip(out[small], out[big], strict=True)}
    b.results["records"] = out


def bench_memory(b: Bench) -> None:
    path = b.work / "sparse-4gib.safetensors"
    sparse_safetensors(path, tensors=64, tensor_bytes=64 * MiB)
    s = b.fresh("memory-store")
    init_store(s).close()
    code = ("import json, resource, sys; from pathlib import Path; from nscas.opening import open_store\n"
            "s = open_store(Path(sys.argv[1])); oid = s.put_file(Path(sys.argv[2]))\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
            "print(json.dumps({'id': str(oid), 'vmhwm': int(hwm) * 1024,"
            " 'ru_maxrss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, str(s), str(path)], capture_output=True,
                         text=True, check=True)
    dt = time.perf_counter() - t0
    res = json.loads(out.stdout)
    print(f"\n## 5. bounded memory\n\nput_file of a {path.stat().st_size / (1 << 30):.2f} GiB sparse "
          f"safetensors file (64 tensors of 64 MiB, each split in two 32 MiB parts, compressed): "
          f"{dt:.1f} s, peak RSS (VmHWM) {res['vmhwm'] / MiB:.0f} MiB, "
          f"ru_maxrss {res['ru_maxrss'] / MiB:.0f} MiB")
    b.results["memory"] = {"seconds": dt, **res, "file_bytes": path.stat().st_size}
    shutil.rmtree(s)
    path.unlink()


def bench_parts(b: Bench, f1: Path) -> None:
    """The pieces a put is made of, each alone over the same 1 GiB (page cache warm)."""
    size = f1.stat().st_size
    buf = bytearray(16 * MiB)

    def read_all() -> None:
        with f1.open("rb") as f:
            while f.readinto(buf):
                pass

    def hash_all(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            h = make()
            view = memoryview(buf)
            with f1.open("rb") as f:
                while n := f.readinto(buf):
                    h.update(view[:n])
        return run

    def zstd_samples() -> None:
        c = zstandard.ZstdCompressor(level=3)
        with f1.open("rb") as f:
            for _ in range(TENSORS):
                c.compress(f.read(64 << 10))
                f.seek(16 * MiB - (64 << 10), 1)

    rows: list[Row] = []
    for label, fn in [
        ("read 1 GiB (16 MiB readinto)", read_all),
        ("read + blake3 (1 thread)", hash_all(blake3.blake3)),
        ("read + blake3 (AUTO threads)", hash_all(lambda: blake3.blake3(max_threads=blake3.blake3.AUTO))),
        ("read + sha256", hash_all(hashlib.sha256)),
        ("zstd level 3 on 64 samples of 64 KiB", zstd_samples),
    ]:
        rows.append((label, [b.timed_call(fn) for _ in range(b.args.runs)], ""))
    b.results["parts"] = table(f"6. parts of a put over {size / (1 << 30):.2f} GiB", rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dvc", type=Path, help="path to a dvc executable (its column is skipped if absent)")
    p.add_argument("--runs", type=int, default=3, help="runs per measurement (median reported; >= 3)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/nscas-bench"), help="scratch directory")
    p.add_argument("--records", type=lambda s: [int(x) for x in s.split(",")],
                   default=[100_000, 1_000_000], help="record-store sizes, comma-separated")
    p.add_argument("--cold", action="store_true", help="drop the page cache before every timed command")
    p.add_argument("--only", default="add,records,memory,parts", help="sections, comma-separated")
    p.add_argument("--json", type=Path, help="also write all results here")
    args = p.parse_args()
    if args.runs < 3:
        p.error("--runs must be at least 3")
    if args.dvc and not args.dvc.is_file():
        print(f"no dvc at {args.dvc}: its column is skipped", file=sys.stderr)
        args.dvc = None
    args.workdir.mkdir(parents=True, exist_ok=True)
    b = Bench(args)
    only = set(args.only.split(","))
    print(f"# nscas store benchmark: {os.cpu_count()} CPUs, runs={args.runs}, "
          f"page cache {'dropped before each command' if args.cold else 'warm'} "
          f"(drop_caches {'allowed' if b.can_drop else 'NOT allowed'}); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "memory" in only:  # first, while this process is small: a child's ru_maxrss inherits it
        bench_memory(b)
    f1, f2 = args.workdir / "ckpt1.safetensors", args.workdir / "ckpt2.safetensors"
    if only & {"add", "parts"} and not f1.exists():
        make_checkpoint(f1)
    if "add" in only:
        if not f2.exists():
            make_second(f1, f2)
        bench_add_fsck_second(b, f1, f2)
    if "parts" in only:
        bench_parts(b, f1)
    if "records" in only:
        bench_records(b)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(b.results, indent=1))


if __name__ == "__main__":
    main()
