"""Resources: per run, where it ran, for how long, on how many devices; and a cost estimate.

Wall seconds run from a receipt's ``started`` to its ``finished`` (setup and model loading
included). Allocated device seconds are wall seconds times the devices the run used: its
world for ``train``, its replicas for ``serve``, one otherwise. A CPU run counts one CPU
"device" per rank, replica or process (not per core), and is totalled apart from GPU runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest

from .evidence import Evidence, Run

CPU_NOTE = ("cpu runs count one CPU 'device' per rank, replica or process, not per core; "
            "their device seconds are totalled apart from GPU device seconds")
COST_NOTE = ("estimate only: price_per_host_hour x hosts x wall hours of the runs listed; it "
             "excludes setup and idle time outside the runs, storage, transfer and taxes; not "
             "an invoice")


def _devices_used(run: Run) -> tuple[str, int]:
    device = str(run.params.get("device", "cpu"))
    if run.recipe == "train":
        return device, int(run.params.get("world", 1))
    if run.recipe == "serve":
        return device, int(run.params.get("replicas", 2))
    if run.recipe == "evaluate":
        return device, 1
    return "cpu", 1


def _seconds(run: Run) -> float:
    try:
        started = datetime.fromisoformat(run.record["started"])
        finished = datetime.fromisoformat(run.record["finished"])
    except ValueError as exc:
        raise RecipeError(f"{run.name}: receipt times are not ISO 8601: {exc}") from None
    return (finished - started).total_seconds()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResources:
    """Where and how long one input run ran (``resources.runs[]``)."""

    input: str
    recipe: str
    receipt: Digest
    host: str | None
    hosts: int
    device_type: str
    devices_used: int
    device_names: tuple[Any, ...]
    python: str | None
    torch: str | None
    platform: str | None
    started: str
    finished: str
    wall_seconds: float

    @property
    def allocated_device_seconds(self) -> float:
        return self.wall_seconds * self.devices_used

    @property
    def host_hours(self) -> float:
        return self.hosts * self.wall_seconds / 3600

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "recipe": self.recipe, "receipt": str(self.receipt),
                "host": self.host, "hosts": self.hosts, "device_type": self.device_type,
                "devices_used": self.devices_used, "device_names": list(self.device_names),
                "python": self.python, "torch": self.torch, "platform": self.platform,
                "started": self.started, "finished": self.finished,
                "wall_seconds": self.wall_seconds,
                "allocated_device_seconds": self.allocated_device_seconds,
                "host_hours": self.host_hours}


def run_resources(run: Run) -> RunResources:
    device, used = _devices_used(run)
    env = run.environment
    kinds = ("cuda",) if device == "cuda" else ("cpu",)
    names = [d.get("name") for d in env.get("devices", []) if d.get("type") in kinds]
    torch = env.get("torch")
    return RunResources(
        input=run.name,
        recipe=run.recipe,
        receipt=run.receipt,
        host=env.get("host"),
        hosts=int(run.params.get("nnodes", 1)) if run.recipe == "train" else 1,
        device_type=device,
        devices_used=used,
        device_names=tuple(names[:used] if device == "cuda" else names[:1]),
        python=env.get("python"),
        torch=torch.get("version") if isinstance(torch, dict) else None,
        platform=env.get("platform"),
        started=run.record["started"],
        finished=run.record["finished"],
        wall_seconds=_seconds(run),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """report.json's ``resources`` part (also written alone as resources.json)."""

    runs: tuple[RunResources, ...]
    """Every input run, in report order."""
    price_per_host_hour: float
    """0: none given, so no cost estimate."""

    @property
    def host_hours(self) -> float:
        return sum(r.host_hours for r in self.runs)

    def to_json(self) -> dict[str, Any]:
        by_type: dict[str, float] = {}
        for r in self.runs:
            by_type[r.device_type] = by_type.get(r.device_type, 0.0) + r.allocated_device_seconds
        host_hours = self.host_hours
        if self.price_per_host_hour > 0:
            cost: dict[str, Any] = {"price_per_host_hour": self.price_per_host_hour,
                                    "host_hours": host_hours,
                                    "estimate": self.price_per_host_hour * host_hours,
                                    "note": COST_NOTE}
        else:
            cost = {"price_per_host_hour": None, "host_hours": host_hours, "estimate": None,
                    "note": "no price per host-hour given (param price_per_host_hour), so no "
                            "cost estimate"}
        return {
            "runs": [r.to_json() for r in self.runs],
            "totals": {"wall_seconds": sum(r.wall_seconds for r in self.runs),
                       "allocated_device_seconds": dict(sorted(by_type.items())),
                       "host_hours": host_hours},
            "cost_estimate": cost,
            "notes": [
                "wall seconds run from each receipt's started to its finished time, setup "
                "included",
                "allocated device seconds = wall seconds x devices used (world for train, "
                "replicas for serve, one otherwise)",
                CPU_NOTE,
            ],
        }


def resources_section(ev: Evidence, price_per_host_hour: float) -> Resources:
    return Resources(runs=tuple(run_resources(run) for run in ev.runs()),
                     price_per_host_hour=price_per_host_hour)
