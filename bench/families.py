#!/usr/bin/env python3
"""The model families on one shape: celer's decode of each family against its Llama path,
and celer against llama.cpp (llama-bench) on the same GGUF files (docs/benchmarks.md).

    build/bench-venv/bin/python bench/families.py [--make-only] [--quants q4_0,q8_0]
        [--families llama,qwen3,gemma3,gemma2,phi3] [--peer llama,qwen3,gemma3]
        [--rounds 1] [--reps 2] [--threads 2] [--out FILE]

Models (build/bench-models/families/<family>/<quant>.gguf, made once): random weights
(numpy, fixed seed per family, every matrix N(0, 0.02)) on one shape, Llama-3.2-1B's
(hidden 2048, 16 layers, 32 query / 8 KV heads of 64, MLP 8192, vocabulary 128256, tied
embeddings, the Llama 3.1 tokenizer from ../shared/tokenizers), each family with its own
features switched on:
  llama   RoPE base 500000, SwiGLU (the baseline)
  qwen3   per-head q/k RMSNorm
  gemma3  5 local (window 512, base 10000) : 1 global (base 1e6, linear x8) layers, q/k
          norms, four norms a layer, GeGLU, query scale 1/sqrt(64), embedding x sqrt(2048)
  gemma2  alternating window 4096 / global, attention soft-cap 50 and final soft-cap 30,
          four norms a layer, GeGLU
  phi3    fused qkv and gate_up, partial rotary 0.75 (48 of 64 dims), LongRoPE factors
The float32 weights go through tools/make_gguf_fixtures.write_family_gguf (the layout of
llama.cpp's convert_hf_to_gguf.py) as F16, then `llama-quantize --pure` (every matrix,
embedding included, at the type, as bench/make_models.py's Q4_0 files) to each quant.

Runs: per quant, one palindrome per round over celer on each family, then llama-bench on
each --peer family, then the same reversed (so every pair is A B B A), each invocation
`-p 512 -n 128 -r REPS -t THREADS` after its own warm-up. Report: medians of every timed
repetition [min-max], celer / llama.cpp and family / llama (celer) as ratios of medians
with the min-max of the paired invocations.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from machine import cpu_flags, cpu_model, git_commit, loadavg
from run import cell, llama_bench, ratio_cell, results_by_test, run_cmd

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "bench-models" / "families"
CELER = ROOT / "build" / "celer"
sys.path.insert(0, str(ROOT / "tools"))

SHAPE = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
    max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001,
)
GEGLU = dict(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
FAMILIES = {
    "llama": (2001, dict(model_type="llama", rope_theta=500000.0, rms_norm_eps=1e-5, hidden_act="silu")),
    "qwen3": (2002, dict(model_type="qwen3", rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu")),
    "gemma3": (2003, dict(
        model_type="gemma3_text", rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=512,
        sliding_window_pattern=6, query_pre_attn_scalar=64, rms_norm_eps=1e-6, **GEGLU)),
    "gemma2": (2004, dict(
        model_type="gemma2", rope_theta=10000.0, sliding_window=4096, query_pre_attn_scalar=64,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6, **GEGLU)),
    "phi3": (2005, dict(
        model_type="phi3", rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu",
        partial_rotary_factor=0.75, original_max_position_embeddings=4096,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(24)],
                      "long_factor": [1.0 + 1.5 * i for i in range(24)]})),
}
QUANTS = {"q4_0": "Q4_0", "q8_0": "Q8_0"}
TESTS = ("pp512", "tg128")


def log(msg):
    print(f"families: {msg}", file=sys.stderr, flush=True)


def llama_quantize():
    return llama_bench().parent / "llama-quantize"


def config_of(family):
    seed, extra = FAMILIES[family]
    return seed, dict(SHAPE, **extra)


def make(family, quants):
    """Writes the family's F16 GGUF, quantizes it to each missing quant, removes the F16."""
    d = OUT / family
    missing = [q for q in quants if not (d / f"{q}.gguf").exists()]
    if not missing:
        return
    import gguf
    import make_fixtures as mf
    from make_gguf_fixtures import write_family_gguf
    from make_models import SHARED_TOKENIZERS, gguf_vocab

    seed, cfg = config_of(family)
    d.mkdir(parents=True, exist_ok=True)
    log(f"{family}: random weights (seed {seed})")
    tensors = mf.init_weights(cfg, seed, vocab=cfg["vocab_size"], std=0.02)
    tok_dir = SHARED_TOKENIZERS / "llama3_1"

    def tokenizer(w):
        tokens, types, merges = gguf_vocab(tok_dir, cfg["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_add_bos_token(True)

    f16 = d / "f16.gguf.part"
    log(f"{family}: {f16.name}")
    write_family_gguf(f16, cfg, tensors, gguf.GGMLQuantizationType.F16, meta=tokenizer)
    del tensors
    for q in missing:
        log(f"{family}: llama-quantize --pure {QUANTS[q]}")
        part = d / f"{q}.gguf.part"
        subprocess.run([str(llama_quantize()), "--pure", str(f16), str(part), QUANTS[q]],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.replace(part, d / f"{q}.gguf")
    f16.unlink()
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def name_of(o):
    return f"pp{o['n_prompt']}" if int(o.get("n_prompt", 0)) else f"tg{o['n_gen']}"


def invoke(engine, family, quant, args):
    path = OUT / family / f"{quant}.gguf"
    common = ["-m", path, "-p", "512", "-n", "128", "-r", args.reps, "-t", args.threads, "-o", "json"]
    cmd = [CELER, "bench"] + common if engine == "celer" else [llama_bench()] + common
    out, err, rc, rss, secs = run_cmd(cmd)
    base = {"cmd": " ".join(shlex.quote(str(c)) for c in cmd), "seconds": secs, "peak_rss_bytes": rss}
    return results_by_test(out, err, rc, base, TESTS, name_of)


def run_quant(quant, args):
    """{(engine, family): {test: [runs]}} over args.rounds palindromes."""
    order = [("celer", f) for f in args.families] + [("llama.cpp", f) for f in args.peer]
    runs = {k: {t: [] for t in TESTS} for k in order}
    total, n = args.rounds * 2 * len(order), 0
    for rnd in range(args.rounds):
        for engine, family in order + order[::-1]:
            n += 1
            got = invoke(engine, family, quant, args)
            for t, r in got.items():
                r["round"] = rnd
                runs[(engine, family)][t].append(r)
            what = "; ".join(f"{t} {statistics.mean(r['result']['samples_ts']):.1f}" if "result" in r
                             else f"{t} FAILED: {r['error']}" for t, r in got.items())
            log(f"[{n}/{total}] {quant} {engine} {family}: {what} t/s")
    return runs


def report(all_runs, args):
    lines = [f"`{' '.join(shlex.quote(a) for a in ['bench/families.py'] + sys.argv[1:])}`", "",
             f"- commit {git_commit()}, CPU {cpu_model()} ({cpu_flags()}), "
             f"{args.threads} threads, {args.rounds} round(s), {args.reps} timed repetitions an invocation",
             f"- load average after: {loadavg()}", ""]
    for quant, runs in all_runs.items():
        lines += [f"#### {QUANTS[quant]}", "",
                  "| family | celer pp512 | llama.cpp pp512 | celer / llama.cpp | celer tg128 | "
                  "llama.cpp tg128 | celer / llama.cpp | tg128 / llama family (celer) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        base = runs.get(("celer", "llama"))
        for f in args.families:
            c = runs[("celer", f)]
            p = runs.get(("llama.cpp", f))
            row = [f, cell(c["pp512"]), cell(p["pp512"]) if p else "-",
                   ratio_cell(c["pp512"], p["pp512"]) if p else "-", cell(c["tg128"]),
                   cell(p["tg128"]) if p else "-", ratio_cell(c["tg128"], p["tg128"]) if p else "-",
                   ratio_cell(c["tg128"], base["tg128"]) if base and f != "llama" else "-"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-only", action="store_true", help="write the models, run nothing")
    ap.add_argument("--quants", default="q4_0,q8_0")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--peer", default="llama,qwen3,gemma3", help="families llama-bench runs too")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    quants = args.quants.split(",")
    args.families = args.families.split(",")
    args.peer = [f for f in args.peer.split(",") if f]
    bad = [q for q in quants if q not in QUANTS] + [f for f in args.families + args.peer if f not in FAMILIES]
    if bad:
        sys.exit(f"families: unknown {', '.join(bad)}")
    for f in dict.fromkeys(args.families + args.peer):
        make(f, quants)
    if args.make_only:
        return
    if not CELER.exists():
        sys.exit("families: build/celer is missing; HINT: run make first")
    text = report({q: run_quant(q, args) for q in quants}, args)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
