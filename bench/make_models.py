#!/usr/bin/env python3
"""Benchmark models for bench/run.py, written into build/bench-models/ (idempotent).

    smollm2-135m/        the real SmolLM2-135M-Instruct (tools/fetch_model.sh)
        q4_1.gguf          symlink to the fetched Q4_1 GGUF (its token_embd is Q8_0)
        q4_0.gguf          the same file with every Q4_1 matrix re-quantized to Q4_0 by the
                           gguf package from the dequantized Q4_1 values; every other tensor
                           and all metadata copied unchanged
        mlx-g32/           `celer convert` of q4_1.gguf (lossless) + the SmolLM2 tokenizer
    llama3.2-1b-shape/   random weights shaped like Llama-3.2-1B (tied, llama3 RoPE scaling)
    qwen2.5-0.5b-shape/  random weights shaped like Qwen2.5-0.5B (tied, q/k/v biases)
        mlx-g32/           MLX affine 4-bit group 32, fp16 scales/biases
        mlx-g64/           MLX affine 4-bit group 64, fp16 scales/biases
        q4_1.gguf          bit-identical values to mlx-g32 (same codes, same fp16 scale/min)
        q4_0.gguf          Q4_0 (gguf package quantizer) from the same float values

Random weights: numpy default_rng with a fixed seed per model; matrices normal(0, 0.02),
norms 1 + normal(0, 0.02), biases normal(0, 0.02); norms and biases are rounded to fp16
once so the MLX (fp16) and GGUF (F32) files hold the same values. Quantization is
min/max affine per group: scale = fp16((max - min) / 15), bias = fp16(min),
q = clip(round((w - bias) / scale), 0, 15). GGUF files follow llama.cpp's converter:
tensor names blk.N.*, q/k rows of arch llama permuted for its interleaved RoPE (as
tools/make_gguf_fixtures.py does), and the tokenizer.ggml.* metadata built from the real
tokenizers in ../shared/tokenizers (Llama 3.1 for the Llama shape, Qwen3 for the Qwen
shape), padded with [PADn] tokens to the model's vocabulary. The Llama-shaped GGUF
carries no rope_freqs.weight tensor (celer does not read it yet), so llama.cpp runs it
with unscaled RoPE: the same work per token, slightly different values at long range.

Run:  build/bench-venv/bin/python bench/make_models.py [--verify] [--force]
      --verify loads every model in celer (inspect, generate --ids), llama.cpp
      (llama-bench, one tiny test) and mlx-lm (one forward), and compares celer's logits
      of mlx-g32 and q4_1.gguf.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

# GGUF tensor names, llama.cpp's q/k row order and blocks from MLX codes: shared with the
# fixture writer, so both agree.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from gguf_layout import add_shape, gguf_name, mlx_to_blocks, permute  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "bench-models"
CELER = ROOT / "build" / "celer"
SHARED_TOKENIZERS = ROOT.parent / "shared" / "tokenizers"
SMOLLM2_TOKENIZER = ROOT / "tests" / "tokenizer" / "smollm2"

LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "float16",
}

QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "torch_dtype": "float16",
}

# name -> (config, seed, tokenizer dir, GGUF pre-tokenizer name, add BOS)
SYNTHETIC = {
    "llama3.2-1b-shape": (LLAMA_1B, 1001, "llama3_1", "llama-bpe", True),
    "qwen2.5-0.5b-shape": (QWEN_05B, 1002, "qwen3", "qwen2", False),
}



def log(msg):
    print(f"make_models: {msg}", flush=True)


# ==== Tensors with Hugging Face names, and their quantization ====


def tensor_specs(cfg):
    """(name, shape, kind) in checkpoint order; kind is matrix, norm or bias."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    qkv_bias = cfg["model_type"] == "qwen2"
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], d), "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (d,), "norm"))
        for n, rows in (("q", nq), ("k", nkv), ("v", nkv)):
            specs.append((p + f"self_attn.{n}_proj.weight", (rows, d), "matrix"))
            if qkv_bias:
                specs.append((p + f"self_attn.{n}_proj.bias", (rows,), "bias"))
        specs.append((p + "self_attn.o_proj.weight", (d, nq), "matrix"))
        specs.append((p + "post_attention_layernorm.weight", (d,), "norm"))
        specs.append((p + "mlp.gate_proj.weight", (f, d), "matrix"))
        specs.append((p + "mlp.up_proj.weight", (f, d), "matrix"))
        specs.append((p + "mlp.down_proj.weight", (d, f), "matrix"))
    specs.append(("model.norm.weight", (d,), "norm"))
    return specs


def quantize_affine(w, group):
    """w[rows, cols] float32 -> codes uint8 [rows, cols], scales and biases fp16 [rows, cols/group]."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo = g.min(axis=2)
    hi = g.max(axis=2)
    scales = ((hi - lo) / 15.0).astype(np.float16)
    scales[scales == 0] = np.float16(1e-4)
    biases = lo.astype(np.float16)
    s32 = scales.astype(np.float32)[:, :, None]
    b32 = biases.astype(np.float32)[:, :, None]
    codes = np.clip(np.rint((g - b32) / s32), 0, 15).astype(np.uint8)
    return codes.reshape(rows, cols), scales, biases


def pack_mlx(codes):
    """codes [rows, cols] -> uint32 [rows, cols/8], element k of a word in bits 4k..4k+3."""
    rows, cols = codes.shape
    c = codes.reshape(rows, cols // 8, 8).astype(np.uint32)
    word = np.zeros((rows, cols // 8), dtype=np.uint32)
    for k in range(8):
        word |= c[:, :, k] << np.uint32(4 * k)
    return word


# ==== Tokenizers ====


def gguf_vocab(tok_dir, vocab_size):
    """tokens, token types and merges for tokenizer.ggml.* from a tokenizer.json."""
    import gguf

    doc = json.loads((tok_dir / "tokenizer.json").read_text())
    tokens = {}
    types = {}
    for text, i in doc["model"]["vocab"].items():
        tokens[i] = text
        types[i] = gguf.TokenType.NORMAL
    for a in doc["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    assert max(tokens) < vocab_size, (tok_dir, max(tokens), vocab_size)
    out_tokens, out_types = [], []
    for i in range(vocab_size):
        if i in tokens:
            out_tokens.append(tokens[i])
            out_types.append(types[i])
        else:
            out_tokens.append(f"[PAD{i}]")
            out_types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    return out_tokens, out_types, merges


def copy_tokenizer(tok_dir, dst):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tok_dir / name).exists():
            shutil.copyfile(tok_dir / name, dst / name)


# ==== Synthetic models ====


def write_synthetic(name, cfg, seed, tok_name, pre, add_bos):
    import gguf
    from gguf import GGMLQuantizationType as Q
    from safetensors.numpy import save_file

    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tok_dir = SHARED_TOKENIZERS / tok_name
    tok_cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    arch = cfg["model_type"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]

    mlx = {32: {}, 64: {}}
    writers = {}
    for qname, ftype in (("q4_1", 3), ("q4_0", 2)):  # llama.cpp file types MOSTLY_Q4_1 / _Q4_0
        w = gguf.GGUFWriter(str(d / f"{qname}.gguf.part"), arch)
        w.add_name(name)
        w.add_file_type(ftype)
        add_shape(w, cfg)
        w.add_rope_dimension_count(hd)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_vocab_size(cfg["vocab_size"])
        tokens, types, merges = gguf_vocab(tok_dir, cfg["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(cfg["bos_token_id"])
        eos = cfg["eos_token_id"]
        w.add_eos_token_id(eos[-1] if isinstance(eos, list) else eos)
        w.add_add_bos_token(add_bos)
        if tok_cfg.get("chat_template"):
            w.add_chat_template(tok_cfg["chat_template"])
        w.add_quantization_version(2)
        writers[qname] = w

    specs = tensor_specs(cfg)
    for i, (hf, shape, kind) in enumerate(specs):
        if kind == "matrix":
            v = rng.standard_normal(shape, dtype=np.float32)
            v *= np.float32(0.02)
            prefix = hf[: -len(".weight")]
            n_head = 0
            if arch == "llama" and ".q_proj." in hf:
                n_head = cfg["num_attention_heads"]
            if arch == "llama" and ".k_proj." in hf:
                n_head = cfg["num_key_value_heads"]
            for group in (32, 64):
                codes, scales, biases = quantize_affine(v, group)
                words = pack_mlx(codes)
                mlx[group][prefix + ".weight"] = words
                mlx[group][prefix + ".scales"] = scales
                mlx[group][prefix + ".biases"] = biases
                if group == 32:
                    if n_head:  # quantization is per row, so permuting rows commutes with it
                        words, scales, biases = (permute(a, n_head) for a in (words, scales, biases))
                    writers["q4_1"].add_tensor(gguf_name(hf), mlx_to_blocks(words, scales, biases, "q4_1"), raw_dtype=Q.Q4_1)
                    del codes, words, scales, biases
            stored = permute(v, n_head) if n_head else v
            writers["q4_0"].add_tensor(gguf_name(hf), gguf.quants.quantize(stored, Q.Q4_0), raw_dtype=Q.Q4_0)
            del v, stored
        else:
            std = 0.02
            base = 1.0 if kind == "norm" else 0.0
            v16 = (base + std * rng.standard_normal(shape)).astype(np.float16)
            mlx[32][hf] = v16
            mlx[64][hf] = v16
            for w in writers.values():
                w.add_tensor(gguf_name(hf), v16.astype(np.float32))
        if i % 20 == 0:
            log(f"{name}: {i + 1}/{len(specs)} tensors")

    for qname, w in writers.items():
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(d / f"{qname}.gguf.part", d / f"{qname}.gguf")
    writers.clear()

    for group, tensors in mlx.items():
        mdir = d / f"mlx-g{group}"
        tmp = d / f"mlx-g{group}.part"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        c = dict(cfg)
        c["quantization"] = {"group_size": group, "bits": 4, "mode": "affine"}
        c["quantization_config"] = dict(c["quantization"])
        (tmp / "config.json").write_text(json.dumps(c, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "mlx"})
        copy_tokenizer(tok_dir, tmp)
        shutil.rmtree(mdir, ignore_errors=True)
        os.replace(tmp, mdir)
    (d / "seed").write_text(f"{seed}\n")


# ==== SmolLM2 ====


def make_smollm2_q4_0(src, dst):
    """Every Q4_1 matrix of src re-quantized to Q4_0 (gguf package), the rest copied."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as T

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst) + ".part", arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val = field.contents()
        if key == "general.file_type":
            val = 2  # MOSTLY_Q4_0
        vtype = field.types[0]
        sub = field.types[-1] if vtype == T.ARRAY else None
        w.add_key_value(key, val, vtype, sub)
    for t in r.tensors:
        if t.tensor_type == Q.Q4_1:
            vals = gguf.quants.dequantize(t.data, Q.Q4_1)
            w.add_tensor(t.name, gguf.quants.quantize(vals, Q.Q4_0), raw_dtype=Q.Q4_0)
        elif t.tensor_type in (Q.F32, Q.F16):
            w.add_tensor(t.name, np.array(t.data))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(dst) + ".part", dst)


def write_smollm2(force):
    d = OUT / "smollm2-135m"
    d.mkdir(parents=True, exist_ok=True)
    src = subprocess.run(["bash", str(ROOT / "tools" / "fetch_model.sh")], check=True, capture_output=True, text=True).stdout.strip()
    link = d / "q4_1.gguf"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(src)
    if force or not (d / "q4_0.gguf").exists():
        log("smollm2-135m: q4_0.gguf")
        make_smollm2_q4_0(link, d / "q4_0.gguf")
    mdir = d / "mlx-g32"
    if force or not (mdir / "model.safetensors").exists():
        log("smollm2-135m: mlx-g32 (celer convert)")
        if not CELER.exists():
            sys.exit("make_models: build/celer is missing; HINT: run make first")
        tmp = d / "mlx-g32.part"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([str(CELER), "convert", "-m", str(link), "-o", str(tmp)], check=True)
        copy_tokenizer(SMOLLM2_TOKENIZER, tmp)
        shutil.rmtree(mdir, ignore_errors=True)
        os.replace(tmp, mdir)


# ==== Verification ====


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def llama_bench_path():
    found = sorted((ROOT / "build").glob("llama.cpp-*/build/bin/llama-bench"))
    return found[-1] if found else None


def verify(name, threads):
    d = OUT / name
    ids = "1,2,3,4,5,6,7,8"
    paths = [p for p in (d / "mlx-g32", d / "mlx-g64", d / "q4_1.gguf", d / "q4_0.gguf") if p.exists()]
    for p in paths:
        info = run([CELER, "inspect", "-m", p]).stdout.splitlines()
        arch = next((l.split(":", 1)[1].strip() for l in info if l.startswith("architecture:")), "?")
        gen = run([CELER, "generate", "-m", p, "--ids", "1,2,3", "-n", "4", "--temp", "0", "--print-ids", "-t", threads])
        log(f"{name}/{p.name}: celer inspect: {arch}; generate --ids 1,2,3 -> {gen.stdout.strip()}")
    # celer logits of mlx-g32 and q4_1.gguf: the same values, so (near-)identical logits.
    check_dir = d / "mlx-g32"
    tmp = None
    cfg = json.loads((check_dir / "config.json").read_text())
    if cfg.get("rope_scaling"):
        # The GGUF has no rope_freqs tensor, so compare against the same weights without
        # the RoPE scaling: a view of mlx-g32 whose config drops rope_scaling.
        tmp = d / "mlx-g32-check"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for f in check_dir.iterdir():
            if f.name != "config.json":
                (tmp / f.name).symlink_to(f)
        cfg.pop("rope_scaling")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        check_dir = tmp
    a_path, b_path = d / "logits-mlx.npy", d / "logits-gguf.npy"
    run([CELER, "logits", "-m", check_dir, "--ids", ids, "--all", "-o", a_path, "-t", threads])
    run([CELER, "logits", "-m", d / "q4_1.gguf", "--ids", ids, "--all", "-o", b_path, "-t", threads])
    a, b = np.load(a_path), np.load(b_path)
    diff = float(np.abs(a - b).max())
    same_argmax = bool((a.argmax(-1) == b.argmax(-1)).all())
    log(f"{name}: celer logits mlx-g32 vs q4_1.gguf: max |diff| {diff:.3g}, argmax equal {same_argmax}")
    if tmp:
        shutil.rmtree(tmp)
    a_path.unlink()
    b_path.unlink()
    if diff > 1e-3 or not same_argmax:
        sys.exit(f"make_models: {name}: mlx-g32 and q4_1.gguf disagree in celer")
    lb = llama_bench_path()
    if lb:
        for g in ("q4_1.gguf", "q4_0.gguf"):
            out = run([lb, "-m", d / g, "-p", "16", "-n", "2", "-r", "1", "-t", threads, "-o", "json"])
            res = json.loads(out.stdout)
            log(f"{name}/{g}: llama-bench loads it ({res[0]['model_type']}, {res[0]['model_n_params']} params)")
    # mlx-lm: load through mlx_lm.load (tokenizer included) and compare last-row logits.
    # Upcast to float32 (exact for fp16 scales): mlx's fp16 CPU path is ~50x slower.
    for mdir in (d / "mlx-g32", d / "mlx-g64"):
        if not mdir.exists():
            continue
        code = (
            "import sys, numpy as np, mlx.core as mx\n"
            "mx.set_default_device(mx.cpu)\n"
            "from mlx_lm import load\n"
            "model, tok = load(sys.argv[1])\n"
            "model.set_dtype(mx.float32)\n"
            "ids = [int(x) for x in sys.argv[2].split(',')]\n"
            "out = model(mx.array([ids]))\n"
            "np.save(sys.argv[3], np.array(out[0, -1].astype(mx.float32)))\n"
        )
        mlx_out = d / "logits-mlxlm.npy"
        run([sys.executable, "-c", code, mdir, ids, mlx_out])
        run([CELER, "logits", "-m", mdir, "--ids", ids, "-o", d / "logits-celer.npy", "-t", threads])
        m = np.load(mlx_out).reshape(-1)
        c = np.load(d / "logits-celer.npy").reshape(-1)
        log(f"{name}/{mdir.name}: mlx-lm loads it; last-row logits vs celer: max |diff| {np.abs(m - c).max():.3g} "
            f"of max |logit| {np.abs(c).max():.3g} (mlx upcast to float32, as bench/mlx_bench.py runs it), argmax {int(m.argmax())} vs {int(c.argmax())}")
        mlx_out.unlink()
        (d / "logits-celer.npy").unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m," + ",".join(SYNTHETIC), help="comma-separated subset")
    ap.add_argument("--force", action="store_true", help="rewrite models that exist")
    ap.add_argument("--verify", action="store_true", help="load every model in celer, llama.cpp and mlx-lm")
    ap.add_argument("--threads", default="2")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == "smollm2-135m":
            write_smollm2(args.force)
        elif name in SYNTHETIC:
            d = OUT / name
            done = all((d / f).exists() for f in ("mlx-g32/model.safetensors", "mlx-g64/model.safetensors", "q4_1.gguf", "q4_0.gguf"))
            if args.force or not done:
                log(f"{name}: writing (seed {SYNTHETIC[name][1]})")
                write_synthetic(name, *SYNTHETIC[name])
            else:
                log(f"{name}: present")
        else:
            sys.exit(f"make_models: unknown model {name}; known: smollm2-135m, {', '.join(SYNTHETIC)}")
    if args.verify:
        for name in names:
            verify(name, args.threads)


if __name__ == "__main__":
    main()
