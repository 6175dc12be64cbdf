"""A run killed after its first checkpoint resumes to bit-identical final parameters (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nscas.errors import RecipeError
from nscas.recipes.train.checkpoints import claim_output_dir, completed_checkpoints
from nscas.recipes.train.events import CheckpointReady
from nscas.recipes.train.journal import effective_steps, read_journal
from nscas.recipes.train.launch import run_training
from nscas.recipes.train.protocol import result_path
from tests.recipes.test_train_fixtures import THREADS, make_documents, make_spec, tiny  # noqa: F401

PARAMS = {"steps": 8, "batch": 4, "world": 2, "warmup": 2, "checkpoint_steps": (2,)}


class Interrupt(Exception):
    """Raised from on_checkpoint: the launcher then kills every rank mid-run."""


def _steps(journal: Path) -> list[dict]:
    return effective_steps(read_journal(journal).entries)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_parameters(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    torch.set_num_threads(1)
    root, tokenizer, base = tiny
    docs = make_documents(20, seed=9, lengths=(40, 90))
    whole = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="whole", **PARAMS)
    reference = run_training(whole, env=THREADS)

    broken = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="broken", **PARAMS)

    def interrupt(ready: CheckpointReady) -> None:
        if ready.step == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_training(broken, on_checkpoint=interrupt, env=THREADS)
    out = Path(broken.output_dir)
    # The kill landed between the first checkpoint and the end.
    assert [c.step for c in completed_checkpoints(out)] == [2]
    assert completed_checkpoints(out)[0].state_file.is_file()  # what the resume reads
    assert not result_path(out, 0).exists()

    seen: list[CheckpointReady] = []
    resumed = run_training(broken, on_checkpoint=seen.append, env=THREADS)
    assert [(c.step, c.resumed) for c in seen] == [(2, True), (8, False)]
    assert [c.step for c in resumed.checkpoints] == [2, 8]
    # One resume state at most, and none at the final step: nothing resumes a finished run.
    assert [c.state_file.exists() for c in completed_checkpoints(out)] == [False, False]

    want = load_file(reference.checkpoints[-1].hf_dir / "model.safetensors")
    got = load_file(resumed.checkpoints[-1].hf_dir / "model.safetensors")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[name], got[name]) for name in want)
    assert resumed.results[0].sha256_stream == reference.results[0].sha256_stream
    assert [r.parameter_blake3 for r in resumed.results] == [
        r.parameter_blake3 for r in reference.results
    ]

    for r_ref, r_new in zip(reference.results, resumed.results, strict=True):
        assert r_new.resumed_from == 2 and r_new.updates == 8
        entries = read_journal(Path(r_new.journal)).entries  # the chain still holds
        resumes = [e for e in entries if e.get("event") == "resume"]
        assert [(e["from_step"], e["rank"]) for e in resumes] == [(2, r_new.rank)]
        ref_steps, new_steps = _steps(Path(r_ref.journal)), _steps(Path(r_new.journal))
        assert [e["step"] for e in new_steps] == [1, 2, 3, 4, 5, 6, 7, 8]
        keys = ("loss", "grad_norm", "lr", "documents", "targets", "weighted_targets")
        assert [[e[k] for k in keys] for e in new_steps] == [[e[k] for k in keys] for e in ref_steps]
        assert r_new.targets == r_ref.targets and r_new.bytes_communicated == r_ref.bytes_communicated


@pytest.mark.slow
def test_a_run_killed_after_its_final_checkpoint_resumes_without_a_resume_state(
        tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    torch.set_num_threads(1)
    root, tokenizer, base = tiny
    docs = make_documents(20, seed=9, lengths=(40, 90))
    params = {**PARAMS, "world": 1}
    whole = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="whole-one", **params)
    reference = run_training(whole, env=THREADS)
    broken = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="broken-one", **params)

    def interrupt(ready: CheckpointReady) -> None:
        if ready.step == 8:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_training(broken, on_checkpoint=interrupt, env=THREADS)
    out = Path(broken.output_dir)
    final = completed_checkpoints(out)[-1]
    assert final.step == 8 and final.hf_dir.is_dir() and not final.state_file.exists()
    resumed = run_training(broken, env=THREADS)
    (result,) = resumed.results
    assert result.resumed_from == 8 and result.updates == 8
    assert result.parameter_blake3 == reference.results[0].parameter_blake3
    assert result.sha256_stream == reference.results[0].sha256_stream


def test_an_output_directory_of_another_run_is_refused(tmp_path: Path) -> None:
    assert claim_output_dir(tmp_path / "out", "a" * 64) is False
    assert claim_output_dir(tmp_path / "out", "a" * 64) is True
    assert json.loads((tmp_path / "out" / "run.json").read_text())["identity"] == "a" * 64
    with pytest.raises(RecipeError, match="holds another run"):
        claim_output_dir(tmp_path / "out", "b" * 64)


@pytest.mark.parametrize("padding", [None, "tokenizer", 5])
def test_a_checkpoint_loads_with_the_padding_idx_its_run_trained_with(
        tiny: tuple[Path, Path, Path], tmp_path: Path, padding: object) -> None:  # noqa: F811
    # transformers makes a loaded config's pad_token_id the embedding's padding_idx, whose row
    # then learns nothing from its occurrences as input: a checkpoint naming the tokenizer's pad
    # where the run's embedding had another (a base whose config named none) would resume and
    # replay with another backward pass than the run's.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nscas.recipes.train.checkpoints import write_checkpoint

    _root, tokenizer, base = tiny
    pad = AutoTokenizer.from_pretrained(tokenizer).pad_token_id
    assert pad is not None
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    trained_with = pad if padding == "tokenizer" else padding
    model.get_input_embeddings().padding_idx = trained_with
    model.config.pad_token_id = trained_with
    paths = write_checkpoint(tmp_path / "out", 1, model=model, tokenizer_dir=tokenizer,
                             state={})
    config = json.loads((paths.hf_dir / "config.json").read_text())
    assert config["pad_token_id"] == trained_with
    again = AutoModelForCausalLM.from_pretrained(paths.hf_dir, dtype=torch.float32)
    assert again.get_input_embeddings().padding_idx == trained_with
    generation = json.loads((paths.hf_dir / "generation_config.json").read_text())
    assert generation.get("pad_token_id") == pad  # generation pads with the tokenizer's


def test_a_new_checkpoint_leaves_one_resume_state_and_the_final_one_none(
        tiny: tuple[Path, Path, Path], tmp_path: Path) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM

    from nscas.recipes.train.checkpoints import write_checkpoint

    _root, tokenizer, base = tiny
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    out = tmp_path / "run"

    def states() -> list[int]:
        return [c.step for c in completed_checkpoints(out) if c.state_file.exists()]

    for step in (2, 4):
        write_checkpoint(out, step, model=model, tokenizer_dir=tokenizer, state={"x": step})
        assert states() == [step]  # the earlier one's went once this one was complete
    write_checkpoint(out, 8, model=model, tokenizer_dir=tokenizer, state=None)
    assert [c.step for c in completed_checkpoints(out)] == [2, 4, 8] and states() == []
