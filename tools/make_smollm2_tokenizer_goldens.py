#!/usr/bin/env python3
"""Golden ids of SmolLM2's tokenizer, as transformers exports it from the GGUF file.

transformers builds a tokenizer from the GGUF metadata of the default model
(tests/tokenizer/smollm2/ holds its save_pretrained output, committed); Hugging Face
`tokenizers` then encodes every string of tests/tokenizer/corpus.json with and without
special tokens. The strings are stored beside their ids, so the goldens stand alone.

Run: build/venv/bin/python tools/make_smollm2_tokenizer_goldens.py MODEL.gguf
"""
import json
import sys
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

root = Path(__file__).resolve().parent.parent
out_dir = root / "tests" / "tokenizer"
gguf_path = Path(sys.argv[1]).resolve()
tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
tok.save_pretrained(out_dir / "smollm2")
fast = Tokenizer.from_file(str(out_dir / "smollm2" / "tokenizer.json"))
texts = json.loads((out_dir / "corpus.json").read_text(encoding="utf-8"))
cases = []
for t in texts:
    cases.append({"text": t, "ids": fast.encode(t, add_special_tokens=True).ids,
                  "ids_plain": fast.encode(t, add_special_tokens=False).ids,
                  "decoded": fast.decode(fast.encode(t, add_special_tokens=False).ids, skip_special_tokens=False)})
doc = {"tokenizer": "smollm2 (from " + gguf_path.name + ")", "tokenizers_version": tokenizers.__version__, "cases": cases}
(out_dir / "golden_smollm2.json").write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
print(len(cases), "cases")
