"""make_tokenizer_goldens.py - writes the tokenizer test corpus and its golden ids.

Builds tests/tokenizer/corpus.json (a fixed list of strings chosen to stress
pre-tokenizer regexes, byte fallback, normalization and added tokens) and, for each
real tokenizer in ../shared/tokenizers/, tests/tokenizer/golden_<name>.json with the
ids Hugging Face `tokenizers` gives with and without special tokens and the decoded
text. It does not run at test time; the C tests only read the committed files.

Usage: build/venv/bin/python tools/make_tokenizer_goldens.py [--shared ../shared]
"""
import argparse
import json
import os
import random

import tokenizers
from tokenizers import Tokenizer

NAMES = ["llama3_1", "qwen3", "llama2"]


def corpus():
    s = [
        "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t x", "a", "Hello",
        "Hello world", " Hello world", "Hello  world", "Hello   world  ", "hello\nworld",
        "Hello, world! How are you?", "The quick brown fox jumps over the lazy dog.",
        "I'm sure you're right, they've said we'll go and he'd come, it's John's.",
        "I'M SURE YOU'RE RIGHT, THEY'VE SAID WE'LL GO AND HE'D COME, IT'S JOHN'S.",
        "don't DON'T Don'T can't won't isn't", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D",
        "x's y'S z're", "''s", "' s", "rock'n'roll", "ſ 'ſ", "O'Neil's",
        "0", "1", "12", "123", "1234", "12345", "123456789", "3.14159265358979",
        "1,000,000", "2024-01-15", "+1 (555) 012-3456", "0x7fffffff", "1e-10", "99 bottles",
        "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
        "a1b2c3", "abc123def", "٣٤٥ ١٢", "१२३४", "½ ¾ ² ³", "Ⅻ ⅻ",
        "def main():\n    print('hi')\n    return 0\n",
        "int main(void) {\n\tint x = 42;\n\treturn x;\n}\n",
        "for (let i = 0; i < n; i++) { console.log(`i=${i}`); }",
        "fn add(a: i32, b: i32) -> i32 { a + b }",
        "SELECT * FROM users WHERE id = 1;",
        "<html><body><p class=\"x\">Hi</p></body></html>",
        "#include <stdio.h>\n#define N 10\n",
        "    indented four\n        eight\n\t\ttabs",
        "x = [1, 2, 3]\ny = {'a': 1, \"b\": 2}",
        "a  b   c    d     e",
        "line1\n\n\nline2\r\n\r\nline3",
        "trailing spaces    ", "   leading spaces", " \t \n mixed \t\n ",
        "$$$ %%% &&& *** !!!", "...", "!!!???", "--- === +++", "a.b.c", "e-mail@example.com",
        "https://example.com/path?q=1&r=2#frag", "C:\\Windows\\System32", "~/.bashrc",
        "😀", "😀😁😂", "Hello 😀 world", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏾‍💻 coding",
        "🇺🇸🇫🇷", "❤️", "☃", "✓ ✗", "→ ← ↑ ↓", "∑∫∂√∞", "€ £ ¥ ₹ ₿",
        "你好", "你好世界", "我爱北京天安门", "日本語のテキスト", "カタカナ ひらがな", "한국어 텍스트",
        "中文，标点。", "混合English和中文", "東京タワー 333m",
        "مرحبا بالعالم", "السلام عليكم", "שלום עולם", "नमस्ते दुनिया", "हिन्दी भाषा",
        "ภาษาไทย", "Ελληνικά", "Русский язык", "Привет, мир!", "Українська", "Tiếng Việt",
        "ქართული", "Հայերեն", "தமிழ்", "বাংলা",
        "café", "cafe\u0301", "e\u0301\u0301", "n\u0303", "A\u030a", "Å", "ﬁ ﬂ", "ｆｕｌｌ ｗｉｄｔｈ",
        "x\u0308y\u0308", "\u0301", "a\u0300\u0301\u0302\u0303\u0304",
        "a\u00a0b", "\u00a0", "a\u200bb", "\u200b", "a\u200cb\u200dc", "\ufeffbom", "a\u2028b\u2029c",
        "\u200e\u200f", "abc\u202edef", "\u3000full\u3000space", "a\u2003b\u2009c", "x\u0085y",
        "\u000b\u000c", "tab\there", "\u180e", "\ufffd", "\U0010fffd", "\ue000", "\u2581", "▁hello",
        "<s>", "</s>", "<unk>", "<s>Hello</s>", " <s> Hello", "Hello <s> world", "<s><s>", "<s >",
        "<|begin_of_text|>", "<|begin_of_text|>Hello", "Hi<|end_of_text|>", "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<|begin_of_text|><|begin_of_text|>", "<|begin_of_text", "<|reserved_special_token_5|>",
        "<|im_start|>", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>", "<|endoftext|>", "<think>\nhmm\n</think>", "<tool_call>{}</tool_call>",
        "<|im_start|> spaced <|im_end|>", "text<|im_start|>text", "<|fim_prefix|>", "<|vision_start|>",
        "<0x41>", "<0xFF>", "[INST] hi [/INST]",
        "a <mask> b", "x<mask>y", "<mask>", "  <mask>  ", "[NEW] word [NEW]word", "[NEW]", "w[NEW] [NEW]",
        "１２３ ｶﾀｶﾅ ㍿", "v1.2.3 and 2,500.00",
        "a" * 300, "ab" * 200, "Supercalifragilisticexpialidocious",
        "pneumonoultramicroscopicsilicovolcanoconiosis", "x" * 1000 + " y",
        "antidisestablishmentarianism" * 5, " " * 64, "\n" * 40, "\t" * 20, "-" * 100,
        "😀" * 50, "你" * 100, "1" * 50, "a b " * 50,
        "\U0001d54f\U0001d550", "𝓗𝓮𝓵𝓵𝓸", "🀄🃏", "\U00020000\U0002a6d6",
    ]
    words = ["the", "The", "THE", "hello", "world", "token", "tokenizer", "café", "naïve",
             "über", "日本", "🙂", "42", "3.5", "don't", "it's", "\n", "\t", "  ", "?!", "(x)",
             "α", "ß", "İstanbul", "ǅ", "ΣΑΣ"]
    # Deterministic combinations: pairs and triples of words with varied joiners.
    joiners = [" ", "", "  ", "\n", "\t", " \n"]
    k = 0
    for i, a in enumerate(words):
        for j, b in enumerate(words):
            if (i * 7 + j * 3) % 11 == 0:
                s.append(a + joiners[k % len(joiners)] + b)
                k += 1
    for i in range(60):
        a, b, c = words[i % len(words)], words[(i * 5 + 1) % len(words)], words[(i * 11 + 2) % len(words)]
        s.append(f"{a}{joiners[i % 6]}{b}{joiners[(i + 1) % 6]}{c}")
    # Seeded random strings over a palette of the characters above: cheap coverage of
    # combinations nobody wrote down (random.Random's sequence is stable across versions).
    rng = random.Random(7)
    palette = list("aAbBzZ e\u00e9  \t\n\r0123456789'\u2019\".,;:!?-_()[]{}<>|/\\@#$%^&*+=~`") + [
        "'s", "'T", "'ll", "'RE", "\u00a0", "\u200b", "\u200d", "\u0301", "\u0308", "\u4f60", "\u597d",
        "\ud55c", "\u0627", "\u0644", "\u0928", "\u094d", "\U0001f600", "\U0001f44d", "\U0001f3fd", "\u017f",
        "\u00df", "\u0130", "\u2581", "\u3000", "\u0085", "\ufeff", "<s>", "</s>", "<|begin_of_text|>",
        "<|im_start|>", "<|eot_id|>", "<think>", "<0x41>", "\ufb01", "\u2460", "\u00b2", "\u216b", "<mask>", "[NEW]"]
    for _ in range(200):
        s.append("".join(rng.choice(palette) for _ in range(rng.randint(1, 40))))
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# Configurations the real tokenizers do not use, built on a real one: the C test
# applies the same "override" to the base tokenizer.json before loading it.
META = "\u2581"
VARIANTS = [
    ("llama2_metaspace_first", "llama2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": META, "prepend_scheme": "first", "split": False},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": META, "prepend_scheme": "first", "split": False}]},
    }),
    ("llama2_metaspace_split", "llama2", {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Metaspace", "replacement": META, "prepend_scheme": "always", "split": True},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Metaspace", "replacement": META, "prepend_scheme": "always", "split": True}]},
    }),
    ("llama2_nfkc_digits", "llama2", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Prepend", "prepend": META},
            {"type": "Replace", "pattern": {"Regex": " +"}, "content": META}]},
        "pre_tokenizer": {"type": "Digits", "individual_digits": True},
        "added_tokens_extra": [
            {"id": 32000, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False,
             "normalized": False, "special": True},
            {"id": 32001, "content": "[NEW]", "single_word": True, "lstrip": False, "rstrip": True,
             "normalized": True, "special": False}],
    }),
    ("llama3_gpt2", "llama3_1", {
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    }),
    ("llama3_splits", "llama3_1", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}+"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[,.!?]"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": True},
            {"type": "Split", "pattern": {"Regex": "\\n+"}, "behavior": "Removed", "invert": False},
            {"type": "Digits", "individual_digits": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    }),
]


def apply_override(doc, override):
    doc = dict(doc)
    for k, v in override.items():
        if k == "added_tokens_extra":
            doc["added_tokens"] = list(doc["added_tokens"]) + v
        else:
            doc[k] = v
    return doc


def golden_cases(tok, texts):
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        plain = tok.encode(t, add_special_tokens=False).ids
        cases.append({
            "ids": ids,
            "ids_plain": plain,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            "roundtrip": tok.decode(plain, skip_special_tokens=False) == t,
        })
    return cases


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "tokenizer"))
    args = ap.parse_args()
    texts = corpus()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False, indent=0)
        f.write("\n")
    for name in NAMES:
        tok = Tokenizer.from_file(os.path.join(args.shared, "tokenizers", name, "tokenizer.json"))
        cases = golden_cases(tok, texts)
        doc = {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "cases": cases}
        with open(os.path.join(args.out, f"golden_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(name, len(cases), "cases")
    variants = []
    for name, base, override in VARIANTS:
        with open(os.path.join(args.shared, "tokenizers", base, "tokenizer.json"), encoding="utf-8") as f:
            doc = json.load(f)
        tok = Tokenizer.from_str(json.dumps(apply_override(doc, override)))
        variants.append({"name": name, "base": base, "override": override, "cases": golden_cases(tok, texts)})
        print(name, "variant")
    with open(os.path.join(args.out, "golden_variants.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "variants": variants}, f,
                  ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
