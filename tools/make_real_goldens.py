#!/usr/bin/env python3
"""Golden outputs of the default model (SmolLM2-135M-Instruct Q4_1 GGUF) from transformers.

transformers loads the same GGUF file (it dequantizes every tensor to float32) and its
tokenizer and chat template. For three fixed chat prompts this writes the prompt ids
(the chat template applied with add_generation_prompt), the 32-token greedy
continuation, the smallest top-1 margin over those steps, and the float32 logits of
the last prompt row (tests/real/smollm2_last_logits.npy, [3, vocab]).

Run: build/venv/bin/python tools/make_real_goldens.py MODEL.gguf
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors."
]
N_GEN = 32


def main():
    gguf_path = Path(sys.argv[1]).resolve()
    out = Path(__file__).resolve().parent.parent / "tests" / "real"
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    model.eval()
    cases, last = [], []
    for p in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
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
        cases.append({"prompt": p, "ids": ids, "greedy": seq[len(ids):], "min_margin": min(margins),
                      "text": tok.decode(seq[len(ids):])})
        print(f"{p!r}: {len(ids)} ids, margin {min(margins):.4f}: {cases[-1]['text']!r}")
    np.save(out / "smollm2_last_logits.npy", np.stack(last).astype("<f4"))
    doc = {"model": gguf_path.name, "transformers": transformers.__version__, "cases": cases}
    (out / "smollm2.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
