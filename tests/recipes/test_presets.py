"""Model presets: exact parameter counts, seeded determinism, the HF directory round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from nscas.errors import DestinationExists, InvalidInput
from nscas.recipes.common.digests import sha256_stream
from nscas.recipes.init.presets import (
    PRESETS,
    build_model,
    load_hf_dir,
    parameter_count,
    save_hf_dir,
)
from nscas.recipes.tokenizer.bpe import train_tokenizer

torch.set_num_threads(1)

VOCAB = 300
"""The size of the test tokenizer."""


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [f'{{"id":"K{i}","units":{i % 20}}} record number {i}' for i in range(200)]
    path = train_tokenizer(texts, vocab_size=300, out_dir=tmp_path_factory.mktemp("t") / "tok")
    assert len(AutoTokenizer.from_pretrained(path)) == VOCAB
    return path


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_smollm2_matches_the_published_architecture_on_meta() -> None:
    model = build_model("smollm2-1.7b", vocab_size=320, seed=0, meta=True)
    assert parameter_count(model) == (218, 1_711_376_384)
    assert next(model.parameters()).device.type == "meta"
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (49152, 2048, 24)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 32)
    assert config.intermediate_size == 8192 and config.rms_norm_eps == 1e-5
    assert config.rope_parameters["rope_theta"] == 130000.0
    assert config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # the largest tokenizer that fits is the published vocabulary itself
    build_model("smollm2-1.7b", vocab_size=49152, seed=0, meta=True)
    with pytest.raises(InvalidInput, match="49152"):
        build_model("smollm2-1.7b", vocab_size=49153, seed=0, meta=True)


def test_tiny_and_small_take_their_vocabulary_from_the_tokenizer() -> None:
    tiny = build_model("llama-tiny", vocab_size=2048, seed=0, meta=True)
    # embedding 2048*128 + 3 layers * (4*128*128 + 3*128*512 + 2*128) + final norm 128
    assert parameter_count(tiny) == (3 * 9 + 2, 1_049_472)
    assert tiny.config.vocab_size == 2048
    assert build_model("llama-tiny", vocab_size=300, seed=0, meta=True).config.vocab_size == 300
    for vocab in (2048, 49152):
        _, count = parameter_count(build_model("llama-small", vocab_size=vocab, seed=0, meta=True))
        assert 30_000_000 <= count <= 60_000_000, (vocab, count)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as info:
        build_model("llama-huge", vocab_size=300, seed=0)
    for name in PRESETS:
        assert name in str(info.value)
    assert "llama-huge" in str(info.value)


def test_seeded_initialisation_is_bit_identical() -> None:
    a = build_model("llama-tiny", vocab_size=300, seed=11)
    b = build_model("llama-tiny", vocab_size=300, seed=11)
    c = build_model("llama-tiny", vocab_size=300, seed=12)
    assert same_weights(a, b) and not same_weights(a, c)
    assert sha256_stream(a) == sha256_stream(b) != sha256_stream(c)
    assert next(a.parameters()).dtype == torch.float32
    # the model's own init ran: N(0, 0.02) matrices, unit norms
    assert abs(a.model.embed_tokens.weight.std().item() - 0.02) < 0.002
    assert torch.equal(a.model.norm.weight, torch.ones(128))
    # another process (other RNG and hash state) builds the same weights
    code = ("import torch; torch.set_num_threads(1)\n"
            "from nscas.recipes.init.presets import build_model\n"
            "from nscas.recipes.common.digests import sha256_stream\n"
            "print(sha256_stream(build_model('llama-tiny', vocab_size=300, seed=11)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == sha256_stream(a)


def test_save_and_load_round_trip(tok_dir: Path, tmp_path: Path) -> None:
    model = build_model("llama-tiny", vocab_size=VOCAB, seed=3)
    out = save_hf_dir(model, tok_dir, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= names
    for path in tok_dir.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes()

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == VOCAB
    assert (config["eos_token_id"], config["pad_token_id"]) == (2, 0)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2 and generation.get("do_sample", False) is False

    loaded, tokenizer = load_hf_dir(out)
    assert same_weights(model, loaded)
    assert sha256_stream(loaded) == sha256_stream(model)
    assert next(loaded.parameters()).dtype == torch.float32
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert tokenizer.eos_token_id == 2 and len(tokenizer) == VOCAB
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, loaded.eval()(ids).logits)

    # saving the same model again writes the same weight bytes
    again = save_hf_dir(model, tok_dir, tmp_path / "hf2")
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_save_refuses_bad_destinations_and_vocabularies(tok_dir: Path, tmp_path: Path) -> None:
    model = build_model("llama-tiny", vocab_size=VOCAB, seed=3)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    with pytest.raises(DestinationExists):
        save_hf_dir(model, tok_dir, taken)
    small = build_model("llama-tiny", vocab_size=VOCAB - 1, seed=3)
    with pytest.raises(InvalidInput, match=f"{VOCAB} entries"):
        save_hf_dir(small, tok_dir, tmp_path / "small")
    assert not (tmp_path / "small").exists()


def test_load_refuses_a_directory_without_weights(tok_dir: Path, tmp_path: Path) -> None:
    out = save_hf_dir(build_model("llama-tiny", vocab_size=VOCAB, seed=3), tok_dir, tmp_path / "hf")
    (out / "model.safetensors").unlink()
    with pytest.raises(InvalidInput, match=r"missing model\.safetensors"):
        load_hf_dir(out)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_hf_dir(tmp_path / "nowhere")
    with pytest.raises(InvalidInput, match=r"missing config\.json, model\.safetensors"):
        load_hf_dir(tok_dir)
