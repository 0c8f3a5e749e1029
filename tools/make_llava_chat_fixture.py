#!/usr/bin/env python3
"""Generate tests/server/fixtures/llava-chat: a tiny random LLaVA-NeXT checkpoint with a
byte-level BPE tokenizer and a LLaVA-style chat template, for the end-to-end tests of
`image_url` parts in `celer serve` (tests/server/suite.py).

Usage:
    build/venv/bin/python tools/make_llava_chat_fixture.py [--out tests/server/fixtures/llava-chat]

Deterministic: the corpus, weights, images and prompt are fixed below. Pinned tools:
transformers 5.23.0, tokenizers, torch (CPU is enough), Pillow.

What it writes:
    config.json, model.safetensors  LlavaNextForConditionalGeneration.save_pretrained (float32):
                                    CLIP tower (hidden 32, 3 layers, 4 heads, image 56, patch 14,
                                    quick_gelu), Llama text model (hidden 64, 2 layers), anyres
                                    pinpoints [[56,112],[112,56],[112,112]]
    preprocessor_config.json        LlavaNextImageProcessor (shortest edge 56, crop 56)
    tokenizer.json                  byte-level BPE trained here with `tokenizers`: "<unk>" 0,
                                    "<s>" 1, "</s>" 2, merges, then the added special token
                                    "<image>" as the last id (= image_token_index); the model's
                                    vocabulary is exactly the tokenizer's
    tokenizer_config.json           bos/eos and the chat template (CHAT_TEMPLATE below)
    image_a.png, image_b.png        two images of the same size and different pixels
    golden.json                     per image: the rendered prompt, the prompt ids the processor
                                    expands (prompt_tokens = their count), the greedy completion
                                    ids of model.generate (max_new_tokens 8, do_sample False) and
                                    their text

A weight seed is accepted only when, for both images, every greedy step has a top-1/top-2
logit margin of at least MIN_MARGIN, no completion id is special, no completion ends early,
the completion's bytes are valid UTF-8 (so its text can be compared exactly), and the two
images give different completions.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "server" / "fixtures" / "llava-chat"

TARGET_VOCAB = 512
CROP = 56
PATCH = 14
PINPOINTS = [[56, 112], [112, 56], [112, 112]]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
GEN_LEN = 8
MIN_MARGIN = 1e-3
FIRST_SEED = 31001
MAX_SEED_TRIES = 400
IMAGE_W, IMAGE_H = 80, 48  # anyres 1x2 grid, columns cut by the unpadding
IMAGE_SEEDS = {"a": 7101, "b": 7202}
PROMPT = "What is in this picture? Answer in a few words."

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              image_size=CROP, patch_size=PATCH, hidden_act="quick_gelu", layer_norm_eps=1e-5)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, hidden_act="silu", bos_token_id=1, eos_token_id=2,
            rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False)

# LLaVA-style: the content is a string, or a list of parts where an image part becomes
# "<image>\n" in place.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% elif message['role'] == 'assistant' %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

CORPUS = [
    "USER: What is in this picture? Answer in a few words.",
    "ASSISTANT: A small red boat on a quiet lake at sunset.",
    "The picture shows a cat sitting on a wooden table next to a window.",
    "There are three people walking along the beach in the morning light.",
    "A green field with a white house, a tall tree and a blue sky above it.",
    "Describe the image in one sentence, please. What colours do you see?",
    "The quick brown fox jumps over the lazy dog while the birds sing in the trees.",
    "Answer briefly: the photo is of a city street with cars, shops and a bicycle.",
    "In this image a child is reading a book in the library on a rainy afternoon.",
    "Mountains covered in snow rise behind a village; smoke comes from the chimneys.",
    "A plate of fruit: apples, oranges, grapes and a banana on a striped cloth.",
    "The dog runs across the garden to catch a yellow ball thrown by its owner.",
    "Numbers and symbols: 1, 2, 3, 10, 42, 100; (a) [b] {c} - + = ? ! : ; ' \" / \\.",
]

TEXT_STD = 0.15
EMBED_STD = 0.35
BIAS_STD = 0.1


def train_tokenizer(out_dir):
    """tokenizer.json: byte-level BPE over CORPUS, then "<image>" as an added special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB - 1, min_frequency=1, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS * 4, trainer)
    tk.add_special_tokens(["<image>"])
    assert tk.token_to_id("<unk>") == 0 and tk.token_to_id("<s>") == 1 and tk.token_to_id("</s>") == 2
    n_vocab = tk.get_vocab_size(with_added_tokens=True)
    image_id = tk.token_to_id("<image>")
    assert image_id == n_vocab - 1, (image_id, n_vocab)
    tk.save(str(out_dir / "tokenizer.json"))
    return n_vocab, image_id


def write_tokenizer_config(out_dir, image_id):
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, t in ((0, "<unk>"), (1, "<s>"), (2, "</s>"), (image_id, "<image>"))
        },
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "extra_special_tokens": {"image_token": "<image>"},
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def llava_config(n_vocab, image_id):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextConfig

    text = LlamaConfig(vocab_size=n_vocab, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       dtype="float32", **TEXT)
    cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(**VISION), text_config=text, image_token_index=image_id,
                          image_grid_pinpoints=PINPOINTS, vision_feature_layer=-2,
                          vision_feature_select_strategy="default", projector_hidden_act="gelu",
                          multimodal_projector_bias=True, tie_word_embeddings=False)
    cfg.architectures = ["LlavaNextForConditionalGeneration"]
    cfg.dtype = "float32"
    return cfg


def init_model(cfg, seed):
    """The model with parameters drawn from a seeded numpy generator, in sorted name order."""
    import torch
    from transformers import LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration(cfg).to(torch.float32).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            if name.endswith("norm.weight") or "layer_norm" in name or "layrnorm" in name:
                v = 1.0 + rng.standard_normal(shape) * 0.1 if name.endswith("weight") else \
                    rng.standard_normal(shape) * BIAS_STD
            elif name.endswith("bias"):
                v = rng.standard_normal(shape) * BIAS_STD
            elif "embed" in name or name.endswith("image_newline") or "class_embedding" in name:
                v = rng.standard_normal(shape) * EMBED_STD
            else:
                v = rng.standard_normal(shape) * TEXT_STD
            p.copy_(torch.from_numpy(np.asarray(v, dtype=np.float32)))
    return model


def image_processor():
    from transformers import LlavaNextImageProcessor

    return LlavaNextImageProcessor(size={"shortest_edge": CROP}, crop_size={"height": CROP, "width": CROP},
                                   image_grid_pinpoints=PINPOINTS, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                                   resample=3, rescale_factor=1 / 255, do_pad=True)


def make_image(w, h, seed):
    """Colour waves plus noise, uint8 RGB."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    ph = rng.uniform(0, 2 * np.pi, size=3)
    f = rng.uniform(0.05, 0.15, size=(3, 2))
    chans = [np.sin(x * f[c, 0] + y * f[c, 1] * (1 if c % 2 else -1) + ph[c]) for c in range(3)]
    img = 128 + 80 * np.stack(chans, -1) + rng.normal(0, 10, size=(h, w, 3))
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def processor(d):
    from transformers import AutoTokenizer, LlavaNextImageProcessor, LlavaNextProcessor

    tok = AutoTokenizer.from_pretrained(str(d))
    ip = LlavaNextImageProcessor.from_pretrained(str(d))
    return LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=CHAT_TEMPLATE, image_token="<image>")


def byte_of_char():
    """The inverse of the byte-level pre-tokenizer's byte -> character map: printable
    Latin-1 bytes stand for themselves, the other bytes for U+0100 onwards in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    m, k = {}, 0
    for b in range(256):
        if b in keep:
            m[chr(b)] = b
        else:
            m[chr(256 + k)] = b
            k += 1
    return m


BYTE_OF_CHAR = byte_of_char()


def token_bytes(token):
    return bytes(BYTE_OF_CHAR[c] for c in token)


def golden_case(model, proc, d, name, image_id, specials):
    """The rendered prompt, expanded ids and greedy completion for image_<name>.png; None
    when the seed fails the acceptance rules."""
    import torch
    from PIL import Image

    img = Image.open(d / f"image_{name}.png")
    img.load()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.count("<image>") == 1, text
    enc = proc(images=[img], text=text, add_special_tokens=False, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    plain = proc.tokenizer(text, add_special_tokens=False)["input_ids"]
    n_img = ids.count(image_id)
    start = plain.index(image_id)
    assert plain.count(image_id) == 1 and ids == plain[:start] + [image_id] * n_img + plain[start + 1:]
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=GEN_LEN, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    out = gen.sequences[0, len(ids):].tolist()
    margins = [float(np.diff(np.sort(s[0].float().numpy())[-2:])[0]) for s in gen.logits]
    if len(out) != GEN_LEN or any(t in specials for t in out) or min(margins) < MIN_MARGIN:
        return None
    pieces = [token_bytes(proc.tokenizer.convert_ids_to_tokens(t)) for t in out]
    try:
        text_out = b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError:
        return None  # the completion's text must be well defined to compare it
    if "\0" in text_out or text_out != proc.tokenizer.decode(out, skip_special_tokens=False):
        return None
    return {
        "image": f"image_{name}.png",
        "image_size": [IMAGE_W, IMAGE_H],
        "prompt_text": text,
        "prompt_ids": plain,
        "prompt_tokens": len(ids),
        "image_rows": n_img,
        "image_start": start,
        "completion_ids": out,
        "completion_text": text_out,
        "completion_token_bytes": [list(b) for b in pieces],
        "min_margin": min(margins),
    }


README = """# llava-chat

A tiny random LLaVA-NeXT checkpoint with a tokenizer and a chat template, for the
end-to-end tests of `image_url` content parts in `celer serve` (tests/server/suite.py).
Made by `build/venv/bin/python tools/make_llava_chat_fixture.py` (deterministic; weight
seed {seed}); versions: {versions}.

- `config.json`, `model.safetensors`: `LlavaNextForConditionalGeneration.save_pretrained`
  in float32: CLIP tower (hidden 32, 3 layers, 4 heads, image 56, patch 14, quick_gelu,
  feature layer -2, strategy "default"), GELU projector, Llama text model (hidden 64, 2
  layers, 4 heads, 2 KV heads, vocabulary {n_vocab}), pinpoints [[56,112],[112,56],[112,112]].
- `preprocessor_config.json`: `LlavaNextImageProcessor` (shortest edge 56, crop 56).
- `tokenizer.json`: byte-level BPE trained with `tokenizers` on a few sentences; `<unk>` 0,
  `<s>` 1, `</s>` 2, and `<image>` {image_token} (the config's `image_token_index`).
- `tokenizer_config.json`: bos/eos and a LLaVA-style chat template that writes `<image>\\n`
  for an image part of a message's content list.
- `image_a.png`, `image_b.png`: {w}x{h}, same size, different pixels.
- `golden.json`: per image, for one user message [image, "{prompt}"], the rendered
  prompt, its ids (one `<image>`), `prompt_tokens` (the ids after LlavaNextProcessor expands
  the image token: {n_a}), and the greedy completion (`model.generate`, max_new_tokens
  {gen}, do_sample False, pixel_values from the processor) as ids, text and bytes per token.

This folder is not under tests/fixtures, so the checkpoint-enumerating tests do not list it.
"""


def versions():
    import PIL
    import tokenizers
    import torch
    import transformers

    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "torch": torch.__version__.split("+")[0], "pillow": PIL.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    import torch
    import transformers

    assert transformers.__version__ == "5.23.0", transformers.__version__
    torch.manual_seed(0)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "llava-chat"
        d.mkdir()
        n_vocab, image_id = train_tokenizer(d)
        write_tokenizer_config(d, image_id)
        image_processor().save_pretrained(str(d))
        for name, seed in IMAGE_SEEDS.items():
            make_image(IMAGE_W, IMAGE_H, seed).save(d / f"image_{name}.png", format="PNG", compress_level=9)
        proc = processor(d)
        specials = {0, 1, 2, image_id}
        cfg = llava_config(n_vocab, image_id)
        for seed in range(FIRST_SEED, FIRST_SEED + MAX_SEED_TRIES):
            model = init_model(cfg, seed)
            model.save_pretrained(str(d), safe_serialization=True)
            from transformers import LlavaNextForConditionalGeneration

            # goldens from the checkpoint as read back, in float32 with eager attention
            back, info = LlavaNextForConditionalGeneration.from_pretrained(
                str(d), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
            back.eval()
            assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
            cases = {n: golden_case(back, proc, d, n, image_id, specials) for n in IMAGE_SEEDS}
            if all(cases.values()) and cases["a"]["completion_ids"] != cases["b"]["completion_ids"]:
                break
            print(f"seed {seed}: rejected", file=sys.stderr)
        else:
            sys.exit(f"no acceptable seed in {MAX_SEED_TRIES} tries")
        golden = {
            "seed": seed,
            "versions": versions(),
            "n_vocab": n_vocab,
            "image_token": image_id,
            "eos_token": 2,
            "max_new_tokens": GEN_LEN,
            "messages_content": [{"type": "image"}, {"type": "text", "text": PROMPT}],
            "prompt": PROMPT,
            "cases": cases,
        }
        (d / "golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
        vs = ", ".join(f"{k} {v}" for k, v in golden["versions"].items())
        (d / "README.md").write_text(README.format(seed=seed, versions=vs, n_vocab=n_vocab, image_token=image_id,
                                                   w=IMAGE_W, h=IMAGE_H, prompt=PROMPT,
                                                   n_a=cases["a"]["prompt_tokens"], gen=GEN_LEN))
        gc = d / "generation_config.json"
        if gc.exists():
            gc.unlink()
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(d, out)
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"{out}: seed {seed}, vocab {n_vocab}, image token {image_id}, "
          f"prompt_tokens {cases['a']['prompt_tokens']}, {total} bytes")
    for n, c in cases.items():
        print(f"  {n}: {c['completion_ids']} {c['completion_text']!r} margin {c['min_margin']:.4f}")


if __name__ == "__main__":
    main()
