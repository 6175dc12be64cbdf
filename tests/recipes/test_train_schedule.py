"""The document and learning-rate schedules and the params of docs/experiment.md §3 (pure, no processes)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from nscas.errors import InvalidInput
from nscas.recipes.train.config import TrainParams, WorkerSpec
from nscas.recipes.train.schedule import document_schedule, learning_rate, rank_share


def test_published_schedule_first_batch_and_one_epoch() -> None:
    batches = document_schedule(1024, steps=128, batch=8, seed=20260913)
    assert len(batches) == 128 and all(len(b) == 8 for b in batches)
    assert batches[0] == [475, 164, 110, 140, 483, 798, 431, 397]
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1024))  # each document exactly once


def test_schedule_reshuffles_with_the_same_generator_until_enough() -> None:
    batches = document_schedule(5, steps=3, batch=4, seed=7)
    flat = [i for b in batches for i in b]
    assert len(flat) == 12
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    # The second epoch continues the first generator rather than reseeding it.
    assert flat[5:10] != flat[:5]
    assert document_schedule(5, steps=3, batch=4, seed=7) == batches


def test_rank_share_takes_every_world_th_document() -> None:
    batch = [475, 164, 110, 140, 483, 798, 431, 397]
    assert rank_share(batch, rank=0, world=2) == [475, 110, 483, 431]
    assert rank_share(batch, rank=1, world=2) == [164, 140, 798, 397]
    assert rank_share(batch, rank=0, world=1) == batch


def test_learning_rate_warmup_then_cosine_to_a_tenth() -> None:
    lr = 3e-5
    values = [learning_rate(s, lr=lr, warmup=8, steps=128) for s in range(128)]
    assert values[:8] == [lr * (s + 1) / 8 for s in range(8)]
    assert values[8] == lr
    assert values[127] == pytest.approx(0.1 * lr, rel=1e-12)
    assert all(a > b for a, b in itertools.pairwise(values[8:]))
    # Cosine: progress p = (s - 8) / 119 gives 0.1·lr + 0.9·lr·(1 + cos(πp))/2.
    p = (50 - 8) / 119
    assert values[50] == pytest.approx(0.1 * lr + 0.9 * lr * (1 + math.cos(math.pi * p)) / 2)


def test_published_defaults() -> None:
    p = TrainParams()
    assert (p.steps, p.batch, p.lr, p.warmup, p.betas, p.eps) == (128, 8, 3e-5, 8, (0.9, 0.95), 1e-8)
    assert (p.weight_decay, p.clip, p.schedule_seed, p.checkpoint_steps) == (0.01, 1.0, 20260913, (64, 128))
    assert (p.grounded_weight, p.replay_weight, p.max_length, p.world) == (8, 1, 1024, 1)
    assert (p.device, p.deterministic, p.gradient_checkpointing, p.nnodes, p.node_rank) == (
        "cpu", True, False, 1, 0)
    assert (p.micro_batch, p.bucket_mb) == (1, 25)  # one backward per document, DDP's buckets


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch": 8, "world": 3}, "batch (8) is not divisible by world (3)"),
        ({"grounded_weight": 17}, "grounded_weight must be an integer between 1 and 16"),
        ({"replay_weight": 0}, "replay_weight must be an integer between 1 and 16"),
        ({"checkpoint_steps": (4, 2)}, "must be increasing"),
        ({"checkpoint_steps": (200,)}, "between 1 and steps (128)"),
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda'"),
        ({"lr": float("nan")}, "lr must be a positive number"),
        ({"nnodes": 2, "world": 2, "rdzv_endpoint": "10.0.0.1:0"}, "needs a fixed port"),
        ({"world": 3, "batch": 6, "nnodes": 2, "rdzv_endpoint": "h:29400"}, "not divisible by nnodes"),
        ({"micro_batch": 0}, "micro_batch must be an integer >= 1"),
        ({"bucket_mb": 0}, "bucket_mb must be an integer between 1 and 4096"),
        ({"micro_batch": True}, "micro_batch must be an integer >= 1"),
        ({"micro_batch": 2.0}, "micro_batch must be an integer >= 1"),
        ({"micro_batch": 5, "world": 2}, "micro_batch (5) is more than a rank's documents per "
                                         "update (batch / world = 4)"),
    ],
)
def test_bad_params_are_refused_with_the_reason(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        TrainParams(**values)
    assert message in str(caught.value)


def test_params_checkpoint_set() -> None:
    p = TrainParams(steps=4, checkpoint_steps=(2, 4), world=2, batch=4)
    assert p.checkpoint_set == frozenset({2, 4})
    assert TrainParams(steps=5, checkpoint_steps=(2,)).checkpoint_set == frozenset({2, 5})


def test_spec_params_are_parsed_strictly_naming_the_key_and_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = WorkerSpec(base_dir="b", tokenizer_dir="t", documents=("d",), output_dir="o")
    body = json.loads(spec.to_json())
    for params, message in (({**body["params"], "stepz": 3}, "unknown key(s) in params: stepz"),
                            ({**body["params"], "steps": "4"}, "params.steps must be an integer"),
                            ({**body["params"], "steps": 0}, "steps must be an integer >= 1")):
        path = tmp_path / "spec.json"
        path.write_text(json.dumps({**body, "params": params}))
        with pytest.raises(InvalidInput) as caught:
            WorkerSpec.read(path)
        assert str(path) in str(caught.value) and message in str(caught.value)


def test_worker_spec_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = WorkerSpec(base_dir="b", tokenizer_dir="t", documents=("d1", "d2"), output_dir="o",
                      params=TrainParams(steps=3, checkpoint_steps=(1,)), run_key="k")
    spec.write(tmp_path / "spec.json")
    assert WorkerSpec.read(tmp_path / "spec.json") == spec
    assert json.loads((tmp_path / "spec.json").read_text())["params"]["betas"] == [0.9, 0.95]
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(InvalidInput, match="not a train-spec/1"):
        WorkerSpec.read(tmp_path / "bad.json")
