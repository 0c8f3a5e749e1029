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
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
from gguf_layout import gguf_name, heads_for, permute, unpermute  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

TYPES = {"f32": Q.F32, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}
SOURCES = {"llama-tied-bf16": TYPES, "qwen2-bf16": TYPES,
           "cohere2-bf16": {"f32": Q.F32, "q4_1": Q.Q4_1}}

def write_one(src_dir, dst_dir, qtype, ids):
    cfg = json.loads((src_dir / "config.json").read_text())
    arch = cfg["model_type"]
    tensors = mf.read_tensors(src_dir)
    w = gguf.GGUFWriter(str(dst_dir / "model.gguf"), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
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
        stored = permute(v, n_head) if n_head else v
        if v.ndim == 2 and qtype != Q.F32:
            q = gguf.quants.quantize(stored, qtype)
            w.add_tensor(gguf_name(hf), q, raw_dtype=qtype)
            deq = gguf.quants.dequantize(q, qtype).reshape(stored.shape).astype(np.float32)
        else:
            w.add_tensor(gguf_name(hf), np.ascontiguousarray(stored))
            deq = stored
        back[hf] = unpermute(deq, n_head) if n_head else deq
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

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
        "gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0",
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
