"""How llama.cpp lays out a Llama-family checkpoint in GGUF, for the writers that make GGUF
twins of MLX checkpoints (tools/make_gguf_fixtures.py, bench/make_models.py,
bench/cuda_models.py): tensor names, the q/k row order of arch llama, and ggml blocks
(Q4_0, Q4_1, Q8_0) made from MLX affine codes without changing a value.

Only numpy; it writes no file and needs no gguf package.
"""
import numpy as np

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf):
    """GGUF tensor name of a Hugging Face parameter name (model.layers.3.mlp.up_proj.weight
    -> blk.3.ffn_up.weight)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{parts[2]}." + LAYER_NAMES[".".join(parts[3:])]


def add_shape(w, cfg):
    """The model-shape keys every writer starts with, from a Hugging Face config, on a
    gguf.GGUFWriter: block_count, context_length, embedding_length, feed_forward_length,
    attention.head_count and attention.head_count_kv."""
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])


def permute(w, n_head):
    """llama.cpp converter's q/k row order for its interleaved RoPE (rows of head h
    reordered (h, j, i) -> (h, i, j), j the half of the head, i the pair index). Acts on
    rows only, so it applies alike to weights, packed codes, scales and biases."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute(w, n_head):
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def heads_for(hf, cfg):
    """Heads whose rows permute() reorders for parameter hf (q or k), else 0."""
    if ".q_proj." in hf:
        return cfg["num_attention_heads"]
    if ".k_proj." in hf:
        return cfg["num_key_value_heads"]
    return 0


# ==== ggml blocks from MLX codes ====

QK = 32  # elements per Q4_0 / Q4_1 / Q8_0 block
BLOCK_BYTES = {"q4_0": 2 + QK // 2, "q4_1": 4 + QK // 2, "q8_0": 2 + QK}
BLOCK_BITS = {"q4_0": 4, "q4_1": 4, "q8_0": 8}
# Q4_0 and Q8_0 have no bias: w = d * (q - 8) and w = d * (q - 128) in MLX's unsigned codes.
IMPLIED_BIAS = {"q4_0": -8.0, "q8_0": -128.0}


def mlx_to_blocks(words, scales, biases, qtype):
    """MLX affine codes -> ggml blocks, the same values.

    words: uint32 [rows, cols * bits / 32], element i of a row in word i * bits / 32 at
    bits (i * bits) % 32 (low first); scales, biases: float16 [rows, cols / group], group a
    multiple of 32. Returns uint8 [rows, cols / 32 * BLOCK_BYTES[qtype]]: per block of 32
    the fp16 scale d of its group, for q4_1 the fp16 bias m, then the codes. Q4 blocks hold
    elements j and j + 16 in the low and high nibble of byte j; Q8_0 holds q - 128 as int8.
    Q4_1 is exact for any codes; Q4_0 and Q8_0 have no bias of their own, so every bias
    must be -8 * scale (4-bit) or -128 * scale (8-bit), else ValueError."""
    rows, groups = scales.shape
    bits = BLOCK_BITS[qtype]
    cols = words.shape[1] * 32 // bits
    if scales.dtype != np.float16 or biases.shape != scales.shape or cols % (groups * QK):
        raise ValueError(f"{qtype}: codes {words.shape} and scales {scales.shape} do not make groups of 32k")
    if qtype in IMPLIED_BIAS:
        implied = (np.float32(IMPLIED_BIAS[qtype]) * scales.astype(np.float32)).astype(np.float16)
        if not np.array_equal(biases, implied):
            raise ValueError(f"{qtype}: the biases are not {IMPLIED_BIAS[qtype]:g} * scale")
    nb = cols // QK
    code_bytes = np.ascontiguousarray(words).view(np.uint8).reshape(rows, nb, QK * bits // 8)
    out = np.empty((rows, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    d = np.repeat(scales, cols // groups // QK, axis=1)
    out[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    off = 2
    if qtype == "q4_1":
        out[:, :, 2:4] = np.repeat(biases, cols // groups // QK, axis=1).view(np.uint8).reshape(rows, nb, 2)
        off = 4
    if bits == 8:
        out[:, :, off:] = code_bytes ^ np.uint8(0x80)  # (q - 128) as int8
        return out.reshape(rows, nb * BLOCK_BYTES[qtype])
    # 4-bit: MLX byte k of a block holds elements 2k (low nibble) and 2k + 1, so bytes 0-7
    # (a) hold elements 0-15 and bytes 8-15 (b) elements 16-31. On eight bytes at once:
    # even[k] = a.lo[k] | b.lo[k] << 4 is ggml byte 2k, odd[k] = a.hi[k] | b.hi[k] << 4
    # is ggml byte 2k + 1.
    halves = code_bytes.reshape(rows, nb, 2, 8).view(np.uint64)[..., 0]
    a, b = halves[:, :, 0], halves[:, :, 1]
    lo = np.uint64(0x0F0F0F0F0F0F0F0F)
    even = (a & lo) | ((b & lo) << np.uint64(4))
    odd = ((a >> np.uint64(4)) & lo) | (b & ~lo)
    out[:, :, off::2] = even.view(np.uint8).reshape(rows, nb, 8)
    out[:, :, off + 1::2] = odd.view(np.uint8).reshape(rows, nb, 8)
    return out.reshape(rows, nb * BLOCK_BYTES[qtype])
