#!/usr/bin/env python3
"""make bench-cuda: celer's CUDA backend against llama.cpp's CUDA build on one GPU, the same
values in both (docs/benchmarks.md, "CUDA backend against llama.cpp").

Pairs: celer runs the MLX directory, llama-bench the GGUF twin bench/cuda_models.py writes
from the same random codes, scales and biases (Llama-3.1-8B shape):
  4bit-g64 / q4_0    4.5 bits per weight both
  4bit-g32 / q4_1    5.0 bits per weight both
  8bit-g64 / q8_0    8.5 bits per weight both

Steps, all on the GPU machine (it needs no network; celer is built elsewhere):
  1. llama-bench from the cut llama.cpp tree of bench/setup_cuda.sh (--llama-src), CMake +
     Ninja, Release, CUDA architecture 90, GGML_NATIVE off, no curl, static, in
     WORK/llama-build; skipped when built with the same flags. The models are written into
     WORK/models meanwhile, one process per model, unless there from an identical run.
  2. --check: celer's logits of every MLX directory and of its twin on the device (equal
     values must give equal logits), and the twins' blocks dequantized by llama.cpp's gguf-py
     against the MLX values of a few tensors.
  3. R rounds; in each, per pair and per depth, celer, llama.cpp, llama.cpp, celer (A B B A):
       celer bench -m DIR --device cuda -p 512,2048 -n 128 -r REPS -o json
       llama-bench -m FILE -p 512,2048 -n 128 -ngl 99 -r REPS -o json
     then both with -p 0 -n 128 -d 2048 (tg128 after a 2048-token prefix). llama-bench keeps
     its other defaults (flash attention auto: one verbose invocation says what it chose).
     Device memory is sampled by nvidia-smi every 200 ms: each invocation's peak, and the
     idle level before the first.
  4. WORK/report.md (also printed): median tok/s [min-max] per engine, pair and test,
     celer ÷ llama.cpp per pair (ratio of medians [min-max of the paired invocations]),
     memory, the machine, versions and the commands; WORK/results.json has every sample.

--dry-run does the same on the CPU (a CPU build of llama-bench, --device cpu, 2 threads) with
tiny models (d 256, 2 layers, vocab 512, and extra twins for the check): it tests this
harness where there is no GPU; its figures mean nothing.

Run on the GPU machine (celer built elsewhere, its CUDA module celer-cuda.so beside it):
  python3 bench/cuda.py --celer PATH/celer [--llama-src build/llama.cpp-cuda/src] [--work DIR]
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from machine import cpu_model, git_commit, gpu_info, loadavg, nvcc_version
from run import cell, ratio_cell, results_by_test, run_cmd

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"

# (MLX directory, bits, group, GGUF twin, celer label, llama.cpp label, bits per weight)
PAIRS = [
    ("4bit-g64", 4, 64, "q4_0", "MLX 4-bit g64", "GGUF Q4_0", "4.5"),
    ("4bit-g32", 4, 32, "q4_1", "MLX 4-bit g32", "GGUF Q4_1", "5.0"),
    ("8bit-g64", 8, 64, "q8_0", "MLX 8-bit g64", "GGUF Q8_0", "8.5"),
]
# Twins the dry run's check adds: g32 is Q4_0's values too, and 8-bit g32 is exactly Q8_0.
EXTRA_TWINS = {"4bit-g32": ["q4_0"], "8bit-g32": ["q8_0"]}
SMALL_SHAPE = ["--hidden", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--layers", "2"]
DEFAULT_TESTS = "pp512,pp2048,tg128,tg128@d2048"


def log(msg):
    print(f"bench-cuda: {msg}", file=sys.stderr, flush=True)


def test_name(n_prompt, n_gen, n_depth):
    name = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    return name + (f" @ d{n_depth}" if n_depth else "")


def parse_tests(spec):
    """"pp512,tg128@d2048" -> [(n_prompt, n_gen, n_depth)]."""
    out = []
    for t in spec.split(","):
        kind, _, depth = t.strip().partition("@d")
        if kind[:2] not in ("pp", "tg") or not kind[2:].isdigit() or (depth and not depth.isdigit()):
            sys.exit(f"bench-cuda: --tests: {t}: expected ppN or tgN, optionally @dD")
        n = int(kind[2:])
        out.append((n, 0, int(depth or 0)) if kind[:2] == "pp" else (0, n, int(depth or 0)))
    return out


# ==== llama-bench ====


def find_nvcc():
    """nvcc from $CUDACXX, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; None if none."""
    home = os.environ.get("CUDA_HOME")
    for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), home and os.path.join(home, "bin", "nvcc"),
              "/usr/local/cuda/bin/nvcc"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def build_llama(src, build, cuda, jobs, commit):
    """Configures and builds llama-bench; returns (path, seconds or None when it was built)."""
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_CCACHE=OFF", "-DBUILD_SHARED_LIBS=OFF",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON",
             f"-DLLAMA_BUILD_COMMIT={commit}"]
    if cuda:
        nvcc = find_nvcc()
        if not nvcc:
            sys.exit("bench-cuda: nvcc not found (PATH, /usr/local/cuda/bin); HINT: --dry-run builds for the CPU")
        flags += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    else:
        flags += ["-DGGML_CUDA=OFF"]
    if shutil.which("ninja"):
        flags = ["-G", "Ninja"] + flags
    exe = build / "bin" / "llama-bench"
    stamp = build / "celer-flags.txt"
    want = "\n".join([str(src.resolve())] + flags) + "\n"
    if exe.exists() and stamp.exists() and stamp.read_text() == want:
        log(f"llama-bench is built ({exe})")
        return exe, None
    build.mkdir(parents=True, exist_ok=True)
    log(f"building llama-bench ({'CUDA sm_90' if cuda else 'CPU'}, -j{jobs}) in {build}")
    t0 = time.time()
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(src.resolve().parent))
    for step, cmd in (("configure", ["cmake", "-S", src, "-B", build] + flags),
                      ("build", ["cmake", "--build", build, "-j", str(jobs), "--target", "llama-bench"])):
        with open(build / f"{step}.log", "w") as f:
            rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0:
            sys.exit(f"bench-cuda: llama.cpp {step} failed:\n" + "".join(open(build / f"{step}.log").readlines()[-30:]))
    stamp.write_text(want)
    secs = time.time() - t0
    log(f"llama-bench built in {secs:.0f} s")
    return exe, secs


# ==== Models ====


def model_jobs(args):
    """{name: cuda_models.py arguments} of every model this run needs."""
    jobs = {}
    for name, bits, group, twin, *_ in PAIRS:
        if name in args.pairs:
            jobs[name] = [bits, group, [twin]]
    if args.dry_run and args.check:
        jobs.setdefault("4bit-g32", [4, 32, ["q4_1"]])[2] += EXTRA_TWINS["4bit-g32"]
        jobs["8bit-g32"] = [8, 32, EXTRA_TWINS["8bit-g32"]]
    shape = SMALL_SHAPE if args.dry_run else []
    return {name: ["--out", str(args.work / "models" / name), "--bits", str(b), "--group", str(g),
                   "--gguf", ",".join(t)] + shape for name, (b, g, t) in jobs.items()}


def model_bytes(margs):
    """Bytes the MLX directory and the GGUF twins of one Llama-3.1-8B-shaped model take."""
    sys.path.insert(0, str(TOOLS))
    from cuda_models import LLAMA31_8B, specs
    from gguf_layout import BLOCK_BYTES, QK

    bits, group = int(margs[margs.index("--bits") + 1]), int(margs[margs.index("--group") + 1])
    weights = sum(rows * cols for _, rows, cols in specs(LLAMA31_8B))
    twins = margs[margs.index("--gguf") + 1].split(",")
    return weights * (bits + 32 / group) / 8 + sum(weights * BLOCK_BYTES[t] / QK for t in twins)


def start_models(args):
    """Starts cuda_models.py for every model not already written with the same arguments;
    returns the running processes. Exits first when the disk cannot hold them."""
    (args.work / "models").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(args.llama_src / "gguf-py"))
    todo = {}
    for name, margs in model_jobs(args).items():
        stamp = args.work / "models" / f"{name}.args"
        out = margs[margs.index("--out") + 1]
        twins = margs[margs.index("--gguf") + 1].split(",")
        files = [Path(out) / "model.safetensors"] + [Path(f"{out}.{t}.gguf") for t in twins]
        if stamp.exists() and stamp.read_text() == " ".join(margs) and all(f.exists() for f in files):
            log(f"model {name} is there")
        else:
            todo[name] = margs
    if not args.dry_run:
        need, free = sum(model_bytes(m) for m in todo.values()), shutil.disk_usage(args.work).free
        if need + 2**30 > free:
            sys.exit(f"bench-cuda: the models need {need / 2**30:.0f} GiB, {args.work} has {free / 2**30:.0f} GiB "
                     f"free; HINT: --pairs with fewer pairs, or --work on a larger disk")
    procs = []
    for name, margs in todo.items():
        stamp = args.work / "models" / f"{name}.args"
        stamp.unlink(missing_ok=True)
        log(f"writing model {name}")
        logfile = open(args.work / "models" / f"{name}.log", "w")
        p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "cuda_models.py")] + margs, env=env,
                             stdout=logfile, stderr=subprocess.STDOUT)
        procs.append((name, p, stamp, " ".join(margs), time.time()))
    return procs


def wait_models(args, procs):
    """Seconds the slowest model took, as its own last line says (None when none was
    written)."""
    slowest = None
    for name, p, stamp, margs, _ in procs:
        logfile = args.work / "models" / f"{name}.log"
        if p.wait() != 0:
            sys.exit(f"bench-cuda: writing model {name} failed; see {logfile}")
        stamp.write_text(margs)
        last = (logfile.read_text().strip().splitlines() or [""])[-1]
        secs = float(last.rsplit("; ", 1)[-1].split()[0]) if last.endswith(" s") else 0.0
        slowest = max(slowest or 0.0, secs)
        log(f"model {name} written in {secs:.0f} s")
    return slowest


# ==== Device memory ====


class DeviceMemory:
    """memory.used of one GPU every 200 ms from nvidia-smi, in a thread; peak(t0, t1) is the
    highest sample in a time window. Off where nvidia-smi is missing."""

    def __init__(self, index):
        self.samples, self.proc = [], None
        if not shutil.which("nvidia-smi"):
            return
        self.proc = subprocess.Popen(["nvidia-smi", "-i", str(index), "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits", "-lms", "200"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.samples.append((time.time(), int(line)))

    def peak(self, t0, t1):
        vals = [m for t, m in self.samples if t0 <= t <= t1]
        return max(vals) if vals else None

    def idle(self):
        """The median of the next 5 samples (at most 5 s), with nothing of ours running."""
        if not self.proc:
            return None
        t0 = time.time()
        while time.time() < t0 + 5 and sum(t >= t0 for t, _ in self.samples) < 5:
            time.sleep(0.1)
        vals = [m for t, m in self.samples if t >= t0]
        return statistics.median(vals) if vals else None

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


# ==== Runs ====


def engine_cmd(args, engine, pair, ps, ns, depth, reps=None):
    name, _, _, twin = pair[:4]
    models = args.work / "models"
    lists = ["-p", ",".join(map(str, ps)) or "0", "-n", ",".join(map(str, ns)) or "0"]
    lists += ["-d", str(depth)] if depth else []
    rest = ["-r", str(reps or args.reps)] + (["-t", str(args.threads)] if args.threads else []) + ["-o", "json"]
    if engine == "celer":
        return [args.celer, "bench", "-m", models / name, "--device", args.device] + lists + rest
    return [args.llama_bench, "-m", models / f"{name}.{twin}.gguf"] + lists + ["-ngl", "99"] + rest


def run_one(args, engine, pair, ps, ns, depth, mem):
    """One invocation: {test name: run dict} with each test's JSON object, or the error."""
    cmd = engine_cmd(args, engine, pair, ps, ns, depth)
    t0 = time.time()
    out, err, rc, rss, secs = run_cmd(cmd)
    base = {"engine": engine, "cmd": " ".join(shlex.quote(str(c)) for c in cmd), "rc": rc, "seconds": secs,
            "peak_rss_bytes": rss, "device_peak_mib": mem.peak(t0, time.time())}
    names = [test_name(p, 0, depth) for p in ps] + [test_name(0, n, depth) for n in ns]
    return results_by_test(out, err, rc, base, names, lambda o: test_name(
        int(o.get("n_prompt", 0)), int(o.get("n_gen", 0)), int(o.get("n_depth", 0))))


def depth_groups(tests):
    """{depth: (prompt lengths, generation lengths)}: one invocation per engine each."""
    by_depth = {}
    for p, n, d in tests:
        ps, ns = by_depth.setdefault(d, ([], []))
        (ps if p else ns).append(p or n)
    return dict(sorted(by_depth.items()))


def run_rounds(args, tests, mem, deadline):
    """{pair name: {test: {engine: [runs]}}}, A B B A per round, pair and depth; no new
    invocation starts after deadline (time.time(), or None)."""
    by_depth = depth_groups(tests)
    runs, k_inv = {}, 0
    pairs = [p for p in PAIRS if p[0] in args.pairs]
    total = args.rounds * len(pairs) * len(by_depth) * 4
    for k in range(args.rounds):
        for pair in pairs:
            per_test = runs.setdefault(pair[0], {})
            for depth, (ps, ns) in by_depth.items():
                for engine in ("celer", "llama", "llama", "celer"):
                    if deadline and time.time() > deadline:
                        log(f"time budget spent: stopping after {k_inv} of {total} invocations")
                        args.stopped = f"stopped at the time budget after {k_inv} of {total} invocations"
                        return runs
                    k_inv += 1
                    got = run_one(args, engine, pair, ps, ns, depth, mem)
                    for t, r in got.items():
                        r["round"] = k
                        per_test.setdefault(t, {}).setdefault(engine, []).append(r)
                    first = next(iter(got.values()))
                    what = "; ".join(f"{t} {statistics.mean(r['result']['samples_ts']):.1f}" if "result" in r
                                     else f"{t} FAILED: {r['error']}" for t, r in got.items())
                    log(f"[{k_inv}/{total}] round {k + 1} {pair[0]} {engine}: {what} t/s ({first['seconds']:.0f} s)")
    return runs


def flash_attn_probe(args):
    """What llama-bench's default flash attention (auto) resolves to on the first pair's
    twin: one short verbose invocation."""
    pair = next(p for p in PAIRS if p[0] in args.pairs)
    cmd = engine_cmd(args, "llama", pair, [32], [], 0, reps=1) + ["-v"]
    _, err, rc, _, _ = run_cmd(cmd)
    if rc != 0:
        return "unknown (the verbose run failed)"
    for line in err.splitlines():
        if "Flash Attention" in line:
            return line.split(":", 1)[-1].strip()
    return "unknown (no line about it in the verbose log)"


# ==== Pairing check ====


def check_pairs(args):
    """Rows of the check table: celer's logits of each MLX directory against each of its
    twins, and gguf-py's dequantization of a few twin tensors against the MLX values."""
    sys.path.insert(0, str(args.llama_src / "gguf-py"))
    sys.path.insert(0, str(TOOLS))
    from cuda_models import import_gguf, read_safetensors
    from gguf_layout import heads_for, unpermute
    from make_fixtures import dequantize

    gguf = import_gguf()
    ids = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"
    rows = []
    for name, margs in model_jobs(args).items():
        mdir = args.work / "models" / name
        twins = margs[margs.index("--gguf") + 1].split(",")
        logits = {}
        for m in [mdir] + [Path(f"{mdir}.{t}.gguf") for t in twins]:
            f = args.work / "check" / f"{m.name}.npy"
            f.parent.mkdir(exist_ok=True)
            cmd = [args.celer, "logits", "-m", m, "--ids", ids, "--all", "--device", args.device, "-o", f]
            _, err, rc, _, secs = run_cmd(cmd + (["-t", str(args.threads)] if args.threads else []))
            logits[m.name] = np.load(f) if rc == 0 else err.strip()[-200:]
            log(f"check: celer logits of {m.name} ({secs:.0f} s)")
        cfg = json.loads((mdir / "config.json").read_text())
        mlx = read_safetensors(mdir / "model.safetensors")
        ref = logits[mdir.name]
        for t in twins:
            got = logits[f"{mdir.name}.{t}.gguf"]
            row = {"mlx": name, "gguf": f"{name}.{t}.gguf"}
            if isinstance(ref, str) or isinstance(got, str):
                row["error"] = ref if isinstance(ref, str) else got
            else:
                row["max_abs_logit"] = float(np.abs(ref).max())
                row["rel_diff"] = float(np.abs(ref - got).max() / max(row["max_abs_logit"], 1e-30))
                row["argmax_equal"] = bool((ref.argmax(-1) == got.argmax(-1)).all())
            reader = gguf.GGUFReader(f"{mdir}.{t}.gguf")
            tensors = {x.name: x for x in reader.tensors}
            worst = 0.0
            for hf, gname in (("model.layers.0.self_attn.k_proj", "blk.0.attn_k.weight"),
                              ("model.layers.0.mlp.down_proj", "blk.0.ffn_down.weight")):
                x = tensors[gname]
                deq = gguf.quants.dequantize(np.asarray(x.data), x.tensor_type)
                n_head = heads_for(hf + ".weight", cfg)
                deq = unpermute(deq, n_head) if n_head else deq
                w, _, _ = dequantize(np.asarray(mlx[hf + ".weight"]), np.asarray(mlx[hf + ".scales"]),
                                     np.asarray(mlx[hf + ".biases"]), deq.shape[1])
                worst = max(worst, float(np.abs(deq - w).max()))
            row["dequant_max_abs_diff"] = worst
            rows.append(row)
            log(f"check: {row}")
    return rows


# ==== Report ====


def mib(path):
    p = Path(path)
    n = sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size
    return f"{n / 2**20:.0f}"


def write_report(args, info, runs, tests, check, started, finished):
    lines = []
    w = lines.append
    names = [test_name(*t) for t in tests]
    first = {e: next((r["result"] for pt in runs.values() for rt in pt.values() for r in rt.get(e, [])
                      if "result" in r), {}) for e in ("celer", "llama")}
    lb, cl = first["llama"], first["celer"]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cfg = json.loads((args.work / "models" / args.pairs[0] / "config.json").read_text())
    w("# celer against llama.cpp on the GPU" +
      (" (dry run on the CPU: the figures mean nothing)" if args.dry_run else ""))
    w("")
    w(f"- date: {started:%Y-%m-%d %H:%M} UTC (run took {(finished - started).total_seconds() / 60:.1f} min)")
    w(f"- machine: {'; '.join(info['gpus']) or 'no GPU'}; CUDA compiler {info['nvcc']}; "
      f"{cpu_model()}, {os.cpu_count()} CPUs, {mem / 2**30:.0f} GiB")
    w(f"- load average before / after the run: {info['load_before']} / {loadavg()}")
    w(f"- celer: commit {args.celer_commit}, device {args.device}, kernels {cl.get('kernels', '?')}, "
      f"binary {args.celer}")
    built = f"built here in {info['build_s']:.0f} s with -j{args.jobs}" if info["build_s"] else "built before this run"
    w(f"- llama.cpp: commit {info['llama_commit']} (llama-cpp-python sdist, cut tree {args.llama_src}), build "
      f"{lb.get('build_commit', '?')}, backends {lb.get('backends', '?')}; Release, "
      f"{'CUDA architecture 90, ' if not args.dry_run else 'CPU only, '}GGML_NATIVE off; {built}")
    w(f"- llama-bench settings: n_gpu_layers {lb.get('n_gpu_layers', '?')}, flash_attn {lb.get('flash_attn', '?')} "
      f"(llama-bench's default; its verbose log says: {info['flash_attn']}), n_batch {lb.get('n_batch', '?')}, "
      f"n_ubatch {lb.get('n_ubatch', '?')}, KV {lb.get('type_k', '?')}/{lb.get('type_v', '?')}; "
      f"celer: n_batch {cl.get('n_batch', '?')}, its default KV cache (f16)")
    models = f"written in {info['models_s']:.0f} s" if info["models_s"] else "written before this run"
    w(f"- model: random weights, Llama-3.1 shape: {cfg['num_hidden_layers']} layers, d {cfg['hidden_size']}, "
      f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads, ffn {cfg['intermediate_size']}, vocab "
      f"{cfg['vocab_size']}, untied head, RoPE theta {cfg['rope_theta']:g} unscaled (bench/cuda_models.py; {models})")
    w(f"- rounds {args.rounds}, {args.reps} timed repetitions per invocation after each engine's warm-up; "
      f"per round, pair and depth: celer, llama.cpp, llama.cpp, celer")
    pair = next(p for p in PAIRS if p[0] in args.pairs)
    for depth, (ps, ns) in depth_groups(tests).items():
        ex = [" ".join(shlex.quote(str(c)) for c in engine_cmd(args, e, pair, ps, ns, depth))
              for e in ("celer", "llama")]
        w(f"- invocations{f' at depth {depth}' if depth else ''}, e.g. `{ex[0]}` and `{ex[1]}`")
    if args.stopped:
        w(f"- **incomplete**: {args.stopped} (--budget-s {args.budget_s})")
    w(f"- command: `{args.command}`")
    w("")
    w("Cells: median tok/s over every timed repetition [min-max].")
    w("")
    w("| engine (weights, bits per weight) | " + " | ".join(names) + " |")
    w("| --- | " + " | ".join("---:" for _ in names) + " |")
    for name, _, _, _, clabel, llabel, bpw in PAIRS:
        if name not in runs:
            continue
        for engine, label in (("celer", clabel), ("llama", llabel)):
            who = "celer" if engine == "celer" else "llama.cpp"
            cells = [cell(runs[name].get(t, {}).get(engine, [])) for t in names]
            w(f"| {who}, {label} ({bpw}) | " + " | ".join(cells) + " |")
    w("")
    w("celer ÷ llama.cpp on the same values and bytes per weight: ratio of the medians [min-max of the ratios "
      "of paired invocations: each round's first celer against its first llama.cpp, last against last]. "
      "Above 1: celer is faster.")
    w("")
    w("| pair | " + " | ".join(names) + " |")
    w("| --- | " + " | ".join("---:" for _ in names) + " |")
    for name, _, _, _, clabel, llabel, bpw in PAIRS:
        if name in runs:
            w(f"| {clabel} ÷ {llabel} ({bpw}) | " + " | ".join(
                ratio_cell(runs[name].get(t, {}).get("celer", []), runs[name].get(t, {}).get("llama", []))
                for t in names) + " |")
    w("")
    idle = info["idle_mib"]
    w("Memory: the highest device memory nvidia-smi showed (every 200 ms) during any invocation of an engine on a "
      "pair" + (f", and that less the {idle:.0f} MiB in use before the first run" if idle is not None else
                " (not measured: no nvidia-smi)") + "; the peak resident memory of the process on the host; the load "
      "time celer reports (model open + context create; llama-bench reports none); what celer's context says it "
      "holds on the device (weights + KV cache + buffers, for the largest context of the pair's invocations).")
    w("")
    w("| engine (weights) | file MiB | peak device MiB | above idle MiB | peak host RSS MiB | load ms | "
      "celer's own count, MiB |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, _, _, twin, clabel, llabel, bpw in PAIRS:
        if name not in runs:
            continue
        for engine, label, path in (("celer", clabel, args.work / "models" / name),
                                    ("llama", llabel, args.work / "models" / f"{name}.{twin}.gguf")):
            rs = [r for rt in runs[name].values() for r in rt.get(engine, [])]
            dev = [r["device_peak_mib"] for r in rs if r.get("device_peak_mib") is not None]
            rss = [r["peak_rss_bytes"] for r in rs if r.get("peak_rss_bytes")]
            loads = [r["result"]["load_ms"] for r in rs if "result" in r and "load_ms" in r["result"]]
            own = [r["result"] for r in rs if "result" in r and "device_weight_bytes" in r["result"]]
            own_cell = "-"
            if own:
                o = max(own, key=lambda x: x["device_kv_bytes"] + x["device_buffer_bytes"])
                parts = [o["device_weight_bytes"], o["device_kv_bytes"], o["device_buffer_bytes"]]
                own_cell = " + ".join(f"{v / 2**20:.0f}" for v in parts) + f" = {sum(parts) / 2**20:.0f}"
            who = "celer" if engine == "celer" else "llama.cpp"
            cells = [mib(path), str(max(dev)) if dev else "-",
                     f"{max(dev) - idle:.0f}" if dev and idle is not None else "-",
                     f"{max(rss) / 2**20:.0f}" if rss else "-",
                     f"{statistics.median(loads):.0f}" if loads else "-", own_cell]
            w(f"| {who}, {label} | " + " | ".join(cells) + " |")
    if check is not None:
        w("")
        w("Pairing check: celer's logits (every row of 16 ids, on the device) of the MLX directory against those "
          "of the twin, and llama.cpp's gguf-py dequantization of blk.0.attn_k and blk.0.ffn_down of the twin "
          "against the MLX values (k rows back in MLX order). Equal values: the dequantizations are equal, and "
          "the logits differ only by the order of fp32 sums where the pair's groups differ (celer on a device "
          "scales each group's sum; the bound is 1e-5 of the largest logit).")
        w("")
        w("| MLX | GGUF | max abs logit | max abs diff / max abs logit | argmax equal | gguf-py vs MLX, max abs diff |")
        w("| --- | --- | ---: | ---: | --- | ---: |")
        for r in check:
            if "error" in r:
                w(f"| {r['mlx']} | {r['gguf']} | failed: {r['error'][:80]} | | | {r['dequant_max_abs_diff']:.3g} |")
            else:
                w(f"| {r['mlx']} | {r['gguf']} | {r['max_abs_logit']:.4g} | {r['rel_diff']:.3g} | "
                  f"{'yes' if r['argmax_equal'] else 'NO'} | {r['dequant_max_abs_diff']:.3g} |")
    w("")
    return "\n".join(lines)


# ==== Main ====


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--celer", default=str(ROOT / "build" / "celer"), help="the celer binary (default build/celer)")
    ap.add_argument("--celer-commit", default="", help="the commit the binary was built from (default: this tree's)")
    ap.add_argument("--llama-src", default=str(ROOT / "build" / "llama.cpp-cuda" / "src"),
                    help="the cut llama.cpp tree of bench/setup_cuda.sh")
    ap.add_argument("--work", default="/tmp/bench-cuda", help="builds, models, report (default /tmp/bench-cuda)")
    ap.add_argument("--rounds", type=int, default=1, help="A B B A rounds (default 1)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per invocation (default 3)")
    ap.add_argument("--pairs", default=",".join(p[0] for p in PAIRS), help="comma-separated (default: all)")
    ap.add_argument("--tests", default=DEFAULT_TESTS, help=f"comma-separated (default {DEFAULT_TESTS})")
    ap.add_argument("--quick", action="store_true", help="the 4bit-g64 pair only, 2 repetitions")
    ap.add_argument("--check", action="store_true", help="check the pairing first (celer logits, gguf-py blocks)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only, tiny models: tests the harness")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="llama.cpp build jobs (default: all CPUs)")
    ap.add_argument("--threads", type=int, default=0, help="-t for both engines (default: theirs; dry run 2)")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU nvidia-smi watches (default 0)")
    ap.add_argument("--llama-bench", default="",
                    help="a llama-bench built before from the same tree and flags (no build: on a machine "
                    "that starts bare each time, one built once and carried over saves the build)")
    ap.add_argument("--budget-s", type=int, default=0,
                    help="start no benchmark invocation this many seconds after the start; the report then "
                    "covers what ran (default: no limit)")
    args = ap.parse_args()
    args.command = " ".join(shlex.quote(a) for a in ["bench/cuda.py"] + sys.argv[1:])
    if args.quick:
        args.pairs, args.reps = PAIRS[0][0], 2
    args.pairs = [p for p in args.pairs.split(",") if p]
    for p in args.pairs:
        if p not in {x[0] for x in PAIRS}:
            sys.exit(f"bench-cuda: unknown pair {p}; known: {', '.join(x[0] for x in PAIRS)}")
    tests = parse_tests(args.tests)
    args.device = "cpu" if args.dry_run else "cuda"
    args.threads = args.threads or (2 if args.dry_run else 0)
    args.work = Path(args.work).resolve()
    args.llama_src = Path(args.llama_src).resolve()
    args.celer = str(Path(args.celer).resolve())
    args.celer_commit = args.celer_commit or git_commit()
    if not os.access(args.celer, os.X_OK):
        sys.exit(f"bench-cuda: {args.celer} is not an executable; HINT: --celer PATH (built with make where nvcc is)")
    module = os.environ.get("CELER_CUDA_MODULE") or str(Path(args.celer).parent / "celer-cuda.so")
    if not args.dry_run and not os.path.exists(module):
        sys.exit(f"bench-cuda: the CUDA module {module} is missing; HINT: make builds it beside build/celer, "
                 "copy the two together")
    if not (args.llama_src / "CMakeLists.txt").exists():
        sys.exit(f"bench-cuda: no llama.cpp tree at {args.llama_src}; HINT: bash bench/setup_cuda.sh")
    args.work.mkdir(parents=True, exist_ok=True)
    args.stopped = ""

    started = datetime.datetime.now(datetime.timezone.utc)
    commit_file = args.llama_src.parent / "llama-cpp-commit"
    info = {"load_before": loadavg(), "gpus": gpu_info(), "nvcc": nvcc_version(find_nvcc() or "nvcc"),
            "llama_commit": commit_file.read_text().strip() if commit_file.exists() else "unknown"}
    procs = start_models(args)
    build = args.work / ("llama-build-cpu" if args.dry_run else "llama-build")
    try:
        if args.llama_bench:
            args.llama_bench, info["build_s"] = Path(args.llama_bench).resolve(), None
            if not os.access(args.llama_bench, os.X_OK):
                sys.exit(f"bench-cuda: --llama-bench {args.llama_bench} is not an executable")
            log(f"llama-bench given: {args.llama_bench}")
        else:
            args.llama_bench, info["build_s"] = build_llama(args.llama_src, build, not args.dry_run, args.jobs,
                                                            info["llama_commit"])
    except SystemExit:
        for _, p, *_ in procs:
            p.terminate()
        raise
    info["models_s"] = wait_models(args, procs)
    check = check_pairs(args) if args.check else None

    mem = DeviceMemory(args.gpu)
    try:
        info["idle_mib"] = mem.idle()
        info["flash_attn"] = flash_attn_probe(args)
        log(f"llama-bench flash attention (auto): {info['flash_attn']}")
        runs = run_rounds(args, tests, mem, started.timestamp() + args.budget_s if args.budget_s else None)
    finally:
        mem.stop()
    finished = datetime.datetime.now(datetime.timezone.utc)

    (args.work / "results.json").write_text(json.dumps({"command": args.command, "info": info, "check": check,
                                                        "runs": runs}, indent=1, default=str) + "\n")
    report = write_report(args, info, runs, tests, check, started, finished)
    (args.work / "report.md").write_text(report)
    print(report)
    log(f"wrote {args.work / 'report.md'} and {args.work / 'results.json'} "
        f"({(finished - started).total_seconds() / 60:.1f} min)")
    failed = check and any("error" in r or r["rel_diff"] > 1e-5 or r["dequant_max_abs_diff"] > 0 for r in check)
    if failed:
        sys.exit("bench-cuda: the pairing check failed (see the report)")


if __name__ == "__main__":
    main()
