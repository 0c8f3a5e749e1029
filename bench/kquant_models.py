#!/usr/bin/env python3
"""Random GGUF models in llama-quantize's K-quant mixes, for speed measurements:

    python3 bench/kquant_models.py --out FILE.gguf [--mix q4_k_m] [--layers 32] [--hidden D ...]

Llama-3.1-8B's shape by default (bench/cuda_models.py's config and its placeholder
vocabulary), each matrix of the type llama.cpp's Q4_K_M (or Q5_K_M) gives it: Q6_K for the
LM head and for attn_v and ffn_down of the layers it spends more bits on (the first and last
eighth and every third between), the mix's own type elsewhere, norms F32. Block bytes are
random (codes and 6-bit group scales uniform) with each super-block's fp16 factors drawn so
weights stay within about +-0.06, as a trained 8B's do; the values mean nothing, the bytes
per weight and the work per token are the real file's. Only numpy and gguf-py (PYTHONPATH,
as for cuda_models.py), so it runs on the GPU machine; written to FILE.part, renamed when
complete.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_models import K_BLOCKS, LLAMA31_8B, block_bytes, gguf_writer, log, specs  # noqa: E402

# llama.cpp's general.file_type of the mixes, and the type of their ordinary matrices.
MIXES = {"q4_k_m": (15, "q4_k"), "q5_k_m": (17, "q5_k")}
# Offsets of the fp16 factors in each super-block: d (and dmin), as ggml lays them out.
FACTORS = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208, None)}
# Scale of d and dmin: about 0.06 / (63 * 15) and 0.03 / 63 for 4-bit; Q6_K: 0.06 / (127 * 31).
D_RANGE = {"q4_k": (4e-5, 8e-5), "q5_k": (2e-5, 4e-5), "q6_k": (1e-5, 2e-5)}
M_RANGE = (3e-4, 6e-4)


def more_bits(i, n):
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_types(cfg, base):
    """Tensor name -> ggml type, as llama-quantize's mix assigns them."""
    n = cfg["num_hidden_layers"]
    types = {"lm_head.weight": "q6_k"}
    for i in range(n):
        t = "q6_k" if more_bits(i, n) else base
        types[f"model.layers.{i}.self_attn.v_proj.weight"] = t
        types[f"model.layers.{i}.mlp.down_proj.weight"] = t
    return types


def blocks(t, rows, cols, rng):
    """Random super-blocks of type t for a [rows, cols] matrix, factors in range."""
    n, size = K_BLOCKS[t]
    nb = rows * cols // n
    raw = rng.integers(0, 2**64 - 1, size=(nb * size + 7) // 8, dtype=np.uint64, endpoint=True)
    b = raw.view(np.uint8)[: nb * size].reshape(nb, size)
    d_at, m_at = FACTORS[t]
    b[:, d_at:d_at + 2] = rng.uniform(*D_RANGE[t], size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    if m_at is not None:
        b[:, m_at:m_at + 2] = rng.uniform(*M_RANGE, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mix", default="q4_k_m", choices=sorted(MIXES))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    cfg = dict(LLAMA31_8B, num_hidden_layers=a.layers)
    cfg.pop("rope_scaling")
    for key, val in (("hidden_size", a.hidden), ("intermediate_size", a.ffn), ("num_attention_heads", a.heads),
                     ("num_key_value_heads", a.kv_heads)):
        if val:
            cfg[key] = val
    if a.vocab:
        cfg.update(vocab_size=a.vocab, bos_token_id=a.vocab - 2, eos_token_id=[a.vocab - 1])
    file_type, base = MIXES[a.mix]
    types = tensor_types(cfg, base)
    sp = specs(cfg)
    for name, rows, cols in sp:
        if cols and cols % 256:
            sys.exit(f"kquant_models: {name}: {cols} columns, not whole super-blocks of 256")
    t0 = time.time()
    part = a.out + ".part"
    w = gguf_writer(Path(part), cfg, base, sp, mix=types, file_type=file_type)
    rng = np.random.default_rng(a.seed)
    for k, (name, rows, cols) in enumerate(sp):
        if cols:
            w.write_tensor_data(blocks(types.get(name, base), rows, cols, rng))
        else:
            w.write_tensor_data((1.0 + 0.02 * rng.standard_normal(rows)).astype(np.float32))
        if k % 40 == 0:
            log(f"{a.out}: {k + 1}/{len(sp)} tensors")
    w.close()
    os.replace(part, a.out)
    size = sum(block_bytes(types.get(n, base), r, c) for n, r, c in sp if c)
    print(f"{a.out}: {a.mix}, {cfg['num_hidden_layers']} layers, d {cfg['hidden_size']}, "
          f"{size / 2**30:.2f} GiB of matrices; {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
