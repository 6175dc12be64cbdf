"""``nscas import-hf``: an HF directory in, a checkpoint out that loads with equal weights."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from typer.testing import Result

from nscas.cli.import_hf import SOURCE, check_hf_dir, import_hf
from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.store.writer import Store
from tests.runner.helpers import snapshot

torch.set_num_threads(1)

Nscas = Callable[..., Result]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved by ``save_pretrained`` (seeded, so the test sees fixed weights)."""
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.save_pretrained(out)
    return out


def test_import_hf_stores_a_checkpoint_that_loads_with_equal_weights(
        nscas: Nscas, home: Path, hf_dir: Path) -> None:
    result = nscas("--store", home, "import-hf", hf_dir, "--ref", "models/tiny", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"checkpoint", "params", "files", "model_type", "ref"}
    assert out["model_type"] == "llama" and out["ref"] == "models/tiny"
    with Store(home / ".nscas") as store:
        checkpoint = Digest.parse(out["checkpoint"])
        assert store.ref_get("models/tiny") == checkpoint
        record = store.get_record(checkpoint)
        assert record == {"nscas": "checkpoint/1", "files": out["files"], "params": out["params"],
                          "step": 0, "parent": None, "source": SOURCE}
        files = store.get_record(Digest.parse(record["files"]))["entries"]
        assert set(files) == {p.name for p in hf_dir.iterdir()}
        store.materialise(Digest.parse(record["files"]), home / "restored")
    original = AutoModelForCausalLM.from_pretrained(hf_dir)
    restored = AutoModelForCausalLM.from_pretrained(home / "restored")
    a, b = original.state_dict(), restored.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    again = nscas("--store", home, "import-hf", hf_dir, "--json")  # idempotent
    assert json.loads(again.stdout)["checkpoint"] == out["checkpoint"]


def test_import_hf_plain_output(nscas: Nscas, home: Path, hf_dir: Path) -> None:
    result = nscas("--store", home, "import-hf", hf_dir, "--ref", "models/tiny")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["checkpoint:", "params:", "files:",
                                                       "model_type:"]
    checkpoint = lines[0].split()[1]
    assert lines[4] == f"models/tiny -> {checkpoint}"


def test_a_linked_snapshot_imports_as_the_same_checkpoint(
        store: Store, hf_dir: Path, tmp_path: Path) -> None:
    """The HF cache keeps snapshots as links into a blob folder; they import like the files."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshot"
    shutil.copytree(hf_dir, blobs)
    snap.mkdir()
    for f in blobs.iterdir():
        os.symlink(os.path.relpath(f, snap), snap / f.name)
    linked = import_hf(store, snap)
    direct = import_hf(store, hf_dir)
    assert linked == direct
    assert all(p.is_symlink() for p in snap.iterdir())  # the source is left as it was


def broken(hf_dir: Path, tmp_path: Path, case: str) -> Path:
    d = tmp_path / case
    shutil.copytree(hf_dir, d)
    if case == "no-weights":
        (d / "model.safetensors").unlink()
    elif case == "bin-weights-only":
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
    elif case == "no-config":
        (d / "config.json").unlink()
    elif case == "config-not-json":
        (d / "config.json").write_text('{"model_type": "llama",')
    elif case == "config-not-object":
        (d / "config.json").write_text("[1, 2]")
    elif case == "config-without-model-type":
        (d / "config.json").write_text('{"hidden_size": 32}')
    elif case == "index-names-missing-shard":
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {},
                        "weight_map": {"lm_head.weight": "model-00002.safetensors"}}))
    elif case == "not-a-directory":
        d = d / "config.json"
    return d


BROKEN = {
    "no-weights": "holds no *.safetensors weights",
    "bin-weights-only": "holds no *.safetensors weights (found pytorch_model.bin; save it again "
                        "with safe_serialization=True)",
    "no-config": "has no config.json; not a Hugging Face model directory",
    "config-not-json": "config.json is broken: not JSON",
    "config-not-object": "config.json is broken: expected a JSON object",
    "config-without-model-type": "config.json is broken: it has no 'model_type' string",
    "index-names-missing-shard": "names weight files that are not there: "
                                 "['model-00002.safetensors']",
    "not-a-directory": "is not a directory",
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_not_a_model_directory_exits_2_and_stores_nothing(
        nscas: Nscas, home: Path, hf_dir: Path, tmp_path: Path, case: str) -> None:
    d = broken(hf_dir, tmp_path, case)
    with pytest.raises(InvalidInput, match="^" + str(d).replace(".", r"\.")):
        check_hf_dir(d)
    with Store(home / ".nscas") as store:
        before = snapshot(store)
    result = nscas("--store", home, "import-hf", d, "--ref", "models/x")
    assert result.exit_code == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"nscas: error: {d}") and BROKEN[case] in line, line
    with Store(home / ".nscas") as store:
        assert snapshot(store) == before


def test_bad_ref_name_is_refused_before_storing(nscas: Nscas, home: Path, hf_dir: Path) -> None:
    result = nscas("--store", home, "import-hf", hf_dir, "--ref", "bad name")
    assert result.exit_code == 2 and "invalid ref name 'bad name'" in result.stderr
    with Store(home / ".nscas") as store:
        assert store.counts()["objects"] == 0


def test_import_hf_help_has_an_example(nscas: Nscas) -> None:
    result = nscas("import-hf", "--help")
    assert result.exit_code == 0 and "Example: nscas import-hf" in result.stdout
