"""Serving: the three phases recomputed from the retained request log (docs/experiment.md §5).

The numbers come from the serve recipe's own log reader and metric definitions
(``nscas.recipes.serve.metrics``), applied here to the retained log rather than taken from
the receipt; every serve claim is audited against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nscas.objects.digests import Digest
from nscas.recipes.serve.client import PHASES
from nscas.recipes.serve.metrics import read_log, serving_claims
from nscas.store.protocol import ObjectReader

from .audit import Audit
from .evidence import Evidence

PHASE_METRICS = ("successes", "wall_seconds", "requests_per_second", "median_latency_seconds",
                 "p95_latency_seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """One serving phase, recomputed from the request log."""

    requests: int
    attempts: int
    failed_attempts: int
    metrics: Mapping[str, Any]
    """``PHASE_METRICS`` by name, as the serve recipe's metric definitions give them."""

    @property
    def requests_per_second(self) -> Any:
        return self.metrics["requests_per_second"]

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "attempts": self.attempts,
                "failed_attempts": self.failed_attempts,
                **{k: self.metrics[k] for k in PHASE_METRICS}}


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    """report.json's ``serving`` part."""

    receipt: Digest
    model: Digest | None
    served_arm: str | None
    replicas: int
    concurrency: Any
    device: str
    phases: Mapping[str, Phase]
    throughput_ratio: Any
    failure_retries: Any
    identical_outputs: Any
    cache_hits: Any

    def to_json(self) -> dict[str, Any]:
        return {"receipt": str(self.receipt), "model": str(self.model),
                "served_arm": self.served_arm, "replicas": self.replicas,
                "concurrency": self.concurrency, "device": self.device,
                "phases": {k: v.to_json() for k, v in self.phases.items()},
                "throughput_ratio": self.throughput_ratio,
                "failure_retries": self.failure_retries,
                "identical_outputs": self.identical_outputs, "cache_hits": self.cache_hits}


def serving_section(store: ObjectReader, ev: Evidence, audit: Audit) -> Serving | None:
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
        phases[phase] = Phase(
            requests=len({a["request_id"] for a in mine}),
            attempts=len(mine),
            failed_attempts=sum(1 for a in mine if not a["ok"]),
            metrics={k: numbers[f"{phase}.{k}"] for k in PHASE_METRICS},
        )
    model = run.input("model")
    served = [arm for arm, t in ev.train.items() if t.output("checkpoint") == model]
    return Serving(
        receipt=run.receipt,
        model=model,
        served_arm=served[0] if served else None,
        replicas=int(run.params.get("replicas", 2)),
        concurrency=run.params.get("concurrency"),
        device=run.params.get("device", "cpu"),
        phases=phases,
        throughput_ratio=numbers["throughput_ratio"],
        failure_retries=numbers["failure_retries"],
        identical_outputs=numbers["identical_outputs"],
        cache_hits=numbers["cache_hits"],
    )
