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
  team     a team store (PostgreSQL + S3; the test harness's servers, tests/store/services.py,
           moto on 127.0.0.1): nscas add vs dvc add + dvc push to the same endpoint; bytes a
           push of the second checkpoint sends, counted on the wire by a relay; log and
           lineage on 100,000 and 1,000,000 records (``team-add``, ``team-push``,
           ``team-records`` pick one part)
  codecs   chunk codecs on a real fine-tune (benchmarks/store_codecs.py): a seed checkpoint
           (--seed-dir, an HF directory of FP32 safetensors) and a child trained from it for
           --child-steps CPU updates: stored/raw of each vs the reference methods, in F32 and
           BF16; push bytes of the child to a store holding the seed; get speed vs raw
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import rfc8785
import zstandard
from safetensors.numpy import save_file

from nscas.objects import canonical, kinds
from nscas.objects.digests import Digest
from nscas.store.config import S3Settings, StoreConfig
from nscas.store.lineage import lineage
from nscas.store.opening import open_store
from nscas.store.reading import StoreReader
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import fsck

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

    def timed(self, cmd: list[str], *, cwd: Path | None = None,
              stdout: list[bytes] | None = None) -> Sample:
        """Wall-clock and CPU seconds of one command (which must succeed); its output is
        appended to ``stdout`` if given."""
        self.drop()
        c0 = _cpu(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=cwd, stderr=subprocess.PIPE,
                             stdout=subprocess.DEVNULL if stdout is None else subprocess.PIPE,
                             env={**os.environ, "DVC_NO_ANALYTICS": "1"})
        dt = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.decode()[-2000:]}")
        if stdout is not None:
            stdout.append(out.stdout)
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
    """Grow ``store`` to ``total`` records through ``put_records``, in batches of 20,000."""
    batch: list[dict[str, Any]] = []
    for blob, records in record_runs(state, total, rfc8785.dumps):
        store.put_bytes(blob)
        batch += [value for value, _ in records]
        if len(batch) >= 20_000:
            store.put_records(batch)
            batch = []
    if batch:
        store.put_records(batch)


def record_runs(state: dict[str, Any], total: int, encode: Callable[[Any], bytes]
                ) -> Iterator[tuple[bytes, list[tuple[dict[str, Any], bytes]]]]:
    """The records that grow a store to ``total``: groups of 10 training runs of 4 records each,
    each run as (its small blob, [(record, its canonical bytes by ``encode``)]).

    Each run: action/1 (inputs.base = the previous checkpoint), checkpoint/1 (parent chain of
    10 per group), journal/1, receipt/1, plus one small blob. All share one code tree, one
    params record and one environment, so those have ever more parents.
    """
    if not state:
        blob = b"shared weights"
        tree = {"nscas": "tree/1", "entries": {
            "model.safetensors": {"id": _blob_id(blob), "size": 14,
                                  "sha256": hashlib.sha256(blob).hexdigest()}}}
        params = {"nscas": "params/1", "tensors": {
            "w": {"dtype": "U8", "shape": [14], "data": _blob_id(blob)}}}
        env = {"nscas": "environment/1", "python": "3.11", "platform": "linux",
               "packages": {}, "torch": None, "devices": [], "determinism": {}}
        shared = [(r, encode(r)) for r in (tree, params, env)]
        state.update(tree=_hex_id(shared[0][1]), params=_hex_id(shared[1][1]),
                     env=_hex_id(shared[2][1]), run=0, records=3, prev=None)
        yield blob, shared
    while state["records"] < total:
        i = state["run"]
        step = i % 10
        prev = None if step == 0 else state["prev"]
        blob = b"journal of run %d\n" % i  # tiny: inline
        action = {"nscas": "action/1", "recipe": "train@1", "code": state["tree"],
                  "inputs": {"base": prev} if prev else {}, "params": {"run": i, "lr": 0.001}}
        ckpt = {"nscas": "checkpoint/1", "files": state["tree"], "params": state["params"],
                "step": step, "parent": prev, "run": i}
        journal = {"nscas": "journal/1", "rank": 0, "world": 1, "entries": _blob_id(blob),
                   "head": hashlib.sha256(b"%d" % i).hexdigest()}
        done = [(value, encode(value)) for value in (action, ckpt, journal)]
        ids = [_hex_id(data) for _, data in done]
        receipt = {"nscas": "receipt/1", "action": ids[0], "environment": state["env"],
                   "outputs": {"checkpoint": ids[1]}, "journals": [ids[2]],
                   "claims": {"loss": {"value": 1.0 / (i + 1), "verifier": "train-loss"}},
                   "started": "2025-01-01T00:00:00Z", "finished": "2025-01-01T00:01:00Z",
                   "status": "succeeded"}
        done.append((receipt, encode(receipt)))
        if step == 0 and state.get("probe_for") != total and state["records"] >= total // 2:
            state["probe_ckpt"], state["probe_for"] = ids[1], total  # a group's first, mid-store
        state["last_receipt"] = _hex_id(done[3][1])
        state["prev"] = ids[1]
        state["run"] += 1
        state["records"] += 4
        yield blob, done


def _hex_id(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def _blob_id(data: bytes) -> str:
    """The ID ``put_bytes`` gives these bytes (a small blob: BLAKE3 of the bytes)."""
    return _hex_id(data)


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
        rows = query_rows(b, store, state, d)
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


def query_rows(b: Bench, store: StoreReader, state: dict[str, Any], where: Path) -> list[Row]:
    """log and lineage on a store ``build_records`` (or ``build_pg_records``) grew: in-process
    (median of at least 5 after one warm-up call) and through the CLI (a fresh process each)."""
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
        rows.append((f"{label} (CLI)", [b.timed([str(NSCAS), "--store", str(where), *argv])
                                        for _ in range(b.args.runs)], ""))
    return rows


def bench_memory(b: Bench) -> None:
    path = b.work / "sparse-4gib.safetensors"
    sparse_safetensors(path, tensors=64, tensor_bytes=64 * MiB)
    s = b.fresh("memory-store")
    init_store(s).close()
    code = ("import json, resource, sys; from pathlib import Path; from nscas.store.opening import open_store\n"
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


# ----------------------------------------------------------------------------- team store

class Relay:
    """A TCP relay on 127.0.0.1 in front of a server, counting the bytes clients send through
    it: what goes over the wire to the server (requests, headers and bodies alike), measured
    outside nscas, whatever nscas itself reports."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.sent = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.sent = self.connections = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            with self._lock:
                self.connections += 1
            left = [2]  # directions still open; the last one to end closes both sockets
            for src, dst, count in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, count, left),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool, left: list[int]) -> None:
        buf = bytearray(1 << 20)
        try:
            while n := src.recv_into(buf):
                if count:
                    with self._lock:
                        self.sent += n
                dst.sendall(memoryview(buf)[:n])
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            src.close()
            dst.close()

    def close(self) -> None:
        self._server.close()


def _s3(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def bucket_bytes(endpoint: str, bucket: str) -> int:
    """Bytes the service holds in ``bucket`` (its own listing)."""
    pages = _s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sum(item["Size"] for page in pages for item in page.get("Contents", []))


def empty_bucket(endpoint: str, bucket: str) -> None:
    """Delete what a run left in ``bucket`` (moto keeps it in memory and /tmp)."""
    c = _s3(endpoint)
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            c.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def _bucket_of(config: StoreConfig) -> str:
    return config.objects.removeprefix("s3://").split("/", 1)[0]


def _dvc_repo(b: Bench, name: str, endpoint: str, bucket: str) -> Path:
    """A fresh dvc repository whose default remote is ``s3://bucket/dvc`` at ``endpoint``
    (credentials from the AWS environment variables, as nscas gets them)."""
    dvc = str(b.args.dvc)
    repo = b.fresh(name)
    for cmd in (["init", "--no-scm", "-q"], ["config", "core.analytics", "false"],
                ["remote", "add", "-d", "team", f"s3://{bucket}/dvc"],
                ["remote", "modify", "team", "endpointurl", endpoint]):
        subprocess.run([dvc, *cmd], cwd=repo, check=True, stdout=subprocess.DEVNULL)
    return repo


def bench_team(b: Bench, f1: Path, f2: Path, parts: set[str]) -> None:
    """The team store's three targets, against the servers the test suite starts: Debian's
    PostgreSQL (here with fsync on) and moto's S3 server, both on 127.0.0.1."""
    sys.path.insert(0, str(REPO))
    from tests.store.services import S3_KEYS, TeamServices, start_moto, start_postgres

    os.environ.update(S3_KEYS)
    pg = start_postgres(fsync=True)
    if isinstance(pg, str):
        raise SystemExit(f"team section: {pg}")
    moto = start_moto()
    if isinstance(moto, str):
        pg.close()
        raise SystemExit(f"team section: {moto}")
    services = TeamServices(postgres=pg, moto=moto)
    b.results["team"] = {}
    try:
        if "add" in parts:
            bench_team_add(b, services, f1)
        if "push" in parts:
            bench_team_push(b, services, f1, f2)
        if "records" in parts:
            bench_team_records(b, services)
    finally:
        moto.process.kill()
        moto.process.wait()
        pg.close()


def bench_team_add(b: Bench, services: Any, f1: Path) -> None:
    """nscas add into PostgreSQL + S3 against dvc add + dvc push to the same S3 endpoint; the
    two sides' order alternates from run to run."""
    t: dict[str, list[Sample]] = {k: [] for k in ("nscas", "dvc_add", "dvc_push", "dvc")}
    endpoint = services.moto.endpoint
    for run in range(b.args.runs):
        print(f"team add: run {run + 1}/{b.args.runs}", file=sys.stderr)
        sides = ["nscas", "dvc"] if run % 2 == 0 else ["dvc", "nscas"]
        for side in sides:
            if side == "nscas":
                config = services.config()
                s = b.fresh("team-add-store")
                init_store(s, config).close()
                t["nscas"].append(b.timed([str(NSCAS), "--store", str(s / ".nscas" / "store.toml"),
                                           "add", str(f1)]))
                empty_bucket(endpoint, _bucket_of(config))
            elif b.args.dvc:
                bucket = services.moto.new_bucket()
                repo = _dvc_repo(b, "team-dvc-repo", endpoint, bucket)
                shutil.copyfile(f1, repo / "model.safetensors")
                add = b.timed([str(b.args.dvc), "add", "-q", "model.safetensors"], cwd=repo)
                push = b.timed([str(b.args.dvc), "push", "-q"], cwd=repo)
                t["dvc_add"].append(add)
                t["dvc_push"].append(push)
                t["dvc"].append((add[0] + push[0], add[1] + push[1]))
                shutil.rmtree(repo)
                empty_bucket(endpoint, bucket)
    b.results["team"]["add"] = table(
        "7. add a 1 GiB safetensors file to a team store (PostgreSQL + S3 on moto, loopback)", [
            ("dvc add + dvc push", t["dvc"], "one sum per run; s3 remote at the same endpoint"),
            ("  dvc add", t["dvc_add"], "MD5, copy into the cache"),
            ("  dvc push", t["dvc_push"], "the 1 GiB file to S3 (multipart)"),
            ("nscas add (CLI)", t["nscas"], "64 chunks to S3 (temporary key, copy, delete), "
                                            "one PostgreSQL transaction"),
        ], base="dvc add + dvc push" if b.args.dvc else None)


def bench_team_push(b: Bench, services: Any, f1: Path, f2: Path) -> None:
    """Push the first checkpoint, then the second (90 % of its tensors unchanged), from a local
    store to a fresh team store each run; the team store reaches PostgreSQL and S3 through
    relays that count the bytes sent."""
    local = b.fresh("push-local")
    with init_store(local) as store:
        store.ref_set("bench/one", store.put_file(f1))
        store.ref_set("bench/two", store.put_file(f2))
    pg_relay, s3_relay = Relay(services.postgres.port), Relay(int(services.moto.endpoint.rsplit(":", 1)[1]))
    endpoint = services.moto.endpoint
    size = f2.stat().st_size
    times: dict[str, list[Sample]] = {"one": [], "two": []}
    sent: dict[str, list[dict[str, int]]] = {"one": [], "two": []}
    try:
        for run in range(b.args.runs):
            print(f"team push: run {run + 1}/{b.args.runs}", file=sys.stderr)
            direct = services.config()
            config = StoreConfig(
                database=direct.database.replace(f":{services.postgres.port}/", f":{pg_relay.port}/"),
                objects=direct.objects, s3=S3Settings(endpoint_url=f"http://127.0.0.1:{s3_relay.port}"))
            remote = b.fresh("push-remote")
            init_store(remote, config).close()
            name = f"team{run}"
            subprocess.run([str(NSCAS), "--store", str(local), "remote", "add", name,
                            str(remote / ".nscas" / "store.toml")], check=True,
                           stdout=subprocess.DEVNULL)
            bucket = _bucket_of(config)
            for which in ("one", "two"):
                held = bucket_bytes(endpoint, bucket)
                pg_relay.reset()
                s3_relay.reset()
                out: list[bytes] = []
                times[which].append(b.timed([str(NSCAS), "--store", str(local), "push",
                                             f"bench/{which}", "--to", name, "--json"], stdout=out))
                sent[which].append({"s3_wire": s3_relay.sent, "pg_wire": pg_relay.sent,
                                    "s3_connections": s3_relay.connections,
                                    "claimed": json.loads(out[0])["bytes_sent"],
                                    "stored": bucket_bytes(endpoint, bucket) - held})
            empty_bucket(endpoint, bucket)
        dvc_sent = _dvc_second_push(b, services, s3_relay, f1, f2) if b.args.dvc else None
    finally:
        pg_relay.close()
        s3_relay.close()
    shutil.rmtree(local)

    def med(which: str, key: str) -> float:
        return statistics.median(x[key] for x in sent[which])

    r = b.results["team"]
    r["push"] = table("8. push to a team store (bytes counted on the wire by relays)", [
        ("nscas push first checkpoint", times["one"], f"S3 {med('one', 's3_wire') / MiB:.1f} MiB "
         f"+ PostgreSQL {med('one', 'pg_wire') / MiB:.2f} MiB sent"),
        ("nscas push second checkpoint", times["two"], f"S3 {med('two', 's3_wire') / MiB:.1f} MiB "
         f"+ PostgreSQL {med('two', 'pg_wire') / MiB:.2f} MiB sent"),
    ], base="nscas push first checkpoint")
    r["push_bytes"] = sent
    frac = (med("two", "s3_wire") + med("two", "pg_wire")) / size
    print(f"\nsecond push: {frac:.2%} of the file's {size:,} bytes went over the wire "
          f"(S3 {med('two', 's3_wire') / size:.2%}, PostgreSQL {med('two', 'pg_wire') / size:.3%}; "
          f"{med('two', 's3_connections'):.0f} S3 connections); nscas claims "
          f"{med('two', 'claimed') / size:.2%}; the bucket grew by {med('two', 'stored') / size:.2%}. "
          f"First push: {(med('one', 's3_wire') + med('one', 'pg_wire')) / size:.2%} on the wire.")
    r["push_second_fraction"] = frac
    if dvc_sent is not None:
        print(f"dvc push of the same second checkpoint (one run): {dvc_sent / size:.2%} of it on "
              "the wire")
        r["dvc_second_push_fraction"] = dvc_sent / size


def _dvc_second_push(b: Bench, services: Any, relay: Relay, f1: Path, f2: Path) -> int:
    """What dvc push sends for the second checkpoint after the first (bytes on the wire)."""
    bucket = services.moto.new_bucket()
    repo = _dvc_repo(b, "push-dvc-repo", f"http://127.0.0.1:{relay.port}", bucket)
    dvc = str(b.args.dvc)
    shutil.copyfile(f1, repo / "model.safetensors")
    for _ in range(2):
        subprocess.run([dvc, "add", "-q", "model.safetensors"], cwd=repo, check=True)
        relay.reset()
        subprocess.run([dvc, "push", "-q"], cwd=repo, check=True)
        shutil.copyfile(f2, repo / "model.next")
        os.replace(repo / "model.next", repo / "model.safetensors")
    shutil.rmtree(repo)
    empty_bucket(services.moto.endpoint, bucket)
    return relay.sent


def build_pg_records(database: str, total: int, state: dict[str, Any]) -> float:
    """Grow a team store's database to ``total`` records: those ``build_records`` puts, loaded
    by COPY in one transaction (``put_records`` on PostgreSQL is about 1 ms a record).

    The rows are the store's own: each record checked by ``kinds.validate``, its bytes the RFC
    8785 canonical encoding (``json.dumps`` where that is the same bytes, no floats; checked
    against ``canonical.encode`` every 97th record), links from ``canonical.iter_links``, every
    row after the rows it links to (the closure holds; the foreign keys check it). Returns the
    seconds the COPY took.
    """
    import psycopg

    now = time.time()
    objects: list[tuple[Any, ...]] = []
    links: list[tuple[str, str, str]] = []
    for blob, records in record_runs(state, total, _fast_canonical):
        objects.append((blake3.blake3(blob).hexdigest(), len(blob), hashlib.sha256(blob).hexdigest(),
                        None, "inline", "raw", len(blob), blob, now))
        for value, data in records:
            if len(objects) % 97 == 0 and data != canonical.encode(value):
                raise SystemExit(f"fast encoding differs from canonical.encode for {value}")
            kind = kinds.validate(value)
            hex_id = blake3.blake3(data).hexdigest()
            objects.append((hex_id, len(data), hashlib.sha256(data).hexdigest(), kind, "inline",
                            "raw", len(data), data, now))
            links.extend((hex_id, path, d.hex) for path, d in canonical.iter_links(value))
    t0 = time.perf_counter()
    with psycopg.connect(database) as c, c.cursor() as cur:  # one transaction
        with cur.copy("COPY objects (id, size, sha256, kind, storage, codec, stored_size, data, "
                      "created) FROM STDIN") as copy:
            for row in objects:
                copy.write_row(row)
        with cur.copy("COPY links (parent, path, child) FROM STDIN") as copy:
            for link in links:
                copy.write_row(link)
    with psycopg.connect(database, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")  # what autovacuum does for a store in use: index-only scans
    return time.perf_counter() - t0


def _fast_canonical(value: Any) -> bytes:
    """RFC 8785 bytes: ``json.dumps`` gives the same for ASCII keys and no floats."""
    if _has_float(value):
        return rfc8785.dumps(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def bench_team_records(b: Bench, services: Any) -> None:
    config = services.config()
    d = b.fresh("team-records")
    init_store(d, config).close()
    where = d / ".nscas" / "store.toml"
    empty = b.fresh("team-empty")
    init_store(empty, services.config()).close()
    sqlite_empty = b.fresh("empty-store")
    init_store(sqlite_empty).close()
    floor_pg: list[Sample] = []
    floor_sqlite: list[Sample] = []
    for _ in range(b.args.runs):
        floor_pg.append(b.timed([str(NSCAS), "--store", str(empty / ".nscas" / "store.toml"),
                                 "log", "--limit", "20"]))
        floor_sqlite.append(b.timed([str(NSCAS), "--store", str(sqlite_empty), "log", "--limit",
                                     "20"]))
    state: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for total in b.args.records:
        t0 = time.perf_counter()
        copy_s = build_pg_records(config.database, total, state)
        built = time.perf_counter() - t0
        with open_store(where, readonly=True) as store:
            n = store.counts()["records"]
            for probe in (state["last_receipt"], state["env"], state["probe_ckpt"]):
                canonical.decode(store.get_bytes(Digest.parse(probe)))  # re-hashed as read
            print(f"team store of {n} records built in {built:.0f} s ({copy_s:.0f} s of COPY)",
                  file=sys.stderr)
            rows = query_rows(b, store, state, where)
        rows.append(("nscas log --limit 20 on an EMPTY team store (CLI floor)", floor_pg,
                     "start-up, psycopg, one connection"))
        rows.append(("nscas log --limit 20 on an EMPTY SQLite store (CLI floor)", floor_sqlite,
                     "start-up"))
        out[str(n)] = table(f"9. queries on a team store of {n:,} records (PostgreSQL)", rows)
        out[f"{n}_build_s"] = built
    b.results["team"]["records"] = out


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
    p.add_argument("--seed-dir", type=Path, help="codecs: the seed checkpoint's HF directory")
    p.add_argument("--child-steps", type=int, default=4, help="codecs: CPU updates of the child")
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
    team = {part for part in ("add", "push", "records")
            if "team" in only or f"team-{part}" in only}
    if team:
        if team & {"add", "push"} and not f1.exists():
            make_checkpoint(f1)
        if team & {"add", "push"} and not f2.exists():
            make_second(f1, f2)
        bench_team(b, f1, f2, team)
    if "codecs" in only:
        if args.seed_dir is None:
            p.error("--only codecs needs --seed-dir (scripts/get-smollm2, then nscas get)")
        from store_codecs import bench_codecs  # this directory is on sys.path: a script

        b.results["codecs"] = bench_codecs(args.workdir / "codecs", args.seed_dir,
                                           steps=args.child_steps, runs=args.runs)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(b.results, indent=1))


if __name__ == "__main__":
    main()
