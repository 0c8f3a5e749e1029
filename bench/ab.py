#!/usr/bin/env python3
"""Two celer builds on one model, interleaved A B B A: how each change in docs/benchmarks.md
is measured against the commit before it.

    python3 bench/ab.py --a OLD/celer --b NEW/celer -m MODEL [--device cuda]
                        [--tests pp512,pp2048,tg128,tg128@d2048,tg128np16] [--rounds 2] [--reps 3]

Tests are ppN or tgN, a tgN optionally with npK (K sequences decoding together, celer bench
-np K), either with @dD (after a D-token prefix prefilled untimed). Tests of one depth and
one K share an invocation. Per round and invocation: A, B, B, A, each `celer bench ... -o
json` after its own warm-up run. The report (printed, and written to --out when given):
per test, each build's median tok/s over every timed repetition [min-max], and B / A as
the ratio of the medians [min-max over the paired invocations: in each round A's first
with B's first, B's second with A's second]. Above 1, B is faster.

Both binaries see the same environment (LD_LIBRARY_PATH and CELER_* included). Models for
the GPU: bench/cuda_models.py. On the CPU (--device cpu) it works the same; a tiny model
from bench/cuda_models.py --hidden 256 --ffn 512 --heads 4 --kv-heads 2 --vocab 512
--layers 2 tests the harness in seconds.
"""
import argparse
import shlex
import statistics
import sys
from pathlib import Path

from machine import gpu_info, loadavg
from run import cell, ratio_cell, results_by_test, run_cmd


def log(msg):
    print(f"ab: {msg}", file=sys.stderr, flush=True)


def parse_tests(spec):
    """"pp512,tg128np16@d2048" -> [(kind, n, seqs, depth)]."""
    out = []
    for t in spec.split(","):
        body, _, depth = t.strip().partition("@d")
        kind, body = body[:2], body[2:]
        n, _, seqs = body.partition("np")
        ok = kind in ("pp", "tg") and n.isdigit() and int(n) > 0 and (not depth or depth.isdigit())
        ok = ok and (not seqs or (seqs.isdigit() and int(seqs) > 0 and kind == "tg"))
        if not ok:
            sys.exit(f"ab: --tests: {t!r}: expected ppN or tgN[npK], optionally @dD")
        out.append((kind, int(n), int(seqs or 1), int(depth or 0)))
    return out


def test_name(kind, n, seqs, depth):
    return f"{kind}{n}" + (f" np{seqs}" if seqs > 1 else "") + (f" @ d{depth}" if depth else "")


def groups(tests):
    """[(depth, seqs, prompt lengths, generation lengths)]: one invocation each."""
    by = {}
    for kind, n, seqs, depth in tests:
        ps, ns = by.setdefault((depth, seqs), ([], []))
        (ps if kind == "pp" else ns).append(n)
    return [(d, s, ps, ns) for (d, s), (ps, ns) in sorted(by.items())]


def bench_cmd(binary, args, depth, seqs, ps, ns):
    cmd = [binary, "bench", "-m", args.model, "--device", args.device, "-p", ",".join(map(str, ps)) or "0",
           "-n", ",".join(map(str, ns)) or "0", "-r", str(args.reps), "-o", "json"]
    cmd += ["-np", str(seqs)] if seqs > 1 else []
    cmd += ["-d", str(depth)] if depth else []
    return cmd + (["-t", str(args.threads)] if args.threads else [])


def run_one(binary, args, depth, seqs, ps, ns):
    """{test name: run dict}, with celer bench's JSON object or the error."""
    cmd = bench_cmd(binary, args, depth, seqs, ps, ns)
    out, err, rc, _, secs = run_cmd(cmd)
    names = [test_name("pp", p, 1, depth) for p in ps] + [test_name("tg", n, seqs, depth) for n in ns]
    base = {"cmd": " ".join(shlex.quote(str(c)) for c in cmd), "seconds": secs}
    return results_by_test(out, err, rc, base, names, name_of)


def name_of(o):
    """The test name of one object of celer bench -o json."""
    n_prompt, n_gen = int(o.get("n_prompt", 0)), int(o.get("n_gen", 0))
    kind, n = ("pp", n_prompt) if n_prompt else ("tg", n_gen)
    return test_name(kind, n, int(o.get("n_seq", 1)), int(o.get("n_depth", 0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the build measured first (the commit before)")
    ap.add_argument("--b", required=True, help="the build measured against it")
    ap.add_argument("-m", "--model", required=True, help="a model directory or GGUF file")
    ap.add_argument("--device", default="cuda", help="celer's --device (default cuda)")
    ap.add_argument("--tests", default="pp512,pp2048,tg128,tg128@d2048", help="comma-separated (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="A B B A rounds (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per invocation (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="celer bench -t (default: celer's)")
    ap.add_argument("--label-a", default="A", help="A's name in the report (a commit, say)")
    ap.add_argument("--label-b", default="B", help="B's name in the report")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1:
        sys.exit("ab: --rounds and --reps must be at least 1")
    builds = {"a": str(Path(args.a).resolve()), "b": str(Path(args.b).resolve())}
    for side, path in builds.items():
        if not Path(path).is_file():
            sys.exit(f"ab: --{side} {path}: no such binary")
    tests = parse_tests(args.tests)
    names = [test_name(*t) for t in tests]
    runs = {t: {"a": [], "b": []} for t in names}
    invocations = groups(tests)
    total, k = args.rounds * len(invocations) * 4, 0
    for rnd in range(args.rounds):
        for depth, seqs, ps, ns in invocations:
            for side in ("a", "b", "b", "a"):
                k += 1
                got = run_one(builds[side], args, depth, seqs, ps, ns)
                for t, r in got.items():
                    r["round"] = rnd
                    runs[t][side].append(r)
                what = "; ".join(f"{t} {statistics.mean(r['result']['samples_ts']):.1f}" if "result" in r
                                 else f"{t} FAILED: {r['error']}" for t, r in got.items())
                log(f"[{k}/{total}] round {rnd + 1} {side.upper()}: {what} t/s")

    lines = [f"`{' '.join(shlex.quote(a) for a in ['bench/ab.py'] + sys.argv[1:])}`", ""]
    lines += [f"- A ({args.label_a}): {builds['a']}", f"- B ({args.label_b}): {builds['b']}",
              f"- model {args.model}, --device {args.device}, {args.rounds} round(s) of A B B A, "
              f"{args.reps} timed repetitions an invocation",
              f"- GPUs: {'; '.join(gpu_info()) or 'none seen'}; load average after: {loadavg()}", ""]
    lines += [f"| test | {args.label_a} | {args.label_b} | {args.label_b} / {args.label_a} |", "| --- | ---: | ---: | ---: |"]
    for t in names:
        lines.append(f"| {t} | {cell(runs[t]['a'])} | {cell(runs[t]['b'])} | {ratio_cell(runs[t]['b'], runs[t]['a'])} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    if any("error" in r for t in names for side in "ab" for r in runs[t][side]):
        sys.exit("ab: some invocations failed (see the table)")


if __name__ == "__main__":
    main()
