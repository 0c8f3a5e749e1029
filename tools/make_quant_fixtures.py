#!/usr/bin/env python3
"""Quantized formats against their own libraries' dequantization: tests/quants/.

GGUF block types against gguf-py, and MLX affine widths against mlx.

For each ggml block type in TYPES, writes tests/quants/<type>.gguf: a one-layer llama-arch
model (hidden 256, MLP 512, 4 heads of 64, 2 KV heads, vocabulary 256, tied embeddings;
every width a multiple of 256 so the 256-element super-blocks fit) whose matrices hold
random block bytes of that type, with each block's fp16 scale fields set to finite
values (positive scales in [1e-3, 1e-2) for Q5_0/Q5_1, [1e-4, 1e-3) for the types whose
integer scales or codebook values reach 63 or 127; signed mins) so every block decodes to
numbers of a sane size.
Norms are F32 ones. Beside it, tests/quants/<type>.json holds, for every matrix under
its Hugging Face name, what gguf-py's gguf.quants.dequantize() returns (float32, Hugging
Face row order: q/k rows un-permuted as celer reads them) as the FNV-1a 64-bit hash of all
its little-endian bytes and the bit patterns of its first row. tests/test_quant_formats.c
binds each matrix and checks every dequantized value bit for bit against them.

MLX (MLX_CASES): tests/quants/mlx-<bits>bit/ is the same model as an mlx-lm checkpoint
(config.json with a "quantization" block, model.safetensors) whose matrices mlx.core.quantize
made from random normal weights at that width, group size and scale dtype (bits 2, 3, 5 and
6: the widths whose codes cross 32-bit words, beside the 4 and 8 the other fixtures have),
one module overridden to 8 bits g64 as mlx-lm's mixed recipes do, and expect.json as above
from mlx.core.dequantize with its scales and biases widened to float32 (celer dequantizes
in float32; mlx's own output would round to the scale dtype).

Run: build/venv/bin/python tools/make_quant_fixtures.py [--out tests/quants]
(tools/setup_venv.sh; only numpy, gguf and mlx[cpu] of tools/requirements.txt are used)
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_layout import add_shape, gguf_name, heads_for, unpermute  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

CFG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
       "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
       "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
       "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}

# block type -> (bytes of a block, byte offsets of its fp16 scale fields, of its fp16 mins)
TYPES = {
    "q5_0": (Q.Q5_0, 22, [0], []),
    "q5_1": (Q.Q5_1, 24, [0], [2]),
    "q4_k": (Q.Q4_K, 144, [0], [2]),
    "q5_k": (Q.Q5_K, 176, [0], [2]),
    "q6_k": (Q.Q6_K, 210, [208], []),
    "q3_k": (Q.Q3_K, 110, [108], []),
    "q2_k": (Q.Q2_K, 84, [80], [82]),
    "iq4_nl": (Q.IQ4_NL, 18, [0], []),
    "iq4_xs": (Q.IQ4_XS, 136, [0], []),
}


def matrices(cfg):
    """(Hugging Face name, rows, cols) of every matrix."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", cfg["vocab_size"], d)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", d, d), (p + "self_attn.k_proj.weight", kv, d),
                (p + "self_attn.v_proj.weight", kv, d), (p + "self_attn.o_proj.weight", d, d),
                (p + "mlp.gate_proj.weight", f, d), (p + "mlp.up_proj.weight", f, d),
                (p + "mlp.down_proj.weight", d, f)]
    return out


def random_blocks(rng, qtype, bsize, scale_at, min_at, rows, cols):
    """Random bytes of rows x cols elements of qtype with sane fp16 scale and min fields."""
    elems, _ = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // elems
    raw = rng.integers(0, 256, size=(n, bsize), dtype=np.uint8)
    # the K-quants' integer scales and the codebook values reach 63 or 127: smaller factors
    hi = 1e-2 if qtype in (Q.Q5_0, Q.Q5_1) else 1e-3
    for off in scale_at:
        raw[:, off:off + 2] = rng.uniform(hi / 10, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    for off in min_at:
        raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // elems * bsize)


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def expectation(v):
    """The hash of v's float32 bytes and its first row's bit patterns."""
    v = np.ascontiguousarray(v, dtype="<f4")
    return {"rows": v.shape[0], "cols": v.shape[1], "fnv1a64": f"{fnv1a64(v.tobytes()):016x}",
            "row0_bits": [int(x) for x in v[0].view("<u4")]}


# bits -> (group size, scale dtype name)
MLX_CASES = {2: (32, "bfloat16"), 3: (64, "float16"), 5: (128, "bfloat16"), 6: (32, "float16")}
# mode -> group size: fp4 codes under 8-bit scales, no biases
MLX_FP4 = {"mxfp4": 32, "nvfp4": 16}


def write_mlx(out, bits, seed):
    import mlx.core as mx

    group, dtname = MLX_CASES[bits]
    dt = getattr(mx, dtname)
    rng = np.random.default_rng(seed)
    d = out / f"mlx-{bits}bit"
    d.mkdir(parents=True, exist_ok=True)
    tensors, want = {}, {}
    override = "model.layers.0.mlp.down_proj"  # a mixed recipe's 8-bit module
    for hf, rows, cols in matrices(CFG):
        module = hf[: -len(".weight")]
        b, g = (8, 64) if module == override else (bits, group)
        w = mx.array(rng.standard_normal((rows, cols)).astype(np.float32) * 0.02).astype(dt)
        q, s, bi = mx.quantize(w, group_size=g, bits=b)
        tensors[hf] = q
        tensors[module + ".scales"] = s
        tensors[module + ".biases"] = bi
        deq = mx.dequantize(q, s.astype(mx.float32), bi.astype(mx.float32), group_size=g, bits=b)
        want[hf] = np.array(deq)
    dm = CFG["hidden_size"]
    for i in range(CFG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = mx.ones((dm,), dtype=dt)
    tensors["model.norm.weight"] = mx.ones((dm,), dtype=dt)
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    cfg = dict(CFG, torch_dtype=dtname, head_dim=dm // CFG["num_attention_heads"],
               quantization={"group_size": group, "bits": bits, override: {"group_size": 64, "bits": 8}})
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (d / "expect.json").write_text(json.dumps({k: expectation(v) for k, v in sorted(want.items())}) + "\n")


def write_fp4(out, mode, seed):
    """mlx-<mode>/: every matrix in that mode; expect.json from mx.dequantize in float32."""
    import mlx.core as mx

    group = MLX_FP4[mode]
    rng = np.random.default_rng(seed)
    d = out / f"mlx-{mode}"
    d.mkdir(parents=True, exist_ok=True)
    tensors, want = {}, {}
    for hf, rows, cols in matrices(CFG):
        module = hf[: -len(".weight")]
        w = mx.array(rng.standard_normal((rows, cols)).astype(np.float32) * 0.02).astype(mx.bfloat16)
        q, s = mx.quantize(w, group_size=group, bits=4, mode=mode)
        tensors[hf] = q
        tensors[module + ".scales"] = s
        want[hf] = np.array(mx.dequantize(q, s, group_size=group, bits=4, mode=mode, dtype=mx.float32))
    dm = CFG["hidden_size"]
    for i in range(CFG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = mx.ones((dm,), dtype=mx.bfloat16)
    tensors["model.norm.weight"] = mx.ones((dm,), dtype=mx.bfloat16)
    mx.save_safetensors(str(d / "model.safetensors"), tensors)
    cfg = dict(CFG, torch_dtype="bfloat16", head_dim=dm // CFG["num_attention_heads"],
               quantization={"group_size": group, "bits": 4, "mode": mode})
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (d / "expect.json").write_text(json.dumps({k: expectation(v) for k, v in sorted(want.items())}) + "\n")


def write_one(out, tname, seed):
    qtype, bsize, scale_at, min_at = TYPES[tname]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out / f"{tname}.gguf"), "llama")
    add_shape(w, CFG)
    w.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    w.add_rope_freq_base(CFG["rope_theta"])
    w.add_vocab_size(CFG["vocab_size"])
    w.add_bos_token_id(CFG["bos_token_id"])
    w.add_eos_token_id(CFG["eos_token_id"])
    want = {}
    for hf, rows, cols in matrices(CFG):
        raw = random_blocks(rng, qtype, bsize, scale_at, min_at, rows, cols)
        w.add_tensor(gguf_name(hf), raw, raw_dtype=qtype)
        deq = gguf.quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
        n_head = heads_for(hf, CFG)
        want[hf] = unpermute(deq, n_head) if n_head else deq  # the file holds permuted q/k rows
    d = CFG["hidden_size"]
    for i in range(CFG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w.add_tensor(gguf_name(f"model.layers.{i}.{norm}.weight"), np.ones(d, np.float32))
    w.add_tensor(gguf_name("model.norm.weight"), np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (out / f"{tname}.json").write_text(json.dumps({k: expectation(v) for k, v in sorted(want.items())}) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/quants")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, tname in enumerate(TYPES):
        write_one(out, tname, 1000 + i)
        print(f"{tname}: {(out / (tname + '.gguf')).stat().st_size} bytes")
    for bits in MLX_CASES:
        write_mlx(out, bits, 2000 + bits)
        print(f"mlx-{bits}bit: {(out / f'mlx-{bits}bit' / 'model.safetensors').stat().st_size} bytes")
    for i, mode in enumerate(MLX_FP4):
        write_fp4(out, mode, 3000 + i)
        print(f"mlx-{mode}: {(out / f'mlx-{mode}' / 'model.safetensors').stat().st_size} bytes")


if __name__ == "__main__":
    main()
