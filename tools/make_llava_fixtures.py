#!/usr/bin/env python3
"""Generate the tiny random LLaVA-NeXT (LLaVA 1.6) checkpoints and goldens in tests/fixtures/llava-*.

Usage:
    bash tools/setup_venv.sh
    build/venv/bin/python tools/make_llava_fixtures.py --out tests/fixtures [--only NAME[,NAME...]]

Deterministic: weights, images, prompt ids and seeds are fixed below (a seed whose
goldens have a top-1/top-2 margin under 1e-3 is rejected and the next one tried).

Fixtures (tests/fixtures/README.md, section "LLaVA-NeXT", has the details):

    llava-mistral-f32     mistral text model; transformers 5.23.0 save_pretrained with
                          save_original_format=False: model.language_model.*, lm_head.weight,
                          model.vision_tower.*, model.multi_modal_projector.*, model.image_newline
    llava-llama-bf16      llama text model, bf16; the layout transformers < 4.52 wrote:
                          language_model.model.*, language_model.lm_head.weight,
                          vision_tower.vision_model.*, multi_modal_projector.*, image_newline,
                          and the sparse config.json transformers 4.45.2 writes (defaults left out)
    llava-qwen2-f32       qwen2 text model (q/k/v biases, tied embeddings);
                          vision_feature_layer [-3, -1] (two hidden states concatenated);
                          transformers 5.23.0 save_pretrained as is (save_original_format=True):
                          language_model.model.*, vision_tower.* (no vision_model level),
                          multi_modal_projector.*, image_newline
    llava-mistral-mlx-q4  mistral text model; mlx-vlm 0.7.10's own conversion
                          (mlx_vlm.convert.convert, -q, 4 bits, group 64) of a float16
                          checkpoint in the < 4.52 layout: the language model 4-bit, the vision
                          tower and projector float16, the patch kernel channels last

How a fixture is made:
1. A LlavaNextForConditionalGeneration is built from its config (transformers 5.23.0) and its
   parameters are drawn from a numpy generator (seeded, in sorted parameter-name order),
   then rounded to the checkpoint dtype.
2. The checkpoint is written (see the layouts above), with preprocessor_config.json from
   LlavaNextImageProcessor.save_pretrained (crop 56, shortest edge 56, the pinpoints, CLIP
   mean/std, bicubic).
3. The goldens are computed by transformers in float32 with attn_implementation="eager" on
   the checkpoint as read back from disk: LlavaNextForConditionalGeneration.from_pretrained
   on the directory (which must report no missing, unexpected or mismatched tensors); for
   the mlx-vlm checkpoint on its tensors dequantized in float32 (w = scale * q + bias per
   group of the input dimension, the same formula as tools/make_fixtures.py, checked equal to
   mx.dequantize) and its patch kernel transposed back, loaded from a scratch copy in the
   < 4.52 layout.
4. Per image case, LlavaNextProcessor (the image processor above, a word-level tokenizer
   whose id 500 is "<image>", patch_size 14, num_additional_image_tokens 1, strategy default)
   expands the prompt's one "<image>" into one image token per feature position and gives
   pixel_values and image_sizes. The count is checked against
   LlavaNextProcessor._get_number_of_features, against the packed feature length the model
   produces, and against an independent torch implementation of the tower, projector and
   anyres packing in this file (reference_image_rows), which must match the features to 1e-5.
   The features must also be exactly the rows of inputs_embeds at the image tokens.
5. Logits of every prompt row come from one forward pass; the greedy continuation from
   model.generate (16 tokens, EOS not stopping it), cross-checked by a cache-free argmax loop.
6. The mlx-vlm checkpoint is also loaded by mlx-vlm itself (strict) and, with its parameters
   upcast to float32, its vision tower + projector and its text-only logits are compared with
   transformers' (report; bounded loosely).

--check-legacy-config PYTHON runs PYTHON (an interpreter with transformers 4.45.2 and no
torch) to confirm that the < 4.52 config.json files written here are what that version's
LlavaNextConfig.save_pretrained writes for the same settings.
"""

import argparse
import copy
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

VOCAB = 512
IMAGE_TOKEN = 500
GEN_LEN = 16
MIN_MARGIN = 1e-3
MAX_SEED_TRIES = 48
CROP = 56
PATCH = 14
PINPOINTS = [[56, 112], [112, 56], [112, 112]]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
PROMPT_SEED = 20241205
TEXT_BEFORE = 19  # random ids after BOS and before the image: 20 text tokens precede it
TEXT_AFTER = 5

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              image_size=CROP, patch_size=PATCH, hidden_act="quick_gelu", layer_norm_eps=1e-5)

TEXT_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", bos_token_id=1,
                   eos_token_id=2)

TEXT = {
    "mistral": dict(TEXT_COMMON, model_type="mistral", rms_norm_eps=1e-5, rope_theta=1000000.0,
                    sliding_window=None, max_position_embeddings=32768, tie_word_embeddings=False),
    "llama": dict(TEXT_COMMON, model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
                  max_position_embeddings=2048, tie_word_embeddings=False),
    "qwen2": dict(TEXT_COMMON, model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0,
                  use_sliding_window=False, max_position_embeddings=32768, tie_word_embeddings=True),
}

# Image cases: (name, width, height, format). Over all fixtures the anyres grids 1x2, 2x1
# and 2x2 occur, with and without padding, with unpadding cutting rows, cutting columns
# and cutting nothing, an image smaller than a tile, and one whose unpadded width is
# decided by transformers' round(x, 7) (int() alone would cut a column pair more).
FIXTURES = {
    "llava-mistral-f32": dict(
        text="mistral", layout="hf5", dtype="float32", seed=21001, feature_layer=-2,
        cases=[("wide", 120, 50, "png"), ("tall", 40, 110, "jpg"), ("rect", 100, 60, "png")]),
    "llava-llama-bf16": dict(
        text="llama", layout="hf4", dtype="bfloat16", seed=22001, feature_layer=-2,
        cases=[("exact", 112, 56, "png"), ("square", 80, 80, "jpg"), ("tiny", 30, 20, "png")]),
    "llava-qwen2-f32": dict(
        text="qwen2", layout="hf5-original", dtype="float32", seed=23001, feature_layer=[-3, -1],
        cases=[("tall", 50, 120, "png"), ("photo", 150, 100, "jpg"), ("round7", 392, 147, "jpg")]),
    "llava-mistral-mlx-q4": dict(
        text="mistral", layout="mlx-vlm", dtype="float16", seed=24001, feature_layer=-2,
        cases=[("wide", 120, 50, "png"), ("tall", 50, 120, "jpg"), ("square", 90, 80, "png")]),
}
MLX_BITS = 4
MLX_GROUP = 64

TEXT_STD = 0.15
BIAS_STD = 0.1
EMBED_STD = 0.35


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------


def text_config(kind, dtype):
    from transformers import AutoConfig

    t = dict(TEXT[kind])
    theta = t.pop("rope_theta")
    model_type = t.pop("model_type")
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    t["dtype"] = dtype
    return AutoConfig.for_model(model_type, **t)


def llava_config(spec):
    from transformers import CLIPVisionConfig, LlavaNextConfig

    kind = spec["text"]
    cfg = LlavaNextConfig(
        vision_config=CLIPVisionConfig(**VISION),
        text_config=text_config(kind, spec["dtype"]),
        image_token_index=IMAGE_TOKEN,
        image_grid_pinpoints=PINPOINTS,
        vision_feature_layer=spec["feature_layer"],
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        multimodal_projector_bias=True,
        tie_word_embeddings=TEXT[kind]["tie_word_embeddings"],
    )
    cfg.architectures = ["LlavaNextForConditionalGeneration"]
    cfg.dtype = spec["dtype"]
    return cfg


def legacy_config(spec):
    """config.json as transformers 4.45.2's LlavaNextConfig.save_pretrained writes it
    (to_json_string(use_diff=True): values equal to the class defaults are left out, so
    e.g. text_config has no rope_theta when it is 10000 and vision_config has no
    hidden_act, which defaults to quick_gelu). --check-legacy-config confirms it."""
    kind = spec["text"]
    t = TEXT[kind]
    assert kind in ("llama", "mistral") and spec["feature_layer"] == -2
    text = {
        "head_dim": t["hidden_size"] // t["num_attention_heads"],
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "model_type": kind,
        "num_attention_heads": t["num_attention_heads"],
        "num_hidden_layers": t["num_hidden_layers"],
        "num_key_value_heads": t["num_key_value_heads"],
        "rms_norm_eps": t["rms_norm_eps"],
        "torch_dtype": spec["dtype"],
        "vocab_size": t["vocab_size"],
    }
    if kind == "mistral":  # MistralConfig 4.45 defaults: rope_theta 1e4, sliding_window 4096
        text.update(max_position_embeddings=t["max_position_embeddings"], rope_theta=t["rope_theta"],
                    sliding_window=t["sliding_window"])
    else:  # LlamaConfig 4.45 defaults: rope_theta 1e4, max_position_embeddings 2048
        assert t["rope_theta"] == 10000.0 and t["max_position_embeddings"] == 2048
    text = dict(sorted(text.items()))
    vision = {
        "hidden_size": VISION["hidden_size"],
        "image_size": VISION["image_size"],
        "intermediate_size": VISION["intermediate_size"],
        "model_type": "clip_vision_model",
        "num_attention_heads": VISION["num_attention_heads"],
        "num_hidden_layers": VISION["num_hidden_layers"],
        "patch_size": VISION["patch_size"],
        # CLIPVisionConfig's default (512) differs from the projection_dim of the default
        # vision config LlavaNextConfig diffs against (768), so it is written
        "projection_dim": 512,
    }
    return {
        "architectures": ["LlavaNextForConditionalGeneration"],
        "ignore_index": -100,
        "image_grid_pinpoints": PINPOINTS,
        "image_seq_length": 576,
        "image_token_index": IMAGE_TOKEN,
        "model_type": "llava_next",
        "projector_hidden_act": "gelu",
        "text_config": text,
        "tie_word_embeddings": t["tie_word_embeddings"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.45.2",
        "vision_config": vision,
        "vision_feature_layer": spec["feature_layer"],
        "vision_feature_select_strategy": "default",
    }


LEGACY_CHECK = r"""
import json, sys
from transformers import CLIPVisionConfig, LlavaNextConfig, LlamaConfig, MistralConfig
assert __import__("transformers").__version__ == "4.45.2"
a = json.loads(sys.argv[1])
t = dict(a["text"]); cls = {"llama": LlamaConfig, "mistral": MistralConfig}[t.pop("model_type")]
t.pop("rope_parameters", None)
cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(**a["vision"]).to_dict(),
                      text_config=cls(**t).to_dict(), **a["top"])
cfg.architectures = ["LlavaNextForConditionalGeneration"]
print(cfg.to_json_string(use_diff=True))
"""


def check_legacy_config(python, spec):
    t = dict(TEXT[spec["text"]], torch_dtype=spec["dtype"])
    arg = {"text": t, "vision": VISION,
           "top": {"image_token_index": IMAGE_TOKEN, "image_grid_pinpoints": PINPOINTS,
                   "vision_feature_layer": spec["feature_layer"],
                   "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
                   "torch_dtype": spec["dtype"], "tie_word_embeddings": t["tie_word_embeddings"]}}
    out = subprocess.run([python, "-c", LEGACY_CHECK, json.dumps(arg)], check=True,
                         capture_output=True, text=True).stdout
    theirs = json.loads(out)
    ours = legacy_config(spec)
    assert theirs == ours, (theirs, ours)


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


def param_std(name, shape):
    """(kind, scale) for a parameter by its transformers name."""
    if "vision_tower" in name:
        if name.endswith("patch_embedding.weight"):
            return "normal", 1.5 / math.sqrt(int(np.prod(shape[1:])))
        if name.endswith("class_embedding"):
            return "normal", 0.5
        if name.endswith("position_embedding.weight"):
            return "normal", 0.3
    if "norm" in name:  # layer norms, RMS norms, pre_layrnorm
        return ("one", 0.1) if name.endswith("weight") else ("normal", 0.1)
    if name.endswith("bias"):
        return "normal", BIAS_STD
    if name.endswith("image_newline"):
        return "normal", EMBED_STD
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "normal", EMBED_STD
    if "language_model" in name:
        return "normal", TEXT_STD
    # vision attention / MLP and the projector
    return "normal", 1.0 / math.sqrt(shape[-1])


def init_model(spec, seed):
    """The model in float32 with random parameters, rounded to the checkpoint dtype."""
    import torch
    from transformers import LlavaNextForConditionalGeneration

    cfg = llava_config(spec)
    model = LlavaNextForConditionalGeneration(cfg).to(torch.float32).eval()
    rng = np.random.default_rng(seed)
    store = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec["dtype"]]
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):  # tied lm_head appears once
            shape = tuple(p.shape)
            kind, s = param_std(name, shape)
            v = rng.standard_normal(shape) * s
            if kind == "one":
                v = 1.0 + v
            t = torch.from_numpy(v.astype(np.float32)).to(store).to(torch.float32)
            p.copy_(t)
    if TEXT[spec["text"]]["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    return model


# --------------------------------------------------------------------------
# Processor
# --------------------------------------------------------------------------


def image_processor():
    from transformers import LlavaNextImageProcessor

    ip = LlavaNextImageProcessor(
        size={"shortest_edge": CROP}, crop_size={"height": CROP, "width": CROP},
        image_grid_pinpoints=PINPOINTS, image_mean=CLIP_MEAN, image_std=CLIP_STD,
        resample=3, rescale_factor=1 / 255, do_pad=True)
    assert ip.backend == "torchvision", ip.backend
    return ip


def tokenizer():
    """A word-level tokenizer over the 512 ids: "<unk>" 0, "<s>" 1, "</s>" 2, "<image>" 500,
    "tN" for every other id N; whitespace-split, nothing added around the text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = {0: "<unk>", 1: "<s>", 2: "</s>", IMAGE_TOKEN: "<image>"}
    vocab = {names.get(i, f"t{i}"): i for i in range(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", extra_special_tokens={"image_token": "<image>"})
    assert tok.image_token_id == IMAGE_TOKEN
    return tok


def processor():
    from transformers import LlavaNextProcessor

    return LlavaNextProcessor(image_processor=image_processor(), tokenizer=tokenizer(),
                              patch_size=PATCH, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1)


def text_ids():
    """BOS, TEXT_BEFORE random ids, the image token, TEXT_AFTER random ids."""
    rng = np.random.default_rng(PROMPT_SEED)
    r = [int(x) for x in rng.integers(3, IMAGE_TOKEN, size=TEXT_BEFORE + TEXT_AFTER)]
    return [1] + r[:TEXT_BEFORE] + [IMAGE_TOKEN] + r[TEXT_BEFORE:]


def ids_to_text(ids):
    names = {0: "<unk>", 1: "<s>", 2: "</s>", IMAGE_TOKEN: "<image>"}
    return " ".join(names.get(i, f"t{i}") for i in ids)


def make_image(w, h, seed):
    """Smooth colour waves plus Gaussian noise, uint8 RGB."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    ph = rng.uniform(0, 2 * np.pi, size=3)
    fx = rng.uniform(0.04, 0.12, size=3)
    fy = rng.uniform(0.04, 0.12, size=3)
    chans = []
    for c in range(3):
        v = np.sin(x * fx[c] + y * fy[c] * (1 if c % 2 else -1) + ph[c])
        v += 0.5 * np.cos(np.hypot(x - w * 0.3, y - h * 0.6) * 0.15 + c)
        chans.append(v)
    img = 128 + 70 * np.stack(chans, -1) + rng.normal(0, 12, size=(h, w, 3))
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def save_image(img, path):
    if path.suffix == ".jpg":
        img.save(path, format="JPEG", quality=90, subsampling=2)
    else:
        img.save(path, format="PNG", optimize=False, compress_level=9)


# --------------------------------------------------------------------------
# Writing checkpoints
# --------------------------------------------------------------------------


def to_legacy_name(k):
    """transformers 5.x in-memory name -> the name transformers < 4.52 used."""
    for old, new in (("model.language_model.", "language_model.model."),
                     ("model.vision_tower.", "vision_tower.vision_model."),
                     ("model.multi_modal_projector.", "multi_modal_projector.")):
        if k.startswith(old):
            return new + k[len(old):]
    if k == "lm_head.weight":
        return "language_model.lm_head.weight"
    if k == "model.image_newline":
        return "image_newline"
    raise KeyError(k)


def from_legacy_name(k):
    for old, new in (("language_model.model.", "model.language_model."),
                     ("vision_tower.vision_model.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector.")):
        if k.startswith(old):
            return new + k[len(old):]
    if k == "language_model.lm_head.weight":
        return "lm_head.weight"
    if k == "image_newline":
        return "model.image_newline"
    raise KeyError(k)


def write_hf5(model, spec, dst, original_format):
    import torch

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]
    m = copy.deepcopy(model).to(dt)
    m.config.dtype = spec["dtype"]
    m.save_pretrained(dst, safe_serialization=True, save_original_format=original_format)


def write_hf4(model, spec, dst, dtype=None):
    """The < 4.52 layout: renamed tensors (tied lm_head left out) + legacy config.json."""
    import torch
    from safetensors.torch import save_file

    dtype = dtype or spec["dtype"]
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    sd = model.state_dict()
    tied = TEXT[spec["text"]]["tie_word_embeddings"]
    out = {}
    for k, v in sd.items():
        if tied and k == "lm_head.weight":
            continue
        out[to_legacy_name(k)] = v.detach().to(dt).contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = legacy_config(dict(spec, dtype=dtype))
    with open(dst / "config.json", "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_mlx(model, spec, dst, scratch):
    """mlx-vlm's conversion of a float16 checkpoint in the < 4.52 layout (the layout of the
    llava-hf checkpoints mlx-community converted), with the processor files it copies."""
    from mlx_vlm.convert import convert

    src = scratch / "mlx-source"
    if src.exists():
        shutil.rmtree(src)
    write_hf4(model, spec, src, dtype="float16")
    processor().save_pretrained(src)  # tokenizer files + processor_config.json
    image_processor().save_pretrained(src)  # preprocessor_config.json
    out = scratch / "mlx-out"
    if out.exists():
        shutil.rmtree(out)
    convert(hf_path=str(src), mlx_path=str(out), quantize=True, q_group_size=MLX_GROUP, q_bits=MLX_BITS)
    # Keep the checkpoint and the processor configs; leave out the generated model card and
    # the word-level tokenizer (made here only because convert loads a processor).
    return copy_kept(out, dst, ("README.md", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                "chat_template.jinja"))


def copy_kept(out, dst, skip):
    """The files of a conversion's output folder out, but those named in skip, copied into
    dst; returns their names."""
    dst.mkdir(parents=True, exist_ok=True)
    kept = []
    for f in sorted(out.iterdir()):
        if f.name in skip:
            continue
        assert f.is_file(), f
        shutil.copy(f, dst / f.name)
        kept.append(f.name)
    return kept


# --------------------------------------------------------------------------
# Reading checkpoints back
# --------------------------------------------------------------------------


def read_tensors(d):
    """All tensors of a directory as numpy (float32 for floating ones), with dtypes."""
    import torch
    from safetensors.torch import load_file

    out, dtypes = {}, {}
    for f in sorted(d.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            assert k not in out, k
            dtypes[k] = str(v.dtype).replace("torch.", "")
            out[k] = v.numpy().copy() if v.dtype == torch.uint32 else v.to(torch.float32).numpy().copy()
    return out, dtypes


def dequantize(packed, scales, biases, in_dim):
    """MLX affine dequantization in float32: w = scale * q + bias per group."""
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


def mlx_as_legacy_f32(d, dst, in_dims):
    """The mlx-vlm checkpoint's values as a float32 < 4.52-layout checkpoint that
    transformers loads: quantized tensors dequantized, the patch kernel back to
    [out, in, kh, kw], the config without its quantization keys."""
    import mlx.core as mx
    import torch
    from safetensors.torch import save_file

    tensors, _ = read_tensors(d)
    arrays = {}
    for f in sorted(d.glob("*.safetensors")):
        arrays.update(mx.load(str(f)))
    out, quant = {}, {}
    for k, v in tensors.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        p = k[: -len(".weight")] if k.endswith(".weight") else None
        if p is not None and p + ".scales" in tensors:
            w, bits, group = dequantize(v, tensors[p + ".scales"], tensors[p + ".biases"], in_dims[k])
            ref = mx.dequantize(arrays[k], arrays[p + ".scales"].astype(mx.float32),
                                arrays[p + ".biases"].astype(mx.float32), group_size=group, bits=bits)
            assert np.array_equal(np.array(ref), w), k
            quant[p] = (bits, group)
            v = w
        elif k.endswith("patch_embedding.weight"):
            assert v.shape[1] == v.shape[2] == PATCH and v.shape[3] == 3, v.shape
            v = np.ascontiguousarray(v.transpose(0, 3, 1, 2))
        out[k] = torch.from_numpy(np.ascontiguousarray(v))
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with open(d / "config.json") as f:
        cfg = json.load(f)
    for k in ("quantization", "quantization_config"):
        cfg.pop(k, None)
    with open(dst / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    return quant


def load_golden_model(d):
    import torch
    from transformers import LlavaNextForConditionalGeneration

    model, info = LlavaNextForConditionalGeneration.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), (d, key, info[key])
    model.eval()
    return model


# --------------------------------------------------------------------------
# Independent reference for the image rows
# --------------------------------------------------------------------------


def best_resolution(h, w):
    """transformers' select_best_resolution, rewritten: the pinpoint (H, W) that keeps the
    most of the image when it is scaled to fit (effective = min(scaled area, h*w), the
    scaled size truncated), ties broken by the least wasted area, then the first listed."""
    best, best_eff, best_waste = None, -1, None
    for H, W in PINPOINTS:
        s = min(W / w, H / h)
        eff = min(int(w * s) * int(h * s), w * h)
        waste = H * W - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (H, W), eff, waste
    return best


def unpadded_size(h, w, rows, cols):
    """The kept (rows, cols) of a rows x cols feature grid for an h x w image: the grid is
    cut symmetrically back to the image's aspect ratio, the kept length int(round(x, 7))."""
    if w / h > cols / rows:
        new = int(round(h * (cols / w), 7))
        pad = (rows - new) // 2
        return rows - 2 * pad, cols, (pad, 0)
    new = int(round(w * (rows / h), 7))
    pad = (cols - new) // 2
    return rows, cols - 2 * pad, (0, pad)


def reference_image_rows(model, pixel_values, h, w):
    """The rows that replace the image tokens, computed from the parameters with plain
    torch ops (no transformers module code)."""
    import torch
    import torch.nn.functional as F

    cfg = model.config
    sd = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    vp = "model.vision_tower."
    x = pixel_values.to(torch.float64)  # [tiles, 3, 56, 56]
    n, g, dv = x.shape[0], CROP // PATCH, VISION["hidden_size"]
    # patch convolution as one product: patch (r, c) flattened in (channel, kh, kw) order
    patches = x.reshape(n, 3, g, PATCH, g, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, 3 * PATCH * PATCH)
    emb = patches @ sd[vp + "embeddings.patch_embedding.weight"].reshape(dv, -1).T
    cls = sd[vp + "embeddings.class_embedding"].expand(n, 1, dv)
    hid = torch.cat([cls, emb], 1) + sd[vp + "embeddings.position_embedding.weight"][None]

    def ln(t, p):
        return F.layer_norm(t, (dv,), sd[p + ".weight"], sd[p + ".bias"], VISION["layer_norm_eps"])

    def lin(t, p):
        return t @ sd[p + ".weight"].T + sd[p + ".bias"]

    hid = ln(hid, vp + "pre_layrnorm")
    states = [hid]  # states[0]: embeddings after pre_layrnorm; states[i]: after layer i
    nh = VISION["num_attention_heads"]
    hd = dv // nh
    for i in range(VISION["num_hidden_layers"]):
        p = f"{vp}encoder.layers.{i}."
        a = ln(hid, p + "layer_norm1")
        q = lin(a, p + "self_attn.q_proj").reshape(n, -1, nh, hd).transpose(1, 2)
        k = lin(a, p + "self_attn.k_proj").reshape(n, -1, nh, hd).transpose(1, 2)
        v = lin(a, p + "self_attn.v_proj").reshape(n, -1, nh, hd).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        hid = hid + lin(att.transpose(1, 2).reshape(n, -1, dv), p + "self_attn.out_proj")
        m = lin(ln(hid, p + "layer_norm2"), p + "mlp.fc1")
        m = m * torch.sigmoid(1.702 * m)  # quick_gelu
        hid = hid + lin(m, p + "mlp.fc2")
        states.append(hid)
    # post_layernorm is not used: the features are raw hidden states
    layers = cfg.vision_feature_layer if isinstance(cfg.vision_feature_layer, list) else [cfg.vision_feature_layer]
    feat = torch.cat([states[l] for l in layers], -1)[:, 1:]  # "default": drop the class token
    pp = "model.multi_modal_projector."
    f = lin(feat, pp + "linear_1")
    f = 0.5 * f * (1 + torch.erf(f / math.sqrt(2)))  # "gelu": the erf form
    f = lin(f, pp + "linear_2")  # [tiles, 16, D]
    H, W = best_resolution(h, w)
    gr, gc = H // CROP, W // CROP
    assert n == 1 + gr * gc, (n, gr, gc)
    D = f.shape[-1]
    # tiles in row-major order; the grid as one (gr*4) x (gc*4) feature map
    grid = f[1:].reshape(gr, gc, g, g, D).permute(0, 2, 1, 3, 4).reshape(gr * g, gc * g, D)
    rows, cols, (pr, pc) = unpadded_size(h, w, gr * g, gc * g)
    grid = grid[pr:pr + rows, pc:pc + cols]
    nl = sd["model.image_newline"].expand(rows, 1, D)
    packed = torch.cat([f[0], torch.cat([grid, nl], 1).reshape(-1, D)], 0)
    return packed.to(torch.float32), dict(best_resolution=[H, W], grid=[gr, gc], unpadded=[rows, cols])


# --------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------


def run_case(model, proc, d, case, seed):
    import torch
    from PIL import Image
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
    from transformers.image_utils import ChannelDimension
    from transformers.models.llava_next import modeling_llava_next as mln

    name, w, h, fmt = case
    fname = f"image_{name}.{fmt}"
    save_image(make_image(w, h, seed), d / fname)
    img = Image.open(d / fname)  # what a reader decodes (JPEG is lossy)
    img.load()
    tids = text_ids()
    enc = proc(images=[img], text=ids_to_text(tids), return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    pv, sizes = enc["pixel_values"], enc["image_sizes"]
    assert sizes.tolist() == [[h, w]], sizes
    n_img = ids.count(IMAGE_TOKEN)
    start = ids.index(IMAGE_TOKEN)
    assert ids == tids[:start] + [IMAGE_TOKEN] * n_img + tids[start + 1:], "expansion"
    assert proc._get_number_of_features(h, w, CROP, CROP) - 1 == n_img  # "default": no CLS row
    alone = proc.image_processor(images=[img], return_tensors="pt")
    assert torch.equal(alone["pixel_values"], pv)
    H, W = select_best_resolution([h, w], PINPOINTS)
    assert (H, W) == best_resolution(h, w)
    tiles = 1 + (H // CROP) * (W // CROP)
    resized = resized_size(h, w, H, W)
    assert resized == get_patch_output_size(np.asarray(img), (H, W), ChannelDimension.LAST)
    assert tuple(pv.shape) == (1, tiles, 3, CROP, CROP), pv.shape
    assert mln.image_size_to_num_patches([h, w], PINPOINTS, CROP) == tiles
    assert mln.get_anyres_image_grid_shape([h, w], PINPOINTS, CROP) == (H // CROP, W // CROP)

    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=pv, image_sizes=sizes)
        feats = out.pooler_output[0]
        assert len(out.pooler_output) == 1 and feats.shape[0] == n_img, (feats.shape, n_img)
        ref, layout = reference_image_rows(model, pv[0], h, w)
        fdiff = float((ref - feats).abs().max())
        assert fdiff < 1e-5 * max(1.0, float(feats.abs().max())), fdiff
        # the rows that replace the image tokens are exactly these features
        x = torch.tensor([ids])
        logits, embeds = forward_capturing_embeds(model, input_ids=x, pixel_values=pv, image_sizes=sizes)
        assert torch.equal(embeds[start:start + n_img], feats)
        gen = model.generate(input_ids=x, attention_mask=torch.ones_like(x), pixel_values=pv,
                             image_sizes=sizes, max_new_tokens=GEN_LEN, min_new_tokens=GEN_LEN,
                             do_sample=False, eos_token_id=None, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    greedy = gen.sequences[0, len(ids):].tolist()
    assert len(greedy) == GEN_LEN
    margins = []
    for s in gen.logits:
        v = np.sort(s[0].float().numpy())
        margins.append(float(v[-1] - v[-2]))
    # cache-free argmax loop
    seq = list(ids)
    with torch.no_grad():
        for _ in range(GEN_LEN):
            lg = model(input_ids=torch.tensor([seq]), pixel_values=pv, image_sizes=sizes).logits[0, -1]
            seq.append(int(torch.argmax(lg)))
    assert seq[len(ids):] == greedy, (seq[len(ids):], greedy)
    srt = np.sort(logits, axis=1)
    pm = srt[:, -1] - srt[:, -2]
    rec = {
        "name": name,
        "image": fname,
        "image_sizes": [h, w],
        "best_resolution": layout["best_resolution"],
        "grid": layout["grid"],
        "tiles": tiles,
        "unpadded": layout["unpadded"],
        "resized": list(resized),
        "image_rows": n_img,
        "image_start": start,
        "text_ids": tids,
        "input_ids": ids,
        "greedy": greedy,
        "min_margin": float(min(margins)),
        "prompt_min_margin": float(pm.min()),
        "max_abs_logit": float(np.abs(logits).max()),
        "max_abs_feature": float(feats.abs().max()),
    }
    arrays = {
        f"golden_logits_{name}.npy": logits.astype("<f4"),
        f"golden_features_{name}.npy": feats.float().numpy().astype("<f4"),
        f"golden_pixels_{name}.npy": pv[0].float().numpy().astype("<f4"),
    }
    return rec, arrays, fdiff


def forward_capturing_embeds(model, **inputs):
    """The logits of every row of model(**inputs) (float32 numpy) and the inputs_embeds its
    language model received (the text rows with the image rows merged in)."""
    captured = {}

    def hook(mod, args, kwargs):
        captured["e"] = kwargs["inputs_embeds"][0].clone()

    hnd = model.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        logits = model(**inputs).logits[0].float().numpy()
    finally:
        hnd.remove()
    return logits, captured["e"]


def resized_size(h, w, H, W):
    """The size (height, width) the processor resizes the image to inside the H x W canvas
    (the rest is padding, split evenly, the extra pixel after): the side with the smaller
    scale fills the canvas, the other is min(ceil(side * scale), canvas side)."""
    sw, sh = W / w, H / h
    if sw < sh:
        return min(math.ceil(h * sw), H), W
    return H, min(math.ceil(w * sh), W)


def versions():
    import PIL
    import torch
    import torchvision
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "torchvision": torchvision.__version__.split("+")[0], "pillow": PIL.__version__}


def mlx_crosscheck(d, model, cases):
    """mlx-vlm loads the directory; with float32 parameters its tower + projector per tile
    and its text-only logits are compared with transformers'. Returns the max diffs."""
    import mlx.core as mx
    import torch
    from mlx.utils import tree_map
    from mlx_vlm.utils import load_model

    m = load_model(Path(d), lazy=False, strict=True)

    def up(v):
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.float32)
        return v

    m.update(tree_map(up, m.parameters()))
    worst_f = 0.0
    for rec in cases:
        pv = np.load(d / f"golden_pixels_{rec['name']}.npy")  # [tiles, 3, 56, 56]
        *_, hs = m.vision_tower(mx.array(pv.transpose(0, 2, 3, 1)), output_hidden_states=True)
        sel = hs[m.vision_feature_layer][:, 1:]
        got = np.array(m.multi_modal_projector(sel))
        with torch.no_grad():
            t = model.model.vision_tower(torch.from_numpy(pv), output_hidden_states=True)
            want = model.model.multi_modal_projector(t.hidden_states[-2][:, 1:]).numpy()
        worst_f = max(worst_f, float(np.abs(got - want).max()) / float(np.abs(want).max()))
    ids = [i if i != IMAGE_TOKEN else 7 for i in text_ids()]
    got = np.array(m.language_model(mx.array([ids])).logits[0])
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    worst_l = float(np.abs(got - want).max()) / float(np.abs(want).max())
    return worst_f, worst_l


def build_fixture(name, spec, scratch, log, legacy_python):
    import torch

    proc = processor()
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        work = scratch / f"{name}-{seed}"
        d = work / name
        d.mkdir(parents=True)
        model = init_model(spec, seed)
        layout = spec["layout"]
        extra = {}
        if layout == "hf5":
            write_hf5(model, spec, d, original_format=False)
        elif layout == "hf5-original":
            write_hf5(model, spec, d, original_format=True)
        elif layout == "hf4":
            write_hf4(model, spec, d)
            if legacy_python:
                check_legacy_config(legacy_python, spec)
        elif layout == "mlx-vlm":
            extra["kept"] = write_mlx(model, spec, d, work)
            if legacy_python:
                check_legacy_config(legacy_python, dict(spec, dtype="float16"))
        else:
            raise ValueError(layout)
        if layout != "mlx-vlm":
            image_processor().save_pretrained(d)
        # the goldens run on what the directory holds, read back from disk
        if layout == "mlx-vlm":
            in_dims = {k: tuple(v.shape)[1] for k, v in
                       ((to_legacy_name(k), v) for k, v in model.state_dict().items()) if v.ndim == 2}
            quant = mlx_as_legacy_f32(d, work / "dequantized", in_dims)
            gm = load_golden_model(work / "dequantized")
            extra["quant"] = quant
        else:
            gm = load_golden_model(d)
            quant = {}
        # the loaded values are the initialised ones (up to quantization)
        ref_sd = model.state_dict()
        for k, v in gm.state_dict().items():
            legacy = to_legacy_name(k)
            p = legacy[: -len(".weight")] if legacy.endswith(".weight") else None
            if p in quant:
                continue
            # exact: the initial values were rounded to the stored dtype
            assert torch.equal(v, ref_sd[k]), k
        cases, arrays, fdiffs = [], {}, []
        for i, case in enumerate(spec["cases"]):
            rec, arr, fdiff = run_case(gm, proc, d, case, seed * 10 + i)
            cases.append(rec)
            arrays.update(arr)
            fdiffs.append(fdiff)
        worst = min(min(c["min_margin"], c["prompt_min_margin"]) for c in cases)
        if worst < MIN_MARGIN:
            log(f"  {name}: seed {seed} rejected (min margin {worst:.2e})")
            shutil.rmtree(work)
            continue
        for fn, a in arrays.items():
            np.save(d / fn, a)
        golden = {
            "image_token": IMAGE_TOKEN,
            "layout": layout,
            "seed": seed,
            **versions(),
        }
        if layout == "mlx-vlm":
            import mlx_vlm

            golden["mlx_vlm"] = mlx_vlm.__version__
        golden["cases"] = cases
        with open(d / "golden.json", "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        if layout == "mlx-vlm":
            extra["crosscheck"] = mlx_crosscheck(d, gm, cases)
        extra["fdiff"] = max(fdiffs)
        return seed, d, cases, extra
    raise RuntimeError(f"no seed with healthy margins for {name}")


def verify_rounding_case(log):
    """The round7 case: int() without round(x, 7) would cut the grid differently."""
    h, w = 147, 392
    H, W = best_resolution(h, w)
    g = CROP // PATCH
    rows, cols = H // CROP * g, W // CROP * g
    x = h * (cols / w)
    assert int(x) != int(round(x, 7))
    plain = rows - 2 * ((rows - int(x)) // 2)
    kept = unpadded_size(h, w, rows, cols)[0]
    assert plain != kept
    log(f"round7: x = {x!r}: int(round(x, 7)) keeps {kept} of {rows} feature rows, int(x) would keep {plain}")


def verify_facts(log):
    """transformers 5.23.0 behaviour the README states, checked here rather than assumed."""
    import torch
    from safetensors import safe_open
    from transformers import LlavaNextForConditionalGeneration
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    # select_best_resolution and unpad_image equal the rewrites above for every size
    g = CROP // PATCH
    for h in range(1, 260):
        for w in range(1, 260):
            H, W = select_best_resolution([h, w], PINPOINTS)
            assert (H, W) == best_resolution(h, w), (h, w)
            rows, cols = H // CROP * g, W // CROP * g
            want = tuple(unpad_image(torch.zeros(1, rows, cols), [h, w]).shape[1:])
            assert want == unpadded_size(h, w, rows, cols)[:2], (h, w)
    spec = dict(FIXTURES["llava-qwen2-f32"], feature_layer=-2)
    with tempfile.TemporaryDirectory() as td:
        # the top-level tie_word_embeddings decides, text_config's is not consulted
        for top, text in ((True, False), (False, True)):
            cfg = llava_config(spec)
            cfg.tie_word_embeddings = top
            cfg.text_config.tie_word_embeddings = text
            m = LlavaNextForConditionalGeneration(cfg)
            tied = m.lm_head.weight.data_ptr() == m.model.language_model.embed_tokens.weight.data_ptr()
            assert tied == top, (top, text)
        # save_pretrained: the original (< 4.52) names by default but without the
        # vision_model level; the in-memory names with save_original_format=False
        for original, probe in ((True, "vision_tower.embeddings.class_embedding"),
                                (False, "model.vision_tower.embeddings.class_embedding")):
            d = Path(td) / str(original)
            m.save_pretrained(d, save_original_format=original)
            with safe_open(str(d / "model.safetensors"), "pt") as f:
                assert probe in f.keys(), (original, sorted(f.keys())[:5])
        # "full" keeps each tile's class token: packing an anyres image fails
        cfg = llava_config(spec)
        cfg.vision_feature_select_strategy = "full"
        m = LlavaNextForConditionalGeneration(cfg).eval()
        try:
            with torch.no_grad():
                m.model.get_image_features(pixel_values=torch.zeros(1, 3, 3, CROP, CROP),
                                           image_sizes=torch.tensor([[50, 120]]))
            raise AssertionError("strategy full ran")
        except RuntimeError as ex:
            log(f"strategy full fails as expected: {str(ex)[:90]}")


def dir_size(d):
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--check-legacy-config", default="", metavar="PYTHON",
                    help="an interpreter with transformers 4.45.2 to confirm the < 4.52 config.json")
    args = ap.parse_args()
    only = [m for m in args.only.split(",") if m]
    for m in only:
        if m not in FIXTURES:
            ap.error(f"unknown fixture {m}")

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)

    def log(msg):
        print(msg, flush=True)

    verify_rounding_case(log)
    verify_facts(log)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary, all_cases = [], []
    with tempfile.TemporaryDirectory() as td:
        scratch = Path(td)
        for name, spec in FIXTURES.items():
            if only and name not in only:
                continue
            log(f"{name}:")
            seed, d, cases, extra = build_fixture(name, spec, scratch, log, args.check_legacy_config)
            dest = out / name
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(d, dest)
            log(f"  seed {seed}; reference rows agree to {extra['fdiff']:.1e}")
            if "kept" in extra:
                log(f"  mlx-vlm wrote (kept): {', '.join(extra['kept'])}")
                qs = sorted({v for v in extra["quant"].values()})
                log(f"  quantized: {len(extra['quant'])} tensors at (bits, group) {qs}")
                f, l = extra["crosscheck"]
                log(f"  mlx-vlm f32: tower+projector rel diff {f:.2e}, text-only logits rel diff {l:.2e}")
                assert f < 1e-4 and l < 1e-4, (f, l)
            for c in cases:
                log(f"  {c['name']:7s} {c['image_sizes'][1]}x{c['image_sizes'][0]} -> pinpoint "
                    f"{c['best_resolution']} grid {c['grid'][0]}x{c['grid'][1]} unpadded "
                    f"{c['unpadded'][0]}x{c['unpadded'][1]}: {c['image_rows']} image rows, prompt "
                    f"{len(c['input_ids'])}; margins {c['min_margin']:.4f} / {c['prompt_min_margin']:.4f}")
            summary.append((name, dir_size(dest), min(min(c["min_margin"], c["prompt_min_margin"]) for c in cases)))
            all_cases += cases
    if not only:  # the case list covers every grid, with and without padding
        assert {tuple(c["grid"]) for c in all_cases} == {(1, 2), (2, 1), (2, 2)}
        assert any(c["resized"] != c["best_resolution"] for c in all_cases)
        assert any(c["resized"] == c["best_resolution"] for c in all_cases)
    total = 0
    log("\nfixture                 size(B)  min margin")
    for name, size, mm in summary:
        total += size
        log(f"{name:22s} {size:8d}  {mm:.4f}")
    log(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
