#!/usr/bin/env python3
"""Tiny random checkpoints of the Qwen3, Gemma 2, Gemma 3 and Phi-3 families, with goldens.

Usage:
    build/venv/bin/python tools/make_family_fixtures.py --out tests/fixtures [--only MODEL,...]

The method is make_fixtures.py's (its helpers do the work): random float32 weights with
HF names drawn from a per-model seed, every norm weight random too; the mlx-lm layouts
converted exactly as `mlx_lm.convert` does; the transformers layout written by
`save_pretrained` in float32; goldens from transformers (float32, eager) on the values
the checkpoint holds; seeds re-drawn until every golden's margins are >= 1e-3. Two
layouts are new here:

- GGUF (`<name>-gguf-<type>`), written by make_gguf_fixtures.write_family_gguf as
  llama.cpp's convert_hf_to_gguf.py lays these architectures out (llama-quantize's types:
  every matrix at the type, vectors and norms F32), from the float32 source weights.
  Goldens come from transformers on the values gguf's dequantize() returns, mapped back
  to the HF names (Gemma's norms minus the 1 the converter adds).
- gemma3-mm-*: a Gemma3ForConditionalGeneration checkpoint (config with `text_config` and
  a tiny SigLIP `vision_config`; the vision tower and projector are random and unused).
  Its goldens are text only: Gemma3ForCausalLM built from `text_config` on the
  `language_model.*` tensors, which the generator checks against
  Gemma3ForConditionalGeneration.from_pretrained on the transformers layout.

Phi-3 fixtures also get golden_short.json / golden_short_logits.npy: a 12-token prompt
(within original_max_position_embeddings 16, so short factors) whose greedy continuation
crosses position 16 (see README: when transformers switches to the long factors).

Everything is checked by the generator: each config feature under test changes
transformers' logits (softcaps, windows, layer kinds, query scale, (1 + w) norms, rope
scaling and LongRoPE factors), and each safetensors layout is cross-checked with mlx-lm
(parameters upcast to float32), also against transformers with the features mlx-lm lacks
turned off. Deterministic: a second run gives identical files.
"""

import copy
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
import make_gguf_fixtures as mg  # noqa: E402

SHORT_LEN = 12  # Phi-3's second prompt: within original_max_position_embeddings


def base(**kw):
    """What every model here shares: vocab 512, hidden 64, 4 heads / 2 KV heads, inter 128,
    bos 1, eos 2, pad 0, tied embeddings, no biases (each family overrides some)."""
    cfg = dict(
        vocab_size=mf.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, initializer_range=0.02, use_cache=True,
        torch_dtype="bfloat16",
    )
    cfg.update(kw)
    return cfg


QWEN3 = base(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32, hidden_act="silu",
    rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False,
    sliding_window=None, max_window_layers=2,
)
GEMMA2 = base(
    architectures=["Gemma2ForCausalLM"], model_type="gemma2", num_hidden_layers=4, head_dim=16,
    query_pre_attn_scalar=24, hidden_act="gelu_pytorch_tanh",
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, rope_theta=10000.0,
    attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=8,
    cache_implementation="hybrid",
)
GEMMA3_TEXT = base(
    architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=6,
    intermediate_size=64, head_dim=32, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
    rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=8,
    sliding_window_pattern=6, attn_logit_softcapping=None, final_logit_softcapping=None,
)
SIGLIP = {
    "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
    "num_channels": 3, "layer_norm_eps": 1e-6, "vision_use_head": False,
}
GEMMA3_MM = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {k: v for k, v in GEMMA3_TEXT.items() if k not in ("architectures", "torch_dtype")},
    "vision_config": SIGLIP,
    "mm_tokens_per_image": 4,
    "boi_token_index": 509,
    "eoi_token_index": 510,
    "image_token_index": 511,
    # mlx-lm 0.32.2 sets the text model's vocabulary from this (default 262208).
    "vocab_size": mf.VOCAB,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}
PHI3 = base(
    architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_act="silu", rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling={
        "type": "longrope",
        "short_factor": [1.0, 1.25, 0.9, 1.6, 1.1, 2.0, 1.4, 2.5],
        "long_factor": [1.2, 2.5, 1.8, 4.0, 3.0, 7.0, 5.5, 12.0],
    },
    max_position_embeddings=64, original_max_position_embeddings=16, sliding_window=12,
    tie_word_embeddings=False, embd_pdrop=0.0, resid_pdrop=0.0,
)
PHI4_MINI = dict(
    PHI3, partial_rotary_factor=0.75, sliding_window=None, tie_word_embeddings=True,
    rope_scaling={
        "type": "longrope",
        "short_factor": [1.0, 1.3, 0.85, 1.7, 1.15, 2.2],
        "long_factor": [1.5, 2.2, 3.1, 2.6, 6.0, 9.5],
    },
)


def mm_init(cfg, seed):
    """gemma3-mm's source tensors, named as the Hub's Gemma 3 checkpoints: the text model's
    (init_weights on text_config, the same draw as gemma3-text) under `language_model.`,
    then a random SigLIP tower under `vision_tower.vision_model.` and the projector
    `multi_modal_projector.*` (unused by the text-only goldens)."""
    text = mf.init_weights(cfg["text_config"], seed)
    w = {"language_model." + k: v for k, v in text.items()}
    rng = np.random.default_rng(seed + 7)
    for name, shape in mm_extra_shapes(cfg).items():
        w[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return w


def mm_extra_shapes(cfg):
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "config.json").write_text(json.dumps(cfg))
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(td))
    out = {}
    for k, v in model.state_dict().items():
        if k.startswith("model.vision_tower."):
            out["vision_tower.vision_model." + k[len("model.vision_tower."):]] = tuple(v.shape)
        elif k.startswith("model.multi_modal_projector."):
            out[k[len("model."):]] = tuple(v.shape)
    return out


MODELS = {
    "qwen3": {"seed": 9001, "config": QWEN3},
    "qwen3-untied": {"seed": 9101, "config": dict(QWEN3, tie_word_embeddings=False)},
    "gemma2": {"seed": 10001, "config": GEMMA2},
    # GGUF has no query scale: llama.cpp takes 1/sqrt(key_length) (1/sqrt(hidden / heads)
    # for the 27B sizes only), so these sources have query_pre_attn_scalar = head_dim.
    "gemma2-gguf": {"seed": 10101, "config": dict(GEMMA2, query_pre_attn_scalar=16)},
    "gemma3-text": {"seed": 11001, "config": GEMMA3_TEXT},
    "gemma3-text-gguf": {"seed": 11101, "config": dict(GEMMA3_TEXT, query_pre_attn_scalar=32)},
    "gemma3-mm": {"seed": 11001, "config": GEMMA3_MM, "init": mm_init},
    "phi3": {"seed": 12001, "config": PHI3},
    "phi4-mini": {"seed": 13001, "config": PHI4_MINI},
}

ALL_GGUF = ("f16", "q8_0", "q4_0", "q4_1")
FIXTURES = (
    [(f"qwen3-{f}", "qwen3", f) for f in ("bf16", "q4g64", "q8g32")]
    + [("qwen3-hf-f32", "qwen3", "hf")]
    + [(f"qwen3-gguf-{t}", "qwen3", "gguf-" + t) for t in ALL_GGUF]
    + [("qwen3-untied-bf16", "qwen3-untied", "bf16")]
    + [(f"gemma2-{f}", "gemma2", f) for f in ("bf16", "q4g64", "q8g32")]
    + [("gemma2-hf-f32", "gemma2", "hf")]
    + [(f"gemma2-gguf-{t}", "gemma2-gguf", "gguf-" + t) for t in ALL_GGUF]
    + [(f"gemma3-text-{f}", "gemma3-text", f) for f in ("bf16", "q4g64", "q8g32")]
    + [("gemma3-text-hf-f32", "gemma3-text", "hf")]
    + [(f"gemma3-text-gguf-{t}", "gemma3-text-gguf", "gguf-" + t) for t in ALL_GGUF]
    + [("gemma3-mm-bf16", "gemma3-mm", "bf16"), ("gemma3-mm-hf-bf16", "gemma3-mm", "hf")]
    + [(f"phi3-{f}", "phi3", f) for f in ("bf16", "q4g64", "q8g32")]
    + [("phi3-hf-f32", "phi3", "hf")]
    + [(f"phi3-gguf-{t}", "phi3", "gguf-" + t) for t in ALL_GGUF]
    + [("phi4-mini-bf16", "phi4-mini", "bf16"), ("phi4-mini-q4g64", "phi4-mini", "q4g64"),
       ("phi4-mini-hf-f32", "phi4-mini", "hf"), ("phi4-mini-gguf-f16", "phi4-mini", "gguf-f16"),
       ("phi4-mini-gguf-q4_0", "phi4-mini", "gguf-q4_0")]
)


# --------------------------------------------------------------------------
# Writing fixtures and their goldens
# --------------------------------------------------------------------------


def read_config(d):
    with open(d / "config.json") as f:
        return json.load(f)


def mm_text_view(cfg, tensors):
    """A gemma3 (multimodal) checkpoint's text model as Gemma3ForCausalLM sees it: the
    text_config (with the top-level tie_word_embeddings, which transformers obeys) and the
    `language_model.` tensors without that prefix; the vision tensors dropped."""
    text = dict(cfg["text_config"], architectures=["Gemma3ForCausalLM"])
    text["tie_word_embeddings"] = cfg.get("tie_word_embeddings", True)
    pre = "language_model."
    return text, {k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)}


def write_mm_hf(src, dst):
    """transformers' own reading of the Hub-named source, saved by save_pretrained in
    bfloat16 (the dtype of the Hub's Gemma 3 checkpoints)."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.bfloat16, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    model.save_pretrained(dst, safe_serialization=True)


def make(dirname, fmt, src, work, ids):
    """make_fixtures.make_fixture, plus GGUF, gemma3-mm's text view and Phi-3's short prompt."""
    cfg = read_config(src)
    mm = cfg["model_type"] == "gemma3"
    if fmt.startswith("gguf-"):
        dst = work / dirname
        dst.mkdir(parents=True)
        back = mg.write_family_gguf(dst / "model.gguf", cfg, mf.read_tensors(src),
                                    mg.FAMILY_TYPES[fmt[len("gguf-"):]])
        model = mf.build_hf_model(cfg)
        sd = {k: back[k] for k in model.state_dict() if k in back}
        mf.load_into(model, sd, cfg["tie_word_embeddings"])
        res = mf.fixture_result(dst, model, cfg, sd, ids)
        res["golden"]["gguf"] = mg.GGUF_VERSION
    elif mm:
        dst = work / dirname
        if fmt == "hf":
            write_mm_hf(src, dst)
        else:
            mf.convert(src, dst, fmt, mf.DTYPE_NAMES.get(fmt, "bfloat16"))
        text_cfg, tensors = mm_text_view(read_config(dst), mf.read_tensors(dst))
        model, _, sd, quant_info = mf.load_checkpoint_model(dst, text_cfg, tensors)
        res = mf.fixture_result(dst, model, text_cfg, sd, ids, quant_info)
        res["mm"] = True
    else:
        res = mf.make_fixture(dirname, fmt, src, work, ids)
    if cfg["model_type"] == "phi3":
        logits, golden = mf.golden_record(res["model"], ids[:SHORT_LEN])
        res["extras"]["short"] = (golden, logits)
    return res


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


def diff_with(res, ids, logits=None, sd=None, **override):
    """Max |logits| difference of transformers with config keys overridden (and/or other
    weights) against the golden (or the given logits)."""
    c = dict(res["cfg"], **override)
    m = mf.build_hf_model(c)
    mf.load_into(m, sd if sd is not None else res["sd"], c["tie_word_embeddings"])
    ref = res["logits"] if logits is None else logits
    return float(np.abs(mf.hf_logits(m, ids) - ref).max())


def expect(log, what, diff, floor=1e-2):
    log(f"  {what}: max logit diff {diff:.4f}")
    assert diff > floor, f"{what}: no effect"


def naive_cached_greedy(model, ids):
    """Greedy decoding that keeps every cached key as it was rotated (no recomputation when
    the sequence crosses original_max_position_embeddings), for comparison."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    seq = list(ids)
    x = torch.tensor([seq])
    out = []
    with torch.no_grad():
        for _ in range(mf.GEN_LEN):
            pos = torch.arange(len(seq) - x.shape[1], len(seq))[None]
            logits = model(x, past_key_values=cache, position_ids=pos, use_cache=True).logits
            tok = int(torch.argmax(logits[0, -1]))
            out.append(tok)
            seq.append(tok)
            x = torch.tensor([[tok]])
    return out


def verify_semantics(name, results, ids, log):
    """Each config feature under test must change transformers' logits."""
    first = next(iter(results.values()))
    cfg, sd = first["cfg"], first["sd"]
    mt = cfg["model_type"]
    if mt == "qwen3":
        ones = {k: (np.ones_like(v) if k.endswith(("q_norm.weight", "k_norm.weight")) else v)
                for k, v in sd.items()}
        expect(log, "q_norm/k_norm weights vs ones", diff_with(first, ids, sd=ones))
        expect(log, "rope_theta 1e6 vs 1e4", diff_with(first, ids, rope_theta=10000.0))
    if mt == "gemma2":
        expect(log, "attn_logit_softcapping 2.0 vs none",
               diff_with(first, ids, attn_logit_softcapping=None), 0.5)
        expect(log, "final_logit_softcapping 3.0 vs none",
               diff_with(first, ids, final_logit_softcapping=None), 0.5)
        expect(log, "sliding_window 8 vs 4096", diff_with(first, ids, sliding_window=4096))
        expect(log, "layer_types alternating vs all sliding",
               diff_with(first, ids, layer_types=["sliding_attention"] * 4))
    if mt == "gemma3_text":
        expect(log, "sliding_window 8 vs 4096", diff_with(first, ids, sliding_window=4096))
        expect(log, "sliding_window_pattern 6 vs 2", diff_with(first, ids, sliding_window_pattern=2))
        expect(log, "linear rope_scaling 8 vs none", diff_with(first, ids, rope_scaling=None))
        expect(log, "rope_local_base_freq 1e4 vs 1e6",
               diff_with(first, ids, rope_local_base_freq=1000000.0))
    if mt in ("gemma2", "gemma3_text"):
        hd = cfg["head_dim"]
        if cfg["query_pre_attn_scalar"] != hd:
            expect(log, f"query_pre_attn_scalar {cfg['query_pre_attn_scalar']} vs head_dim {hd}",
                   diff_with(first, ids, query_pre_attn_scalar=hd))
        plain = {k: (v - 1 if k.endswith("norm.weight") else v) for k, v in sd.items()}
        expect(log, "norms x (1 + w) vs x w", diff_with(first, ids, sd=plain))
    if mt == "phi3":
        rs = cfg["rope_scaling"]
        swapped = dict(rs, long_factor=rs["short_factor"], short_factor=rs["long_factor"])
        expect(log, "24-token prompt: long factors vs short",
               diff_with(first, ids, rope_scaling=dict(rs, long_factor=rs["short_factor"])))
        g, short_logits = first["extras"]["short"]
        expect(log, "12-token prompt: short factors vs long",
               diff_with(first, ids[:SHORT_LEN], logits=short_logits, rope_scaling=swapped))
        expect(log, "LongRoPE attention factor vs 1",
               diff_with(first, ids, rope_scaling=dict(rs, attention_factor=1.0)))
        if cfg.get("sliding_window"):
            expect(log, f"sliding_window {cfg['sliding_window']} vs none",
                   diff_with(first, ids, sliding_window=None))
        naive = naive_cached_greedy(first["model"], ids[:SHORT_LEN])
        log(f"  12-token prompt greedy {g['greedy']}; keeping the short-rotated cache: "
            f"{naive} ({'same' if naive == g['greedy'] else 'differs'})")
    if first.get("mm"):
        check_mm_golden(results, ids, log)


def check_mm_golden(results, ids, log):
    """Gemma3ForConditionalGeneration (transformers reading its own layout) gives the text
    goldens."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = next(r for r in results.values() if "-hf-" in r["dir"].name)
    model = AutoModelForCausalLM.from_pretrained(hf["dir"], dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    diff = float(np.abs(mf.hf_logits(model, ids) - hf["logits"]).max())
    log(f"  Gemma3ForConditionalGeneration text-only vs Gemma3ForCausalLM: max diff {diff:.2e}")
    assert diff < 1e-5


def mlx_semantics(cfg):
    """Config overrides that make transformers compute what mlx-lm 0.32.2 computes for
    a checkpoint with config cfg, where that differs (None where it does not): mlx-lm's
    gemma2 and phi3 have no sliding window; from a transformers 5.x config (rope_parameters,
    no rope_theta / rope_scaling keys) its gemma3_text takes rope_theta 1e6,
    rope_local_base_freq 1e4 and no rope scaling, and its phi3 plain RoPE of base 1e4."""
    mt = cfg["model_type"]
    rp = cfg.get("rope_parameters")
    if mt == "gemma2":
        return {"sliding_window": 4096}
    if mt == "gemma3_text" and rp:
        return {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    if mt == "phi3":
        out = {"sliding_window": None} if cfg.get("sliding_window") else {}
        if rp:
            out["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                      "partial_rotary_factor": rp["partial_rotary_factor"]}
        return out or None
    return None


def family_check(results, log):
    """save_group's cross-check: mlx-lm on each safetensors fixture (none for GGUF), and
    where mlx-lm's semantics differ, against transformers with them."""

    def check(d, cfg, ids, golden):
        if (d / "model.gguf").exists():
            return None
        native, f32 = mf.mlx_logits(d, cfg, ids)
        ref = mlx_semantics(cfg)
        if ref:
            log(f"    {d.name}: mlx-lm f32 vs transformers with {json.dumps(ref)}: "
                f"{diff_with(results[d.name], ids, logits=f32, **ref):.2e}")
        return float(np.abs(native - golden).max()), float(np.abs(f32 - golden).max())

    return check


def main():
    out, only, log = mf.start(__doc__)
    ids = mf.prompt_ids()
    summary = []
    with tempfile.TemporaryDirectory() as td:
        for name, spec in MODELS.items():
            if only and name not in only:
                continue
            group = [f for f in FIXTURES if f[1] == name]
            log(f"{name}:")
            seed, results = mf.build_model_group(name, group, Path(td), ids, log,
                                                 spec=copy.deepcopy(spec), make=make)
            log(f"  seed {seed}")
            verify_semantics(name, results, ids, log)
            mf.save_group(results, ids, out, log, summary, check=family_check(results, log))
    mf.print_summary(summary, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
