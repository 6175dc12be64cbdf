"""``verify --replay N --replay-steps K``: training updates replayed from the run's base (a fresh
optimizer: no published state needed) and from a published optimizer state, in the verifier's
own loop, against the journal's per-update parameter digests.

The forgery here is the one plain verification cannot catch: the final checkpoint swapped for
another one, with every digest that speaks of it (the receipt's claims, the journal's step
entry and agreement, the checkpoints tree) rewritten consistently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.recipes.train.config import TrainParams
from nscas.store.writer import Store
from nscas.verifiers.core.runs import Run
from nscas.verifiers.replay import training as replay_training
from nscas.verifiers.replay.options import ReplayOptions
from nscas.verifiers.replay.step import (
    Document,
    ReplayStepError,
    Request,
    Update,
    compute,
    environment,
)
from nscas.verifiers.replay.step import main as replaystep_main
from nscas.verifiers.replay.training import reproducible
from nscas.verifiers.verify import verify
from tests.pipelines import run_pipeline, step, tiny_pipeline
from tests.verifiers.conftest import nscas_verify

_INPUTS = {"base": "step.init.checkpoint", "documents": "step.prepare.train",
           "replay": "step.prepare.replay"}
_PARAMS = {"steps": 4, "checkpoint_steps": [2, 4], "lr": 1e-3}
PIPELINE = (tiny_pipeline(test=8, dev=4, train=16, replay=8)
            + step("train", "train", inputs=_INPUTS, params={**_PARAMS, "publish_state": [2]})
            + step("train-plain", "train", inputs=_INPUTS,
                   params={**_PARAMS, "parameter_digests": 0})
            + step("train-loose", "train", inputs=_INPUTS,
                   params={**_PARAMS, "publish_state": [2], "deterministic": False})
            + step("train-two", "train", inputs=_INPUTS, params={**_PARAMS, "world": 2}))
REPLAY = ReplayOptions(count=0, seed=1, steps=2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trained:
    root: Path
    store: Store
    receipt: str
    plain: str
    loose: str
    """A run with ``deterministic = false``."""
    two: str
    """A run of two ranks, without a published state."""
    light: Path
    """``--no-weights`` export of ``receipt``."""

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))

    def journal(self, receipt: str) -> list[dict[str, Any]]:
        record = self.record(self.record(receipt)["journals"][0])
        data = self.store.get_bytes(Digest.parse(record["entries"]))
        return [json.loads(line) for line in data.decode().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    import torch

    from nscas.bundle.exporting import export_bundle

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("replay-training")
    store, steps = run_pipeline(root, PIPELINE)
    export_bundle(store, steps["train"].receipt, root / "light", weights=False)
    yield Trained(root=root, store=store, receipt=str(steps["train"].receipt),
                  plain=str(steps["train-plain"].receipt),
                  loose=str(steps["train-loose"].receipt), two=str(steps["train-two"].receipt),
                  light=root / "light")
    store.close()


def _checks(report: Any) -> dict[str, Any]:
    return {c.name: c for c in report.checks}


def test_the_journal_carries_a_digest_per_update_and_the_state_is_published(
        trained: Trained) -> None:
    steps = [e for e in trained.journal(trained.receipt) if "event" not in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(len(e["parameters"]) == 64 for e in steps)
    agreed = {e["step"]: e["parameters"] for e in trained.journal(trained.receipt)
              if e.get("event") == "agreed"}
    assert agreed[2] == steps[1]["parameters"] and agreed[4] == steps[3]["parameters"]
    assert all("parameters" not in e for e in trained.journal(trained.plain)
               if "event" not in e)
    receipt = trained.record(trained.receipt)
    tree = trained.record(receipt["outputs"]["checkpoints"])["entries"]
    first = trained.record(tree["step-000002"]["id"])
    assert "state" not in trained.record(tree["step-000004"]["id"])
    files = trained.record(first["state"])["entries"]
    assert sorted(files) == ["optimizer.safetensors", "state.json"]
    state = json.loads(trained.store.get_bytes(Digest.parse(files["state.json"]["id"])))
    assert state["format"] == "nscas-train-state/1" and state["step"] == 2
    assert [g["weight_decay"] for g in state["groups"]] == [0.01, 0.0]
    # Nothing the run computed drew from torch's generator: it is still as the rank seeded it,
    # which is why a replay from the base (step 0) needs no published state.
    import torch
    from safetensors.torch import load as load_tensors

    tensors = load_tensors(trained.store.get_bytes(Digest.parse(
        files["optimizer.safetensors"]["id"])))
    seeded = torch.Generator().manual_seed(TrainParams().schedule_seed).get_state()
    assert torch.equal(tensors["rng/0/torch"], seeded)
    # Digests and a published state change nothing the training computes.
    plain = trained.record(trained.plain)
    assert trained.record(plain["outputs"]["checkpoint"])["params"] == \
        trained.record(receipt["outputs"]["checkpoint"])["params"]
    report = verify(trained.receipt, store=trained.store_dir)
    checks = _checks(report)
    assert report.ok, [c for c in report.checks if c.status == "failed"]
    assert checks["train." + trained.receipt[7:15] + ".state"].status == "passed"
    between = checks["train." + trained.receipt[7:15] + ".journals.parameters.replay"]
    assert between.status == "skipped" and sorted(between.claimed) == ["1", "3"]


def test_the_store_keeps_the_published_state_and_no_resume_state(trained: Trained) -> None:
    # The torch pickle a resume reads stays in the work area, gone once the run succeeded:
    # storing it too kept two more copies of the weights per checkpoint for good.
    assert trained.store.ref_list("states/") == []
    assert [p.name for p in (trained.store_dir / "work").iterdir()] == [".lock"]


def test_replayed_updates_reproduce_the_journal_digests_bit_for_bit_on_the_cpu(
        trained: Trained, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    # The auditor's own workspace setting is not the run's: the replay process uses the
    # run's (docs/format.md §7.8), and this process's flags are left as they were.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    before = torch.are_deterministic_algorithms_enabled()
    processes: list[int] = []

    def counted(requests: Any, workdir: Path) -> Any:
        processes.append(len(requests))
        return compute(requests, workdir)

    monkeypatch.setattr(replay_training, "compute", counted)
    report = verify(trained.receipt, store=trained.store_dir, replay=REPLAY)
    check = _checks(report)["train." + trained.receipt[7:15] + ".replay.training"]
    assert check.status == "passed", check.message
    # Updates 1 and 2 from the base with a fresh AdamW, 3 and 4 from the state of step 2, in
    # one replay process: the second start reproduces the journal after the first ran there.
    assert processes == [2]
    assert check.recomputed["replayed"] == [1, 2, 3, 4] and check.recomputed["from"] == [0, 2]
    assert check.recomputed["relative_l2"] == [0.0, 0.0]
    assert check.recomputed["max_abs"] == [0.0, 0.0]
    assert "from the base, the state of step 2" in check.message
    assert "5 digest(s) compared" in check.message  # the loaded base's agreement too
    assert _checks(report)["replay.environment"].recomputed["steps"] == 2
    settings = check.recomputed["settings"]
    assert settings["deterministic_algorithms"] is True
    assert settings["cublas_workspace_config"] == ":4096:8"
    assert settings["cuda_started_first"] is False
    assert (settings["matmul_tf32"], settings["cudnn_tf32"]) == (False, False)
    assert (settings["cudnn_deterministic"], settings["cudnn_benchmark"]) == (True, False)
    assert "padding_idx" in settings  # what the embedding's backward skipped, if anything
    assert torch.are_deterministic_algorithms_enabled() is before


def test_a_run_without_deterministic_is_replayed_with_nothing_set(
        trained: Trained, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    report = verify(trained.loose, store=trained.store_dir, replay=REPLAY)
    check = _checks(report)["train." + trained.loose[7:15] + ".replay.training"]
    # On the CPU the kernels are the same either way: still bit for bit.
    assert check.status == "passed", check.message
    settings = check.recomputed["settings"]
    assert settings["deterministic_algorithms"] is False
    assert settings["cublas_workspace_config"] is None
    assert settings["cudnn_deterministic"] is False


def test_only_a_deterministic_cuda_run_is_expected_bit_for_bit_on_cuda() -> None:
    def run(**params: Any) -> Run:
        return Run(id="blake3:" + "0" * 64, name="train.00000000", receipt={},
                   action={"params": params}, recipe="train")

    assert reproducible(run(device="cuda", world=1), "cuda")
    assert reproducible(run(device="cuda", world=2, deterministic=True), "cuda")
    assert not reproducible(run(device="cuda", world=1, deterministic=False), "cuda")
    assert reproducible(run(device="cpu", world=1, deterministic=False), "cpu")
    assert not reproducible(run(device="cuda", world=1), "cpu")
    assert not reproducible(run(device="cpu", world=4), "cpu")


def test_the_replay_process_environment_and_refusals(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert environment(True)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in environment(False)
    request = Request(
        model_dir=str(tmp_path / "absent"), state_file=str(tmp_path / "absent.safetensors"),
        groups=(), device="cpu", autocast=False, deterministic=True,
        gradient_checkpointing=False, world=1, micro_batch=1, clip=1.0, lr=1e-3,
        betas=(0.9, 0.95), eps=1e-8, updates=(Update(step=1, lr=1e-3, indices=(0,)),),
        documents={0: Document(input_ids=(1, 2), labels=(-100, 2), weight=1)}, compare={},
        seconds=None)
    assert Request.from_json(json.loads(json.dumps(request.to_json()))) == request
    with pytest.raises(ReplayStepError, match=r"absent\.safetensors is not a safetensors file"):
        compute([request], tmp_path)
    assert replaystep_main(["only-one"]) == 2
    # Started from a directory holding a checkout: its nscas/ must not shadow the package
    # (the replay process then reaches the same refusal, from inside).
    checkout = tmp_path / "checkout"
    (checkout / "nscas").mkdir(parents=True)
    (checkout / "nscas" / "__init__.py").write_text(
        'raise ImportError("a checkout\'s nscas/ shadowed the installed package")\n')
    monkeypatch.chdir(checkout)
    with pytest.raises(ReplayStepError, match=r"absent\.safetensors is not a safetensors file"):
        compute([request], tmp_path)


@pytest.mark.parametrize("which", ["plain", "two"])
def test_a_run_without_published_state_is_replayed_from_its_base(
        trained: Trained, which: str) -> None:
    # The state at step 0 is the run's own inputs and params: the base's weights, a fresh
    # AdamW and the seeded generator. One rank (no per-update digests: the agreements at 0
    # and 2 are compared) and two ranks (a digest per update), bit for bit.
    receipt = getattr(trained, which)
    report = verify(receipt, store=trained.store_dir, replay=REPLAY)
    check = _checks(report)["train." + receipt[7:15] + ".replay.training"]
    assert check.status == "passed", check.message
    assert check.recomputed["from"] == [0] and check.recomputed["replayed"] == [1, 2]
    assert check.recomputed["relative_l2"] == [0.0] and check.recomputed["max_abs"] == [0.0]
    assert f"{2 if which == 'plain' else 3} digest(s) compared" in check.message


def test_a_run_with_no_step_zero_agreement_nor_published_state_is_not_rechecked(
        trained: Trained, tmp_path: Path) -> None:
    forged = _forge(trained, tmp_path, swap=False, receipt=trained.plain, step=0,
                    key="event", value="dropped")
    check = _checks(verify(forged, store=trained.store_dir, replay=REPLAY))[
        f"train.{forged[7:15]}.replay.training"]
    assert check.status == "skipped" and check.needs == "model"
    assert "publish_state" in check.message and "step 0" in check.message


def _forge(trained: Trained, tmp: Path, *, swap: bool, receipt: str | None = None,
           step: int = 3, key: str = "parameters", value: Any = "0" * 64) -> str:
    """A consistent forgery of a train receipt (``trained.receipt``'s by default): with
    ``swap``, its final checkpoint swapped for one whose weights differ by 1e-3 in one value
    and every digest claim rewritten for it; without, rank 0's journal's ``key`` of ``step``
    set to ``value`` (rechained, a new head; a loss with the loss claims rewritten to match;
    ``event`` of step 0: its agreement entry made another event)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from nscas.models.checkpoints import put_checkpoint
    from nscas.recipes.common.digests import sha256_stream
    from nscas.recipes.train.exchange import parameter_digest
    from nscas.recipes.train.journal import entry_hash, loss_claims
    from nscas.store.protocol import tree_record

    store = trained.store
    target = trained.receipt if receipt is None else receipt
    receipt_record = trained.record(target)
    tree = trained.record(receipt_record["outputs"]["checkpoints"])["entries"]
    journal = trained.journal(target)
    outputs, claims = dict(receipt_record["outputs"]), dict(receipt_record["claims"])
    if swap:
        final = trained.record(tree["step-000004"]["id"])
        folder = tmp / "swapped"
        store.materialise(Digest.parse(final["files"]), folder)
        weights = load_file(folder / "model.safetensors")
        weights["model.norm.weight"][0] += 1e-3
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        digest = parameter_digest(model).hex()
        swapped = put_checkpoint(store, folder, step=4, parent=Digest.parse(final["parent"]))
        outputs["checkpoint"] = str(swapped)
        outputs["checkpoints"] = str(store.put_record(tree_record(store, {
            "step-000002": Digest.parse(tree["step-000002"]["id"]), "step-000004": swapped})))
        claims["parameter_digest"] = {**claims["parameter_digest"],
                                      "value": store.get_record(swapped)["params"]}
        claims["sha256_stream"] = {**claims["sha256_stream"], "value": sha256_stream(model)}
        for entry in journal:
            if entry.get("step") == 4:  # the step entry and the agreement at step 4
                entry["parameters"] = digest
    elif key == "event":
        for entry in journal:
            if entry.get("step") == step and entry.get("event") == "agreed":
                entry["event"] = value
    else:
        for entry in journal:
            if entry.get("step") == step and "event" not in entry:
                entry[key] = value
        if key == "loss":
            losses = [e["loss"] for e in journal if "event" not in e]
            for name, claimed in loss_claims(losses).items():
                claims[name] = {**claims[name], "value": claimed}
    prev, lines = None, []
    for entry in journal:
        entry["prev"] = prev
        entry["hash"] = prev = entry_hash(entry)
        lines.append(rfc8785.dumps(entry) + b"\n")
    record = trained.record(receipt_record["journals"][0])
    record.update(entries=str(store.put_bytes(b"".join(lines))), head=prev)
    forged = {**receipt_record, "outputs": outputs, "claims": claims,
              "journals": [str(store.put_record(record))]}
    return str(store.put_record(forged))


@pytest.mark.parametrize("swap", [True, False], ids=["swapped-checkpoint", "one-digest"])
def test_a_consistent_rewrite_only_a_replay_can_see_is_caught(
        trained: Trained, tmp_path: Path, swap: bool) -> None:
    forged = _forge(trained, tmp_path, swap=swap)
    name = f"train.{forged[7:15]}"
    plain = verify(forged, store=trained.store_dir)
    assert plain.ok, [(c.name, c.message) for c in plain.checks if c.status == "failed"]
    if not swap:  # the rewritten digest is one plain verification declares it cannot see
        assert _checks(plain)[f"{name}.journals.parameters.replay"].claimed["3"] == "0" * 64
    check = _checks(verify(forged, store=trained.store_dir, replay=REPLAY))[
        f"{name}.replay.training"]
    assert check.status == "failed"
    assert ("step 4: parameter digest" if swap else "step 3: parameter digest") in check.message


@pytest.mark.parametrize(("step", "key", "value", "words"), [
    (1, "parameters", "0" * 64, "step 1: parameter digest"),
    (2, "loss", 1.25, "step 2: loss"),
], ids=["digest-at-1", "loss-at-2"])
def test_a_rewrite_before_any_published_state_is_caught_from_the_base(
        trained: Trained, tmp_path: Path, step: int, key: str, value: Any, words: str) -> None:
    forged = _forge(trained, tmp_path, swap=False, step=step, key=key, value=value)
    name = f"train.{forged[7:15]}"
    plain = verify(forged, store=trained.store_dir)
    assert plain.ok, [(c.name, c.message) for c in plain.checks if c.status == "failed"]
    check = _checks(verify(forged, store=trained.store_dir, replay=REPLAY))[
        f"{name}.replay.training"]
    assert check.status == "failed"
    assert words in check.message, check.message


def test_a_bundle_without_weights_lists_the_training_replay_as_not_rechecked(
        trained: Trained) -> None:
    manifest = json.loads((trained.light / "manifest.json").read_bytes())
    state = trained.record(trained.record(trained.record(trained.record(trained.receipt)[
        "outputs"]["checkpoints"])["entries"]["step-000002"]["id"])["state"])["entries"]
    assert state["optimizer.safetensors"]["id"] in manifest["omitted"]
    paths = [p for p, e in manifest["objects"].items() if e["id"] == state["state.json"]["id"]]
    assert len(paths) == 1 and paths[0].startswith("states/") and paths[0].endswith(
        "/state.json"), paths
    report = verify(str(trained.light), replay=REPLAY)
    checks = _checks(report)
    check = checks["train." + trained.receipt[7:15] + ".replay.training"]
    assert check.status == "skipped" and check.needs == "weights"
    assert checks["integrity.omitted"].status == "skipped"
    assert checks["train." + trained.receipt[7:15] + ".state"].status == "passed"
    assert report.ok and not verify(str(trained.light), strict=True).ok


def test_the_command_replays_training_steps(trained: Trained) -> None:
    v = nscas_verify(trained.receipt, "--replay", "0", "--replay-steps", "1",
                     "--replay-seed", "3", store=trained.store_dir)
    assert v.code == 0, v.stderr
    check = v.check("train." + trained.receipt[7:15] + ".replay.training")
    assert check["status"] == "passed" and check["recomputed"]["replayed"] == [1, 3]
    refused = nscas_verify(trained.receipt, "--replay-steps", "1", store=trained.store_dir)
    assert refused.code == 2 and refused.stdout == ""


@pytest.mark.parametrize(("changes", "words"), [
    ({"publish_state": (3,)}, "publish_state"),
    ({"publish_state": (4, 2)}, "publish_state"),
    ({"publish_state": [2]}, "publish_state"),
    ({"parameter_digests": -1}, "parameter_digests"),
    ({"parameter_digests": True}, "parameter_digests"),
])
def test_bad_digest_and_state_params_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        TrainParams(steps=4, checkpoint_steps=(2, 4), **changes)


def test_a_batch_tokenised_otherwise_than_the_journal_says_is_named() -> None:
    from nscas.verifiers.replay.training import count_problems

    docs = {0: Document(input_ids=(1, 2, 3), labels=(-100, 2, 3), weight=8),
            1: Document(input_ids=(4, 5), labels=(-100, 5), weight=1)}
    updates = [Update(step=7, lr=1e-3, indices=(0, 1))]
    honest = {7: {"tokens": 5, "targets": 3, "weighted_targets": 17}}
    assert count_problems(updates, honest, docs) == []
    # One more input token than the replay's documents have (a trailing token, say): the
    # loss could still agree, the arithmetic would not.
    longer = {7: {**honest[7], "tokens": 6}}
    assert count_problems(updates, longer, docs) == [
        "step 7: its documents as tokenised here have tokens 5, the journal's 6"]
    reweighted = {7: {**honest[7], "weighted_targets": 10}}
    assert "weighted_targets 17, the journal's 10" in count_problems(updates, reweighted, docs)[0]


def test_a_replay_bound_of_zero_is_not_rechecked_not_a_crash(trained: Trained) -> None:
    """Every "not rechecked" path of the training replay builds its check (a time
    bound of 0 leaves every update unreplayed: skipped, needs a model run, with what was
    computed)."""
    options = ReplayOptions(count=0, seed=1, steps=2, time_limit=0.0)
    report = verify(trained.receipt, store=trained.store_dir, replay=options)
    check = _checks(report)["train." + trained.receipt[7:15] + ".replay.training"]
    assert check.status == "skipped" and check.needs == "model", check.message
    assert check.recomputed is not None and check.recomputed["replayed"] == []


def test_the_training_replay_loads_the_bundle_model_folder(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a bundle, the replay loads the model from ``models/<arm>/``, the folder a reader
    gives to ``from_pretrained``, and it reproduces the journal there too."""
    from nscas.bundle.exporting import export_bundle
    from nscas.verifiers.bundle import loading
    from nscas.verifiers.replay import models as replay

    export_bundle(trained.store, Digest.parse(trained.receipt), tmp_path / "bundle")
    loaded: list[Path] = []

    def spy(objects: Any, checkpoint: str) -> Path | None:
        folder = loading.model_folder(objects, checkpoint)
        loaded.append(folder) if folder is not None else None
        return folder

    monkeypatch.setattr(replay, "model_folder", spy)
    report = verify(str(tmp_path / "bundle"), strict=True, replay=REPLAY)
    check = _checks(report)["train." + trained.receipt[7:15] + ".replay.training"]
    assert check.status == "passed", check.message
    assert loaded and all(p.parent == tmp_path / "bundle" / "models" for p in loaded)
