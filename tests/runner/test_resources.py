"""Resources (nscas.runs.resources): what a step may be given, on a machine described by hand."""

from __future__ import annotations

import pytest

from nscas.errors import ConfigError
from nscas.runs.resources import Gpu, Machine, Needs, Pool, default_jobs, needs_of

MACHINE = Machine(cores=(0, 1, 2, 3), gpus=(Gpu(index=0, memory_gb=80.0),
                                           Gpu(index=1, memory_gb=80.0)))


def test_cores_and_gpus_are_given_whole_and_given_back() -> None:
    pool = Pool(MACHINE)
    first = pool.take(Needs(cores=2, gpus=1))
    second = pool.take(Needs(cores=2, gpus=1))
    assert first is not None and second is not None
    assert set(first.cores).isdisjoint(second.cores) and first.gpus != second.gpus
    assert pool.take(Needs(cores=1)) is None  # every core taken
    pool.give_back(first, Needs(cores=2, gpus=1))
    third = pool.take(Needs(cores=1, gpus=1))
    assert third is not None and third.gpus == first.gpus
    assert third.environment(Needs(cores=1, gpus=1)) == {
        "CUDA_VISIBLE_DEVICES": str(first.gpus[0]), "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1"}


def test_a_world_of_two_shares_its_cores_between_its_ranks() -> None:
    grant = Pool(MACHINE).take(Needs(cores=4, world=2))
    assert grant is not None
    assert grant.environment(Needs(cores=4, world=2))["OMP_NUM_THREADS"] == "2"


def test_gpu_share_lets_steps_share_a_gpu_within_its_memory() -> None:
    pool = Pool(Machine(cores=tuple(range(8)), gpus=(Gpu(index=0, memory_gb=80.0),)),
                gpu_share=4)
    small = Needs(cores=1, gpus=1, gpu_memory_gb=30.0)
    grants = [pool.take(small), pool.take(small)]
    assert all(g is not None and g.gpus == (0,) for g in grants)
    assert pool.take(small) is None  # 60 of 80 GB taken: a third 30 GB does not fit
    assert pool.take(Needs(cores=1, gpus=1, gpu_memory_gb=20.0)) is not None
    assert pool.take(Needs(cores=1, gpus=1)) is not None  # no estimate: only a slot
    assert pool.take(Needs(cores=1, gpus=1)) is None  # four slots taken


def test_without_sharing_a_gpu_is_one_steps() -> None:
    pool = Pool(Machine(cores=(0, 1), gpus=(Gpu(index=0, memory_gb=80.0),)))
    assert pool.take(Needs(gpus=1, gpu_memory_gb=1.0)) is not None
    assert pool.take(Needs(gpus=1, gpu_memory_gb=1.0)) is None


@pytest.mark.parametrize(("needs", "said"), [
    (Needs(cores=5), "short of 5 CPU cores"),
    (Needs(gpus=3), "short of 3 GPUs"),
    (Needs(gpus=1, gpu_memory_gb=100.0), "short of 1 GPU(s) of 100 GB"),
])
def test_what_can_never_fit_is_said(needs: Needs, said: str) -> None:
    why = Pool(MACHINE).never_fits(needs)
    assert why is not None and said in why and "this machine has 4 CPU cores, 2 GPUs" in why


def test_a_fitting_step_is_not_refused() -> None:
    assert Pool(MACHINE).never_fits(Needs(cores=4, gpus=2, gpu_memory_gb=80.0)) is None


def test_gpu_share_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        Pool(MACHINE, gpu_share=0)


def test_recipes_declare_their_needs_from_their_params() -> None:
    from nscas.recipes.evaluate.recipe import EvaluateParams
    from nscas.recipes.train.config import TrainParams

    assert needs_of("train", TrainParams(world=2, device="cuda")) == Needs(cores=2, gpus=2,
                                                                           world=2)
    assert needs_of("train", TrainParams(world=2)) == Needs(cores=2, world=2)
    assert needs_of("evaluate", EvaluateParams(device="cuda", threads=3)) == Needs(cores=3,
                                                                                  gpus=1)
    assert needs_of("prepare", object()) == Needs()  # none declared: one core


def test_a_steps_share_bounds_the_steps_on_its_gpu() -> None:
    pool = Pool(Machine(cores=tuple(range(8)), gpus=(Gpu(index=0, memory_gb=139.0),)))
    train = Needs(cores=1, gpus=1, gpu_memory_gb=30.0)
    four = [pool.take(train, 4) for _ in range(4)]
    assert all(g is not None and g.gpus == (0,) and g.share == 4 for g in four)
    assert pool.take(train, 4) is None  # four at once is what each allows
    assert pool.take(Needs(cores=1, gpus=1)) is None  # whole (no --gpu-share): not beside them
    first = four[0]
    assert first is not None
    pool.give_back(first, train)
    assert pool.take(Needs(cores=1, gpus=1, gpu_memory_gb=10.0), 2) is None  # 4 there: > 2
    assert pool.take(train, 8) is not None  # its share allows 8, theirs 4: the fourth again


def test_a_step_that_shares_waits_for_a_gpu_held_whole() -> None:
    pool = Pool(Machine(cores=(0, 1, 2), gpus=(Gpu(index=0, memory_gb=80.0),)))
    whole = pool.take(Needs(gpus=1))
    assert whole is not None
    assert pool.take(Needs(gpus=1, gpu_memory_gb=1.0), 4) is None
    pool.give_back(whole, Needs(gpus=1))
    assert pool.take(Needs(gpus=1, gpu_memory_gb=1.0), 4) is not None


def test_the_default_job_count_is_the_machines_cores_or_gpus() -> None:
    assert default_jobs(MACHINE) == 4
    assert default_jobs(Machine(cores=(0,), gpus=(Gpu(index=0, memory_gb=1.0),
                                                   Gpu(index=1, memory_gb=1.0)))) == 2
    assert default_jobs(Machine(cores=(3,))) == 1
