#!/usr/bin/env python3
"""GGUF test fixtures written by the `gguf` package from the safetensors fixtures.

For each source fixture (llama-tied-bf16: arch llama; qwen2-bf16: arch qwen2 with q/k/v
biases; cohere2-bf16: arch cohere2, F32 and Q4_1 only, its metadata as llama.cpp's
converter writes it: logit_scale, sliding_window, layer_norm_epsilon, and no
sliding_window_pattern key, so a reader must take llama.cpp's default of 4) and each
tensor type F32, Q8_0, Q4_0, Q4_1, writes
tests/fixtures/<source>-gguf-<type>/model.gguf the way llama.cpp's converter lays it
out: GGUF tensor names, metadata under `<arch>.*`, and for arch llama the q/k rows
permuted for llama.cpp's interleaved RoPE (rows of head h reordered (h, j, i) -> (h, i, j)
with j the half of the head and i the pair index). Norms stay F32, every matrix takes
the chosen type. Goldens (golden.json, golden_logits.npy) come from transformers in
float32 on the values gguf's own dequantize() returns, q/k un-permuted.

Run: build/venv/bin/python tools/make_gguf_fixtures.py --fixtures tests/fixtures [--only SOURCE]

write_family_gguf writes arches qwen3, gemma2, gemma3 and phi3 for
tools/make_family_fixtures.py (which makes those fixtures and their goldens).
"""
import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
from gguf_layout import add_shape, gguf_name, heads_for, permute, unpermute  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

TYPES = {"f32": Q.F32, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}
FAMILY_TYPES = {"f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}
GGUF_VERSION = gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0"
SOURCES = {"llama-tied-bf16": TYPES, "qwen2-bf16": TYPES,
           "cohere2-bf16": {"f32": Q.F32, "q4_1": Q.Q4_1}}

FILE_TYPES = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.F16: gguf.LlamaFileType.MOSTLY_F16,
              Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
              Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1}


def add_tensor(w, name, v, qtype):
    """Add float32 v as tensor name: a matrix (not a *_norm.weight) at type qtype, anything
    else F32, as llama.cpp's converter and llama-quantize store them. Returns the float32
    values a reader gets back (gguf's own dequantize())."""
    if v.ndim == 2 and not name.endswith("_norm.weight") and qtype != Q.F32:
        q = gguf.quants.quantize(v, qtype)
        w.add_tensor(name, q, raw_dtype=qtype)
        return gguf.quants.dequantize(q, qtype).reshape(v.shape).astype(np.float32)
    w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
    return v


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ==== qwen3, gemma2, gemma3, phi3: convert_hf_to_gguf.py's metadata and tensors ====

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}


def add_common(w, cfg, qtype):
    """The keys every one of these converters writes (TextModel.set_gguf_parameters, or the
    model's own list), plus vocabulary size and bos/eos ids (no tokenizer is stored)."""
    add_shape(w, cfg)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(FILE_TYPES[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])


def phi3_rope(cfg):
    """Phi-3's rotary dimensions, attention factor and LongRoPE factor lists, as
    Phi3MiniModel computes them: rope_dims = int(partial_rotary_factor * hidden) // heads,
    attn_factor = sqrt(1 + ln(s) / ln(original)) with s = max_position_embeddings /
    original_max_position_embeddings (1 if s <= 1)."""
    rs = cfg["rope_scaling"]
    orig = cfg["original_max_position_embeddings"]
    dims = int(cfg.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // cfg["num_attention_heads"]
    scale = cfg["max_position_embeddings"] / orig
    attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    assert len(rs["long_factor"]) == len(rs["short_factor"]) == dims // 2
    return dims, attn, rs["long_factor"], rs["short_factor"]


def write_family_gguf(path, cfg, tensors, qtype, meta=None):
    """A qwen3, gemma2, gemma3_text or phi3 model (or a plain llama, the benchmark's
    baseline; cfg: its HF config in the keys mlx-lm's checkpoints use; tensors: float32 with
    HF names) written to path as convert_hf_to_gguf.py lays it out (tensor types as
    llama-quantize gives them: every matrix at qtype, vectors and norms F32); meta(writer),
    when given, adds keys of its own (a tokenizer). Returns the float32 values a reader
    recovers, by HF name, with Gemma's +1 on the norms taken off again."""
    arch = GGUF_ARCH[cfg["model_type"]]
    w = gguf.GGUFWriter(str(path), arch)
    add_common(w, cfg, qtype)
    if meta:
        meta(w)
    hd = mf.head_dim_of(cfg)
    if arch == "llama":
        assert not cfg.get("rope_scaling")
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_rope_dimension_count(hd)
    if arch in ("qwen3", "gemma2", "gemma3"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch == "qwen3":
        w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma2":  # no rope.freq_base: llama.cpp's default 10000
        assert cfg.get("rope_theta", 10000.0) == 10000.0
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma3":
        rs = cfg.get("rope_scaling")
        if rs:
            assert rs["rope_type"] == "linear"
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_rope_freq_base_swa(cfg["rope_local_base_freq"])
        assert not cfg.get("final_logit_softcapping") and not cfg.get("attn_logit_softcapping")
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "phi3":
        dims, attn, long_f, short_f = phi3_rope(cfg)
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
        w.add_rope_dimension_count(dims)
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        w.add_rope_scaling_attn_factors(attn)
        add_tensor(w, "rope_factors_long.weight", np.array(long_f, dtype=np.float32), qtype)
        add_tensor(w, "rope_factors_short.weight", np.array(short_f, dtype=np.float32), qtype)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg["num_hidden_layers"])
    gemma = arch in ("gemma2", "gemma3")
    back = {}
    for hf, v in sorted(tensors.items()):
        if arch == "gemma2" and hf == "lm_head.weight":
            continue  # the converter skips it
        # Gemma's converters store every *norm.weight as 1 + w (exact in float32 for the
        # generator's w, so taking 1 off again gives w back)
        shift = np.float32(1.0 if gemma and hf.endswith("norm.weight") else 0.0)
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        n_head = heads_for(hf, cfg) if arch == "llama" else 0
        if n_head:  # llama.cpp's interleaved RoPE order
            back[hf] = unpermute(add_tensor(w, name, permute(v.astype(np.float32), n_head), qtype), n_head)
            continue
        back[hf] = add_tensor(w, name, v.astype(np.float32) + shift, qtype) - shift
    finish(w)
    return back


def write_one(src_dir, dst_dir, qtype, ids):
    cfg = json.loads((src_dir / "config.json").read_text())
    arch = cfg["model_type"]
    tensors = mf.read_tensors(src_dir)
    w = gguf.GGUFWriter(str(dst_dir / "model.gguf"), arch)
    add_shape(w, cfg)
    if arch == "cohere2":
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
        w.add_logit_scale(cfg["logit_scale"])
        w.add_sliding_window(cfg["sliding_window"])
        assert cfg.get("sliding_window_pattern", 4) == 4
    else:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    back = {}  # the float32 values a reader recovers, in Hugging Face order
    for hf, v in sorted(tensors.items()):
        v = v.astype(np.float32)
        n_head = heads_for(hf, cfg) if arch == "llama" else 0
        deq = add_tensor(w, gguf_name(hf), permute(v, n_head) if n_head else v, qtype)
        back[hf] = unpermute(deq, n_head) if n_head else deq
    finish(w)

    model = mf.build_hf_model(cfg)
    sd = {k: back[k] for k in model.state_dict() if k in back}
    mf.load_into(model, sd, cfg["tie_word_embeddings"])
    logits = mf.hf_logits(model, ids)
    greedy, margins = mf.hf_greedy(model, ids)
    np.save(dst_dir / "golden_logits.npy", logits.astype("<f4"))
    import transformers

    golden = {
        "input_ids": ids,
        "greedy": greedy,
        "min_margin": float(min(margins)),
        "max_abs_logit": float(np.abs(logits).max()),
        "source": src_dir.name,
        "transformers": transformers.__version__,
        "gguf": GGUF_VERSION,
    }
    (dst_dir / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    return golden


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--only", default="", help="comma-separated source fixtures (default: all)")
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x]
    root = Path(args.fixtures)
    ids = json.loads((root / "llama-tied-bf16" / "golden.json").read_text())["input_ids"]
    for src, types in SOURCES.items():
        if only and src not in only:
            continue
        for tname, qtype in types.items():
            dst = root / f"{src.rsplit('-', 1)[0]}-gguf-{tname}"
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            g = write_one(root / src, dst, qtype, ids)
            print(f"{dst.name:28s} {(dst / 'model.gguf').stat().st_size:8d} bytes  min_margin {g['min_margin']:.4f}")


if __name__ == "__main__":
    main()
