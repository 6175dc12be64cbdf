"""Recipe ``init`` through the runner: presets, determinism, the parameter digest, loading."""

from __future__ import annotations

import hashlib
import json
import struct
import typing
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
import rfc8785
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nscas.errors import ConfigError
from nscas.objects.digests import Digest
from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store, init_store
from tests.runner.helpers import PIPELINE, snapshot, write

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, StepResult]]]:
    directory = tmp_path_factory.mktemp("init")
    store = init_store(directory)
    results = run_file(store, write(directory, "p.toml", PIPELINE))
    yield store, {r.step: r for r in results}
    store.close()


@pytest.fixture(scope="module")
def materialised(home: tuple[Store, dict[str, StepResult]],
                 tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model directory, tokenizer directory) as the store writes them back."""
    store, steps = home
    out = tmp_path_factory.mktemp("out")
    checkpoint = store.get_record(steps["init"].outputs["checkpoint"])
    store.materialise(Digest.parse(checkpoint["files"]), out / "model")
    store.materialise(steps["tokenizer"].outputs["tokenizer"], out / "tokenizer")
    return out / "model", out / "tokenizer"


def params_digest(path: Path) -> str:
    """The params/1 ID of a safetensors file, rebuilt from docs/format.md §4 without nscas."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start:base + end]
        tensors[name] = {"dtype": info["dtype"], "shape": info["shape"],
                         "data": "blake3:" + blake3.blake3(raw).hexdigest()}
    record = rfc8785.dumps({"nscas": "params/1", "tensors": tensors})
    return "blake3:" + blake3.blake3(record).hexdigest()


def test_checkpoint_record_and_claims(home: tuple[Store, dict[str, StepResult]]) -> None:
    store, steps = home
    init = steps["init"]
    record = store.get_record(init.outputs["checkpoint"])
    assert (record["step"], record["parent"], record["preset"], record["seed"]) == (
        0, None, "llama-tiny", 0)
    assert init.claims["parameter_digest"] == record["params"]
    params = store.get_record(Digest.parse(record["params"]))
    assert init.claims["tensors"] == len(params["tensors"])
    files = store.get_record(Digest.parse(record["files"]))["entries"]
    assert {"config.json", "model.safetensors"} <= set(files)


def test_params_digest_matches_the_materialised_weights(
        home: tuple[Store, dict[str, StepResult]], materialised: tuple[Path, Path]) -> None:
    store, steps = home
    record = store.get_record(steps["init"].outputs["checkpoint"])
    model_dir, _ = materialised
    assert params_digest(model_dir / "model.safetensors") == record["params"]


def test_the_checkpoint_loads_with_transformers(
        home: tuple[Store, dict[str, StepResult]], materialised: tuple[Path, Path]) -> None:
    _, steps = home
    model_dir, tok_dir = materialised
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer) == steps["tokenizer"].claims["vocab_size"]
    assert sum(p.numel() for p in model.parameters()) == steps["init"].claims["parameters"]
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode() + b"\0" + str(tuple(param.shape)).encode() + b"\0")
        digest.update(param.detach().contiguous().numpy().tobytes())
    assert digest.hexdigest() == steps["init"].claims["sha256_stream"]
    ids = tokenizer('{"city":"Oslo","units":3}')["input_ids"]
    assert tokenizer.decode(ids) == '{"city":"Oslo","units":3}'
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))


def test_same_inputs_give_the_same_checkpoint_in_another_store(
        home: tuple[Store, dict[str, StepResult]], materialised: tuple[Path, Path],
        tmp_path: Path) -> None:
    _, steps = home
    other = init_store(tmp_path)
    try:
        tokenizer = other.put_tree(materialised[1])
        assert tokenizer == steps["tokenizer"].outputs["tokenizer"]
        path = write(tmp_path, "init.toml", f"""
recipe = "init"
inputs = {{ tokenizer = "{tokenizer}" }}
params = {{ preset = "llama-tiny", seed = 0 }}
""")
        [again] = run_file(other, path)
        assert not again.cached
        assert again.action == steps["init"].action
        assert again.outputs == steps["init"].outputs
        assert again.claims == steps["init"].claims
    finally:
        other.close()


def test_another_seed_gives_other_weights(
        home: tuple[Store, dict[str, StepResult]], tmp_path: Path) -> None:
    store, steps = home
    tokenizer = steps["tokenizer"].outputs["tokenizer"]
    path = write(tmp_path, "init.toml", f'recipe = "init"\ninputs = {{ tokenizer = "{tokenizer}" }}'
                                        '\nparams = { seed = 1 }\n')
    [seeded] = run_file(store, path)
    assert seeded.claims["parameter_digest"] != steps["init"].claims["parameter_digest"]
    assert seeded.claims["parameters"] == steps["init"].claims["parameters"]


def test_unknown_preset_is_refused_before_running(
        home: tuple[Store, dict[str, StepResult]], tmp_path: Path) -> None:
    store, steps = home
    tokenizer = steps["tokenizer"].outputs["tokenizer"]
    path = write(tmp_path, "init.toml", f'recipe = "init"\ninputs = {{ tokenizer = "{tokenizer}" }}'
                                        '\nparams = { preset = "llama-huge" }\n')
    before = snapshot(store)
    with pytest.raises(ConfigError) as err:
        run_file(store, path)
    assert err.value.message == (f"{path}: params.preset must be one of 'llama-tiny', "
                                 "'llama-small', 'smollm2-1.7b', got 'llama-huge'")
    assert snapshot(store) == before


def test_preset_names_in_params_match_the_presets() -> None:
    from nscas.recipes.init.presets import PRESETS
    from nscas.recipes.init.recipe import InitParams

    hint = typing.get_type_hints(InitParams)["preset"]
    assert set(typing.get_args(hint)) == set(PRESETS)
