#!/usr/bin/env python3
"""Generate the tiny random test checkpoints and golden outputs in tests/fixtures.

Usage:
    bash tools/setup_venv.sh
    build/venv/bin/python tools/make_fixtures.py --out tests/fixtures

Everything is deterministic: weights, prompt ids and seeds are fixed below.

How a fixture is produced
-------------------------
1. Random float32 weights with HF tensor names are drawn from a per-model seed
   and written, together with an HF-style config.json, to a scratch "source"
   directory.
2. That directory is converted exactly the way `mlx_lm.convert` does it (the
   same library calls, minus the tokenizer, which these fixtures do not have):
   `mlx_lm.utils.load_model`, cast of every floating parameter to the target
   dtype, `mlx_lm.utils.quantize_model` for quantized formats,
   `mlx_lm.utils.save_model` and `mlx_lm.utils.save_config`.  So tensor names,
   dtypes, the packed codes, scales and biases (computed by mlx.core.quantize),
   the shard index and the config keys are bit-for-bit what the pinned mlx-lm
   writes.  mlx-lm 0.32.2 writes, for a uniform recipe,
       "quantization": {"group_size": G, "bits": B, "mode": "affine"}
   and an identical "quantization_config"; it also writes
   model.safetensors.index.json even for a single shard, and leaves a linear
   layer dense (no override entry, no scales) when its input dimension is not
   a multiple of the group size (llama-tied-q4g64: down_proj has in = 96).
3. The golden logits are computed by transformers (AutoModelForCausalLM built
   from the written config.json with the quantization keys removed, float32,
   attn_implementation="eager") with its weights set to the checkpoint's
   values: dense tensors converted to float32, quantized tensors dequantized in
   float32 numpy from the stored codes, w = f32(scale) * q + f32(bias) per
   group along the input dimension (4-bit: element j of a uint32 word is bits
   4j..4j+3; 8-bit: byte j).  Bits and group size are inferred from the shapes
   (packed_in * 32 == bits * in, group = in / scales_cols), which is also how
   llama-mixed's lm_head (no override entry) has to be read.
4. Every written directory is loaded back with mlx_lm.utils.load_model and its
   logits are compared with the golden, once in the checkpoint dtype (loose,
   report only) and once with all floating parameters upcast to float32 (should
   agree to ~1e-5 wherever mlx-lm implements the same semantics).

Sliding window semantics (transformers 5.23.0, masking_utils.py):
    causal_mask_function:   kv_idx <= q_idx
    sliding_window_overlay: kv_idx > q_idx - sliding_window
so query i sees key j iff 0 <= i - j < sliding_window (a window of 8 means
the query itself plus the 7 previous tokens).  MistralModel uses
create_sliding_window_causal_mask whenever config.sliding_window is not None.
mlx-lm 0.32.2's create_causal_mask uses the same rule (linds < rinds + window),
but its llama/mistral model only applies it to layers that config
"layer_types" marks "sliding_attention" (and needs at least one
"full_attention" entry there); the mlx cross-check for mistral therefore marks
every layer as sliding after loading (the checkpoint has no layer_types).

rope_traditional (llama-trad-bf16) is explained at permute_for_traditional().

Cohere2 (cohere2-*): five layers with sliding_window_pattern 4 (layers 0, 1, 2
and 4 sliding with window 8, layer 3 global), a window shorter than the
prompt, logit_scale 0.5 and tied embeddings.  cohere2-hf-f32 is the same
model written by transformers' save_pretrained (its own config.json, with
layer_types instead of the pattern), the layout of transformers checkpoints.

Regenerate a subset with --only MODEL[,MODEL...] (the others stay as they are).

tools/make_family_fixtures.py (Qwen3, Gemma 2 and 3, Phi-3, also as GGUF) builds on the
helpers here: init_weights knows those layouts, build_model_group takes a model spec and
a writer for each fixture, save_group a cross-check.
"""

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

VOCAB = 512
PROMPT_LEN = 24
GEN_LEN = 16
PROMPT_SEED = 20240917
MIN_MARGIN = 1e-3
MAX_SEED_TRIES = 64

# --------------------------------------------------------------------------
# Model definitions
# --------------------------------------------------------------------------


def llama_base(**kw):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 2048,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }
    cfg.update(kw)
    return cfg


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

MODELS = {
    "llama3": {
        "seed": 1001,
        "config": llama_base(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
    },
    "llama-tied": {
        "seed": 2001,
        "config": llama_base(
            num_hidden_layers=3, intermediate_size=96, tie_word_embeddings=True
        ),
    },
    "mistral": {
        "seed": 3001,
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "sliding_window": 8,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "bfloat16",
        },
    },
    "qwen2": {
        "seed": 4001,
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 2048,
            # As in real Qwen2 configs: a sliding_window value is present but
            # disabled by use_sliding_window=false (it must be ignored; it is
            # deliberately shorter than the prompt so that a loader applying it
            # fails the golden).
            "use_sliding_window": False,
            "sliding_window": 16,
            "max_window_layers": 1,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "bfloat16",
        },
    },
    "llama-misc": {
        "seed": 5001,
        "config": llama_base(
            head_dim=32,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling={"type": "linear", "factor": 2.0},
            torch_dtype="float16",
        ),
    },
    "llama-yarn": {
        "seed": 6001,
        "config": llama_base(
            hidden_size=128,
            intermediate_size=256,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            max_position_embeddings=64,
            torch_dtype="float32",
        ),
    },
    "llama-trad": {
        "seed": 7001,
        "config": llama_base(rope_traditional=True),
    },
    "cohere2": {
        "seed": 8001,
        "config": {
            "architectures": ["Cohere2ForCausalLM"],
            "model_type": "cohere2",
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "head_dim": 16,
            "intermediate_size": 128,
            "num_hidden_layers": 5,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "layer_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "logit_scale": 0.5,
            "sliding_window": 8,
            "sliding_window_pattern": 4,
            "max_position_embeddings": 2048,
            "attention_bias": False,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "bfloat16",
        },
    },
}

# (directory, model, format).  Formats: a dense dtype, "qBgG" (uniform MLX
# affine), "mixed" (llama-mixed recipe), "sharded" (two-file bf16 copy).
FIXTURES = [
    ("llama3-bf16", "llama3", "bf16"),
    ("llama3-q4g64", "llama3", "q4g64"),
    ("llama3-q8g32", "llama3", "q8g32"),
    ("llama-mixed", "llama3", "mixed"),
    ("llama3-sharded-bf16", "llama3", "sharded"),
    ("llama-tied-bf16", "llama-tied", "bf16"),
    ("llama-tied-q4g64", "llama-tied", "q4g64"),
    ("llama-tied-q8g32", "llama-tied", "q8g32"),
    ("mistral-bf16", "mistral", "bf16"),
    ("mistral-q4g64", "mistral", "q4g64"),
    ("mistral-q8g32", "mistral", "q8g32"),
    ("qwen2-bf16", "qwen2", "bf16"),
    ("qwen2-q4g64", "qwen2", "q4g64"),
    ("qwen2-q8g32", "qwen2", "q8g32"),
    ("llama-misc-f16", "llama-misc", "f16"),
    ("llama-yarn-f32", "llama-yarn", "f32"),
    ("llama-yarn-q4g128", "llama-yarn", "q4g128"),
    ("llama-trad-bf16", "llama-trad", "bf16"),
    ("cohere2-bf16", "cohere2", "bf16"),
    ("cohere2-q4g64", "cohere2", "q4g64"),
    ("cohere2-q8g32", "cohere2", "q8g32"),
    ("cohere2-hf-f32", "cohere2", "hf"),
]

DTYPE_NAMES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}

PROJ_STD = 0.15
BIAS_STD = 0.1
EMBED_STD = 0.35
HEAD_STD = 0.35


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def init_weights(cfg, seed, vocab=VOCAB, std=None):
    """Random float32 weights with HF names: vocab rows of embedding (and head), every
    matrix N(0, std) when std is given (the benchmark's large models), else the fixtures'
    PROJ_STD, EMBED_STD and HEAD_STD.

    Norm weights are drawn around 1 (1 + N(0, 0.1); 1 + N(0, 0.3) for the per-head q/k
    norms), except Gemma's: Gemma multiplies by (1 + w), so w ~ N(0, 0.3) clipped to
    [-0.45, 0.9], far from 1 (a reader that drops the +1 fails) and with 1 + w in
    [0.55, 1.9], where (1 + w) - 1 is exact in float32 (the GGUF round trip adds 1).
    Phi-3's fused qkv_proj (rows q, k, v) and gate_up_proj (rows gate, up) are drawn as
    the separate projections and concatenated."""
    rng = np.random.default_rng(seed)
    H = cfg["hidden_size"]
    I = cfg["intermediate_size"]
    hd = head_dim_of(cfg)
    nq = cfg["num_attention_heads"] * hd
    nkv = cfg["num_key_value_heads"] * hd
    mt = cfg["model_type"]
    qwen = mt == "qwen2"
    gemma = mt in ("gemma2", "gemma3_text")
    qk_norm = mt in ("qwen3", "gemma3_text")
    fused = mt == "phi3"
    attn_bias = cfg.get("attention_bias", False)
    mlp_bias = cfg.get("mlp_bias", False)

    def normal(shape, fixture_std):
        return (rng.standard_normal(shape) * (std or fixture_std)).astype(np.float32)

    def norm_w(n=H, spread=0.1):
        if gemma:
            return np.clip(0.3 * rng.standard_normal(n), -0.45, 0.9).astype(np.float32)
        return (1.0 + spread * rng.standard_normal(n)).astype(np.float32)

    cohere = mt == "cohere2"
    w = {"model.embed_tokens.weight": normal((vocab, H), EMBED_STD)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w()
        for name, out_dim in (("q", nq), ("k", nkv), ("v", nkv)):
            w[p + f"self_attn.{name}_proj.weight"] = normal((out_dim, H), PROJ_STD)
            if qwen or attn_bias:
                w[p + f"self_attn.{name}_proj.bias"] = normal(out_dim, BIAS_STD)
        if qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm_w(hd, 0.3)
            w[p + "self_attn.k_norm.weight"] = norm_w(hd, 0.3)
        w[p + "self_attn.o_proj.weight"] = normal((H, nq), PROJ_STD)
        if attn_bias:
            w[p + "self_attn.o_proj.bias"] = normal(H, BIAS_STD)
        if not cohere:  # Cohere2's one norm feeds attention and the MLP
            w[p + "post_attention_layernorm.weight"] = norm_w()
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm_w()
            w[p + "post_feedforward_layernorm.weight"] = norm_w()
        w[p + "mlp.gate_proj.weight"] = normal((I, H), PROJ_STD)
        w[p + "mlp.up_proj.weight"] = normal((I, H), PROJ_STD)
        w[p + "mlp.down_proj.weight"] = normal((H, I), PROJ_STD)
        if mlp_bias:
            for n, d in (("gate", I), ("up", I), ("down", H)):
                w[p + f"mlp.{n}_proj.bias"] = normal(d, BIAS_STD)
        if fused:
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [w.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [w.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
    w["model.norm.weight"] = norm_w()
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((vocab, H), HEAD_STD)
    return w


# --------------------------------------------------------------------------
# Writing checkpoints (the mlx_lm.convert path)
# --------------------------------------------------------------------------


def write_source(src, cfg, weights):
    from safetensors.numpy import save_file

    src.mkdir(parents=True, exist_ok=True)
    with open(src / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(weights, str(src / "model.safetensors"), metadata={"format": "pt"})


def mixed_predicate(path, module):
    """llama-mixed recipe: down_proj 8-bit g32, layer 1 v_proj dense,
    lm_head 8-bit g64 (its config entry is removed afterwards)."""
    if path.endswith("mlp.down_proj"):
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    if path == "model.layers.1.self_attn.v_proj":
        return False
    if path == "lm_head":
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    return True


def convert(src, dst, fmt, dtype_name):
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(src, lazy=False)
    dtype = getattr(mx, dtype_name)

    def set_dtype(k, v):
        if mx.issubdtype(v.dtype, mx.floating):
            return v.astype(dtype)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))

    if fmt == "mixed":
        model, config = quantize_model(
            model, config, 64, 4, mode="affine", quant_predicate=mixed_predicate
        )
        q = config["quantization"]
        # lm_head stays 8-bit g64 but gets no override entry: a loader has to
        # infer its bits and group size from the tensor shapes.
        del q["lm_head"]
        # Explicit "not quantized" entry for the dense v_proj.
        q["model.layers.1.self_attn.v_proj"] = False
        config["quantization_config"] = q
    elif fmt.startswith("q"):
        bits, group = (int(x) for x in fmt[1:].split("g"))
        model, config = quantize_model(model, config, group, bits, mode="affine")

    save_model(dst, model)
    save_config(config, dst / "config.json")


def write_hf(src, dst):
    """The source weights in float32 through transformers' save_pretrained."""
    import torch

    with open(src / "config.json") as f:
        cfg = json.load(f)
    model = build_hf_model(cfg)
    tensors = read_tensors(src)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    sd, _ = hf_state_dict(cfg, tensors, shapes)
    load_into(model, sd, cfg["tie_word_embeddings"])
    model.config.dtype = torch.float32
    model.save_pretrained(dst, safe_serialization=True)


def write_sharded(bf16_dir, dst):
    """Split the llama3-bf16 tensors over two files with an index."""
    import mlx.core as mx

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(bf16_dir / "config.json", dst / "config.json")
    tensors = mx.load(str(bf16_dir / "model.safetensors"))
    names = sorted(tensors)
    first = [n for n in names if n.startswith("model.embed_tokens.") or n.startswith("model.layers.0.")]
    second = [n for n in names if n not in first]
    files = {
        "model-00001-of-00002.safetensors": first,
        "model-00002-of-00002.safetensors": second,
    }
    weight_map = {}
    for fname, group in files.items():
        mx.save_safetensors(str(dst / fname), {n: tensors[n] for n in group}, metadata={"format": "mlx"})
        for n in group:
            weight_map[n] = fname
    with open(bf16_dir / "model.safetensors.index.json") as f:
        meta = json.load(f)["metadata"]
    assert meta["total_size"] == sum(tensors[n].nbytes for n in names)
    index = {"metadata": meta, "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    with open(dst / "model.safetensors.index.json", "w") as f:
        json.dump(index, f, indent=4)


# --------------------------------------------------------------------------
# Reading checkpoints back and dequantizing in numpy
# --------------------------------------------------------------------------


def read_tensors(d):
    """All tensors of a checkpoint directory as numpy (float32 for floats)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("model*.safetensors")):
        for k, v in load_file(str(f)).items():
            assert k not in out, k
            if v.dtype == torch.uint32:
                out[k] = v.numpy().copy()
            else:
                assert v.is_floating_point(), (k, v.dtype)
                out[k] = v.to(torch.float32).numpy().copy()
    return out


def dequantize(packed, scales, biases, in_dim):
    """MLX affine dequantization, float32: w = scale * q + bias per group."""
    assert packed.dtype == np.uint32
    out_dim, packed_in = packed.shape
    bits = packed_in * 32 // in_dim
    assert packed_in * 32 == bits * in_dim and bits in (4, 8), (packed.shape, in_dim)
    group = in_dim // scales.shape[1]
    assert group * scales.shape[1] == in_dim
    per_word = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    q = ((packed[:, :, None] >> shifts) & mask).reshape(out_dim, in_dim).astype(np.float32)
    s = np.repeat(scales.astype(np.float32), group, axis=1)
    b = np.repeat(biases.astype(np.float32), group, axis=1)
    return s * q + b, bits, group


def permute_for_traditional(w, n_heads, hd):
    """Rows of a q/k projection reordered within each head: new row i takes
    old row 2i and new row i + hd/2 takes old row 2i+1 (i < hd/2).

    Traditional RoPE (what "rope_traditional": true selects in MLX) rotates
    the adjacent pairs (2i, 2i+1) of each head by angle pos * freq_i.
    transformers' RoPE (rotate_half) rotates the pairs (i, i + hd/2) by the
    same angle with the same sign convention.  After this permutation the
    pair (i, i + hd/2) of the permuted projection holds exactly the original
    pair (2i, 2i+1), so non-traditional RoPE on the permuted q and k equals
    traditional RoPE on the original q and k, with the components reordered
    the same way in q and in k.  Attention only uses the per-head dot product
    q.k, which is invariant under applying one permutation to both, and v is
    untouched; so transformers on the permuted weights computes the exact
    output of the traditional-RoPE model on the original weights, which are
    what the checkpoint stores.
    """
    half = hd // 2
    perm_head = np.empty(hd, dtype=np.int64)
    perm_head[:half] = np.arange(half) * 2
    perm_head[half:] = np.arange(half) * 2 + 1
    perm = np.concatenate([h * hd + perm_head for h in range(n_heads)])
    return w[perm]


def hf_state_dict(cfg, tensors, hf_shapes):
    """Checkpoint tensors -> float32 state dict for transformers."""
    sd = {}
    quant_info = {}
    for name, shape in hf_shapes.items():
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix is not None and prefix + ".scales" in tensors:
            w, bits, group = dequantize(
                tensors[name], tensors[prefix + ".scales"], tensors[prefix + ".biases"], shape[1]
            )
            quant_info[prefix] = (bits, group)
            sd[name] = w
        elif name in tensors:
            sd[name] = tensors[name]
        else:
            continue
        assert tuple(sd[name].shape) == tuple(shape), (name, sd[name].shape, shape)
    if cfg.get("rope_traditional", False):
        hd = head_dim_of(cfg)
        for k in list(sd):
            if k.endswith("self_attn.q_proj.weight") or k.endswith("self_attn.q_proj.bias"):
                sd[k] = permute_for_traditional(sd[k], cfg["num_attention_heads"], hd)
            if k.endswith("self_attn.k_proj.weight") or k.endswith("self_attn.k_proj.bias"):
                sd[k] = permute_for_traditional(sd[k], cfg["num_key_value_heads"], hd)
    return sd, quant_info


# --------------------------------------------------------------------------
# transformers reference
# --------------------------------------------------------------------------

HF_DROP_KEYS = ("quantization", "quantization_config", "rope_traditional")


def build_hf_model(cfg):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = {k: v for k, v in cfg.items() if k not in HF_DROP_KEYS}
    with tempfile.TemporaryDirectory() as td:
        with open(Path(td) / "config.json", "w") as f:
            json.dump(hf_cfg, f)
        config = AutoConfig.from_pretrained(td)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    model.eval()
    return model


def load_into(model, sd, tied):
    import torch

    tsd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    res = model.load_state_dict(tsd, strict=False)
    missing = set(res.missing_keys)
    expected_missing = {"lm_head.weight"} if tied else set()
    assert missing == expected_missing, missing
    assert not res.unexpected_keys, res.unexpected_keys
    if tied:
        assert (
            model.lm_head.weight.data_ptr()
            == model.model.embed_tokens.weight.data_ptr()
        ), "lm_head not tied"


def hf_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float32).numpy()


def hf_greedy(model, ids):
    import torch
    from transformers import GenerationConfig

    model.generation_config.eos_token_id = None
    gen = GenerationConfig(
        max_new_tokens=GEN_LEN,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=1,
    )
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            generation_config=gen,
            return_dict_in_generate=True,
            output_logits=True,
        )
    toks = out.sequences[0, len(ids):].tolist()
    assert len(toks) == GEN_LEN, len(toks)
    margins = []
    for step_logits in out.logits:
        v = np.sort(step_logits[0].to(torch.float32).numpy())
        margins.append(float(v[-1] - v[-2]))
    # Cross-check against a cache-free argmax loop.
    seq = list(ids)
    for _ in range(GEN_LEN):
        seq.append(int(np.argmax(hf_logits(model, seq)[-1])))
    assert seq[len(ids):] == toks, (seq[len(ids):], toks)
    return toks, margins


def row_margins(logits):
    v = np.sort(logits, axis=1)
    return v[:, -1] - v[:, -2]


# --------------------------------------------------------------------------
# mlx-lm cross-check (report only)
# --------------------------------------------------------------------------


def mlx_check(d, cfg, ids, golden):
    """Max |mlx-lm logits - golden|, in the checkpoint dtype and upcast to float32."""
    native, f32 = mlx_logits(d, cfg, ids)
    return float(np.abs(native - golden).max()), float(np.abs(f32 - golden).max())


def mlx_logits(d, cfg, ids):
    """mlx-lm's logits for ids on checkpoint d: in the checkpoint dtype, then with every
    floating parameter upcast to float32."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    sliding = cfg["model_type"] == "mistral" and cfg.get("sliding_window")
    extra = None
    if sliding:
        # mlx-lm wants at least one "full_attention" entry in layer_types;
        # build with one sliding layer, then switch every layer to sliding.
        n = cfg["num_hidden_layers"]
        extra = {"layer_types": ["sliding_attention"] + ["full_attention"] * (n - 1)}
    model, _ = load_model(d, lazy=False, strict=True, model_config=extra)
    if sliding:
        for layer in model.model.layers:
            layer.use_sliding = True
    native = np.array(model(mx.array([ids]))[0].astype(mx.float32))

    def up(v):
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.float32)
        return v

    model.update(tree_map(up, model.parameters()))
    f32 = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    return native, f32


def check_quant_against_mlx(d, tensors, quant_info):
    """Our numpy dequantization must equal mx.dequantize bit for bit."""
    import mlx.core as mx

    arrays = {}
    for f in sorted(d.glob("model*.safetensors")):
        arrays.update(mx.load(str(f)))
    for prefix, (bits, group) in quant_info.items():
        ref = mx.dequantize(
            arrays[prefix + ".weight"],
            arrays[prefix + ".scales"].astype(mx.float32),
            arrays[prefix + ".biases"].astype(mx.float32),
            group_size=group,
            bits=bits,
        )
        in_dim = arrays[prefix + ".weight"].shape[1] * 32 // bits
        ours, _, _ = dequantize(
            tensors[prefix + ".weight"], tensors[prefix + ".scales"], tensors[prefix + ".biases"], in_dim
        )
        assert np.array_equal(np.array(ref), ours), prefix


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def prompt_ids():
    rng = np.random.default_rng(PROMPT_SEED)
    return [int(x) for x in rng.integers(3, VOCAB, size=PROMPT_LEN)]


def load_checkpoint_model(d, cfg=None, tensors=None):
    """transformers (fp32, eager) holding checkpoint d's values: (model, cfg, state dict,
    quantized modules). cfg and tensors default to d's config.json and safetensors."""
    if cfg is None:
        with open(d / "config.json") as f:
            cfg = json.load(f)
    if tensors is None:
        tensors = read_tensors(d)
    model = build_hf_model(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    sd, quant_info = hf_state_dict(cfg, tensors, shapes)
    load_into(model, sd, cfg["tie_word_embeddings"])
    if quant_info:
        check_quant_against_mlx(d, tensors, quant_info)
    return model, cfg, sd, quant_info


def golden_record(model, ids):
    """The logits of every row of ids and golden.json's record for them."""
    import transformers

    logits = hf_logits(model, ids)
    greedy, margins = hf_greedy(model, ids)
    return logits, {
        "input_ids": ids,
        "greedy": greedy,
        "min_margin": float(min(margins)),
        "prompt_min_margin": float(row_margins(logits).min()),
        "max_abs_logit": float(np.abs(logits).max()),
        "transformers": transformers.__version__,
    }


def fixture_result(d, model, cfg, sd, ids, quant_info=None):
    """What build_model_group keeps of a written fixture. "extras" maps a suffix to a
    further (golden record, logits), saved as golden_<suffix>.json and
    golden_<suffix>_logits.npy."""
    logits, golden = golden_record(model, ids)
    return {"dir": d, "model": model, "cfg": cfg, "sd": sd, "logits": logits,
            "quant_info": quant_info or {}, "golden": golden, "extras": {}}


def make_fixture(dirname, fmt, src, work, ids):
    """Write fixture dirname of format fmt from the source directory, with its goldens."""
    dst = work / dirname
    if fmt == "sharded":
        write_sharded(work / dirname.replace("-sharded", ""), dst)
    elif fmt == "hf":
        write_hf(src, dst)
    else:
        convert(src, dst, fmt, DTYPE_NAMES.get(fmt, "bfloat16"))
    model, cfg, sd, quant_info = load_checkpoint_model(dst)
    return fixture_result(dst, model, cfg, sd, ids, quant_info)


def smallest_margin(res):
    goldens = [res["golden"]] + [g for g, _ in res["extras"].values()]
    return min(min(g["min_margin"], g["prompt_min_margin"]) for g in goldens)


def variant_differs(cfg, sd, ids, logits, **override):
    """Max |logits| difference when some config keys are changed."""
    c = dict(cfg)
    c.update(override)
    m = build_hf_model(c)
    load_into(m, sd, c["tie_word_embeddings"])
    return float(np.abs(hf_logits(m, ids) - logits).max())


def build_model_group(model_name, fixtures, scratch, ids, log, spec=None, make=make_fixture):
    """Draw weights from spec's seed (MODELS[model_name] by default), write every fixture
    of the group with make(dirname, fmt, src, work, ids), and take the next seed while any
    of their goldens has a top-1/top-2 margin under MIN_MARGIN. spec["init"] replaces
    init_weights."""
    spec = spec or MODELS[model_name]
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        cfg = copy.deepcopy(spec["config"])
        weights = spec.get("init", init_weights)(cfg, seed)
        work = scratch / f"{model_name}-{seed}"
        src = work / "src"
        write_source(src, cfg, weights)
        results = {}
        for dirname, _, fmt in fixtures:
            res = make(dirname, fmt, src, work, ids)
            results[dirname] = res
            if smallest_margin(res) < MIN_MARGIN:
                log(f"  {dirname}: seed {seed} rejected (smallest margin {smallest_margin(res):.2e})")
                break
        else:
            return seed, results
    raise RuntimeError(f"no seed with healthy margins for {model_name}")


def verify_semantics(model_name, results, ids, log):
    """The config feature under test must actually change transformers' output."""
    first = next(iter(results.values()))
    cfg, sd, logits = first["cfg"], first["sd"], first["logits"]
    if model_name in ("llama3", "llama-yarn", "llama-misc"):
        diff = variant_differs(cfg, sd, ids, logits, rope_scaling=None)
        log(f"  rope_scaling {cfg['rope_scaling']} vs none: max logit diff {diff:.4f}")
        assert diff > 1e-2, "rope scaling has no effect"
    if model_name == "mistral":
        diff = variant_differs(cfg, sd, ids, logits, sliding_window=None)
        log(f"  sliding_window {cfg['sliding_window']} vs none: max logit diff {diff:.4f}")
        assert diff > 1e-2, "sliding window has no effect"
    if model_name == "qwen2":
        diff = variant_differs(cfg, sd, ids, logits, use_sliding_window=False, sliding_window=None)
        log(f"  disabled sliding_window vs none: max logit diff {diff:.2e}")
        assert diff == 0.0
    if model_name == "cohere2":
        diff = variant_differs(cfg, sd, ids, logits, sliding_window=4096)
        log(f"  sliding_window {cfg['sliding_window']} vs 4096: max logit diff {diff:.4f}")
        assert diff > 1e-2, "sliding window has no effect"
        diff = variant_differs(cfg, sd, ids, logits, sliding_window_pattern=2)
        log(f"  sliding_window_pattern 4 vs 2: max logit diff {diff:.4f}")
        assert diff > 1e-2, "the global layer makes no difference"
    if model_name == "llama-trad":
        # Ignoring the flag (no permutation) must give different logits.
        c = {k: v for k, v in cfg.items() if k != "rope_traditional"}
        tensors = read_tensors(first["dir"])
        m = build_hf_model(c)
        shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        plain, _ = hf_state_dict(c, tensors, shapes)
        load_into(m, plain, c["tie_word_embeddings"])
        diff = float(np.abs(hf_logits(m, ids) - logits).max())
        log(f"  rope_traditional vs non-traditional: max logit diff {diff:.4f}")
        assert diff > 1e-2


def write_goldens(d, res):
    np.save(d / "golden_logits.npy", res["logits"].astype("<f4"))
    with open(d / "golden.json", "w") as f:
        json.dump(res["golden"], f, indent=2)
        f.write("\n")
    for suffix, (golden, logits) in res["extras"].items():
        np.save(d / f"golden_{suffix}_logits.npy", logits.astype("<f4"))
        with open(d / f"golden_{suffix}.json", "w") as f:
            json.dump(golden, f, indent=2)
            f.write("\n")


def save_group(results, ids, out, log, summary, check=mlx_check):
    """Write each fixture's goldens, cross-check it with check(dir, cfg, ids, logits) ->
    (diff in the checkpoint dtype, diff in float32) or None, and copy it to out."""
    for dirname, res in results.items():
        d = res["dir"]
        diffs = check(d, res["cfg"], ids, res["logits"])
        native, f32 = diffs if diffs else (float("nan"), float("nan"))
        write_goldens(d, res)
        dest = out / dirname
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(d, dest)
        g = res["golden"]
        qi = ", ".join(f"{k}:{b}b/g{gs}" for k, (b, gs) in sorted(res["quant_info"].items()) if k in ("lm_head", "model.embed_tokens", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.v_proj"))
        log(f"  {dirname}: min_margin {g['min_margin']:.4f} prompt_min_margin "
            f"{g['prompt_min_margin']:.4f} max_abs_logit {g['max_abs_logit']:.2f} "
            f"mlx diff native {native:.4f} f32 {f32:.2e}"
            + (f" [{qi}]" if qi else ""))
        summary.append((dirname, dir_size(dest), g["min_margin"], native, f32))


def dir_size(d):
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def print_summary(summary, log):
    total = 0
    log("\nfixture                     size(B)  min_margin  mlx_native  mlx_f32")
    for name, size, mm, nat, f32 in summary:
        total += size
        log(f"{name:26s} {size:8d}  {mm:10.4f}  {nat:10.4f}  {f32:.2e}")
    log(f"total {total} bytes")


def start(doc):
    """A generator's command line (--out, --only) and set-up: (out, only, log)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    args = ap.parse_args()

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)

    def log(msg):
        print(msg, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    return args.out, [m for m in args.only.split(",") if m], log


def main():
    out, only, log = start(__doc__)
    ids = prompt_ids()
    summary = []
    with tempfile.TemporaryDirectory() as td:
        scratch = Path(td)
        for model_name in MODELS:
            if only and model_name not in only:
                continue
            group = [f for f in FIXTURES if f[1] == model_name]
            log(f"{model_name}:")
            seed, results = build_model_group(model_name, group, scratch, ids, log)
            log(f"  seed {seed}")
            verify_semantics(model_name, results, ids, log)
            if model_name == "llama3":
                a = results["llama3-bf16"]
                b = results["llama3-sharded-bf16"]
                assert np.array_equal(a["logits"], b["logits"])
                assert a["golden"] == b["golden"]
            save_group(results, ids, out, log, summary)
    print_summary(summary, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
