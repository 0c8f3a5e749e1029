#!/usr/bin/env python3
"""Random-weight checkpoints shaped like Llama-3.1-8B for the GPU benchmarks (make bench-cuda).

    python3 bench/cuda_models.py --out DIR [--bits 4] [--group 64] [--layers 32]

writes DIR/config.json and DIR/model.safetensors in mlx-lm's layout: every linear layer
(the embedding and the untied LM head included) as MLX affine codes with fp16 scales and
biases, norms in fp16. Codes are uniform random and scales/biases sane (scale ~ U(0.004,
0.008), bias = -8 * scale), which is all a speed measurement needs: the bytes read per
token are those of the real model. Only numpy is used, so it runs where the GPU is (the
model is made there, never copied). Nothing here is a correctness reference.
"""
import argparse
import json
import struct
from pathlib import Path

import numpy as np

LLAMA31_8B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}


def tensors(cfg, bits, group, rng):
    """(name, dtype string, shape, array) in file order."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def linear(name, rows, cols):
        words = rows * cols * bits // 32
        codes = rng.integers(0, 2**32, size=words, dtype=np.uint32).reshape(rows, cols * bits // 32)
        scales = rng.uniform(0.004, 0.008, size=(rows, cols // group)).astype(np.float16)
        biases = (-(2 ** (bits - 1)) * scales.astype(np.float32)).astype(np.float16)
        yield name + ".weight", "U32", codes
        yield name + ".scales", "F16", scales
        yield name + ".biases", "F16", biases

    def norm(name, n):
        yield name, "F16", (1.0 + 0.02 * rng.standard_normal(n)).astype(np.float16)

    yield from linear("model.embed_tokens", v, d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield from norm(p + "input_layernorm.weight", d)
        yield from linear(p + "self_attn.q_proj", nq, d)
        yield from linear(p + "self_attn.k_proj", nkv, d)
        yield from linear(p + "self_attn.v_proj", nkv, d)
        yield from linear(p + "self_attn.o_proj", d, nq)
        yield from norm(p + "post_attention_layernorm.weight", d)
        yield from linear(p + "mlp.gate_proj", f, d)
        yield from linear(p + "mlp.up_proj", f, d)
        yield from linear(p + "mlp.down_proj", d, f)
    yield from norm("model.norm.weight", d)
    yield from linear("lm_head", v, d)


def write_safetensors(path, items):
    """items: (name, dtype, array); the header first, then the data in the same order."""
    header, offset = {}, 0
    for name, dt, a in items:
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {"format": "mlx"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, a in items:
            f.write(np.ascontiguousarray(a).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--group", type=int, default=64, choices=(32, 64, 128))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    cfg = dict(LLAMA31_8B, num_hidden_layers=a.layers)
    cfg["quantization"] = {"group_size": a.group, "bits": a.bits}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    items = list(tensors(cfg, a.bits, a.group, np.random.default_rng(a.seed)))
    write_safetensors(out / "model.safetensors", items)
    total = sum(x.nbytes for _, _, x in items)
    print(f"{out}: {len(items)} tensors, {total / 2**30:.2f} GiB ({a.bits}-bit g{a.group}, {a.layers} layers)")


if __name__ == "__main__":
    main()
