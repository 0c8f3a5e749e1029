#!/usr/bin/env python3
"""The vision benchmark model for bench/vision.py: a LLaVA-NeXT (LLaVA 1.6) with random
weights whose vision tower is exactly CLIP ViT-L/14-336, written into
build/bench-models/llava-vitl-random/ (idempotent; --force rewrites it).

    config.json, model.safetensors   LlavaNextForConditionalGeneration.save_pretrained
                                     (transformers 5.23.0, its default layout), bfloat16
    preprocessor_config.json         LlavaNextImageProcessor.save_pretrained with the
                                     llava-v1.6 settings: shortest_edge 336, crop 336x336,
                                     CLIP mean/std, bicubic, the five llava-v1.6 pinpoints
    image_672x448.png                the benchmark image (smooth colour waves + noise)

Shape:
  vision   CLIP ViT-L/14-336: d 1024, 24 layers, 16 heads, ffn 4096, quick_gelu,
           336 px, patch 14 (577 positions a tile); vision_feature_layer -2 (23 layers
           used), strategy default (class token dropped)
  project  1024 -> 1024 -> 1024, gelu, with biases
  text     Mistral-shaped, small enough for a 2-core 24 GiB machine: d 1024, 8 layers,
           16 query / 8 KV heads of 64, ffn 2816, vocab 32064, rope_theta 1e6, no sliding
           window; image_token_index 32000
The image is 672x448 (w x h): of the pinpoints (h, w) [336,672] [672,336] [672,672]
[1008,336] [336,1008], [672,672] keeps the whole image at scale 1, so the grid is 2x2:
5 tiles (the base tile + 4) and 576 + 32 x (48 + 1) = 2144 prompt rows (the 48x48 feature
grid unpadded to 32 rows, image_newline after each row).

Random weights (numpy default_rng, fixed seed, parameters in sorted-name order), scaled so
activations stay finite through 24 + 8 layers: matrices normal(0, 1/sqrt(fan_in)), the
patch kernel normal(0, 1.5/sqrt(3*14*14)), class/position embeddings normal(0, 0.5/0.3),
norm weights 1 + normal(0, 0.1), norm biases and other biases normal(0, 0.05), token
embeddings and image_newline normal(0, 0.5). Values are drawn in float32 and saved in
bfloat16; speed is what this model is for.

Run:  build/venv/bin/python bench/make_vision_model.py [--force] [--out DIR]
      (the tools venv: bash tools/setup_venv.sh)
"""
import argparse
import math
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "bench-models" / "llava-vitl-random"
SEED = 20261204
IMAGE_SEED = 4481
IMAGE_W, IMAGE_H = 672, 448
IMAGE_NAME = "image_672x448.png"
EXPECTED_ROWS = 2144

CROP = 336
PATCH = 14
PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
IMAGE_TOKEN = 32000

VISION = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
              image_size=CROP, patch_size=PATCH, hidden_act="quick_gelu", layer_norm_eps=1e-5,
              projection_dim=768)
TEXT = dict(vocab_size=32064, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=8, head_dim=64, hidden_act="silu",
            rms_norm_eps=1e-5, max_position_embeddings=32768, sliding_window=None,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
ROPE_THETA = 1000000.0


def log(msg):
    print(f"make_vision_model: {msg}", file=sys.stderr, flush=True)


def config():
    from transformers import AutoConfig, CLIPVisionConfig, LlavaNextConfig

    text = AutoConfig.for_model("mistral", **TEXT,
                                rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                                dtype="bfloat16")
    cfg = LlavaNextConfig(
        vision_config=CLIPVisionConfig(**VISION),
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        image_grid_pinpoints=PINPOINTS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LlavaNextForConditionalGeneration"]
    cfg.dtype = "bfloat16"
    return cfg


def param_init(name, shape):
    """(offset, std) of a parameter by its transformers name."""
    if name.endswith("patch_embedding.weight"):
        return 0.0, 1.5 / math.sqrt(int(np.prod(shape[1:])))
    if name.endswith("class_embedding"):
        return 0.0, 0.5
    if name.endswith("position_embedding.weight"):
        return 0.0, 0.3
    if "norm" in name or "layrnorm" in name:  # layer norms, RMS norms, pre_layrnorm
        return (1.0, 0.1) if name.endswith("weight") else (0.0, 0.05)
    if name.endswith("bias"):
        return 0.0, 0.05
    if name.endswith("image_newline") or "embed_tokens" in name:
        return 0.0, 0.5
    assert len(shape) == 2, name
    return 0.0, 1.0 / math.sqrt(shape[1])


def build_model():
    import torch
    from transformers import LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration(config()).to(torch.float32).eval()
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            off, std = param_init(name, tuple(p.shape))
            v = rng.standard_normal(tuple(p.shape), dtype=np.float32) * np.float32(std) + np.float32(off)
            p.copy_(torch.from_numpy(v).to(torch.bfloat16).to(torch.float32))
    return model


def image_processor():
    from transformers import LlavaNextImageProcessor

    return LlavaNextImageProcessor(
        size={"shortest_edge": CROP}, crop_size={"height": CROP, "width": CROP},
        image_grid_pinpoints=PINPOINTS, image_mean=CLIP_MEAN, image_std=CLIP_STD,
        resample=3, rescale_factor=1 / 255, do_pad=True)


def make_image():
    """Smooth colour waves plus Gaussian noise, uint8 RGB, IMAGE_W x IMAGE_H."""
    from PIL import Image

    rng = np.random.default_rng(IMAGE_SEED)
    y, x = np.mgrid[0:IMAGE_H, 0:IMAGE_W].astype(np.float64)
    chans = []
    for c in range(3):
        fx, fy, ph = rng.uniform(0.01, 0.05), rng.uniform(0.01, 0.05), rng.uniform(0, 2 * np.pi)
        v = np.sin(x * fx + y * fy * (1 if c % 2 else -1) + ph)
        v += 0.5 * np.cos(np.hypot(x - IMAGE_W * 0.35, y - IMAGE_H * 0.6) * 0.04 + c)
        chans.append(v)
    img = 128 + 70 * np.stack(chans, -1) + rng.normal(0, 10, size=(IMAGE_H, IMAGE_W, 3))
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def check(dst):
    """Reads the directory back with transformers and runs the image through it: no missing
    or unexpected tensors, 5 tiles, EXPECTED_ROWS rows, finite features and logits."""
    import torch
    from PIL import Image
    from transformers import LlavaNextForConditionalGeneration, LlavaNextImageProcessor

    model, info = LlavaNextForConditionalGeneration.from_pretrained(dst, dtype=torch.float32,
                                                                    output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"loading {dst}: {bad}"
    model.eval()
    ip = LlavaNextImageProcessor.from_pretrained(dst)
    img = Image.open(dst / IMAGE_NAME).convert("RGB")
    inp = ip(images=img, return_tensors="pt")
    assert tuple(inp["pixel_values"].shape) == (1, 5, 3, CROP, CROP), inp["pixel_values"].shape
    assert inp["image_sizes"].tolist() == [[IMAGE_H, IMAGE_W]], inp["image_sizes"]
    with torch.inference_mode():
        feats = model.model.get_image_features(inp["pixel_values"], inp["image_sizes"]).pooler_output[0]
        assert tuple(feats.shape) == (EXPECTED_ROWS, TEXT["hidden_size"]), feats.shape
        ids = torch.tensor([[IMAGE_TOKEN] * EXPECTED_ROWS + list(range(100, 116))])
        logits = model(input_ids=ids, pixel_values=inp["pixel_values"], image_sizes=inp["image_sizes"],
                       logits_to_keep=1).logits
    assert torch.isfinite(feats).all() and torch.isfinite(logits).all()
    log(f"check: 5 tiles, {feats.shape[0]} rows; features max |x| {feats.abs().max():.3g}, "
        f"rms {feats.pow(2).mean().sqrt():.3g}; last-row logits max |x| {logits.abs().max():.3g}, "
        f"std {logits.std():.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true", help="rewrite the model even when present")
    ap.add_argument("--no-check", action="store_true", help="skip reading the model back")
    args = ap.parse_args()
    dst = args.out
    done = dst / ".complete"
    if done.exists() and not args.force:
        log(f"{dst} present")
        return
    import torch
    import transformers

    assert transformers.__version__ == "5.23.0", transformers.__version__
    torch.manual_seed(0)  # the constructor's own init; every parameter is overwritten below
    if dst.exists():
        shutil.rmtree(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    log(f"building the model (seed {SEED})")
    model = build_model()
    n = sum(p.numel() for p in model.parameters())
    log(f"{n / 1e6:.1f}M parameters; saving bfloat16 into {dst}")
    model.to(torch.bfloat16).save_pretrained(tmp)
    del model
    image_processor().save_pretrained(tmp)
    make_image().save(tmp / IMAGE_NAME, format="PNG", compress_level=9)
    if not args.no_check:
        check(tmp)
    tmp.rename(dst)
    done.write_text("ok\n")
    log("done")


if __name__ == "__main__":
    main()
