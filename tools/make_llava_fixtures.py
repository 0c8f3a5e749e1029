#!/usr/bin/env python3
"""Tiny random LLaVA-NeXT (LLaVA 1.6) checkpoints with transformers goldens, in every
layout celer reads: tests/fixtures/llava-*/.

Usage:
    bash tools/setup_venv.sh
    build/venv/bin/python tools/make_llava_fixtures.py --out tests/fixtures [--only NAME]

Deterministic (fixed seeds). Each fixture directory holds the checkpoint (config.json,
model.safetensors), preprocessor_config.json (LlavaNextImageProcessor's save_pretrained),
test images image_<case>.png/.jpg and the goldens, all from transformers 5.23.0 in
float32 with attn_implementation="eager" on exactly the weights the checkpoint holds
(quantized tensors dequantized in float32: w = scale * q + bias per group):

    golden.json                  per case: image file, image_sizes (h, w), image rows,
                                 the prompt ids with one image token (text_ids) and
                                 expanded to the image rows (input_ids), the 16-token
                                 greedy continuation, the smallest top-1/top-2 margins
    golden_logits_<case>.npy     float32 [n, vocab]: logits of every prompt row
    golden_features_<case>.npy   float32 [rows, hidden]: the rows that replace the image
                                 tokens (tower, projector, anyres layout, image_newline)

Layouts:
    llava-mistral-f32       transformers 5.23.0 save_pretrained as is: language_model.model.*,
                            language_model.lm_head, vision_tower.* (no vision_model level),
                            multi_modal_projector.*, image_newline
    llava-llama-bf16        the in-memory names of transformers >= 4.52
                            (model.language_model.*, lm_head, model.vision_tower.vision_model.*,
                            model.multi_modal_projector.*, model.image_newline), bf16
    llava-qwen2-f16         the Hub layout of llava-hf checkpoints: language_model.model.*,
                            vision_tower.vision_model.*; qwen2 text model (q/k/v biases), f16
    llava-mistral-mlx-q4    mlx-vlm's layout (as mlx-vlm 0.7.10's convert writes it, reproduced
                            here without its heavy dependencies): the Hub names, the patch kernel
                            channels last [out, kh, kw, in], the language model 4-bit (group 64,
                            fp16 scales and biases, config.json "quantization"), the vision
                            tower and the projector fp16 (mlx-vlm skips multimodal modules)

transformers facts these goldens pin (5.23.0, modeling_llava_next / modeling_clip):
  - hidden_states[i] is the output of encoder layer i, hidden_states[0] the embeddings
    after pre_layrnorm; vision_feature_layer -2 is the output of the second-to-last
    layer; post_layernorm is not applied to it.
  - "default" drops each tile's class token; "full" fails for anyres tiles in
    pack_image_features (the features of a tile with its class token do not form a grid),
    so no fixture uses it.
  - The base tile's features come first, then the grid of tiles as one feature map,
    unpadded (centred crop, int(round(x, 7)) for the kept size), image_newline after each row.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

VOCAB = 512
IMAGE_TOKEN = 500
GEN_LEN = 16
MIN_MARGIN = 1e-3
PINPOINTS = [[56, 112], [112, 56], [112, 112]]
TEXT_IDS_BEFORE = 20  # a full KV block of text before the image
TEXT_IDS_AFTER = 6

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              image_size=56, patch_size=14, hidden_act="quick_gelu", layer_norm_eps=1e-5)

TEXT = {
    "mistral": dict(model_type="mistral", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                    sliding_window=None, tie_word_embeddings=False),
    "llama": dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  tie_word_embeddings=False),
}

# name: (text model, layout, dtype, seed)
FIXTURES = {
    "llava-mistral-f32": ("mistral", "save_pretrained", "float32", 11001),
    "llava-llama-bf16": ("llama", "model_prefixed", "bfloat16", 12001),
    "llava-qwen2-f16": ("qwen2", "hub", "float16", 13001),
    "llava-mistral-mlx-q4": ("mistral", "mlx_vlm", "float16", 14001),
}

# (case, width, height, format): 1x2, 2x1 and 2x2 grids, padding in each
CASES = [("wide", 120, 50, "png"), ("tall", 50, 120, "jpg"), ("square", 90, 80, "png")]


def make_image(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([np.sin(x / (3 + c) + y / (5 + 2 * c) + c) for c in range(3)], -1)
    img = (base * 90 + 128 + rng.normal(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8)
    from PIL import Image

    return Image.fromarray(img)


def build_model(text, seed, dtype):
    import torch
    from transformers import CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration
    from transformers import AutoConfig

    tc = AutoConfig.for_model(**TEXT[text])
    cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(**VISION), text_config=tc, image_token_index=IMAGE_TOKEN,
                          image_grid_pinpoints=PINPOINTS, vision_feature_layer=-2,
                          vision_feature_select_strategy="default", projector_hidden_act="gelu",
                          multimodal_projector_bias=True)
    model = LlavaNextForConditionalGeneration(cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name or "pre_layrnorm" in name:
                v = 1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("weight") else 0.1 * rng.standard_normal(shape)
            elif name.endswith("bias"):
                v = 0.1 * rng.standard_normal(shape)
            elif "embed_tokens" in name or "lm_head" in name:
                v = 0.35 * rng.standard_normal(shape)
            elif "image_newline" in name or "class_embedding" in name or "position_embedding" in name:
                v = 0.5 * rng.standard_normal(shape)
            elif "patch_embedding" in name:
                v = 0.05 * rng.standard_normal(shape)
            else:
                fan_in = shape[-1]
                v = rng.standard_normal(shape) * (1.2 / np.sqrt(fan_in))
            p.copy_(torch.from_numpy(v.astype(np.float32)))
        # round to the checkpoint dtype so the goldens see exactly what is stored
        if dtype != "float32":
            dt = getattr(torch, dtype)
            for p in model.parameters():
                p.copy_(p.to(dt).to(torch.float32))
    return model


def processor():
    from transformers import LlavaNextImageProcessor

    return LlavaNextImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56},
                                   image_grid_pinpoints=PINPOINTS, do_pad=True)


def quantize_4bit(w, group=64):
    """MLX affine 4-bit (mlx.core.quantize): uint32 codes, fp16 scales and biases."""
    import mlx.core as mx

    q, s, b = mx.quantize(mx.array(w.astype(np.float32)).astype(mx.float16), group_size=group, bits=4)
    return np.array(q), np.array(s), np.array(b)


def dequantize(q, s, b, in_dim, group=64):
    per = 8
    shifts = (np.arange(per, dtype=np.uint32) * 4)[None, None, :]
    codes = ((q[:, :, None] >> shifts) & np.uint32(15)).reshape(q.shape[0], in_dim).astype(np.float32)
    return np.repeat(s.astype(np.float32), group, 1) * codes + np.repeat(b.astype(np.float32), group, 1)


def write_checkpoint(model, layout, dtype, dst, cfg_text):
    """Writes dst/config.json and model.safetensors in the layout; returns the float32
    state dict (transformers' save_pretrained names) holding exactly the stored values."""
    import torch
    from safetensors.numpy import save_file

    with tempfile.TemporaryDirectory() as td:
        model.save_pretrained(td, safe_serialization=True)
        from safetensors.numpy import load_file

        sd = load_file(str(Path(td) / "model.safetensors"))
        cfg = json.loads((Path(td) / "config.json").read_text())
    sd = {k: v.astype(np.float32) for k, v in sd.items()}
    np_dtype = {"float32": np.float32, "float16": np.float16}.get(dtype)
    out = {}
    golden_sd = dict(sd)
    cfg["dtype"] = dtype
    for k, v in sd.items():
        name = k
        if layout == "model_prefixed":
            if k.startswith("language_model.model."):
                name = "model.language_model." + k[len("language_model.model."):]
            elif k == "language_model.lm_head.weight":
                name = "lm_head.weight"
            elif k.startswith("vision_tower."):
                name = "model.vision_tower.vision_model." + k[len("vision_tower."):]
            else:
                name = "model." + k
        elif layout in ("hub", "mlx_vlm") and k.startswith("vision_tower."):
            name = "vision_tower.vision_model." + k[len("vision_tower."):]
        if layout == "mlx_vlm":
            if name.endswith("patch_embedding.weight"):
                out[name] = np.ascontiguousarray(v.transpose(0, 2, 3, 1)).astype(np.float16)
                golden_sd[k] = v.astype(np.float16).astype(np.float32)
                continue
            # mlx-vlm's predicate: every linear of the language model; the vision tower
            # and the projector stay float (its skip_multimodal_module list)
            quantizable = name.endswith(".weight") and v.ndim == 2 and name.startswith("language_model.") \
                and v.shape[1] % 64 == 0
            if quantizable:
                q, s, b = quantize_4bit(v)
                base = name[: -len(".weight")]
                out[base + ".weight"], out[base + ".scales"], out[base + ".biases"] = q, s, b
                golden_sd[k] = dequantize(q, s, b, v.shape[1])
                continue
            out[name] = v.astype(np.float16)
            golden_sd[k] = out[name].astype(np.float32)
            continue
        if dtype == "bfloat16":
            t = torch.from_numpy(v).to(torch.bfloat16)
            out[name] = t.view(torch.uint16).numpy()
            continue
        out[name] = v.astype(np_dtype)
    if dtype == "bfloat16":
        # safetensors.numpy has no bf16: write through torch
        from safetensors.torch import save_file as save_torch

        tens = {k: (torch.from_numpy(v).view(torch.bfloat16) if v.dtype == np.uint16 else torch.from_numpy(v))
                for k, v in out.items()}
        save_torch(tens, str(dst / "model.safetensors"), metadata={"format": "pt"})
    else:
        save_file(out, str(dst / "model.safetensors"), metadata={"format": "mlx" if layout == "mlx_vlm" else "pt"})
    if layout == "mlx_vlm":
        cfg["quantization"] = {"group_size": 64, "bits": 4}
        cfg["quantization_config"] = {"group_size": 64, "bits": 4}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return golden_sd, cfg


def golden_model(golden_sd, cfg):
    """transformers' model over exactly the stored values (its own loader maps the names)."""
    import torch
    from safetensors.numpy import save_file
    from transformers import LlavaNextForConditionalGeneration

    c = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    c["dtype"] = "float32"
    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "config.json").write_text(json.dumps(c))
        save_file({k: np.ascontiguousarray(v) for k, v in golden_sd.items()}, str(Path(td) / "model.safetensors"),
                  metadata={"format": "pt"})
        model = LlavaNextForConditionalGeneration.from_pretrained(td, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    return model


def goldens(model, dst, seed):
    import torch
    import transformers

    proc = processor()
    proc.save_pretrained(dst)
    rng = np.random.default_rng(seed + 7)
    text = [int(x) for x in rng.integers(3, IMAGE_TOKEN, size=TEXT_IDS_BEFORE + TEXT_IDS_AFTER)]
    text_ids = [1] + text[:TEXT_IDS_BEFORE] + [IMAGE_TOKEN] + text[TEXT_IDS_BEFORE:]
    cases = []
    worst = 1e9
    for i, (case, w, h, fmt) in enumerate(CASES):
        img = make_image(w, h, seed + i)
        fname = f"image_{case}.{fmt}"
        img.save(dst / fname, quality=92) if fmt == "jpg" else img.save(dst / fname)
        from PIL import Image

        img = Image.open(dst / fname)  # what a reader decodes (JPEG is lossy)
        pv = proc(images=[img], return_tensors="pt")
        with torch.no_grad():
            feats = model.model.get_image_features(pixel_values=pv["pixel_values"], image_sizes=pv["image_sizes"],
                                                   vision_feature_layer=-2,
                                                   vision_feature_select_strategy="default").pooler_output[0]
        rows = int(feats.shape[0])
        ids = text_ids[: TEXT_IDS_BEFORE + 1] + [IMAGE_TOKEN] * rows + text_ids[TEXT_IDS_BEFORE + 2:]
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=x, pixel_values=pv["pixel_values"], image_sizes=pv["image_sizes"]).logits[0]
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), pixel_values=pv["pixel_values"],
                                 image_sizes=pv["image_sizes"], max_new_tokens=GEN_LEN, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        greedy = out.sequences[0, len(ids):].tolist()
        margins = [float(np.diff(np.sort(s[0].float().numpy())[-2:])[0]) for s in out.logits]
        lp = np.sort(logits.float().numpy(), 1)
        prompt_margin = float((lp[:, -1] - lp[:, -2]).min())
        worst = min(worst, min(margins), prompt_margin)
        np.save(dst / f"golden_logits_{case}.npy", logits.float().numpy().astype("<f4"))
        np.save(dst / f"golden_features_{case}.npy", feats.float().numpy().astype("<f4"))
        cases.append({"name": case, "image": fname, "image_sizes": [int(h), int(w)], "image_rows": rows,
                      "text_ids": text_ids, "input_ids": ids, "greedy": greedy, "min_margin": min(margins),
                      "prompt_min_margin": prompt_margin, "max_abs_logit": float(logits.abs().max())})
    (dst / "golden.json").write_text(json.dumps({"image_token": IMAGE_TOKEN, "transformers": transformers.__version__,
                                                "cases": cases}, indent=1) + "\n")
    return worst, cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x]
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name, (text, layout, dtype, seed0) in FIXTURES.items():
        if only and name not in only:
            continue
        for seed in range(seed0, seed0 + 32):
            with tempfile.TemporaryDirectory() as td:
                dst = Path(td) / name
                dst.mkdir()
                model = build_model(text, seed, dtype)
                golden_sd, cfg = write_checkpoint(model, layout, dtype, dst, TEXT[text])
                worst, cases = goldens(golden_model(golden_sd, cfg), dst, seed)
                if worst < MIN_MARGIN:
                    print(f"{name}: seed {seed} rejected (margin {worst:.2e})", flush=True)
                    continue
                final = args.out / name
                shutil.rmtree(final, ignore_errors=True)
                shutil.copytree(dst, final)
                size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
                print(f"{name}: seed {seed}, {size} bytes, margin {worst:.4f}, " +
                      ", ".join(f"{c['name']} {c['image_sizes']} -> {c['image_rows']} rows" for c in cases), flush=True)
                break
        else:
            raise RuntimeError(f"no seed with healthy margins for {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
