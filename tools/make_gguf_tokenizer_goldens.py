"""make_gguf_tokenizer_goldens.py - golden ids for a GGUF file's own tokenizer.

Loads the tokenizer transformers builds from a GGUF file's metadata
(AutoTokenizer.from_pretrained(dir, gguf_file=...)) and writes, for a list of strings
(the hand-written ones below, then tests/tokenizer/corpus.json), the ids with and
without special tokens and the text each decodes back to. test_tokenizer_gguf compares
celer's tokenizer of the same file with them. It does not run at test time.

transformers 5.23.0 refuses to read a GGUF without torch installed (load_gguf_checkpoint
checks for it), although the tokenizer never uses it; tools/requirements-gguf-tok.txt
lists what this script needs.

Usage: build/tokvenv/bin/python tools/make_gguf_tokenizer_goldens.py MODEL.gguf OUT.json
"""
import json
import os
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

OWN = [
    "", "Hello world", "The capital of France is", "  two leading spaces", "trailing spaces   ",
    "a  b   c    d", " ", "    ", "line one\nline two\n\nline four", "tab\tseparated\tvalues",
    "\t\tindented\n    code();\n", "\r\n", "12345 67.89 1,000,000 3.14159", "0x1F 1e-9 -42",
    "Punctuation: (a), [b], {c}; \"d\" 'e' -- f... g!? h/i\\j", "a.b,c;d:e!f?g",
    "你好，世界！这是中文。", "日本語のテキスト", "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم",
    "😀 emoji 👍🏽 and 👨‍👩‍👧‍👦", "🀄🃏 \U0001d54f \U00020000", "\u2581already\u2581metaspace",
    "byte fallback: \u0000\u0001\u007f \ue000 \U0010fffd", "café naïve über ß İstanbul",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>", "<pad><unk><mask>", "text <start_of_turn> spaced <end_of_turn> text",
    "<start_of_image>", "<start_of_turn", "[multimodal]", "<h1>Title</h1><table></table>",
    "\n\n\n\n\n\n\n\n\n\n\n\n", "\t\t\t\t\t\t\t\t\t\t", " " * 40, "x" * 300, "ab" * 100,
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "tests", "tokenizer", "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    texts, seen = [], set()
    for t in OWN + corpus:
        if t not in seen:
            seen.add(t)
            texts.append(t)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    backend = tok.backend_tokenizer
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True)
        plain = tok.encode(t, add_special_tokens=False)
        decoded = tok.decode(ids, skip_special_tokens=False)
        decoded_plain = tok.decode(plain, skip_special_tokens=False)
        # The C test compares with the backend's decode; say so if transformers differs.
        assert decoded == backend.decode(ids, skip_special_tokens=False), t
        cases.append({"text": t, "ids": ids, "ids_plain": plain, "decoded": decoded, "decoded_plain": decoded_plain})
    doc = {"file": os.path.basename(path), "transformers_version": transformers.__version__,
           "tokenizers_version": tokenizers.__version__, "cases": cases}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(len(cases), "cases ->", out)


if __name__ == "__main__":
    main()
