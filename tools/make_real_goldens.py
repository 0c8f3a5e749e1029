#!/usr/bin/env python3
"""Golden outputs of the real models from transformers: the default model
(SmolLM2-135M-Instruct Q4_1 GGUF, name smollm2) and Gemma 3 270M Q4_K_M (name gemma3).

transformers loads the same GGUF file (it dequantizes every tensor to float32) and its
tokenizer and chat template. For three fixed chat prompts this writes the prompt ids
(the chat template applied with add_generation_prompt, or the text tokenized as it is
where the file has no template, as Gemma 3 270M's has not), the 32-token greedy
continuation, the smallest top-1 margin over those steps, and the float32 logits of
the last prompt row (tests/real/NAME_last_logits.npy, [3, vocab]) beside NAME.json.

Run: build/venv/bin/python tools/make_real_goldens.py MODEL.gguf [NAME]   (NAME: smollm2)
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = {
    "smollm2": ["What is the capital of France?", "Write a haiku about the sea.", "Name three primary colors."],
    # a base model: text to continue
    # (prompts whose greedy continuations keep a top-1 margin of 0.17 or more in fp32)
    "gemma3": ["What is the capital of France?", "def fibonacci(n):", "The quick brown fox"],
}
N_GEN = 32


def main():
    gguf_path = Path(sys.argv[1]).resolve()
    name = sys.argv[2] if len(sys.argv) > 2 else "smollm2"
    out = Path(__file__).resolve().parent.parent / "tests" / "real"
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    model.eval()
    cases, last = [], []
    for p in PROMPTS[name]:
        if tok.chat_template:
            ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:  # a base model's GGUF (Gemma 3 270M) has no chat template: the text as it is
            ids = tok(p)["input_ids"]
        ids = [int(i) for i in ids]
        seq, margins = list(ids), []
        with torch.no_grad():
            for step in range(N_GEN):
                logits = model(torch.tensor([seq])).logits[0, -1].to(torch.float32).numpy()
                if step == 0:
                    last.append(logits)
                top = np.sort(logits)
                margins.append(float(top[-1] - top[-2]))
                seq.append(int(np.argmax(logits)))
        cases.append({"prompt": p, "chat": bool(tok.chat_template), "ids": ids, "greedy": seq[len(ids):], "min_margin": min(margins),
                      "text": tok.decode(seq[len(ids):])})
        print(f"{p!r}: {len(ids)} ids, margin {min(margins):.4f}: {cases[-1]['text']!r}")
    np.save(out / f"{name}_last_logits.npy", np.stack(last).astype("<f4"))
    doc = {"model": gguf_path.name, "transformers": transformers.__version__, "cases": cases}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
