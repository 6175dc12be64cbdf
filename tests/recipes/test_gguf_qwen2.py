"""``nscas import-gguf`` of a tiny qwen2 GGUF with Q4_K and Q6_K tensors, as the real
Qwen2.5-Coder-1.5B-Instruct Q4_K_M file is (``make qwen-1.5b``): every value of the FP32
checkpoint is gguf's own dequantisation of its tensor, the model loads with
AutoModelForCausalLM and generates as transformers' GGUF loader does, the turn end is the
template's ``<|im_end|>``, and verify passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from nscas import init_store, open_store
from nscas.cli.root import app
from nscas.objects.digests import Digest
from nscas.verifiers.verify import exit_code, verify
from tests.recipes.test_gguf_qwen2_fixtures import LAYERS, qwen2_parameters, write_qwen2_gguf

HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
            "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
"""qwen2's GGUF block tensors and their Hugging Face names (llama.cpp's convert_hf_to_gguf)."""


def hf_name(name: str) -> str:
    base, _, suffix = name.rpartition(".")
    if base == "token_embd":
        return "model.embed_tokens.weight"
    if base == "output":
        return "lm_head.weight"
    if base == "output_norm":
        return "model.norm.weight"
    _, layer, tensor = base.split(".")
    return f"model.layers.{layer}.{HF_NAMES[tensor]}.{suffix}"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("qwen2")
    path = write_qwen2_gguf(root / "tiny-qwen2.gguf")
    store = init_store(root / "project")
    store.close()
    ran = CliRunner().invoke(app, ["--store", str(store.root), "import-gguf", str(path),
                                   "--ref", "models/tiny-qwen2", "--json"], prog_name="nscas")
    assert ran.exit_code == 0, ran.stderr
    model_dir = root / "model"
    with open_store(store.root) as s:
        checkpoint = Digest.parse(json.loads(ran.stdout)["outputs"]["checkpoint"])
        s.materialise(Digest.parse(s.get_record(checkpoint)["files"]), model_dir)
    return {"path": path, "store": store.root, "out": json.loads(ran.stdout), "dir": model_dir}


def test_the_k_quants_are_converted_and_counted(imported: dict[str, Any]) -> None:
    out = imported["out"]
    assert out["architecture"] == "qwen2"
    assert out["quantisations"] == ["F32", "Q4_K", "Q6_K"]
    claims = out["claims"]
    assert claims["parameters"] == claims["gguf_parameters"] == qwen2_parameters()
    # 9 matrices and vectors and 3 biases a block, both embedding matrices, the final norm.
    assert claims["tensors"] == claims["gguf_tensors"] == 12 * LAYERS + 3


def test_every_value_is_ggufs_own_dequantisation(imported: dict[str, Any]) -> None:
    saved = load_file(imported["dir"] / "model.safetensors")
    reader = gguf.GGUFReader(imported["path"])
    kinds = {t.tensor_type.name for t in reader.tensors}
    assert {"Q4_K", "Q6_K"} <= kinds
    assert set(saved) == {hf_name(t.name) for t in reader.tensors}
    for tensor in reader.tensors:
        want = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        got = saved[hf_name(tensor.name)]
        assert got.dtype == np.float32, tensor.name
        assert np.array_equal(got, want.reshape(got.shape)), tensor.name
    # The hand-made blocks decode to weights of a trained model's size, not noise or zeros.
    q = saved["model.layers.0.self_attn.v_proj.weight"]  # a Q6_K tensor
    assert 0.001 < float(np.abs(q).mean()) < 0.1


def test_it_loads_generates_and_ends_a_turn_with_im_end(imported: dict[str, Any]) -> None:
    src: Path = imported["path"]
    model = AutoModelForCausalLM.from_pretrained(imported["dir"])
    tokenizer = AutoTokenizer.from_pretrained(imported["dir"])
    reference = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                     dtype=torch.float32)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not model.config.tie_word_embeddings
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                           add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)["input_ids"]
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    got = model.generate(prompt, **settings)
    assert got.shape[1] > prompt.shape[1]
    assert torch.equal(got, reference.generate(prompt, **settings))
    turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert imported["out"]["claims"]["end_of_turn"] == {"token": "<|im_end|>", "id": turn_end}


def test_verify_passes(imported: dict[str, Any]) -> None:
    report = verify("models/tiny-qwen2", store=imported["store"])
    assert exit_code(report) == 0, [(c.name, c.message) for c in report.checks
                                    if c.status != "passed"]
