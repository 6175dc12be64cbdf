"""Serving: the three phases recomputed from the retained request log (docs/experiment.md §5).

The numbers come from the serve recipe's own log reader and metric definitions
(``nscas.recipes.serve.metrics``), applied here to the retained log rather than taken from
the receipt; every serve claim is audited against them.
"""

from __future__ import annotations

from typing import Any

from nscas.recipes.serve.client import PHASES
from nscas.recipes.serve.metrics import read_log, serving_claims

from .audit import Audit
from .evidence import Evidence

PHASE_METRICS = ("successes", "wall_seconds", "requests_per_second", "median_latency_seconds",
                 "p95_latency_seconds")


def serving_section(store: Any, ev: Evidence, audit: Audit) -> dict[str, Any] | None:
    run = ev.serve
    if run is None:
        return None
    log = store.get_bytes(run.output("requests"))
    attempts = read_log(log)
    numbers = serving_claims(log)
    for name, value in numbers.items():
        audit.claim(run, name, value)
    phases = {}
    for phase in PHASES:
        mine = [a for a in attempts if a["phase"] == phase]
        phases[phase] = {
            "requests": len({a["request_id"] for a in mine}),
            "attempts": len(mine),
            "failed_attempts": sum(1 for a in mine if not a["ok"]),
            **{k: numbers[f"{phase}.{k}"] for k in PHASE_METRICS},
        }
    model = run.input("model")
    served = [arm for arm, t in ev.train.items() if t.output("checkpoint") == model]
    return {
        "receipt": str(run.receipt),
        "model": str(model),
        "served_arm": served[0] if served else None,
        "replicas": int(run.params.get("replicas", 2)),
        "concurrency": run.params.get("concurrency"),
        "device": run.params.get("device", "cpu"),
        "phases": phases,
        "throughput_ratio": numbers["throughput_ratio"],
        "failure_retries": numbers["failure_retries"],
        "identical_outputs": numbers["identical_outputs"],
        "cache_hits": numbers["cache_hits"],
    }
