"""The default process group's backend: NCCL only where gradients cross GPUs."""

from __future__ import annotations

import torch

from nscas.recipes.train.worker import default_backend


def test_one_rank_on_a_gpu_opens_no_nccl_communicator() -> None:
    assert default_backend(torch.device("cuda", 0), 1) == "gloo"


def test_ranks_on_gpus_reduce_over_nccl() -> None:
    assert default_backend(torch.device("cuda", 1), 2) == "nccl"


def test_cpu_ranks_use_gloo() -> None:
    assert default_backend(torch.device("cpu"), 1) == "gloo"
    assert default_backend(torch.device("cpu"), 2) == "gloo"
