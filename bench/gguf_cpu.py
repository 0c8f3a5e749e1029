#!/usr/bin/env python3
"""celer against llama.cpp on the same GGUF files, on the CPU (docs/benchmarks.md, "GGUF
files on the CPU"): the formats people download, read by both engines as they are.

    build/bench-venv/bin/python bench/gguf_cpu.py [--models a,b] [--tests pp512,tg128]
        [--rounds 2] [--reps 3] [--threads 2]

Models (files in build/bench-models/gguf/, made once):
  gemma3-270m-q4_k_m   the real Gemma 3 270M Q4_K_M of `make model` (celer's model cache)
  llama1b-q4_k_m       Llama-3.2-1B shape (d 2048, 16 layers, 32/8 heads, ffn 8192, vocab
                       128256, tied): random F16 normal(0, 0.02) (bench/kquant_models.py
                       --mix f16), then llama-quantize Q4_K_M
  llama1b-q4_0         the same F16 file, llama-quantize Q4_0

Per model and test, R rounds of celer, llama.cpp, llama.cpp, celer (`celer bench` and
`llama-bench`, -r reps timed repetitions each, -t threads); cells are the median tok/s over
every repetition [min-max], ratios celer / llama.cpp with the min-max of the paired
invocations (bench/run.py's statistics). Then, per model, start-up: the wall time of
`-p 16 -n 0 -r 1` (open, load, warm-up, a 16-token prompt), celer, llama.cpp, llama.cpp,
celer, and the peak RSS of every invocation (GNU time). Writes build/bench/gguf_cpu.md
(also printed) and build/bench/gguf_cpu.json (every sample).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_flags, cpu_model, git_commit, loadavg  # noqa: E402
from run import CELER, ROOT, cell, invoke, llama_bench, ratio_cell  # noqa: E402

WORK = ROOT / "build" / "bench-models" / "gguf"
PY = ROOT / "build" / "bench-venv" / "bin" / "python"
LLAMA1B = ["--layers", "16", "--hidden", "2048", "--ffn", "8192", "--heads", "32", "--kv-heads", "8", "--tied"]
MODELS = {
    "gemma3-270m-q4_k_m": "Gemma 3 270M Q4_K_M (real weights, the file of `make model`)",
    "llama1b-q4_k_m": "Llama-3.2-1B shape, random F16 values, llama-quantize Q4_K_M",
    "llama1b-q4_0": "Llama-3.2-1B shape, the same F16 values, llama-quantize Q4_0",
}


def log(msg):
    print(f"gguf_cpu: {msg}", file=sys.stderr, flush=True)


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.environ.get("CELER_CACHE", os.path.join(base, "celer")))


def model_path(name):
    """The file of model name, made (or found) first."""
    if name == "gemma3-270m-q4_k_m":
        p = cache_dir() / "gemma-3-270m-q4_k_m.gguf"
        if not p.exists():
            sys.exit(f"gguf_cpu: {p} is missing; HINT: make model")
        return p
    WORK.mkdir(parents=True, exist_ok=True)
    f16 = WORK / "llama1b-f16.gguf"
    if not f16.exists():
        log(f"writing {f16}")
        subprocess.run([PY, ROOT / "bench" / "kquant_models.py", "--out", f16, "--mix", "f16"] + LLAMA1B, check=True)
    out = WORK / f"{name}.gguf"
    if not out.exists():
        quantize = Path(llama_bench()).with_name("llama-quantize")
        kind = name.split("-", 1)[1].upper()
        log(f"llama-quantize {kind} -> {out}")
        subprocess.run([quantize, f16, str(out) + ".part", kind], check=True, stdout=subprocess.DEVNULL)
        os.replace(str(out) + ".part", out)
    return out


def run_one(engine, path, n_prompt, n_gen, reps, threads):
    """One invocation of engine on path: bench/run.py's run dict."""
    tool = CELER if engine == "celer" else llama_bench()
    cmd = [tool, "bench", "-m", path] if engine == "celer" else [tool, "-m", path]
    cmd += ["-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-t", str(threads), "-o", "json"]
    return invoke(engine, cmd, n_prompt, n_gen)


def abba(path, n_prompt, n_gen, args, label):
    """R rounds of celer, llama.cpp, llama.cpp, celer: {engine: [runs]}."""
    runs = {"celer": [], "llama": []}
    for k in range(args.rounds):
        for e in ("celer", "llama", "llama", "celer"):
            r = run_one(e, path, n_prompt, n_gen, args.reps, args.threads)
            r["round"] = k
            runs[e].append(r)
            what = f"{statistics.mean(r['result']['samples_ts']):.1f} t/s" if "result" in r else r["error"]
            log(f"{label} round {k + 1} {e}: {what} ({r['seconds']:.1f} s, load {loadavg()})")
    return runs


def mib(runs):
    v = [r["peak_rss_bytes"] / 2**20 for r in runs if r.get("peak_rss_bytes")]
    return f"{statistics.median(v):.0f}" if v else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tests", default="pp512,tg128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit(f"gguf_cpu: unknown model {m} (known: {', '.join(MODELS)})")
    if not os.access(CELER, os.X_OK):
        sys.exit(f"gguf_cpu: {CELER} is missing; HINT: make")
    tests = [t for t in args.tests.split(",") if t]
    results, lines = {}, []
    for m in models:
        path = model_path(m)
        results[m] = {}
        for t in tests:
            n = int(t[2:])
            shape = (n, 0) if t.startswith("pp") else (0, n)
            results[m][t] = abba(path, *shape, args, f"{m} {t}")
        results[m]["start"] = abba(path, 16, 0, argparse.Namespace(**{**vars(args), "reps": 1}), f"{m} start-up")
    lines.append(f"CPU: {cpu_model()} ({cpu_flags()}), {args.threads} threads; celer {git_commit()}; "
                 f"{datetime.date.today()}; {args.rounds} rounds x {args.reps} repetitions")
    lines.append("")
    lines.append("| model | test | celer tok/s | llama.cpp tok/s | celer / llama.cpp |")
    lines.append("| --- | --- | ---: | ---: | ---: |")
    for m in models:
        for t in tests:
            r = results[m][t]
            lines.append(f"| {m} | {t} | {cell(r['celer'])} | {cell(r['llama'])} | {ratio_cell(r['celer'], r['llama'])} |")
    lines.append("")
    lines.append("| model | engine | start-up s (p16) | peak RSS MiB pp | peak RSS MiB tg |")
    lines.append("| --- | --- | ---: | ---: | ---: |")
    for m in models:
        for e, name in (("celer", "celer"), ("llama", "llama.cpp")):
            st = [r["seconds"] for r in results[m]["start"][e] if "result" in r]
            pp = [r for t in tests if t.startswith("pp") for r in results[m][t][e]]
            tg = [r for t in tests if t.startswith("tg") for r in results[m][t][e]]
            lines.append(f"| {m} | {name} | {statistics.median(st):.2f} | {mib(pp)} | {mib(tg)} |" if st
                         else f"| {m} | {name} | failed | {mib(pp)} | {mib(tg)} |")
    report = "\n".join(lines) + "\n"
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gguf_cpu.md").write_text(report)
    (out / "gguf_cpu.json").write_text(json.dumps(results, indent=1) + "\n")
    print(report)


if __name__ == "__main__":
    main()
