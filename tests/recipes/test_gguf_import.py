"""``nscas import-gguf`` and recipe ``convert-gguf`` on a tiny Llama GGUF written by the test:
the file is stored as it is, the checkpoint links it, the weights are transformers' own
dequantisation in FP32, a rerun is identical, verify passes, and bad input writes nothing."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from nscas import Store, init_store, open_store
from nscas.cli.root import app
from nscas.objects.digests import Digest
from nscas.verifiers.verify import exit_code, verify
from tests.recipes.test_gguf_fixtures import parameters, write_gguf


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def nscas(store_dir: Path, *args: str) -> Ran:
    r = CliRunner().invoke(app, ["--store", str(store_dir), *args], prog_name="nscas")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Ran(code=r.exit_code, stdout=r.stdout, stderr=r.stderr)


def object_count(store_dir: Path) -> int:
    with sqlite3.connect(store_dir / "nscas.db") as db:
        return db.execute("SELECT count(*) FROM objects").fetchone()[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    root: Path
    store_dir: Path
    gguf_path: Path
    out: dict[str, Any]

    def store(self) -> Store:
        return open_store(self.store_dir)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    root = tmp_path_factory.mktemp("gguf")
    path = write_gguf(root / "tiny.gguf")
    store = init_store(root / "project")
    store.close()
    ran = nscas(store.root, "import-gguf", str(path), "--ref", "models/tiny", "--json")
    assert ran.code == 0, ran.stderr
    return Imported(root=root, store_dir=store.root, gguf_path=path, out=ran.json())


def test_the_file_is_stored_as_it_is_and_the_checkpoint_links_it(imported: Imported) -> None:
    out = imported.out
    data = imported.gguf_path.read_bytes()
    assert out["gguf"] == str(Digest.of(data))
    with imported.store() as store:
        assert store.get_bytes(Digest.parse(out["gguf"])) == data
        checkpoint = Digest.parse(out["outputs"]["checkpoint"])
        record = store.get_record(checkpoint)
        assert (record["gguf"], record["source"], record["step"], record["parent"]) == (
            out["gguf"], "gguf", 0, None)
        assert store.ref_get("models/tiny") == checkpoint
        receipt = store.get_record(Digest.parse(out["receipt"]))
        action = store.get_record(Digest.parse(receipt["action"]))
        assert action["recipe"] == "convert-gguf@1"
        assert action["inputs"] == {"gguf": out["gguf"]}
        assert action["params"] == {"dtype": "float32"}
        entries = store.get_record(Digest.parse(record["files"]))["entries"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(entries)
    assert out["quantisations"] == ["F32", "Q8_0"]
    claims = out["claims"]
    assert claims["parameters"] == claims["gguf_parameters"] == parameters()
    assert claims["gguf_sha256"] == hashlib.sha256(data).hexdigest()


def test_the_weights_are_transformers_dequantisation_in_fp32(imported: Imported,
                                                              tmp_path: Path) -> None:
    src = imported.gguf_path
    reference = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                     dtype=torch.float32)
    gguf_tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    with imported.store() as store:
        files = store.get_record(Digest.parse(imported.out["outputs"]["checkpoint"]))["files"]
        store.materialise(Digest.parse(files), tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert "quantization_config" not in config  # a plain model, loadable without the file
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    got, want = model.state_dict(), reference.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], tensor), name
    text = "hello world <|im_start|>user\nhi<|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == gguf_tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = torch.tensor([ids])
    assert torch.equal(model(batch).logits, reference(batch).logits)
    # The file names <|im_start|> its eos; the turn end comes from the template.
    assert tokenizer.eos_token == "<|im_start|>"
    assert imported.out["claims"]["end_of_turn"] == {
        "token": "<|im_end|>", "id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert tokenizer.model_max_length == config["max_position_embeddings"]


def test_importing_again_is_cached_and_a_rerun_is_identical(imported: Imported) -> None:
    again = nscas(imported.store_dir, "import-gguf", str(imported.gguf_path), "--json")
    assert again.code == 0, again.stderr
    assert again.json()["cached"] is True
    assert again.json()["receipt"] == imported.out["receipt"]
    rerun = nscas(imported.store_dir, "import-gguf", str(imported.gguf_path), "--rerun", "--json")
    assert rerun.code == 0, rerun.stderr
    body = rerun.json()
    assert body["cached"] is False and body["receipt"] != imported.out["receipt"]
    assert body["verdicts"]["checkpoint"]["status"] == "identical"
    assert body["outputs"] == imported.out["outputs"]


def test_verify_passes_on_the_ref_and_the_receipt(imported: Imported) -> None:
    report = verify("models/tiny", store=imported.store_dir)
    assert exit_code(report) == 0, [(c.name, c.message) for c in report.checks
                                    if c.status != "passed"]
    short = imported.out["receipt"][7:15]
    names = {c.name for c in report.checks}
    assert {f"convert-gguf.{short}.checkpoint", f"convert-gguf.{short}.gguf.parameters",
            f"convert-gguf.{short}.claims.gguf_sha256",
            f"convert-gguf.{short}.claims.end_of_turn"} <= names


def test_lineage_shows_the_checkpoint_derives_from_the_file(imported: Imported) -> None:
    ran = nscas(imported.store_dir, "lineage", "models/tiny", "--format", "json")
    assert ran.code == 0, ran.stderr
    assert imported.out["gguf"] in ran.stdout


@pytest.mark.parametrize(("case", "message"), [
    ("text", "is not a GGUF file"),
    ("missing", "cannot read"),
    ("architecture", "is not one transformers converts"),
    ("no-tokenizer", "holds no tokenizer"),
    ("bad-ref", "ref"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, case: str,
                                                         message: str) -> None:
    store = init_store(tmp_path / "project")
    store.close()
    path = tmp_path / "in.gguf"
    args = []
    if case == "text":
        path.write_text("not a model\n")
    elif case == "architecture":
        write_gguf(path, architecture="nosucharch")
    elif case == "no-tokenizer":
        write_gguf(path, tokenizer=False)
    elif case == "bad-ref":
        write_gguf(path)
        args = ["--ref", "bad..ref"]
    before = object_count(store.root)
    ran = nscas(store.root, "import-gguf", str(path), *args)
    assert ran.code == 2, (ran.stdout, ran.stderr)
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nscas: error: "), ran.stderr
    assert message in lines[0]
    assert "Traceback" not in ran.stderr
    assert object_count(store.root) == before


def test_a_template_without_one_end_of_turn_token_fails_the_conversion(tmp_path: Path) -> None:
    store = init_store(tmp_path / "project")
    store.close()
    path = write_gguf(tmp_path / "m.gguf", template=(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"))
    ran = nscas(store.root, "import-gguf", str(path), "--ref", "models/x")
    assert ran.code == 1
    assert "chat template: nothing closes an assistant turn" in ran.stderr
    with open_store(store.root) as s:
        assert s.ref_get("models/x") is None
