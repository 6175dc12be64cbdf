"""A tiny qwen2 GGUF file laid out as a Q4_K_M one: two blocks, 256 wide, Q4_K and Q6_K
matrices, F32 norms and attention biases, an untied output matrix, a byte-level BPE vocabulary
with Qwen's special tokens and a ChatML template that closes a turn with ``<|im_end|>``.

gguf 0.19 dequantises Q4_K and Q6_K but cannot quantise to them, so their blocks are made
here from the format (ggml's block_q4_K and block_q6_K): random bytes, which are all valid
codes and scales, with the blocks' FP16 super-scales set small and finite. Imported by the
other ``test_gguf_qwen2*`` files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.recipes.test_gguf_fixtures import CHATML, MERGES, SPECIALS, byte_level_vocabulary

HIDDEN, LAYERS, FFN, HEADS, KV_HEADS = 256, 2, 512, 4, 2
KV = HIDDEN // HEADS * KV_HEADS
VOCAB = 256 + len(MERGES) + len(SPECIALS)
QK_K = 256
BLOCK_BYTES = {"Q4_K": 2 + 2 + 12 + QK_K // 2, "Q6_K": QK_K // 2 + QK_K // 4 + QK_K // 16 + 2}
"""ggml's block sizes: Q4_K is d, dmin (FP16), 12 bytes of 6-bit scales and mins, 128 bytes of
4-bit codes; Q6_K is 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d (FP16)."""


def k_blocks(kind: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` x ``columns`` values as ``kind`` blocks (uint8, one row of blocks per row)."""
    import gguf

    assert columns % QK_K == 0
    blocks = rng.integers(0, 256, size=(rows, columns // QK_K, BLOCK_BYTES[kind]), dtype=np.uint8)
    # Super-scales such that codes times sub-block scales stay within about 0.1, as trained
    # weights do (Q4_K: 4-bit codes times 6-bit scales; Q6_K: 6-bit codes times int8 scales).
    size = 1e-4 if kind == "Q4_K" else 2e-5
    scale = (rng.uniform(0.5, 1.5, size=blocks.shape[:2]) * size).astype(np.float16)
    if kind == "Q4_K":
        blocks[..., 0:2] = scale[..., None].view(np.uint8)
        blocks[..., 2:4] = (scale * 0.5)[..., None].view(np.uint8)  # dmin
    else:
        blocks[..., -2:] = scale[..., None].view(np.uint8)
    packed = blocks.reshape(rows, -1)
    kind_type = gguf.GGMLQuantizationType[kind]
    assert gguf.quants.quant_shape_to_byte_shape((rows, columns), kind_type) == packed.shape
    return packed


def write_qwen2_gguf(path: Path, *, seed: int = 0, layers: int = LAYERS,
                     hidden: int = HIDDEN, ffn: int = FFN) -> Path:
    """Write the tiny model to ``path`` (``layers``, ``hidden``, ``ffn`` make it larger)."""
    import gguf

    kv = hidden // HEADS * KV_HEADS
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny-qwen2")
    tokens, types = byte_level_vocabulary()
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def f32(name: str, shape: tuple[int, ...], centre: float = 0.0) -> None:
        writer.add_tensor(name, (centre + rng.standard_normal(shape) * 0.05).astype(np.float32))

    def quantised(name: str, kind: str, rows: int, columns: int) -> None:
        packed = k_blocks(kind, rows, columns, rng)
        writer.add_tensor(name, packed, raw_shape=packed.shape,
                          raw_dtype=gguf.GGMLQuantizationType[kind])

    # As llama.cpp's Q4_K_M mix: Q4_K mostly, Q6_K for half the value and down projections
    # and for the output matrix.
    quantised("token_embd.weight", "Q4_K", len(tokens), hidden)
    for i in range(layers):
        six = "Q6_K" if i % 2 == 0 else "Q4_K"
        f32(f"blk.{i}.attn_norm.weight", (hidden,), 1.0)
        f32(f"blk.{i}.ffn_norm.weight", (hidden,), 1.0)
        quantised(f"blk.{i}.attn_q.weight", "Q4_K", hidden, hidden)
        f32(f"blk.{i}.attn_q.bias", (hidden,))
        quantised(f"blk.{i}.attn_k.weight", "Q4_K", kv, hidden)
        f32(f"blk.{i}.attn_k.bias", (kv,))
        quantised(f"blk.{i}.attn_v.weight", six, kv, hidden)
        f32(f"blk.{i}.attn_v.bias", (kv,))
        quantised(f"blk.{i}.attn_output.weight", "Q4_K", hidden, hidden)
        quantised(f"blk.{i}.ffn_gate.weight", "Q4_K", ffn, hidden)
        quantised(f"blk.{i}.ffn_up.weight", "Q4_K", ffn, hidden)
        quantised(f"blk.{i}.ffn_down.weight", six, hidden, ffn)
    f32("output_norm.weight", (hidden,), 1.0)
    quantised("output.weight", "Q6_K", len(tokens), hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def qwen2_parameters(*, layers: int = LAYERS, hidden: int = HIDDEN, ffn: int = FFN) -> int:
    """The elements of the model's tensors, both embedding matrices counted."""
    kv = hidden // HEADS * KV_HEADS
    layer = 2 * hidden + 2 * hidden * hidden + hidden + 2 * (kv * hidden + kv) + 3 * ffn * hidden
    return 2 * VOCAB * hidden + layers * layer + hidden
