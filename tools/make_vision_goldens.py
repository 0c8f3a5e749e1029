#!/usr/bin/env python3
"""Generate the image-decoding and LLaVA-NeXT preprocessing goldens in tests/fixtures/vision.

Usage:
    bash tools/setup_venv.sh
    build/venv/bin/python tools/make_vision_goldens.py --out tests/fixtures/vision

Deterministic (fixed seeds; Pillow's encoders and this file's PNG writer are deterministic).

What it writes
--------------
images/NAME.{png,jpg}   test images: several sizes and aspect ratios, each in PNG and JPEG,
                        plus PNG colour types and bit depths (gray 1/2/4/8/16 bit, gray+alpha
                        8/16, palette with tRNS, RGB with a tRNS colour key, RGBA 8/16, RGB 16,
                        Adam7-interlaced) and JPEG variants (progressive, grayscale, CMYK,
                        an EXIF orientation tag).
configs/NAME/           preprocessor_config.json (+ processor_config.json, config.json) in the
                        layout of a checkpoint directory; see CONFIGS below.
decoded.bin.xz          per image up to 50,000 pixels (the larger ones have their size and the
                        FNV-1a 64 digest of the bytes in cases.json), the RGB uint8 array the reference pipeline sees:
                        transformers.image_transforms.convert_to_rgb(PIL.Image.open(path))
                        (what the image processor does to a PIL image); the container format
                        is described at write_goldens_xz.
pixels.bin.xz           per preprocessing case, pixel_values[0] (float32 [tiles, 3, h, w]) from
                        AutoImageProcessor.from_pretrained(configs/NAME)(PIL image), which is
                        transformers' LlavaNextImageProcessor, torchvision backend.
cases.json              per case: image, config, image_sizes, pixel shape, and the feature
                        counts: n_tokens counted in the input_ids of LlavaNextProcessor
                        (the processor with a small word-level tokenizer that has an <image>
                        token, called with text "<image>"), n_tokens_formula from
                        LlavaNextProcessor._get_number_of_features (they must agree), the
                        grid from modeling_llava_next.get_anyres_image_grid_shape and the
                        unpadded feature size from modeling_llava_next.unpad_image.
"""
import argparse
import io
import json
import lzma
import os
import shutil
import struct
import sys
import tempfile
import zlib

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image
from transformers import AutoImageProcessor, LlavaNextProcessor, PreTrainedTokenizerFast
from transformers.image_transforms import convert_to_rgb
from transformers.models.llava_next import modeling_llava_next

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# name -> (preprocessor_config, processor_config or None, config.json or None)
CONFIGS = {
    # crop 56, patch 14: 1x2, 2x1 and 2x2 grids; CLIP mean/std; CLS counted, "default".
    "c56": (
        {"crop_size": {"height": 56, "width": 56}, "size": {"shortest_edge": 56},
         "image_grid_pinpoints": [[56, 112], [112, 56], [112, 112]],
         "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3,
         "rescale_factor": 1 / 255},
        {"patch_size": 14, "num_additional_image_tokens": 1,
         "vision_feature_select_strategy": "default"},
        None,
    ),
    # crop 28: pinpoints only in config.json (1x2, 2x1, 2x2, 3x1, 1x3); mean/std 0.5; "full".
    "c28": (
        {"crop_size": 28, "size": {"shortest_edge": 28}, "image_mean": [0.5, 0.5, 0.5],
         "image_std": [0.5, 0.5, 0.5], "resample": 3, "rescale_factor": 1 / 255},
        {"patch_size": 14, "num_additional_image_tokens": 0,
         "vision_feature_select_strategy": "full"},
        {"image_grid_pinpoints": [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]],
         "vision_config": {"patch_size": 14, "image_size": 28}},
    ),
    # bilinear, tiles of 32 resized to 40 then center-cropped to 32; patch 8 from config.json.
    "c32b": (
        {"crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 40},
         "image_grid_pinpoints": [[64, 32], [32, 64], [64, 64]],
         "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 2,
         "rescale_factor": 1 / 255},
        None,
        {"vision_feature_select_strategy": "default",
         "vision_config": {"patch_size": 8, "image_size": 32}},
    ),
    # llava-v1.6-mistral-7b-hf's image processor.
    "llava16": (
        {"crop_size": {"height": 336, "width": 336}, "size": {"shortest_edge": 336},
         "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
         "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3,
         "rescale_factor": 0.00392156862745098, "do_center_crop": True, "do_normalize": True,
         "do_rescale": True, "do_resize": True, "do_convert_rgb": True, "do_pad": True,
         "image_processor_type": "LlavaNextImageProcessor",
         "processor_class": "LlavaNextProcessor"},
        {"patch_size": 14, "num_additional_image_tokens": 1,
         "vision_feature_select_strategy": "default", "image_token": "<image>",
         "processor_class": "LlavaNextProcessor"},
        None,
    ),
}


# ==== Synthetic images ====

def scene(h, w, seed):
    """A smooth, structured RGB picture (gradients, discs, stripes, mild noise): uint8 [h, w, 3]."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 90 * np.sin(a * x / max(w, 1) * 6 + b * y / max(h, 1) * 6 + p * 3)
    for _ in range(3):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.1, 0.4) * max(h, w)
        mask = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    stripes = ((x + 2 * y) // max(2, w // 16)) % 2 == 0
    img[stripes & (y < h / 3)] *= 0.6
    img += rng.normal(0, 6 if h * w < 100000 else 1, img.shape)  # large ones stay small as PNG
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def png_write(samples, bit_depth, color_type, interlace=False, plte=None, trns=None):
    """A PNG from integer samples [h, w, c] at bit_depth (1/2/4/8/16), no filtering."""
    h, w, c = samples.shape

    def pack_rows(sub):
        rows = b""
        for row in sub:
            flat = row.reshape(-1).astype(np.int64)
            if bit_depth == 16:
                data = b"".join(struct.pack(">H", int(v)) for v in flat)
            elif bit_depth == 8:
                data = bytes(int(v) for v in flat)
            else:
                per = 8 // bit_depth
                out = bytearray()
                for i in range(0, len(flat), per):
                    byte = 0
                    for j in range(per):
                        v = int(flat[i + j]) if i + j < len(flat) else 0
                        byte |= v << (8 - bit_depth * (j + 1))
                    out.append(byte)
                data = bytes(out)
            rows += b"\x00" + data
        return rows

    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += pack_rows(sub)
    else:
        raw = pack_rows(samples)
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0,
                                          1 if interlace else 0))
    if plte is not None:
        out += png_chunk(b"PLTE", bytes(plte))
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    out += png_chunk(b"IDAT", zlib.compress(raw, 9))
    out += png_chunk(b"IEND", b"")
    return out


def make_images(dst):
    """Writes the test images; returns {name: filename}."""
    files = {}

    def save(name, data):
        path = os.path.join(dst, name)
        with open(path, "wb") as f:
            f.write(data)
        files[os.path.splitext(name)[0] + "." + name.rsplit(".", 1)[1]] = name

    def pil_bytes(im, fmt, **kw):
        b = io.BytesIO()
        im.save(b, format=fmt, **kw)
        return b.getvalue()

    # (name, width, height): wide, tall, square, tiny, larger, and ones that need padding.
    sizes = [("wide", 90, 40), ("tall", 37, 100), ("square", 64, 64), ("tiny", 3, 5),
             ("tinywide", 5, 3), ("large", 1000, 700), ("pad", 70, 50), ("strip", 200, 20),
             ("llava", 200, 150)]
    for i, (name, w, h) in enumerate(sizes):
        rgb = Image.fromarray(scene(h, w, 100 + i), "RGB")
        save(f"{name}.png", pil_bytes(rgb, "PNG"))
        save(f"{name}.jpg", pil_bytes(rgb, "JPEG", quality=90))
    base = scene(48, 60, 7)
    rng = np.random.RandomState(11)
    # RGBA with every kind of alpha: opaque, clear, and a ramp.
    alpha = np.tile(np.linspace(0, 255, 60).astype(np.uint8), (48, 1))
    alpha[:8] = 255
    alpha[8:12] = 0
    save("rgba.png", pil_bytes(Image.fromarray(np.dstack([base, alpha]), "RGBA"), "PNG"))
    gray = np.asarray(Image.fromarray(base).convert("L"))
    save("gray.png", pil_bytes(Image.fromarray(gray, "L"), "PNG"))
    save("gray_alpha.png", pil_bytes(Image.fromarray(np.dstack([gray, alpha]), "LA"), "PNG"))
    # Palette with a partly transparent tRNS.
    pal_img = Image.fromarray(base).quantize(colors=16, method=Image.Quantize.MEDIANCUT,
                                             dither=Image.Dither.NONE)
    pal = pal_img.getpalette()[: 16 * 3]
    idx = np.asarray(pal_img)
    trns = bytes([255, 0, 128, 200] + [255] * 6)  # 10 entries: the rest are opaque
    save("palette.png", png_write(idx[..., None], 8, 3, plte=pal, trns=trns))
    save("palette_plain.png", pil_bytes(pal_img, "PNG"))
    save("palette4_interlaced.png", png_write(idx[..., None], 4, 3, interlace=True, plte=pal,
                                              trns=bytes([90, 255, 0])))
    # Colour keys.
    key = base[5, 5]
    save("rgb_trns.png", png_write(base, 8, 2, trns=struct.pack(">HHH", *[int(v) for v in key])))
    save("gray_trns.png", png_write(gray[..., None], 8, 0, trns=struct.pack(">H", int(gray[3, 3]))))
    # Low and high bit depths.
    g2 = (gray // 64).astype(np.int64)
    save("gray2.png", png_write(g2[..., None], 2, 0))
    g4 = (gray // 16).astype(np.int64)
    save("gray4_trns.png", png_write(g4[..., None], 4, 0, trns=struct.pack(">H", int(g4[0, 0]))))
    save("gray1.png", pil_bytes(Image.fromarray(gray > 128), "PNG"))
    g16 = (gray.astype(np.int64) * 257 // 3 + rng.randint(0, 2, gray.shape)).astype(np.int64)
    g16[:10] = gray[:10]  # some values below 256 too
    save("gray16.png", png_write(g16[..., None], 16, 0))
    rgb16 = base.astype(np.int64) * 257 + rng.randint(0, 256, base.shape)
    save("rgb16.png", png_write(rgb16, 16, 2))
    a16 = alpha.astype(np.int64) * 257
    save("rgba16.png", png_write(np.dstack([rgb16, a16]), 16, 6))
    save("gray_alpha16.png", png_write(np.dstack([g16 * 3, a16]), 16, 4))
    save("rgb_interlaced.png", png_write(base.astype(np.int64), 8, 2, interlace=True))
    # Small random PNGs over every colour type, bit depth, tRNS form and interlacing,
    # including palette indices past the PLTE entries and 16-bit colour keys.
    rng = np.random.RandomState(5)
    for t in range(40):
        ct = [0, 2, 3, 4, 6][t % 5]
        depths = {0: [1, 2, 4, 8, 16], 2: [8, 16], 3: [1, 2, 4, 8], 4: [8, 16], 6: [8, 16]}[ct]
        d = depths[(t // 5) % len(depths)]
        ch = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ct]
        h, w = rng.randint(1, 12), rng.randint(1, 12)
        smp = rng.randint(0, (1 << d), (h, w, ch))
        plte = trns = None
        if ct == 3:
            n = rng.randint(1, min(1 << d, 20) + 1)
            plte = list(rng.randint(0, 256, 3 * n))
            if t % 2:
                trns = bytes(rng.randint(0, 256, rng.randint(1, n + 1)).astype(np.uint8))
        elif ct in (0, 2) and t % 3:
            key = smp[rng.randint(h), rng.randint(w)] if t % 2 else rng.randint(0, 256, ch)
            trns = struct.pack(">" + "H" * ch, *[int(v) for v in key])
        save(f"rnd{t:02d}_ct{ct}_d{d}.png",
             png_write(smp, d, ct, interlace=bool(t % 4 == 1), plte=plte, trns=trns))
    # JPEG variants.
    im = Image.fromarray(scene(45, 77, 21), "RGB")
    save("progressive.jpg", pil_bytes(im, "JPEG", quality=85, progressive=True))
    save("gray.jpg", pil_bytes(Image.fromarray(gray, "L"), "JPEG", quality=90))
    cmyk = Image.fromarray(base, "RGB").convert("CMYK")
    save("cmyk.jpg", pil_bytes(cmyk, "JPEG", quality=90))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view": neither PIL.Image.open nor the processor rotates
    save("exif_rotated.jpg", pil_bytes(im, "JPEG", quality=90, exif=exif))
    save("subsampling444.jpg", pil_bytes(im, "JPEG", quality=95, subsampling=0))
    return files


# ==== Reference runs ====

def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<image>": 1, "hello": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return fast


def write_config(dst, name):
    pre, proc, model = CONFIGS[name]
    pre = dict(pre, image_processor_type="LlavaNextImageProcessor")
    d = os.path.join(dst, "configs", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2, sort_keys=True)
    if proc is not None:
        with open(os.path.join(d, "processor_config.json"), "w") as f:
            json.dump(proc, f, indent=2, sort_keys=True)
    if model is not None:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(model, f, indent=2, sort_keys=True)
    return d


def processor_settings(name):
    pre, proc, model = CONFIGS[name]
    proc = proc or {}
    model = model or {}
    pins = pre.get("image_grid_pinpoints") or model["image_grid_pinpoints"]
    patch = proc.get("patch_size") or model["vision_config"]["patch_size"]
    strategy = proc.get("vision_feature_select_strategy") or model.get(
        "vision_feature_select_strategy", "default")
    extra = proc.get("num_additional_image_tokens", 0)
    return pins, patch, strategy, extra


def run_case(dst, cfg_dir, cfg_name, image_name, tokenizer):
    pins, patch, strategy, extra = processor_settings(cfg_name)
    ip = AutoImageProcessor.from_pretrained(cfg_dir)
    assert type(ip).__name__ == "LlavaNextImageProcessor" and ip.backend == "torchvision", type(ip)
    if "image_grid_pinpoints" not in CONFIGS[cfg_name][0]:
        ip.image_grid_pinpoints = pins  # the processor would use its class default otherwise
    pil = Image.open(os.path.join(dst, "images", image_name))
    out = ip(images=pil, return_tensors="pt")
    pv = out["pixel_values"][0].numpy().astype(np.float32)
    sizes = [int(v) for v in out["image_sizes"][0]]
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tokenizer, patch_size=patch,
                              vision_feature_select_strategy=strategy,
                              num_additional_image_tokens=extra)
    enc = proc(images=Image.open(os.path.join(dst, "images", image_name)), text="<image>",
               return_tensors="pt")
    assert torch.equal(enc["pixel_values"][0], out["pixel_values"][0])
    n_tokens = int((enc["input_ids"][0] == proc.image_token_id).sum())
    h, w = pv.shape[-2:]
    formula = proc._get_number_of_features(sizes[0], sizes[1], h, w)
    if strategy == "default":
        formula -= 1
    assert formula == n_tokens, (formula, n_tokens)
    grid_h, grid_w = modeling_llava_next.get_anyres_image_grid_shape(sizes, pins, h)
    per = h // patch
    feat = torch.zeros(1, grid_h * per, grid_w * (w // patch))
    unpadded = modeling_llava_next.unpad_image(feat, sizes)
    case = {"image": image_name, "config": cfg_name, "image_sizes": sizes,
            "pixel_shape": list(pv.shape), "n_tokens": n_tokens, "n_tokens_formula": formula,
            "grid": [int(grid_h), int(grid_w)],
            "unpadded": [int(unpadded.shape[1]), int(unpadded.shape[2])]}
    return case, pv


GOLDEN_MAGIC = b"CLRVIS1\n"  # celer vision goldens, format version 1


def write_goldens_xz(path, arrays):
    """xz of: magic, then per array: u32 name length, name (UTF-8), u8 dtype (0 uint8,
    1 float32), u32 ndim, u32 dims[ndim], the C-order data; all little-endian."""
    out = bytearray(GOLDEN_MAGIC)
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        code = {np.dtype(np.uint8): 0, np.dtype(np.float32): 1}[arr.dtype]
        key = name.encode()
        out += struct.pack("<I", len(key)) + key + struct.pack("<BI", code, arr.ndim)
        out += struct.pack(f"<{arr.ndim}I", *arr.shape) + arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    with open(path, "wb") as f:
        f.write(lzma.compress(bytes(out), preset=9 | lzma.PRESET_EXTREME))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/vision")
    args = ap.parse_args()
    dst = args.out
    for part in ["images", "configs"]:  # README.md stays
        shutil.rmtree(os.path.join(dst, part), ignore_errors=True)
    os.makedirs(os.path.join(dst, "images"))
    files = make_images(os.path.join(dst, "images"))
    decoded, digests = {}, {}
    for name in sorted(files.values()):
        arr = convert_to_rgb(Image.open(os.path.join(dst, "images", name)), return_numpy=True)
        assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3, (name, arr.shape)
        arr = np.ascontiguousarray(arr)
        if arr.shape[0] * arr.shape[1] <= 50000:
            decoded[name] = arr
        else:  # large: only the size and a digest of the bytes
            digests[name] = {"height": arr.shape[0], "width": arr.shape[1],
                             "fnv1a64": "%016x" % fnv1a64(arr.tobytes())}
    write_goldens_xz(os.path.join(dst, "decoded.bin.xz"), decoded)

    cfg_dirs = {n: write_config(dst, n) for n in CONFIGS}
    tokenizer = make_tokenizer()
    plan = []
    for stem in ["wide", "tall", "square", "tiny", "tinywide", "large", "pad", "strip"]:
        for ext in ["png", "jpg"]:
            plan.append(("c56", f"{stem}.{ext}"))
    for img in ["rgba.png", "gray.png", "palette.png", "progressive.jpg", "cmyk.jpg",
                "rgb16.png", "rgb_interlaced.png", "wide.png", "tall.jpg", "large.jpg"]:
        plan.append(("c28", img))
    for img in ["wide.png", "tall.png", "pad.jpg", "tiny.png", "gray_alpha.png"]:
        plan.append(("c32b", img))
    plan.append(("llava16", "llava.jpg"))
    plan.append(("llava16", "large.jpg"))
    cases, pixels = [], {}
    for cfg_name, img in plan:
        case, pv = run_case(dst, cfg_dirs[cfg_name], cfg_name, img, tokenizer)
        key = f"{cfg_name}__{img}"
        case["key"] = key
        cases.append(case)
        pixels[key] = pv
        print(f"{key}: {case['pixel_shape']} tokens {case['n_tokens']} grid {case['grid']} "
              f"unpadded {case['unpadded']}")
    write_goldens_xz(os.path.join(dst, "pixels.bin.xz"), pixels)
    meta = {"generator": "tools/make_vision_goldens.py",
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                         "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                         "numpy": np.__version__},
            "decoded_digests": digests, "cases": cases}
    with open(os.path.join(dst, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs)
    print(f"{len(files)} images, {len(cases)} cases, {total / 1e6:.2f} MB in {dst}")


if __name__ == "__main__":
    sys.exit(main())
