#!/usr/bin/env python3
"""Records llama.cpp's verdicts on (grammar, string) pairs into tests/grammar/golden_*.json.

The reference is llama.cpp's own grammar validator, tests/test-gbnf-validator.cpp of its
source tree, compiled against a built libllama (no other part of llama.cpp is needed):

    g++ -O1 -std=c++17 -I$LLAMA/include -I$LLAMA/ggml/include -I$LLAMA/src \\
        -o build/llama-ref/test-gbnf-validator $LLAMA/tests/test-gbnf-validator.cpp \\
        -L$LIB -lllama -lggml -lggml-base -Wl,-rpath,$LIB

For each grammar of tests/grammar/ named below, the strings are hand-written sentences and
non-sentences plus seeded random code-point mutations of them. Each record holds the
string, whether llama.cpp accepts it as a complete sentence ("valid"), and whether it is
a prefix of one ("prefix": valid, or refused only at the end of the input).
tests/test_grammar.c checks that celer's matcher agrees on every record.

Usage: python3 tools/make_grammar_goldens.py --validator build/llama-ref/test-gbnf-validator
Only the Python standard library is needed.
"""
import argparse
import json
import os
import random
import subprocess
import tempfile

SEEDS = {
    "json": [
        '{}', '{"a": 1}', '{"a": [1, 2.5, -3e4, true, null]}', '{"k": {"n": "caf\u00e9 \\u00e9"}}',
        '{"s": "tab\\tnew\\nq\\"b\\\\"}', '{"x": [ ], "y": {}}', '{"a":1,"b":"2"}', '[1]', '{"a" 1}',
        '{"a": 01}', '{"a": 1.}', '{"\u65e5\u672c": "\U0001F600"}', '{\n  "a": 1\n}', '{"a": tru}',
    ],
    "arithmetic": [
        'a=1\n', 'x = (y + 2) * z\n', '1+2=3\n', 'abc = ((1))\n', 'a=b\nc=d\n', 'a=\n', '=1\n',
        'a = 1 2\n', 'foo_bar9 = 12/4-x\n', 'x = (y+2)\n', '1+2=3\n', 'a * (b - c) = ( d )\n',
        'q=1\nr=2\ns=(3)\n',
    ],
    "list": ['- a\n', '- one\n- two\n', '- \u00e9t\u00e9 \u2028\n', '-a\n', '- a', '- \n', '- x\n- y\n- z\n'],
    "chess": [
        '1. e4 e5\n', '1. e4 e5\n2. Nf3 Nc6\n', '1. O-O O-O-O\n', '1. exd5 Qxd5+\n', '1. e9 e5\n',
        '1. Ke2 Ke7 \n', '1. e8=Q a1=N\n', '1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n',
        '1. d4 d5\n2. O-O Qxe7#\n', '1. e4 c5\n10. Rae1 Nbd7+\n', '1. a3 h6\n2. bxa4 g1=Q\n',
    ],
    "japanese": [
        '\u3053\u3093\u306b\u3061\u306f', '\u65e5\u672c\u8a9e \u30ab\u30bf\u30ab\u30ca',
        '\u3042\u3001\u3044\u3002', 'abc', '\u3042 ', '\u4e00\t\u9fff',
    ],
    "c": [
        'int main() { return 0; }\n', 'int x = 1;\n', 'int f(int a, int b) { return a+b; }\n',
        'void g() { while (1) { x = x * 2; } }\n', 'int main( { }\n', 'int main(){return 0;}',
        'int f(int a){x = a*2;while(x<10){x = x+1;}return x;}', 'char c(){//hi\n}',
        'float g(){/* a*b */y = f(1, 2);}', 'int h(){for(int i = 0; i<n; i = i+1){if(i==2){}else{}}}',
    ],
}

POOL = list('az AZ09"\\{}[],:-+.eE()=*/_#\n\t') + ['\u00e9', '\u3042', '\u30a2', '\u4e00', '\U0001F600',
                                                  '\u2028', '\x7f', '\x01']


def mutate(rng, s):
    cps = list(s)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(3)
        at = rng.randint(0, len(cps))
        if op == 0 or not cps:
            cps.insert(at, rng.choice(POOL))
        else:
            at = min(at, len(cps) - 1)
            if op == 1:
                del cps[at]
            else:
                cps[at] = rng.choice(POOL)
    return ''.join(cps)


def verdict(validator, grammar_path, text):
    with tempfile.NamedTemporaryFile('wb', delete=False) as f:
        f.write(text.encode('utf-8'))
        path = f.name
    try:
        out = subprocess.run([validator, grammar_path, path], capture_output=True,
                             check=True).stdout.decode('utf-8', errors='replace')
    finally:
        os.unlink(path)
    if 'is valid' in out:
        return True, True
    if 'invalid' not in out:
        raise RuntimeError(f'unexpected validator output: {out!r}')
    at_end = 'Unexpected end of input' in out
    return False, at_end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--validator', default='build/llama-ref/test-gbnf-validator')
    ap.add_argument('--out', default='tests/grammar')
    ap.add_argument('--mutations', type=int, default=6)
    args = ap.parse_args()
    rng = random.Random(1)
    for name, seeds in SEEDS.items():
        gpath = os.path.join('tests/grammar', name + '.gbnf')
        strings = []
        for s in seeds:
            strings.append(s)
            strings.append(s[: rng.randint(0, len(s))])
            strings.extend(mutate(rng, s) for _ in range(args.mutations))
        records, seen = [], set()
        for s in strings:
            if s in seen or '\x00' in s:
                continue
            seen.add(s)
            valid, prefix = verdict(args.validator, gpath, s)
            records.append({'input': s, 'valid': valid, 'prefix': prefix})
        out = os.path.join(args.out, f'golden_{name}.json')
        with open(out, 'w', encoding='utf-8') as f:
            json.dump({'grammar': name + '.gbnf', 'source': 'llama.cpp test-gbnf-validator',
                       'records': records}, f, ensure_ascii=False, indent=1)
            f.write('\n')
        n_valid = sum(r['valid'] for r in records)
        print(f'{out}: {len(records)} strings, {n_valid} valid')


if __name__ == '__main__':
    main()
