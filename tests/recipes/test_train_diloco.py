"""sync = "diloco" (docs/experiment.md §3.13) on real gloo ranks through torch.distributed.run.

With plain SGD inside, H = 1 and an outer SGD of lr 1 without momentum, DiLoCo is synchronous
SGD of the same objective when every rank's weighted target count S_r is S / W: a rank's
inner step moves θ by lr·g_r with g_r the gradient of Σ_local w_i·loss_i / S_r, the averaged
pseudo-gradient is lr·(g_0 + g_1)/2, and DDP's averaged gradient of Σ_local loss_i·W·w_i/S is
the same (g_0 + g_1)/2 exactly when S_0 = S_1. The documents here are all of one length and
weight, so that holds; clipping is set out of reach (each rank would clip its own norm).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nscas.errors import ConfigError, InvalidInput
from nscas.recipes.init.presets import load_hf_dir
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.events import CheckpointReady
from nscas.recipes.train.exchange import parameter_digest
from nscas.recipes.train.journal import effective_outer_steps, effective_steps, read_journal
from nscas.recipes.train.launch import TrainOutcome, run_training
from nscas.runs.config import parse_params
from nscas.verifiers.training.diloco import diloco_checks
from tests.recipes.test_train_errors import DEAD_RANK_TIMEOUT, assert_killing_rank_one_stops_the_run
from tests.recipes.test_train_fixtures import THREADS, make_documents, make_spec, tiny  # noqa: F401

SGD = {"optimizer": "sgd", "lr": 0.05, "warmup": 0, "clip": 1e9, "steps": 3, "batch": 4,
       "world": 2, "checkpoint_steps": ()}
ADAMW = {"lr": 1e-3, "warmup": 1, "steps": 4, "batch": 4, "world": 2, "checkpoint_steps": (2,)}
DILOCO = {"sync": "diloco", "inner_steps": 2}


def _final(outcome: TrainOutcome) -> dict[str, torch.Tensor]:
    return load_file(outcome.checkpoints[-1].hf_dir / "model.safetensors")


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Relative L2 distance of b from a over every tensor."""
    diff = math.sqrt(sum(((a[n].double() - b[n].double()) ** 2).sum().item() for n in a))
    return diff / math.sqrt(sum((a[n].double() ** 2).sum().item() for n in a))


@pytest.fixture(scope="module")
def adamw_runs(tiny: tuple[Path, Path, Path]) -> dict[str, object]:  # noqa: F811
    torch.set_num_threads(1)
    root, tokenizer, base = tiny
    docs = make_documents(16, seed=11)
    ddp = run_training(make_spec(root, docs=docs, base=base, tokenizer=tokenizer,
                                 out="adamw-ddp", **ADAMW), env=THREADS)
    diloco = run_training(make_spec(root, docs=docs, base=base, tokenizer=tokenizer,
                                    out="adamw-diloco", **ADAMW, **DILOCO), env=THREADS)
    return {"docs": docs, "base": base, "ddp": ddp, "diloco": diloco, "root": root,
            "tokenizer": tokenizer}


def test_sgd_inside_h1_outer_sgd_lr1_is_synchronous_sgd(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    torch.set_num_threads(1)
    root, tokenizer, base = tiny
    docs = make_documents(12, seed=3, weights=(1, 1), lengths=(30, 31))
    assert len({d.targets for d in docs}) == 1  # S_r = S / W on every update
    ddp = run_training(make_spec(root, docs=docs, base=base, tokenizer=tokenizer,
                                 out="sgd-ddp", **SGD), env=THREADS)
    diloco = run_training(make_spec(root, docs=docs, base=base, tokenizer=tokenizer,
                                    out="sgd-diloco", **SGD, sync="diloco", inner_steps=1,
                                    outer_lr=1.0, outer_momentum=0.0), env=THREADS)
    one, two = _final(ddp), _final(diloco)
    start = load_file(Path(base) / "model.safetensors")
    moved = max((one[n] - start[n]).abs().max().item() for n in one)
    apart = max((one[n] - two[n]).abs().max().item() for n in one)
    # θ − (θ − lr·g_r) rounds to ulps of θ, far below what three SGD updates move it.
    assert moved > 1e-3 and apart < 1e-4 * moved, (moved, apart)
    assert diloco.results[0].outer_steps == 3 and ddp.results[0].outer_steps == 0
    # The same per-rank documents and losses as DDP's: every rank's objective is the global one.
    for rank in (0, 1):
        d_steps = effective_steps(read_journal(Path(diloco.results[rank].journal)).entries)
        s_steps = effective_steps(read_journal(Path(ddp.results[rank].journal)).entries)
        assert [e["indices"] for e in d_steps] == [e["indices"] for e in s_steps]
        assert [e["local_indices"] for e in d_steps] == [e["indices"][rank::2] for e in s_steps]
        assert all(2 * e["local_weighted_targets"] == e["weighted_targets"] for e in d_steps)


def test_adamw_inside_runs_and_ranks_agree_after_every_outer_step(adamw_runs: dict) -> None:
    ddp, diloco = adamw_runs["ddp"], adamw_runs["diloco"]
    start = load_file(Path(adamw_runs["base"]) / "model.safetensors")
    a, b = _final(ddp), _final(diloco)
    distance = _distance(a, b)
    moved = _distance(start, a)
    print(f"\nAdamW inside, H = 2, outer 0.7/0.9 vs DDP AdamW after 4 updates: relative L2 "
          f"{distance:.4g} (DDP moved the weights {moved:.4g} from the base)")
    # Not the same algorithm: a finite, non-zero distance of the order of what training moved.
    assert math.isfinite(distance) and 0 < distance < 10 * moved
    n_params = sum(t.numel() for t in start.values())
    outers = []
    for result in diloco.results:
        entries = read_journal(Path(result.journal)).entries
        outer = effective_outer_steps(entries)
        assert [e["outer_step"] for e in outer] == [1, 2] and [e["step"] for e in outer] == [2, 4]
        assert all(e["bytes_sent"] == 4 * n_params for e in outer)
        assert all(e["bytes_communicated"] == 0 for e in effective_steps(entries))
        assert result.outer_steps == 2 and result.bytes_communicated == 2 * 4 * n_params
        outers.append([(e["parameters"], e["pseudo_gradient_norm"]) for e in outer])
    assert outers[0] == outers[1]
    assert diloco.results[0].parameter_blake3 == outers[0][-1][0]
    # Inside an outer step each rank is its own learner: its losses are its own.
    losses = [[e["loss"] for e in effective_steps(read_journal(Path(r.journal)).entries)]
              for r in diloco.results]
    assert losses[0] != losses[1]


def test_the_verifiers_pass_the_real_journals(adamw_runs: dict) -> None:
    diloco = adamw_runs["diloco"]
    ranks = {r.rank: list(read_journal(Path(r.journal)).entries) for r in diloco.results}
    start = load_file(Path(adamw_runs["base"]) / "model.safetensors")
    params = {**TrainParams(**ADAMW, **DILOCO).identity(), "checkpoint_steps": [2]}
    rebuilt = {}
    for checkpoint in diloco.checkpoints:
        model, _ = load_hf_dir(checkpoint.hf_dir, dtype=torch.float32)
        rebuilt[checkpoint.step] = parameter_digest(model).hex()
    size = sum(t.numel() * t.element_size() for t in start.values())
    checks = diloco_checks(ranks, params, name="t", parameters=None, parameter_bytes=size,
                           rebuilt=rebuilt)
    assert [c.status for c in checks] == ["passed"] * len(checks), [c for c in checks]
    assert len(checks) == 4
    # A rank whose outer digest is not the checkpoint's fails, as the tamper tests show.
    ranks[1] = [{**e, "parameters": "0" * 64} if e.get("event") == "outer" else e
                for e in ranks[1]]
    statuses = {c.name: c.status for c in diloco_checks(
        ranks, params, name="t", parameters=None, parameter_bytes=size, rebuilt=rebuilt)}
    assert statuses["t.journals.outer.agree"] == "failed"


def test_a_resumed_run_reaches_the_uninterrupted_digest(adamw_runs: dict) -> None:
    root, tokenizer, base, docs = (adamw_runs[k] for k in ("root", "tokenizer", "base", "docs"))
    broken = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="adamw-broken",
                       **ADAMW, **DILOCO)

    class Interrupt(Exception):
        pass

    def interrupt(ready: CheckpointReady) -> None:
        if ready.step == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_training(broken, on_checkpoint=interrupt, env=THREADS)
    resumed = run_training(broken, env=THREADS)
    whole = adamw_runs["diloco"]
    assert [r.parameter_blake3 for r in resumed.results] == [
        r.parameter_blake3 for r in whole.results]
    want, got = _final(whole), _final(resumed)
    assert all(torch.equal(want[n], got[n]) for n in want)
    for ref, new in zip(whole.results, resumed.results, strict=True):
        assert new.resumed_from == 2 and new.outer_steps == 2
        keep = ("outer_step", "parameters", "pseudo_gradient_norm", "bytes_sent")
        assert [[e[k] for k in keep] for e in effective_outer_steps(
            read_journal(Path(new.journal)).entries)] == [[e[k] for k in keep] for e in
                                                          effective_outer_steps(read_journal(
                                                              Path(ref.journal)).entries)]


def test_a_dead_rank_stops_the_other(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    root, tokenizer, base = tiny
    spec = make_spec(root, docs=make_documents(16, seed=2), base=base, tokenizer=tokenizer,
                     out="diloco-dies", world=2, steps=4000, batch=2, checkpoint_steps=(),
                     timeout_seconds=DEAD_RANK_TIMEOUT, sync="diloco", inner_steps=4)
    # From step 2: between outer steps, while rank 0 is inside its H inner steps.
    assert_killing_rank_one_stops_the_run(spec, timeout=DEAD_RANK_TIMEOUT, from_step=2)


@pytest.mark.parametrize(("params", "message"), [
    ({"sync": "diloco", "inner_steps": 4, "steps": 8, "checkpoint_steps": [2]},
     "checkpoint_steps [2] are not multiples of inner_steps (4): a diloco checkpoint lies on "
     "an outer-step boundary"),
    ({"sync": "diloco", "inner_steps": 3, "steps": 8, "checkpoint_steps": []},
     "steps (8) is not a multiple of inner_steps (3)"),
    ({"inner_steps": 4, "steps": 8, "checkpoint_steps": []},
     "inner_steps applies to sync = 'diloco' only"),
    ({"sync": "local", "steps": 8, "checkpoint_steps": []},
     "sync must be 'ddp' or 'diloco', not 'local'"),
    ({"sync": "diloco", "steps": 8, "checkpoint_steps": [], "outer_momentum": 1.0},
     "outer_momentum must be a number in [0, 1)"),
    ({"sync": "diloco", "steps": 8, "checkpoint_steps": [], "outer_lr": 0.0},
     "outer_lr must be a positive number"),
    ({"optimizer": "adam", "steps": 8, "checkpoint_steps": []},
     "optimizer must be 'adamw' or 'sgd'"),
    ({"sync": "diloco", "steps": 8, "checkpoint_steps": [8], "publish_state": [8]},
     "publish_state is not supported with sync = 'diloco'"),
    ({"optimizer": "sgd", "steps": 8, "checkpoint_steps": [8], "publish_state": [8]},
     "publish_state needs optimizer = 'adamw'"),
])
def test_bad_diloco_params_are_one_clear_line(params: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_params(TrainParams, params, "recipe.toml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_world_one_is_allowed() -> None:
    params = TrainParams(sync="diloco", inner_steps=2, steps=4, checkpoint_steps=(2,), world=1)
    assert params.diloco and params.identity()["inner_steps"] == 2
    with pytest.raises(InvalidInput):
        TrainParams(sync="diloco", inner_steps=0, steps=4, checkpoint_steps=())
