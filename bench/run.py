#!/usr/bin/env python3
"""Side-by-side benchmark: celer, llama.cpp (llama-bench) and mlx-lm on the same machine,
the same thread count and the same weights (docs/benchmarks.md, DESIGN.md section 8).

For each model and test (pp512, pp2048, tg128) the engines run R rounds. A round is a
palindrome: celer, llama.cpp Q4_1, llama.cpp Q4_0, mlx-lm, llama.cpp Q4_0, llama.cpp Q4_1,
celer (ABBA generalized, so a slow drift of the machine weighs on every engine alike;
mlx-lm, single-threaded and slow, runs once in the middle, in --mlx-rounds rounds and the
tests of MLX_TESTS). Each invocation does its own warm-up and r timed repetitions. The
report gives, per engine, the median tok/s over all repetitions and their min-max, then
the ratios celer / peer: ratio of the medians, with the min-max of the per-round ratios.

Extra tests: `head` (celer pp512 with the last-row LM head vs --full-logits, A B B A) and
`accuracy` (the fast kernels against CELER_CPU=ref: KL divergence of the next-token
distributions, top-1 agreement and perplexity, on bench/accuracy.txt).

Engines and the weights they read, in build/bench-models/<model>/ (bench/make_models.py):
  celer        build/celer bench on mlx-g32 (same values as q4_1.gguf)
  llama-q4_1   llama-bench on q4_1.gguf           llama-q4_0   llama-bench on q4_0.gguf
  mlx          bench/mlx_bench.py (mlx-lm, CPU) on mlx-g32
  celer-g64, mlx-g64   the same on mlx-g64 (synthetic models only; not in the default set)

Run (after bash bench/setup.sh, make, bench/make_models.py), e.g. a quick run:
  build/bench-venv/bin/python bench/run.py --models smollm2-135m --tests pp512,tg128 --rounds 1 --reps 2
Writes build/bench/report.md (also printed) and build/bench/results.json (every sample).
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from machine import cpu_flags, cpu_model, git_commit, loadavg, version_of

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "build" / "bench-models"
CELER = ROOT / "build" / "celer"
VENV_PY = ROOT / "build" / "bench-venv" / "bin" / "python"

# engine -> (runner, weights inside the model directory, extra celer flags)
ENGINES = {
    "celer": ("celer", "mlx-g32", []),
    "celer-full-logits": ("celer", "mlx-g32", ["--full-logits"]),
    "celer-g64": ("celer", "mlx-g64", []),
    "llama-q4_1": ("llama", "q4_1.gguf", []),
    "llama-q4_0": ("llama", "q4_0.gguf", []),
    "mlx": ("mlx", "mlx-g32", []),
    "mlx-g64": ("mlx", "mlx-g64", []),
}
ENGINE_LABEL = {
    "celer": "celer (MLX 4-bit g32)",
    "celer-full-logits": "celer --full-logits (MLX 4-bit g32)",
    "celer-g64": "celer (MLX 4-bit g64)",
    "llama-q4_1": "llama.cpp (GGUF Q4_1, same values)",
    "llama-q4_0": "llama.cpp (GGUF Q4_0)",
    "mlx": "mlx-lm (MLX 4-bit g32)",
    "mlx-g64": "mlx-lm (MLX 4-bit g64)",
}
DEFAULT_ENGINES = "celer,llama-q4_1,llama-q4_0,mlx"

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (real weights; token_embd/head 8-bit in every format)",
    "llama3.2-1b-shape": "Llama-3.2-1B shape, random weights (d 2048, 16 layers, 32/8 heads, ffn 8192, vocab 128256, tied)",
    "qwen2.5-0.5b-shape": "Qwen2.5-0.5B shape, random weights (d 896, 24 layers, 14/2 heads, ffn 4864, vocab 151936, tied, qkv bias)",
}
# Tests each model runs unless --tests names them.
MODEL_TESTS = {
    "smollm2-135m": ["pp512", "pp2048", "tg128", "head", "accuracy"],
    "llama3.2-1b-shape": ["pp512", "tg128"],  # pp2048 here: ~17 min a round on 2 cores
    "qwen2.5-0.5b-shape": ["pp512", "tg128"],
}
ALL_TESTS = ["pp512", "pp2048", "tg128", "head", "accuracy"]
# mlx-lm runs one thread at ~2 GFLOP/s here: by default only where it takes minutes, not hours.
MLX_TESTS = {
    "smollm2-135m": ["pp512", "tg128"],
    "llama3.2-1b-shape": ["tg128"],
    "qwen2.5-0.5b-shape": ["pp512", "tg128"],
}


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ==== Running one invocation ====


# Peak RSS goes through GNU time (Debian package `time`): Linux carries a process's RSS
# high-water mark across fork and exec, so wait4's ru_maxrss of a child of this script is
# at least this script's own peak. time's child starts from time's tiny footprint.
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def run_cmd(cmd, env=None):
    """Runs cmd; returns (stdout, stderr, exit code, peak RSS bytes, seconds)."""
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        if GNU_TIME:
            cmd = [GNU_TIME, "-f", "%M", "-o", rss.name] + cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        secs = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        peak = ru.ru_maxrss * 1024
        if GNU_TIME:
            lines = rss.read().split()
            peak = int(lines[-1]) * 1024 if lines and lines[-1].isdigit() else 0
        return out.read().decode(), err.read().decode(errors="replace"), p.returncode, peak, secs


def llama_bench():
    found = sorted((ROOT / "build").glob("llama.cpp-*/build/bin/llama-bench"))
    if not found:
        sys.exit("bench: no build/llama.cpp-*/build/bin/llama-bench; HINT: bash bench/setup.sh")
    return found[-1]


def engine_cmd(engine, model, n_prompt, n_gen, reps, mlx_reps, threads, memory=False):
    runner, weights, extra = ENGINES[engine]
    path = MODELS_DIR / model / weights
    p, n = str(n_prompt), str(n_gen)
    if runner == "celer":
        return [CELER, "bench", "-m", path, "-p", p, "-n", n, "-r", reps, "-t", threads, "-o", "json"] + extra + (["--memory"] if memory else [])
    if runner == "llama":
        return [llama_bench(), "-m", path, "-p", p, "-n", n, "-r", reps, "-t", threads, "-o", "json"]
    return [VENV_PY, ROOT / "bench" / "mlx_bench.py", "-m", path, "-p", p, "-n", n, "-r", mlx_reps, "-o", "json"]


def parse_json_array(text):
    """The JSON array in text (llama-bench may print other lines around it)."""
    start = text.find("[")
    end = text.rfind("]")
    if start < 0 or end < start:
        raise ValueError("no JSON array in the output")
    return json.loads(text[start : end + 1])


def run_engine(engine, model, n_prompt, n_gen, args, memory=False):
    cmd = engine_cmd(engine, model, n_prompt, n_gen, args.reps, args.mlx_reps, args.threads, memory)
    return invoke(engine, cmd, n_prompt, n_gen)


def invoke(engine, cmd, n_prompt, n_gen):
    """One llama-bench-style invocation: a run dict with its result (the JSON object of the
    test n_prompt, n_gen), memory (celer's memory object) or error, peak RSS and seconds."""
    out, err, rc, rss, secs = run_cmd(cmd)
    res = {"engine": engine, "cmd": " ".join(shlex.quote(str(c)) for c in cmd), "rc": rc, "peak_rss_bytes": rss, "seconds": secs}
    if rc != 0:
        res["error"] = (err.strip().splitlines() or ["exit code %d" % rc])[-1]
        return res
    try:
        objs = parse_json_array(out)
    except (ValueError, json.JSONDecodeError) as e:
        res["error"] = f"unreadable output: {e}"
        return res
    for o in objs:
        if o.get("test") == "memory":
            res["memory"] = o
        elif int(o.get("n_prompt", 0)) == n_prompt and int(o.get("n_gen", 0)) == n_gen:
            res["result"] = o
    if "result" not in res:
        res["error"] = f"no result for n_prompt={n_prompt} n_gen={n_gen} in the output"
    return res


# ==== Statistics ====


def results_by_test(out, err, rc, base, names, name_of):
    """{test name: run dict} for one llama-bench-style invocation (JSON array output): base
    plus result (the object whose name_of(object) is the test) or error, for each of names."""
    if rc != 0:
        e = (err.strip().splitlines() or [f"exit code {rc}"])[-1]
        return {t: dict(base, error=e) for t in names}
    try:
        objs = parse_json_array(out)
    except ValueError as e:
        return {t: dict(base, error=f"unreadable output: {e}") for t in names}
    got = {name_of(o): dict(base, result=o) for o in objs}
    return {t: got.get(t, dict(base, error=f"no {t} in the output")) for t in names}


def samples(runs):
    return [float(x) for r in runs if "result" in r for x in r["result"].get("samples_ts", [])]


def run_mean(r):
    s = r["result"].get("samples_ts") or [r["result"]["avg_ts"]]
    return statistics.mean(float(x) for x in s)


def fmt_ts(v):
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def cell(runs):
    if not runs:
        return "-"
    s = samples(runs)
    if not s:
        errs = [r.get("error", "") for r in runs if "error" in r]
        return "failed" + (f": {errs[0][:60]}" if errs else "")
    return f"{fmt_ts(statistics.median(s))} [{fmt_ts(min(s))}-{fmt_ts(max(s))}]"


def ratio_cell(a_runs, b_runs):
    """Ratio of medians a / b and the min-max of the paired ratios. In each round a's
    first invocation pairs with b's first and a's last with b's last (the two halves of
    the palindrome); a peer that ran once in a round pairs with the mean of a's two."""
    sa, sb = samples(a_runs), samples(b_runs)
    if not sa or not sb:
        return "-"
    ratio = statistics.median(sa) / statistics.median(sb)
    pairs = []
    for k in sorted({r["round"] for r in b_runs}):
        ra = [r for r in a_runs if r["round"] == k]
        rb = [r for r in b_runs if r["round"] == k]
        if len(ra) == len(rb):
            pairs += [(x, y) for x, y in zip(ra, rb) if "result" in x and "result" in y]
        elif len(rb) == 1 and "result" in rb[0] and all("result" in x for x in ra):
            pairs.append((statistics.mean(run_mean(x) for x in ra), rb[0]))
    vals = [(x if isinstance(x, float) else run_mean(x)) / run_mean(y) for x, y in pairs]
    if len(vals) > 1:
        return f"{ratio:.2f} [{min(vals):.2f}-{max(vals):.2f}]"
    return f"{ratio:.2f}"


# ==== Side-by-side tests ====


def test_shape(test):
    if test == "head":
        return 512, 0
    kind, n = test[:2], int(test[2:])
    return (n, 0) if kind == "pp" else (0, n)


def run_side_by_side(model, test, engines, args, counter):
    """Rounds of celer, peers..., peers reversed..., celer. Returns {engine: [runs]}."""
    n_prompt, n_gen = test_shape(test)
    base, peers = engines[0], engines[1:]
    runs = {e: [] for e in engines}
    for k in range(args.rounds):
        # A palindrome, so every engine's mean position in the round is its middle. mlx-lm
        # is slow (one thread): it runs once, in the middle, and only in its rounds.
        fast = [p for p in peers if ENGINES[p][0] != "mlx"]
        slow = [p for p in peers if ENGINES[p][0] == "mlx" and k < args.mlx_rounds]
        order = [base] + fast + slow + fast[::-1] + [base]
        for e in order:
            counter[0] += 1
            r = run_engine(e, model, n_prompt, n_gen, args)
            r["round"] = k
            runs[e].append(r)
            what = f"{statistics.mean(r['result']['samples_ts']):.2f} t/s" if "result" in r else f"FAILED: {r['error']}"
            log(f"[{counter[0]}] {model} {test} round {k + 1}/{args.rounds} {e}: {what} ({r['seconds']:.0f} s)")
    return runs


# ==== Fast-path accuracy ====


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def run_accuracy(model, args):
    """Fast kernels (auto) vs CELER_CPU=ref on the same ids: KL(ref || fast) per position,
    top-1 agreement, and the perplexity each gives of the text."""
    path = MODELS_DIR / model / ENGINES["celer"][1]
    text = ROOT / "bench" / "accuracy.txt"
    out, err, rc, _, _ = run_cmd([CELER, "tokenize", "-m", path, "--file", text, "--json"])
    if rc != 0:
        return {"error": err.strip()[-200:]}
    ids = json.loads(out)
    ids = ids["ids"] if isinstance(ids, dict) else ids
    ids = ids[: args.accuracy_tokens]
    res = {"n_tokens": len(ids), "text": str(text.relative_to(ROOT))}
    logits = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kset in ("auto", "ref"):
            env = dict(os.environ, CELER_CPU=kset)
            f = Path(tmp) / f"{kset}.npy"
            cmd = [CELER, "logits", "-m", path, "--ids", ",".join(map(str, ids)), "--all", "-o", f, "-t", args.threads]
            _, err, rc, _, secs = run_cmd(cmd, env=env)
            if rc != 0:
                return {"error": f"CELER_CPU={kset}: " + err.strip()[-200:]}
            logits[kset] = np.load(f)
            log(f"{model} accuracy: logits with CELER_CPU={kset} ({secs:.0f} s)")
    lf, lr = log_softmax(logits["auto"]), log_softmax(logits["ref"])
    kl = (np.exp(lr) * (lr - lf)).sum(axis=-1)
    nxt = np.array(ids[1:])
    rows = np.arange(len(ids) - 1)
    res.update(
        {
            "kl_mean": float(kl.mean()),
            "kl_p99": float(np.quantile(kl, 0.99)),
            "kl_max": float(kl.max()),
            "top1_agreement": float((lf.argmax(-1) == lr.argmax(-1)).mean()),
            "ppl_fast": float(np.exp(-lf[rows, nxt].mean())),
            "ppl_ref": float(np.exp(-lr[rows, nxt].mean())),
            "max_abs_logit_diff": float(np.abs(logits["auto"] - logits["ref"]).max()),
        }
    )
    return res


# ==== Report ====












def first_result(all_runs, runner):
    for per_test in all_runs.values():
        for runs in per_test.values():
            for e, rs in runs.items():
                if ENGINES[e][0] == runner:
                    for r in rs:
                        if "result" in r:
                            return r["result"]
    return None


def mib(b):
    return f"{b / 2**20:.0f}"


def write_memory_table(w, all_runs, tests):
    w("")
    w("## Peak memory and load time")
    w("")
    w("Peak RSS of the benchmark process (max over its invocations, " + ("GNU time %M" if GNU_TIME else
      "wait4: at least the harness's own peak, install the package `time` for exact figures") +
      "), and the load time the engine reports (llama-bench reports none).")
    w("")
    w("| model | engine | " + " | ".join(f"peak RSS MiB {t}" for t in tests) + " | load ms |")
    w("| --- | --- | " + " | ".join("---:" for _ in tests) + " | ---: |")
    for model, per_test in all_runs.items():
        engines = []
        for t in tests:
            for e in per_test.get(t, {}):
                if e not in engines:
                    engines.append(e)
        for e in engines:
            cells, loads = [], []
            for t in tests:
                rs = [r for r in per_test.get(t, {}).get(e, []) if "result" in r]
                cells.append(mib(max(r["peak_rss_bytes"] for r in rs)) if rs else "-")
                loads += [r["result"]["load_ms"] for r in rs if "load_ms" in r["result"]]
            load = f"{statistics.median(loads):.0f}" if loads else "-"
            w(f"| {model} | {ENGINE_LABEL[e]} | " + " | ".join(cells) + f" | {load} |")


def write_report(args, all_runs, bandwidth, accuracy, started, finished):
    lines = []
    w = lines.append
    lb = first_result(all_runs, "llama")
    cel = first_result(all_runs, "celer")
    lcp = sorted((ROOT / "build").glob("llama.cpp-*/build/bin/llama-bench"))
    lcp_version = lcp[-1].parents[2].name.split("-", 1)[1] if lcp else "?"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    w("# celer side-by-side benchmark")
    w("")
    w(f"- date: {started:%Y-%m-%d %H:%M} UTC (run took {(finished - started).total_seconds() / 60:.0f} min)")
    w(f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {mem / 2**30:.0f} GiB; {cpu_flags()}")
    w(f"- threads: {args.threads} for celer and llama.cpp; mlx-lm: 1 (mlx has no CPU thread setting; see docs/benchmarks.md)")
    w(f"- celer: commit {git_commit()}" + (f", kernels {cel.get('kernels')}" if cel else ""))
    if lb:
        w(f"- llama.cpp: from the llama-cpp-python {lcp_version} sdist, build {lb.get('build_commit')} "
          f"({lb.get('build_number')}), {lb.get('backends', '')}, n_batch {lb.get('n_batch')}, n_ubatch {lb.get('n_ubatch')}, "
          f"flash_attn {lb.get('flash_attn')}, KV {lb.get('type_k')}")
    w(f"- mlx {version_of('mlx')} (mlx-cpu {version_of('mlx-cpu')}), mlx-lm {version_of('mlx-lm')}: parameters upcast to float32 "
      f"(the same values; mlx's fastest CPU path), short warm-up, " + ("every test" if args.mlx_all else
      "tests " + "; ".join(f"{m} {'/'.join(t)}" for m, t in MLX_TESTS.items())))
    w(f"- load average before / after the run: {args.load_before} / {loadavg()} (other processes on the machine)")
    w(f"- rounds {args.rounds} (mlx-lm: {min(args.mlx_rounds, args.rounds)}), {args.reps} timed repetitions per invocation "
      f"(mlx-lm: {args.mlx_reps}) "
      f"after one warm-up; order per round: celer, llama.cpp Q4_1, Q4_0, mlx-lm (once, in its rounds and tests), "
      f"Q4_0, Q4_1, celer")
    w(f"- command: `{args.command}`")
    w("")
    w("Cells: median tok/s over every timed repetition [min-max].")
    for model, per_test in all_runs.items():
        tests = [t for t in per_test if t != "head"]
        if not tests:
            continue
        engines = []
        for t in tests:
            for e in per_test[t]:
                if e not in engines:
                    engines.append(e)
        w("")
        w(f"## {model}")
        w("")
        w(MODELS.get(model, model))
        w("")
        w("| engine | " + " | ".join(tests) + " |")
        w("| --- | " + " | ".join("---:" for _ in tests) + " |")
        for e in engines:
            w(f"| {ENGINE_LABEL[e]} | " + " | ".join(cell(per_test[t].get(e, [])) for t in tests) + " |")

    w("")
    w("## Ratios")
    w("")
    w("celer tok/s divided by the peer's: ratio of the medians [min-max of the paired ratios: celer's first and last invocation of a round against the peer's first and last]. Above 1: celer is faster.")
    w("")
    peers = [p for p in ("llama-q4_1", "llama-q4_0", "mlx", "mlx-g64") if any(p in rt for pt in all_runs.values() for rt in pt.values())]
    heads = {"llama-q4_1": "celer ÷ llama.cpp Q4_1", "llama-q4_0": "celer ÷ llama.cpp Q4_0", "mlx": "celer ÷ mlx-lm", "mlx-g64": "celer g64 ÷ mlx-lm g64"}
    if not peers:
        w("(no peer engine ran)")
    else:
        w("| model | test | " + " | ".join(heads[p] for p in peers) + " |")
        w("| --- | --- | " + " | ".join("---:" for _ in peers) + " |")
    for model, per_test in all_runs.items():
        for t, runs in per_test.items():
            if t == "head" or not peers:
                continue
            cells = []
            for p in peers:
                a = runs.get("celer-g64" if p == "mlx-g64" else "celer", [])
                cells.append(ratio_cell(a, runs[p]) if p in runs else "-")
            w(f"| {model} | {t} | " + " | ".join(cells) + " |")
    head_rows = [(m, pt["head"]) for m, pt in all_runs.items() if "head" in pt]
    if head_rows:
        w("")
        w("## Last-row LM head A/B (celer pp512)")
        w("")
        w("| model | last-row head t/s | --full-logits t/s | last-row ÷ full |")
        w("| --- | ---: | ---: | ---: |")
        for m, runs in head_rows:
            w(f"| {m} | {cell(runs['celer'])} | {cell(runs['celer-full-logits'])} | {ratio_cell(runs['celer'], runs['celer-full-logits'])} |")

    if bandwidth:
        w("")
        w("## Decode bandwidth use (celer bench --memory)")
        w("")
        w("One extra celer invocation per model after its rounds: the bytes a decode step reads (weights + KV) "
          "against the read bandwidth celer measures at the same thread count.")
        w("")
        w("| model | test | read GB/s | MB/token | t/s | bandwidth use |")
        w("| --- | --- | ---: | ---: | ---: | ---: |")
        for model, r in bandwidth.items():
            if "memory" not in r or "result" not in r or r["result"].get("bandwidth_use") is None:
                w(f"| {model} | tg128 | failed: {r.get('error', 'no memory figures in the output')[:80]} | | | |")
                continue
            res = r["result"]
            w(f"| {model} | tg{res['n_gen']} | {r['memory']['read_bytes_per_s'] / 1e9:.2f} | "
              f"{res['decode_bytes_per_token'] / 1e6:.1f} | {fmt_ts(run_mean(r))} | {res['bandwidth_use'] * 100:.0f}% |")

    tests = [t for t in ALL_TESTS if t not in ("head", "accuracy") and any(t in pt for pt in all_runs.values())]
    if tests:
        write_memory_table(w, all_runs, tests)
    if accuracy:
        w("")
        w("## Fast-path accuracy")
        w("")
        w("celer's fast kernels (CELER_CPU=auto) against the scalar reference (CELER_CPU=ref) on the same ids: "
          "KL(ref ‖ fast) of the next-token distributions per position, top-1 agreement, perplexity of the text.")
        w("")
        w("| model | tokens | mean KL | p99 KL | max KL | top-1 agreement | ppl fast | ppl ref | max abs logit diff |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for m, a in accuracy.items():
            if "error" in a:
                w(f"| {m} | failed: {a['error'][:80]} | | | | | | | |")
            else:
                w(f"| {m} | {a['n_tokens']} | {a['kl_mean']:.2e} | {a['kl_p99']:.2e} | {a['kl_max']:.2e} | "
                  f"{a['top1_agreement'] * 100:.1f}% | {a['ppl_fast']:.3f} | {a['ppl_ref']:.3f} | {a['max_abs_logit_diff']:.3g} |")
    w("")
    return "\n".join(lines)


# ==== Main ====


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: all)")
    ap.add_argument("--tests", default="", help="comma-separated, from " + ",".join(ALL_TESTS) +
                    " (default: per model, see MODEL_TESTS: pp2048 on SmolLM2 only, head and accuracy on SmolLM2)")
    ap.add_argument("--engines", default=DEFAULT_ENGINES, help="comma-separated; available: " + ",".join(ENGINES))
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds per model and test")
    ap.add_argument("--mlx-rounds", type=int, default=1, help="rounds mlx-lm takes part in (it is single-threaded and slow)")
    ap.add_argument("--mlx-all", action="store_true", help="run mlx-lm in every test, not only those of MLX_TESTS")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions per invocation (after a warm-up)")
    ap.add_argument("--mlx-reps", type=int, default=1, help="timed repetitions per mlx-lm invocation")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--accuracy-tokens", type=int, default=256)
    ap.add_argument("--no-memory", action="store_true", help="skip the extra celer tg128 --memory invocation per model")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench"))
    args = ap.parse_args()
    args.reps, args.mlx_reps = str(args.reps), str(args.mlx_reps)
    args.command = " ".join(shlex.quote(a) for a in ["bench/run.py"] + sys.argv[1:])

    models = [m for m in args.models.split(",") if m]
    tests = [t for t in args.tests.split(",") if t]
    engines = [e for e in args.engines.split(",") if e]
    for m in models:
        if m not in MODELS:
            sys.exit(f"bench: unknown model {m}; known: {', '.join(MODELS)}")
    for t in tests:
        if t not in ALL_TESTS:
            sys.exit(f"bench: unknown test {t}; known: {', '.join(ALL_TESTS)}")
    for e in engines:
        if e not in ENGINES:
            sys.exit(f"bench: unknown engine {e}; known: {', '.join(ENGINES)}")
    if not CELER.exists():
        sys.exit("bench: build/celer is missing; HINT: make")
    engines = ["celer"] + [e for e in engines if e != "celer"]

    started = datetime.datetime.now(datetime.timezone.utc)
    args.load_before = loadavg()
    all_runs, bandwidth, accuracy = {}, {}, {}
    counter = [0]
    for m in models:
        if not (MODELS_DIR / m).exists():
            sys.exit(f"bench: {MODELS_DIR / m} is missing; HINT: build/bench-venv/bin/python bench/make_models.py")
        all_runs[m] = {}
        for t in tests or MODEL_TESTS[m]:
            if t == "accuracy":
                continue  # after every speed run
            if t == "head":
                e = ["celer", "celer-full-logits"]
            else:
                e = [x for x in engines if (MODELS_DIR / m / ENGINES[x][1]).exists()
                     and (ENGINES[x][0] != "mlx" or args.mlx_all or t in MLX_TESTS[m])]
            all_runs[m][t] = run_side_by_side(m, t, e, args, counter)
            if t == "tg128" and not args.no_memory:
                bandwidth[m] = run_engine("celer", m, 0, 128, args, memory=True)
                log(f"{m} tg128 celer --memory: {bandwidth[m].get('error') or 'done'} ({bandwidth[m]['seconds']:.0f} s)")
    for m in models:
        if "accuracy" in (tests or MODEL_TESTS[m]):
            log(f"{m} accuracy: fast kernels vs CELER_CPU=ref")
            accuracy[m] = run_accuracy(m, args)
    finished = datetime.datetime.now(datetime.timezone.utc)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"command": args.command, "runs": all_runs, "bandwidth": bandwidth, "accuracy": accuracy}, indent=1) + "\n")
    report = write_report(args, all_runs, bandwidth, accuracy, started, finished)
    (out / "report.md").write_text(report)
    print(report)
    log(f"wrote {out / 'report.md'} and {out / 'results.json'} ({(finished - started).total_seconds() / 60:.1f} min)")


if __name__ == "__main__":
    main()
