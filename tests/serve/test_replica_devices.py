"""Which GPU each serving replica gets: the k-th of those its step was given, not GPU k of the
machine (a scheduler gives a step its GPUs through CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import pytest

from nscas.errors import RecipeError
from nscas.recipes.serve.processes import replica_environment


def test_replica_k_takes_the_kth_given_gpu() -> None:
    given = {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert [replica_environment("cuda", k, given) for k in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"}]


def test_more_replicas_than_gpus_go_round_them_again() -> None:
    given = {"CUDA_VISIBLE_DEVICES": "GPU-1f2e, 6"}
    assert [replica_environment("cuda", k, given)["CUDA_VISIBLE_DEVICES"]
            for k in range(3)] == ["GPU-1f2e", "6", "GPU-1f2e"]


def test_without_a_restriction_replica_k_takes_gpu_k() -> None:
    assert replica_environment("cuda", 2, {}) == {"CUDA_VISIBLE_DEVICES": "2"}


def test_on_the_cpu_nothing_is_set() -> None:
    assert replica_environment("cpu", 1, {"CUDA_VISIBLE_DEVICES": "3"}) == {}


def test_no_gpu_given_is_one_clear_error() -> None:
    with pytest.raises(RecipeError, match="CUDA_VISIBLE_DEVICES names no GPU"):
        replica_environment("cuda", 0, {"CUDA_VISIBLE_DEVICES": ""})
