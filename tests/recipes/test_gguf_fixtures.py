"""A tiny Llama GGUF file, written here with the ``gguf`` package: two layers, 64 wide, F32
tensors and two Q8_0 ones, a byte-level BPE vocabulary with ChatML special tokens and a chat
template in its metadata, as llama.cpp writes them. Imported by the other ``test_gguf_*`` files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, LAYERS, FFN, KV = 64, 2, 128, 32
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("h e", "l l", "he ll", "o r")


def byte_level_vocabulary() -> tuple[list[str], list[int]]:
    """The tiny files' tokens and token types: the 256 byte tokens as GPT-2 spells them, one
    token per merge (normal, type 1), then the ChatML special tokens (control, type 3)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    return tokens + list(SPECIALS), types


def write_gguf(path: Path, *, template: str | None = CHATML, eos: str = "<|im_start|>",
               architecture: str = "llama", tokenizer: bool = True, seed: int = 0,
               extra_tensor: str | None = None) -> Path:
    """Write the tiny model to ``path``. ``eos`` is the token the file names as eos (the
    issue's GGUF named ``<|im_start|>``, not the template's turn end)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    tokens, types = byte_level_vocabulary()
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(16)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(list(MERGES))
        writer.add_bos_token_id(tokens.index("<|im_start|>"))
        writer.add_eos_token_id(tokens.index(eos))
        if template is not None:
            writer.add_chat_template(template)
    rng = np.random.default_rng(seed)

    def tensor(name: str, shape: tuple[int, ...], *, q8: bool = False) -> None:
        data = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if q8:
            packed = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, packed, raw_shape=packed.shape,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)

    tensor("token_embd.weight", (len(tokens), HIDDEN))
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", (HIDDEN,))
        tensor(f"blk.{i}.ffn_norm.weight", (HIDDEN,))
        tensor(f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), q8=True)
        tensor(f"blk.{i}.attn_k.weight", (KV, HIDDEN))
        tensor(f"blk.{i}.attn_v.weight", (KV, HIDDEN))
        tensor(f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN))
        tensor(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), q8=True)
        tensor(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN))
        tensor(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN))
    tensor("output_norm.weight", (HIDDEN,))
    if extra_tensor is not None:
        tensor(extra_tensor, (8,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def parameters() -> int:
    """The elements of the tiny model's tensors (what its checkpoint must hold)."""
    vocab = 256 + len(MERGES) + len(SPECIALS)
    layer = 2 * HIDDEN + 2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * FFN * HIDDEN
    return vocab * HIDDEN + LAYERS * layer + HIDDEN
