#!/usr/bin/env python3
"""Models for the CPU speed of the 2-, 3-bit and fp4 formats, written into
build/bench-models/lowbit/ (idempotent; --force rewrites).

    q2_k.gguf, q3_k.gguf   random block bytes of that ggml type in every matrix, fp16 scale
                           fields set to sane values (tools/make_quant_fixtures.random_blocks)
    mlx-2bit-g64/          mlx.core.quantize of normal(0, 0.02) weights at 2 bits, group 64,
    mlx-3bit-g64/          3 bits, group 64 (fp16 scales and biases),
    mlx-mxfp4/             mode mxfp4 (group 32, e8m0 scales),
    mlx-nvfp4/             mode nvfp4 (group 16, e4m3 scales)

Every model is one llama-arch shape: hidden 2048, 4 layers, 16 query / 4 KV heads of 128,
MLP 5632, vocabulary 32000, tied embeddings (every width a multiple of 256, so K-quant
super-blocks fit), F32 (GGUF) or bf16 (MLX) norms of ones. No tokenizer: `celer bench`
feeds synthetic ids. The weights are random, so only speed and memory mean anything.

Run: build/mlx-venv/bin/python bench/make_lowbit_models.py [--force]
(python3 -m venv build/mlx-venv && build/mlx-venv/bin/pip install numpy gguf==0.19.0
mlx[cpu]==0.32.4), then e.g.
    build/celer bench -m build/bench-models/lowbit/q2_k.gguf -p 128 -n 32 -r 3 -t 2
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gguf_layout import add_shape, gguf_name  # noqa: E402
from make_quant_fixtures import TYPES, matrices, random_blocks  # noqa: E402

OUT = ROOT / "build" / "bench-models" / "lowbit"
CFG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
       "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 4,
       "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "max_position_embeddings": 4096, "tie_word_embeddings": True, "bos_token_id": 1,
       "eos_token_id": 2, "head_dim": 128}
# name -> (bits, group, mode) for mlx.core.quantize
MLX = {"mlx-2bit-g64": (2, 64, "affine"), "mlx-3bit-g64": (3, 64, "affine"),
       "mlx-mxfp4": (4, 32, "mxfp4"), "mlx-nvfp4": (4, 16, "nvfp4")}


def write_gguf(path, tname, seed):
    import gguf

    qtype, bsize, scale_at, min_at = TYPES[tname]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    add_shape(w, CFG)
    w.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    w.add_rope_freq_base(CFG["rope_theta"])
    w.add_vocab_size(CFG["vocab_size"])
    for hf, rows, cols in matrices(CFG):
        raw = random_blocks(rng, qtype, bsize, scale_at, min_at, rows, cols)
        w.add_tensor(gguf_name(hf), raw, raw_dtype=qtype)
    d = CFG["hidden_size"]
    for i in range(CFG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w.add_tensor(gguf_name(f"model.layers.{i}.{norm}.weight"), np.ones(d, np.float32))
    w.add_tensor(gguf_name("model.norm.weight"), np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_mlx(d, bits, group, mode, seed):
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for hf, rows, cols in matrices(CFG):
        module = hf[: -len(".weight")]
        w = mx.array(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(mx.bfloat16)
        if mode == "affine":
            w = w.astype(mx.float16)
            q, s, b = mx.quantize(w, group_size=group, bits=bits)
            tensors[module + ".biases"] = b
        else:
            q, s = mx.quantize(w, group_size=group, bits=bits, mode=mode)
        tensors[hf] = q
        tensors[module + ".scales"] = s
        mx.eval(tensors[hf])
    dm = CFG["hidden_size"]
    for i in range(CFG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = mx.ones((dm,), dtype=mx.bfloat16)
    tensors["model.norm.weight"] = mx.ones((dm,), dtype=mx.bfloat16)
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    quant = {"group_size": group, "bits": bits}
    if mode != "affine":
        quant["mode"] = mode
    cfg = dict(CFG, torch_dtype="float16" if mode == "affine" else "bfloat16", quantization=quant)
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for i, tname in enumerate(("q2_k", "q3_k")):
        path = OUT / f"{tname}.gguf"
        if args.force or not path.exists():
            write_gguf(path, tname, 4000 + i)
        print(f"{path}: {path.stat().st_size} bytes")
    for i, (name, (bits, group, mode)) in enumerate(MLX.items()):
        d = OUT / name
        if args.force or not (d / "config.json").exists():
            write_mlx(d, bits, group, mode, 5000 + i)
        print(f"{d}: {(d / 'model.safetensors').stat().st_size} bytes")


if __name__ == "__main__":
    main()
