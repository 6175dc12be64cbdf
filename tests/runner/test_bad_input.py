"""Bad recipe and pipeline files: one ConfigError line naming the key and the file, no writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nscas.errors import ConfigError
from nscas.runs.runner import run_file
from nscas.store.writer import Store
from tests.runner.helpers import (
    INIT_STEP,
    PIPELINE,
    PREPARE_RECIPE,
    PREPARE_STEP,
    TOKENIZER_STEP,
    snapshot,
    write,
)

ABSENT = "blake3:" + "ab" * 32
"""A well-formed ID that no test store holds."""

CASES: dict[str, tuple[str, list[str]]] = {
    "malformed-toml": (
        'recipe = "prepare"\n[params\nseed = 1\n',
        ["malformed TOML", "line 2"]),
    "unknown-top-level-key": (
        'recipe = "prepare"\nparam = { seed = 1 }\n',
        ["unknown key(s) in the recipe file: param"]),
    "unknown-top-level-key-in-pipeline": (
        "extra = 1\n" + PIPELINE,
        ["unknown top-level key(s) in a pipeline file: extra"]),
    "unknown-step-key": (
        PIPELINE.replace('name = "tokenizer"', 'name = "tokenizer"\nparameters = {}'),
        ["unknown key(s) in [[step]] #2: parameters"]),
    "duplicate-step-name": (
        PIPELINE.replace('name = "init"', 'name = "tokenizer"'),
        ["step name(s) used twice: tokenizer"]),
    "unknown-param-key": (
        PREPARE_RECIPE + 'colour = "red"\n',
        ["unknown key(s) in params: colour", "known: counts, grounded_weight"]),
    "unknown-nested-param-key": (
        'recipe = "prepare"\n[params]\ncounts = { tests = 3 }\n',
        ["unknown key(s) in params.counts: tests"]),
    "wrong-param-type": (
        'recipe = "prepare"\n[params]\nseed = "seven"\n',
        ["params.seed must be an integer, got 'seven'"]),
    "wrong-nested-param-type": (
        'recipe = "prepare"\n[params]\ncounts = { test = 1.5 }\n',
        ["params.counts.test must be an integer, got 1.5"]),
    "wrong-param-type-in-pipeline": (
        PIPELINE.replace("vocab_size = 512", 'vocab_size = "big"'),
        ["step 'tokenizer': params.vocab_size must be an integer, got 'big'"]),
    "unknown-recipe": (
        'recipe = "nope"\n',
        ["recipe: unknown recipe 'nope'", "known: ", "prepare"]),
    "unknown-recipe-in-pipeline": (
        PIPELINE.replace('recipe = "init"', 'recipe = "initialise"'),
        ["step 'init': recipe: unknown recipe 'initialise'"]),
    "unknown-input": (
        'recipe = "prepare"\n[inputs]\nwording = "coop/wordings"\n',
        ["inputs.wording: recipe 'prepare' has no input 'wording'", "retention"]),
    "missing-required-input": (
        'recipe = "tokenizer"\n',
        ["inputs.prepared is missing: recipe 'tokenizer' requires it"]),
    "missing-required-input-in-pipeline": (
        PREPARE_STEP + TOKENIZER_STEP + INIT_STEP.replace(
            'inputs = { tokenizer = "step.tokenizer.tokenizer" }\n', ""),
        ["step 'init': inputs.tokenizer is missing"]),
    "input-id-not-in-store": (
        f'recipe = "tokenizer"\n[inputs]\nprepared = "{ABSENT}"\n',
        ["inputs.prepared: not found: " + ABSENT]),
    "input-ref-not-in-store": (
        'recipe = "tokenizer"\n[inputs]\nprepared = "coop/nothing"\n',
        ["inputs.prepared: not found: ref 'coop/nothing'"]),
    "input-of-the-wrong-kind": (
        'recipe = "tokenizer"\n[inputs]\nprepared = "{blob}"\n',
        ["inputs.prepared must be a commitment/1, but {blob} is a blob"]),
    "later-step-input-not-in-store": (  # found before the first step runs
        PREPARE_STEP + TOKENIZER_STEP + INIT_STEP.replace(
            "step.tokenizer.tokenizer", "coop/no-tokenizer"),
        ["step 'init': inputs.tokenizer: not found: ref 'coop/no-tokenizer'"]),
    "unknown-output": (
        'recipe = "prepare"\n[outputs]\npreparation = "coop/p"\n',
        ["outputs.preparation: recipe 'prepare' has no output 'preparation'"]),
    "bad-output-ref-name": (
        'recipe = "prepare"\n[outputs]\nprepared = "coop/bad name"\n',
        ["outputs.prepared: ", "coop/bad name"]),
    "one-ref-two-outputs": (
        'recipe = "prepare"\n[outputs]\ntest = "coop/x"\ntrain = "coop/x"\n',
        ["outputs.train: ref 'coop/x' is already the target of outputs.test"]),
    "step-reference-to-unknown-step": (
        PREPARE_STEP + TOKENIZER_STEP.replace("step.prepare.", "step.prep."),
        ["step 'tokenizer': inputs.prepared names unknown step 'prep'"]),
    "step-reference-to-unknown-output": (
        PREPARE_STEP + TOKENIZER_STEP.replace("step.prepare.prepared", "step.prepare.prepped"),
        ["step 'tokenizer': inputs.prepared: step 'prepare' has no output 'prepped'"]),
    "step-reference-in-a-recipe-file": (
        'recipe = "tokenizer"\n[inputs]\nprepared = "step.prepare.prepared"\n',
        ["inputs.prepared names step 'prepare', but the file has no such step"]),
    "dependency-cycle": (
        TOKENIZER_STEP.replace('name = "tokenizer"', 'name = "a"').replace(
            "step.prepare.prepared", "step.b.tokenizer")
        + TOKENIZER_STEP.replace('name = "tokenizer"', 'name = "b"').replace(
            "step.prepare.prepared", "step.a.tokenizer")
        + PREPARE_STEP,
        ["steps depend on each other in a cycle: a -> b -> a"]),
    "self-dependency": (
        TOKENIZER_STEP.replace("step.prepare.prepared", "step.tokenizer.tokenizer"),
        ["cycle: tokenizer -> tokenizer"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_names_the_key_and_the_file_and_writes_nothing(
        store: Store, tmp_path: Path, case: str) -> None:
    blob = store.put_bytes(b"just bytes")
    text, fragments = CASES[case]
    path = write(tmp_path, f"{case}.toml", text.replace("{blob}", str(blob)))
    before = snapshot(store)
    with pytest.raises(ConfigError) as err:
        run_file(store, path)
    message = err.value.message
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    for fragment in fragments:
        assert fragment.replace("{blob}", str(blob)) in message, message
    assert err.value.exit_code == 2
    assert snapshot(store) == before


def test_a_missing_file_is_a_config_error(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        run_file(store, tmp_path / "absent.toml")
