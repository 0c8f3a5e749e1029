"""make_llamacpp_tokenizer_goldens.py - what llama.cpp's tokenizer makes of the golden strings.

For every string of a golden file written by make_gguf_tokenizer_goldens.py (transformers'
ids for a GGUF file's own tokenizer), runs llama.cpp's llama-tokenize on the same GGUF file,
with and without BOS (special tokens in the text parsed, as the tool does by default, and
as transformers does), and writes the ids beside the string. test_tokenizer_gguf holds
celer's ids to both files. The strings where llama.cpp and transformers disagree are listed
on stderr and marked "differs" in the output. It does not run at test time.

llama-tokenize comes from the llama.cpp tree bench/setup.sh builds (the pinned
llama-cpp-python sdist): build/llama.cpp-VERSION/build/bin/llama-tokenize. Set
LLAMA_CPP_COMMIT to record its commit (build/llama.cpp-VERSION/llama-cpp-commit).

Usage: python3 tools/make_llamacpp_tokenizer_goldens.py LLAMA_TOKENIZE MODEL.gguf GOLDEN.json OUT.json
"""
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor


def tokenize(tool, model, text, bos):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [tool, "-m", model, "-f", path, "--ids", "--no-escape", "--log-disable"]
        if not bos:
            cmd.append("--no-bos")
        out = subprocess.run(cmd, check=True, capture_output=True, timeout=120).stdout.decode()
    finally:
        os.unlink(path)
    line = out.strip().splitlines()[-1]
    return json.loads(line)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    tool, model, golden, out = sys.argv[1:]
    with open(golden, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    texts = [c["text"] for c in cases]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        ids = list(pool.map(lambda t: tokenize(tool, model, t, True), texts))
        plain = list(pool.map(lambda t: tokenize(tool, model, t, False), texts))
    result, differ = [], 0
    for c, a, b in zip(cases, ids, plain):
        same = a == c["ids"] and b == c["ids_plain"]
        differ += not same
        if not same:
            print(f"llama.cpp and transformers differ on {c['text']!r}:\n  {a}\n  {c['ids']}",
                  file=sys.stderr)
        result.append({"text": c["text"], "ids": a, "ids_plain": b, "differs": not same})
    commit = os.environ.get("LLAMA_CPP_COMMIT", "")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"file": os.path.basename(model), "llama_cpp_commit": commit, "cases": result},
                  f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(result)} strings, {differ} where llama.cpp and transformers differ")


if __name__ == "__main__":
    main()
