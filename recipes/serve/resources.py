"""What a serve step needs (nscas.runs.resources): on the CPU, each replica's instances'
threads; on CUDA, one GPU per replica (replica k runs on the k-th GPU the step is given) and a core each;
and the disk of its model's files, once per replica (each materialises them, and removes them
once loaded). Not imported by the recipe (no part of its code identity)."""

from __future__ import annotations

from nscas.recipes.serve.recipe import ServeParams
from nscas.runs.resources import InputSizes, Needs


def needs(params: ServeParams, inputs: InputSizes) -> Needs:
    disk = params.replicas * inputs.get("model", 0) / 1e9
    if params.device == "cuda":
        return Needs(cores=params.replicas, gpus=params.replicas, world=params.replicas,
                     disk_gb=disk)
    return Needs(cores=params.replicas * params.instances * params.threads,
                 world=params.replicas, disk_gb=disk)
