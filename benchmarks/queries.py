"""Query-layer benchmark: start-up + query time of ``nscas log`` and ``nscas lineage`` on stores
of 10^6 records, on SQLite and on PostgreSQL, and what each choice of query layer costs.

  cli     each command a fresh ``nscas`` process (start-up + query, as a user runs it), on an
          SQLite store and a team store (PostgreSQL of the test harness, tests/store/services.py;
          object data in a local directory: these commands read metadata only)
  layer   the query layer alone, in a fresh interpreter: import + connect + ``log --limit 20``'s
          statement, then the per-statement time of 200 more, through (b) the plain DB-API driver
          (sqlite3, psycopg 3) and (a) SQLAlchemy 2 Core over the same driver, its tables those
          of nscas.database.schema

The stores are built by bulk inserts of the rows ``put_records`` would write (the records of
benchmarks/store.py's ``record_runs``: 10-run training chains sharing one environment):
SQLite through the store's own write statements (nscas.database.writes), PostgreSQL by COPY.
Prints medians (wall-clock seconds) as Markdown tables.

    .venv/bin/python benchmarks/queries.py [--records 1000000] [--runs 7]
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
from pathlib import Path
from typing import Any

import blake3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.store import _fast_canonical, record_runs  # noqa: E402
from nscas.database import writes  # noqa: E402
from nscas.objects import canonical, kinds  # noqa: E402
from nscas.store.config import StoreConfig  # noqa: E402
from nscas.store.writer import init_store  # noqa: E402

NSCAS = REPO / ".venv" / "bin" / "nscas"
_BATCH = 50_000

# One fresh interpreter per sample: import the layer, connect, run log's statement, then 200 more.
_LAYER = r"""
import sys, time, json
t0, c0 = time.perf_counter(), time.process_time()
layer, engine, where = sys.argv[1:4]
LOG = ("SELECT id, size, sha256, kind, storage, codec, stored_size, created FROM objects "
       "WHERE kind IS NOT NULL ORDER BY seq DESC LIMIT 20")
if layer == "driver":
    if engine == "sqlite":
        import sqlite3
        c = sqlite3.connect(f"file:{where}?mode=ro", uri=True, isolation_level=None)
        run = lambda: c.execute(LOG).fetchall()
    else:
        import psycopg
        c = psycopg.connect(where, autocommit=True)
        run = lambda: c.execute(LOG, prepare=False).fetchall()
else:
    from sqlalchemy import create_engine, select
    from nscas.database.schema import objects as o
    url = (f"sqlite:///file:{where}?mode=ro&uri=true" if engine == "sqlite"
           else "postgresql+psycopg://" + where.split("://", 1)[1])
    conn = create_engine(url).connect()
    stmt = (select(o.c.id, o.c.size, o.c.sha256, o.c.kind, o.c.storage, o.c.codec,
                   o.c.stored_size, o.c.created)
            .where(o.c.kind.is_not(None)).order_by(o.c.seq.desc()).limit(20))
    run = lambda: conn.execute(stmt).fetchall()
rows = run()
first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
t1 = time.perf_counter()
for _ in range(200):
    run()
print(json.dumps({"first": first, "first_cpu": first_cpu, "each": (time.perf_counter() - t1) / 200,
                  "rows": len(rows)}))
"""


def store_rows(total: int, state: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[tuple[str, str, str]]]:
    """The object rows (nscas.database.writes.OBJECT_COLUMNS) and link rows that
    ``put_records`` would write for ``total`` records, every row after those it links to."""
    now = time.time()
    objects: list[tuple[Any, ...]] = []
    links: list[tuple[str, str, str]] = []
    for blob, records in record_runs(state, total, _fast_canonical):
        objects.append((blake3.blake3(blob).hexdigest(), len(blob), hashlib.sha256(blob).hexdigest(),
                        None, "inline", "raw", len(blob), blob, now, None))
        for value, data in records:
            if len(objects) % 97 == 0 and data != canonical.encode(value):
                raise SystemExit(f"fast encoding differs from canonical.encode for {value}")
            hex_id = blake3.blake3(data).hexdigest()
            objects.append((hex_id, len(data), hashlib.sha256(data).hexdigest(),
                            kinds.validate(value), "inline", "raw", len(data), data, now, None))
            links.extend((hex_id, p, d.hex) for p, d in canonical.iter_links(value))
    return objects, links


def load_sqlite(root: Path, objects: list[tuple[Any, ...]], links: list[tuple[str, str, str]]) -> None:
    """A new SQLite store holding these rows, inserted through the store's own write
    statements (nscas.database.writes) in transactions of 50,000 objects."""
    with init_store(root) as store:
        for i in range(0, len(objects), _BATCH):
            with store._begin() as c:
                writes.insert_objects(c, objects[i:i + _BATCH])
        for i in range(0, len(links), _BATCH):
            with store._begin() as c:
                writes.insert_links(c, [{"parent": p, "path": path, "child": ch}
                                        for p, path, ch in links[i:i + _BATCH]])


def load_postgres(database: str, objects: list[tuple[Any, ...]],
                  links: list[tuple[str, str, str]]) -> None:
    """The same rows into a team store's database by COPY, in one transaction, then VACUUM
    ANALYZE (what autovacuum does for a store in use)."""
    import psycopg

    with psycopg.connect(database) as c, c.cursor() as cur:
        with cur.copy(f"COPY objects ({', '.join(writes.OBJECT_COLUMNS)}) FROM STDIN") as copy:
            for row in objects:
                copy.write_row(row)
        with cur.copy("COPY links (parent, path, child) FROM STDIN") as copy:
            for link in links:
                copy.write_row(link)
    with psycopg.connect(database, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system) of one command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dt, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


def cli_rows(store: Path, empty: Path, state: dict[str, Any], runs: int
             ) -> list[tuple[str, tuple[float, float]]]:
    receipt, env, probe = state["last_receipt"], state["env"], state["probe_ckpt"]
    commands = {
        "log --limit 20": ["log", "--limit", "20"],
        "lineage RECEIPT (up)": ["lineage", receipt],
        "lineage ENV --down": ["lineage", env, "--down"],
        "lineage CKPT --down": ["lineage", probe, "--down"],
    }
    out = [("log --limit 20, EMPTY store (start-up floor)",
            medians([timed([str(NSCAS), "--store", str(empty), "log"]) for _ in range(runs)]))]
    for label, argv in commands.items():
        timed([str(NSCAS), "--store", str(store), *argv])  # warm the page cache
        out.append((label, medians([timed([str(NSCAS), "--store", str(store), *argv])
                                    for _ in range(runs)])))
    return out


def layer_rows(engine: str, where: str, runs: int) -> list[tuple[str, float, float, float]]:
    out = []
    for layer, name in (("driver", "(b) plain driver"), ("core", "(a) SQLAlchemy Core")):
        samples = []
        for _ in range(runs):
            p = subprocess.run([sys.executable, "-c", _LAYER, layer, engine, where], cwd=REPO,
                               capture_output=True, text=True, check=True)
            samples.append(json.loads(p.stdout))
        out.append((name, statistics.median(s["first"] for s in samples),
                    statistics.median(s["first_cpu"] for s in samples),
                    statistics.median(s["each"] for s in samples)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=7, help="samples per measurement (median)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/nscas-bench-queries"))
    args = p.parse_args()
    from tests.store.services import start_postgres

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    pg = start_postgres(fsync=True)
    if isinstance(pg, str):
        raise SystemExit(f"no PostgreSQL: {pg}")
    try:
        state: dict[str, Any] = {}
        t0 = time.perf_counter()
        objects, links = store_rows(args.records, state)
        print(f"{state['records']:,} records' rows made in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        t0 = time.perf_counter()
        load_sqlite(args.workdir / "sqlite", objects, links)
        print(f"SQLite store loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        init_store(args.workdir / "sqlite-empty").close()
        team = StoreConfig(database=pg.new_database(), objects=str(args.workdir / "team-data"))
        init_store(args.workdir / "team", team).close()
        empty = StoreConfig(database=pg.new_database(), objects=str(args.workdir / "empty-data"))
        init_store(args.workdir / "team-empty", empty).close()
        t0 = time.perf_counter()
        load_postgres(team.database, objects, links)
        print(f"team store loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        del objects, links
        sqlite_state = pg_state = state
        stores = {
            "SQLite": (args.workdir / "sqlite" / ".nscas", args.workdir / "sqlite-empty" / ".nscas",
                       sqlite_state, "sqlite", str(args.workdir / "sqlite" / ".nscas" / "nscas.db")),
            "PostgreSQL": (args.workdir / "team" / ".nscas" / "store.toml",
                           args.workdir / "team-empty" / ".nscas" / "store.toml", pg_state,
                           "postgresql", team.database),
        }
        bare = medians([timed([sys.executable, "-c", "pass"]) for _ in range(args.runs)])
        print(f"\n## nscas commands on {args.records:,} records: fresh process each, median of "
              f"{args.runs} (s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
              f"`python -c pass` {bare[0]:.3f} s wall, {bare[1]:.3f} s CPU\n")
        cli = {name: cli_rows(s, e, st, args.runs) for name, (s, e, st, _, _) in stores.items()}
        print("| command | SQLite wall | SQLite CPU | PostgreSQL wall | PostgreSQL CPU |"
              "\n|---|---:|---:|---:|---:|")
        for (label, a), (_, b) in zip(cli["SQLite"], cli["PostgreSQL"], strict=True):
            print(f"| {label} | {a[0]:.3f} | {a[1]:.3f} | {b[0]:.3f} | {b[1]:.3f} |")
        print(f"\n## query layer alone on {args.records:,} records: fresh interpreter each, median "
              f"of {args.runs}\n")
        print("| engine | layer | import + connect + log query, wall s | the same, CPU s | "
              "each further statement, ms |\n|---|---|---:|---:|---:|")
        for name, (_, _, _, engine, where) in stores.items():
            for layer, first, cpu, each in layer_rows(engine, where, args.runs):
                print(f"| {name} | {layer} | {first:.3f} | {cpu:.3f} | {each * 1000:.3f} |")
    finally:
        pg.close()


if __name__ == "__main__":
    main()
