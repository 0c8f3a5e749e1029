#!/usr/bin/env python3
"""Vision benchmark: celer against transformers (torch, CPU) on the random-weight LLaVA-NeXT
with a CLIP ViT-L/14-336 tower that bench/make_vision_model.py writes (docs/benchmarks.md,
DESIGN.md section 8). Same machine, same thread count, same image, same weights.

Two figures, each engine measuring the same work after its own warm-up:
  encode     one image from decoded RGB pixels to the rows that go into the prompt:
             preprocessing (resize, crop/pad, normalize into 5 tiles), the vision tower,
             the projector and the anyres layout (base tile, unpadded grid, image_newline).
             celer: celer_image_encode in `celer bench --image`. transformers: the image
             processor on the PIL image, then model.model.get_image_features(pixel_values,
             image_sizes) (tower, projector, pack_image_features); the processor's share is
             reported too.
  ppN+img    one prefill into an empty KV cache of the image's rows then N text ids, LM
             head on the last row only; rows/s = (image rows + N) / time. celer: ppN+img in
             `celer bench --image` (rows encoded before the clock starts). transformers: the
             embedding lookup of the N ids, the concatenation with the image rows and
             model(inputs_embeds=..., logits_to_keep=1, use_cache=True).

Engines (--engines):
  celer     build/celer bench -m MODEL --image IMG -p N -n 0 -r R -t T -o json (copied to
            build/bench/vision-celer first, so a rebuild during the run does not change what
            is measured); it computes with the checkpoint's bf16 weights
  hf-f32    transformers, the checkpoint loaded as float32 (the same values), sdpa attention
  hf-bf16   transformers, the checkpoint as stored, bfloat16 (torch's CPU bf16 matmuls)
transformers runs in a child process of this script (--worker) with torch.set_num_threads(T)
and OMP_NUM_THREADS=MKL_NUM_THREADS=T; celer gets -t T and the same environment.

Rounds are palindromes (ABBA generalized): celer, hf-f32, hf-bf16, hf-bf16, hf-f32, celer.
Every invocation does one warm-up and R timed repetitions of each figure and reports their
mean (celer bench gives the mean per invocation). Cells: median over the invocations
[min-max]. Ratios celer / transformers are speed ratios (images/s for encode, rows/s for
prefill; above 1: celer is faster): ratio of the medians [min-max of the paired ratios: in
each round celer's first invocation against the peer's first, the last against the last].
Peak RSS of every invocation is read through GNU time (/usr/bin/time) when present.

Before the rounds (unless --no-check), a correctness check on the same prompt:
`celer logits --ids 32000,<N ids> --image IMG --all` (each row's logits, the image rows
expanded from the one image token) against transformers in float32 on the same ids, the
image token repeated once per image row: max |diff| / max |reference| over the image rows
and the text rows, and top-1 agreement; transformers bf16 against float32 on the same rows
for scale.

Run (after bash tools/setup_venv.sh, make, bench/make_vision_model.py):
  build/venv/bin/python bench/vision.py [--rounds 3] [--reps 3] [--threads 2] [--prompt 128]
Writes build/bench/vision.md (also printed) and build/bench/vision.json (every invocation).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_flags, cpu_model, git_commit, loadavg, version_of

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "build" / "bench-models" / "llava-vitl-random"
IMAGE_NAME = "image_672x448.png"
CELER = ROOT / "build" / "celer"
IMAGE_TOKEN = 32000
TEXT_ID_SEED = 128
ENGINES = {
    "celer": "celer (bf16 weights)",
    "hf-f32": "transformers float32",
    "hf-bf16": "transformers bfloat16",
}
DEFAULT_ENGINES = "celer,hf-f32,hf-bf16"
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def log(msg):
    print(f"bench-vision: {msg}", file=sys.stderr, flush=True)


def text_ids(n):
    """N deterministic text ids in [3, IMAGE_TOKEN): no image token among them."""
    import numpy as np

    return [int(x) for x in np.random.default_rng(TEXT_ID_SEED).integers(3, IMAGE_TOKEN, size=n)]


# ==== The transformers side (child processes) ====


def hf_setup(threads):
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return torch


def hf_load(torch, model_dir, dtype):
    from transformers import LlavaNextForConditionalGeneration, LlavaNextImageProcessor

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = LlavaNextForConditionalGeneration.from_pretrained(model_dir, dtype=dt).eval()
    return model, LlavaNextImageProcessor.from_pretrained(model_dir), dt


def worker_bench(args):
    """One transformers invocation: warm-up + reps of encode, then of ppN+img. JSON out."""
    torch = hf_setup(args.threads)
    from PIL import Image

    t0 = time.perf_counter()
    model, ip, dt = hf_load(torch, args.model, args.dtype)
    load_ms = (time.perf_counter() - t0) * 1e3
    img = Image.open(args.image).convert("RGB")
    img.load()
    pre_ms, feat_ms, enc_ms, pp_ts = [], [], [], []
    with torch.inference_mode():
        for k in range(-1, args.reps):  # k = -1: the warm-up
            t0 = time.perf_counter()
            inp = ip(images=img, return_tensors="pt")
            pixels = inp["pixel_values"].to(dt)
            t1 = time.perf_counter()
            feats = model.model.get_image_features(pixels, inp["image_sizes"]).pooler_output[0]
            t2 = time.perf_counter()
            if k >= 0:
                pre_ms.append((t1 - t0) * 1e3)
                feat_ms.append((t2 - t1) * 1e3)
                enc_ms.append((t2 - t0) * 1e3)
        rows = int(feats.shape[0])
        ids = torch.tensor(text_ids(args.prompt), dtype=torch.long)
        embed = model.model.language_model.embed_tokens
        for k in range(-1, args.reps):
            t0 = time.perf_counter()
            emb = torch.cat([feats, embed(ids)], dim=0)[None]
            out = model(inputs_embeds=emb, logits_to_keep=1, use_cache=True)
            dt_s = time.perf_counter() - t0
            assert out.logits.shape[1] == 1
            if k >= 0:
                pp_ts.append((rows + args.prompt) / dt_s)
            del out
    hwm = 0
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    print(json.dumps({"engine": f"hf-{'f32' if args.dtype == 'float32' else 'bf16'}", "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "image_rows": rows, "n_prompt": args.prompt,
                      "attn": model.config._attn_implementation, "load_ms": load_ms,
                      "preprocess_ms": pre_ms, "features_ms": feat_ms, "encode_ms": enc_ms, "pp_ts": pp_ts,
                      "vm_hwm": hwm}))


def worker_check(args):
    """transformers' logits of the check prompt against celer's (args.celer_logits)."""
    import numpy as np

    torch = hf_setup(args.threads)
    from PIL import Image

    c = np.load(args.celer_logits)
    img = Image.open(args.image).convert("RGB")
    res = {}
    ref = None
    for dtype in ("float32", "bfloat16"):
        model, ip, dt = hf_load(torch, args.model, dtype)
        inp = ip(images=img, return_tensors="pt")
        with torch.inference_mode():
            feats = model.model.get_image_features(inp["pixel_values"].to(dt), inp["image_sizes"]).pooler_output[0]
            rows = int(feats.shape[0])
            ids = torch.tensor([[IMAGE_TOKEN] * rows + text_ids(args.prompt)])
            logits = model(input_ids=ids, pixel_values=inp["pixel_values"].to(dt),
                           image_sizes=inp["image_sizes"]).logits[0].float().numpy()
        del model
        if dtype == "float32":
            ref = logits
            res["rows"] = rows
            res["features_max_abs"] = float(feats.abs().max())
            res["features_rms"] = float(feats.float().pow(2).mean().sqrt())
            if c.shape != ref.shape:
                res["error"] = f"celer logits {c.shape} against transformers {ref.shape}"
                break
            res["celer"] = compare(c, ref, rows)
        else:
            res["hf_bf16"] = compare(logits, ref, rows)
    print(json.dumps(res))


def compare(x, ref, rows):
    import numpy as np

    out = {}
    for name, sl in (("image", slice(0, rows)), ("text", slice(rows, None)), ("all", slice(None))):
        d = float(np.abs(x[sl] - ref[sl]).max())
        m = float(np.abs(ref[sl]).max())
        out[name] = {"max_abs_diff": d, "max_abs_ref": m, "rel": d / m,
                     "top1": float((x[sl].argmax(-1) == ref[sl].argmax(-1)).mean())}
    return out


# ==== Running invocations ====


def thread_env(threads):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    return env


def run_cmd(cmd, env):
    """Runs cmd; returns (stdout, stderr, exit code, peak RSS bytes, seconds)."""
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        if GNU_TIME:
            cmd = [GNU_TIME, "-f", "%M", "-o", rss.name] + cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        secs = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        peak = ru.ru_maxrss * 1024
        if GNU_TIME:
            lines = rss.read().split()
            peak = int(lines[-1]) * 1024 if lines and lines[-1].isdigit() else 0
        return out.read().decode(), err.read().decode(errors="replace"), code, peak, secs


def parse_json(text, kind):
    """The JSON value in text: an array (celer bench) or the last line's object (worker)."""
    if kind == "array":
        i = text.find("[")
        return json.loads(text[i:]) if i >= 0 else None
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def run_engine(engine, args, celer_bin):
    env = thread_env(args.threads)
    if engine == "celer":
        cmd = [celer_bin, "bench", "-m", args.model, "--image", args.image, "-p", args.prompt, "-n", "0",
               "-r", args.reps, "-t", args.threads, "-o", "json"]
    else:
        cmd = [sys.executable, Path(__file__).resolve(), "--worker", "bench", "--dtype",
               "float32" if engine == "hf-f32" else "bfloat16", "--model", args.model, "--image", args.image,
               "--prompt", args.prompt, "--reps", args.reps, "--threads", args.threads]
    out, err, code, peak, secs = run_cmd(cmd, env)
    run = {"engine": engine, "argv": [str(c) for c in cmd], "seconds": secs, "peak_rss": peak}
    if code != 0:
        run["error"] = f"exit {code}: {err.strip()[-2000:]}"
        return run
    try:
        if engine == "celer":
            arr = parse_json(out, "array")
            enc = next(x for x in arr if x.get("test") == "image_encode")
            pp = next(x for x in arr if x.get("test") == "pp+image")
            txt = next((x for x in arr if x.get("test") == f"pp{args.prompt}"), None)
            run.update(encode_ms=enc["avg_ms"], encode_sd_ms=enc["stddev_ms"], pp_ts=pp["avg_ts"],
                       pp_sd_ts=pp["stddev_ts"], image_rows=enc["image_rows"], kernels=enc["kernels"],
                       threads=enc["n_threads"], text_pp_ts=txt.get("avg_ts") if txt else None, raw=arr)
        else:
            w = parse_json(out, "object")
            run.update(encode_ms=statistics.mean(w["encode_ms"]), features_ms=statistics.mean(w["features_ms"]),
                       preprocess_ms=statistics.mean(w["preprocess_ms"]), pp_ts=statistics.mean(w["pp_ts"]),
                       image_rows=w["image_rows"], threads=w["threads"], raw=w)
    except (StopIteration, KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        run["error"] = f"unreadable output ({e}): {out[-500:]} {err[-500:]}"
    return run


def run_check(args, celer_bin, out_dir):
    """celer logits --all against transformers on the benchmark prompt."""
    npy = out_dir / "vision-check-celer-logits.npy"
    ids = ",".join(str(i) for i in [IMAGE_TOKEN] + text_ids(int(args.prompt)))
    env = thread_env(args.threads)
    cmd = [celer_bin, "logits", "-m", args.model, "--ids", ids, "--image", args.image, "--all",
           "-t", args.threads, "-o", npy]
    out, err, code, _, secs = run_cmd(cmd, env)
    if code != 0:
        return {"error": f"celer logits exit {code}: {err.strip()[-2000:]}"}
    cmd = [sys.executable, Path(__file__).resolve(), "--worker", "check", "--model", args.model, "--image",
           args.image, "--prompt", args.prompt, "--threads", args.threads, "--celer-logits", npy]
    out, err, code, _, secs2 = run_cmd(cmd, env)
    npy.unlink(missing_ok=True)
    if code != 0:
        return {"error": f"check worker exit {code}: {err.strip()[-2000:]}"}
    res = parse_json(out, "object")
    res["seconds"] = secs + secs2
    return res


# ==== Statistics and the report ====


def speed(run, metric):
    """Higher is faster: images/s for encode, rows/s for prefill."""
    return 1e3 / run["encode_ms"] if metric == "encode" else run["pp_ts"]


def ok(runs):
    return [r for r in runs if "error" not in r]


def cell(values, fmt):
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"


def ratio_cell(a_runs, b_runs, metric):
    """Ratio of the median speeds a / b, [min-max of the paired ratios]."""
    a, b = ok(a_runs), ok(b_runs)
    if not a or not b:
        return "-", None
    r = statistics.median(speed(x, metric) for x in a) / statistics.median(speed(y, metric) for y in b)
    pairs = []
    for k in sorted({x["round"] for x in b}):
        ra = [x for x in a_runs if x["round"] == k]
        rb = [y for y in b_runs if y["round"] == k]
        pairs += [speed(x, metric) / speed(y, metric) for x, y in zip(ra, rb) if "error" not in x and "error" not in y]
    spread = f" [{min(pairs):.2f}-{max(pairs):.2f}]" if len(pairs) > 1 else ""
    return f"**{r:.2f}**{spread}", r


def ms(v):
    return f"{v:.0f}"


def ts(v):
    return f"{v:.0f}"


def mib(b):
    return f"{b / 2**20:.0f}"












def write_report(args, runs, check, started, finished, commit):
    lines = []
    w = lines.append
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cel = next((r for r in runs["celer"] if "error" not in r), None)
    rows = cel["image_rows"] if cel else next((r["image_rows"] for e in runs for r in ok(runs[e])), "?")
    hf = [e for e in runs if e != "celer"]
    w("# celer vision benchmark: CLIP ViT-L/14-336 LLaVA-NeXT, random weights")
    w("")
    w(f"- date: {started:%Y-%m-%d %H:%M} UTC (run took {(finished - started).total_seconds() / 60:.0f} min)")
    w(f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {mem / 2**30:.0f} GiB; {cpu_flags()}; "
      f"Linux {platform.release()}")
    w(f"- threads: {args.threads} for every engine (celer -t; torch.set_num_threads, OMP_NUM_THREADS, MKL_NUM_THREADS)")
    w(f"- celer: commit {commit}" + (f", kernels {cel['kernels']}" if cel else ""))
    w(f"- transformers {version_of('transformers')}, torch {version_of('torch')}, Pillow {version_of('pillow')}, "
      f"numpy {version_of('numpy')}, Python {platform.python_version()}; attention "
      + (next((r["raw"]["attn"] for e in hf for r in ok(runs[e])), "?")))
    w(f"- model: {Path(args.model).name} (bench/make_vision_model.py): CLIP ViT-L/14-336 tower (24 layers, feature "
      f"layer -2), projector 1024-1024, Mistral-shaped text model d 1024, 8 layers, 16/8 heads, ffn 2816, vocab 32064; "
      f"bfloat16 safetensors")
    w(f"- image: {Path(args.image).name}, 672x448 -> anyres grid 2x2, 5 tiles of 336x336, {rows} prompt rows")
    w(f"- load average before / after the run: {args.load_before} / {loadavg()}")
    w(f"- rounds {args.rounds}, order per round: " + ", ".join(args.order) + f"; {args.reps} timed repetitions per "
      f"invocation after one warm-up")
    w(f"- command: `{args.command}`")
    w("")
    if check:
        w("## Correctness")
        w("")
        if "error" in check:
            w(f"check failed: {check['error']}")
        else:
            c, b = check["celer"], check.get("hf_bf16")
            w(f"Logits of every row of the prompt ({check['rows']} image rows + {args.prompt} ids), "
              f"`celer logits --all` against transformers float32 (reference); transformers bfloat16 against "
              f"the same reference for scale. max |diff| / max |reference| [max |diff|], top-1 agreement. "
              f"transformers' image features: max |x| {check['features_max_abs']:.3g}, rms {check['features_rms']:.3g}.")
            w("")
            w("| engine | image rows | text rows | top-1 agreement (all rows) |")
            w("| --- | ---: | ---: | ---: |")
            for name, x in (("celer", c), ("transformers bfloat16", b)):
                if x:
                    w(f"| {name} | {x['image']['rel']:.2e} [{x['image']['max_abs_diff']:.2g}] | "
                      f"{x['text']['rel']:.2e} [{x['text']['max_abs_diff']:.2g}] | {100 * x['all']['top1']:.2f}% |")
            w("")
    w("## Speed")
    w("")
    w(f"Cells: median over the invocations of each one's mean of {args.reps} repetitions [min-max]. encode: ms per "
      f"image (preprocessing, tower, projector, layout); pp{args.prompt}+img: rows/s of one prefill of the "
      f"{rows} image rows + {args.prompt} ids. Peak RSS: per invocation, MiB.")
    w("")
    w(f"| engine | encode ms | of which preprocessing ms | pp{args.prompt}+img rows/s | peak RSS MiB |")
    w("| --- | ---: | ---: | ---: | ---: |")
    for e, rs in runs.items():
        good = ok(rs)
        pre = cell([r["preprocess_ms"] for r in good], lambda v: f"{v:.1f}") if e != "celer" else "(inside)"
        w(f"| {ENGINES[e]} | {cell([r['encode_ms'] for r in good], ms)} | {pre} | "
          f"{cell([r['pp_ts'] for r in good], ts)} | {cell([r['peak_rss'] for r in good if r['peak_rss']], mib)} |")
        for r in rs:
            if "error" in r:
                w(f"| {ENGINES[e]}, round {r['round']} | failed: {r['error'][:120]} | | | |")
    w("")
    w("Ratios celer ÷ transformers as speeds (images/s, rows/s; above 1: celer is faster): ratio of the medians "
      "[min-max of the paired ratios].")
    w("")
    w(f"| peer | encode | pp{args.prompt}+img |")
    w("| --- | ---: | ---: |")
    for e in hf:
        w(f"| {ENGINES[e]} | {ratio_cell(runs['celer'], runs[e], 'encode')[0]} | "
          f"{ratio_cell(runs['celer'], runs[e], 'pp')[0]} |")
    w("")
    return "\n".join(lines) + "\n"


# ==== Main ====


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="palindrome rounds (default 3)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per invocation after a warm-up (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="text ids after the image rows in ppN+img (default 128)")
    ap.add_argument("--engines", default=DEFAULT_ENGINES, help="comma-separated from " + ",".join(ENGINES))
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--image", default=None, help=f"default: MODEL/{IMAGE_NAME}")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench"))
    ap.add_argument("--worker", choices=["bench", "check"], help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--celer-logits", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.image = args.image or str(Path(args.model) / IMAGE_NAME)
    if args.worker == "bench":
        return worker_bench(args)
    if args.worker == "check":
        return worker_check(args)

    args.command = " ".join(shlex.quote(a) for a in ["bench/vision.py"] + sys.argv[1:])
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            sys.exit(f"bench-vision: unknown engine {e}; known: {', '.join(ENGINES)}")
    if "celer" not in engines:
        sys.exit("bench-vision: celer must be one of the engines")
    engines = ["celer"] + [e for e in engines if e != "celer"]
    if not CELER.exists():
        sys.exit("bench-vision: build/celer is missing; HINT: make")
    if not (Path(args.model) / ".complete").exists() and not (Path(args.model) / "config.json").exists():
        sys.exit(f"bench-vision: {args.model} is missing; HINT: build/venv/bin/python bench/make_vision_model.py")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    celer_bin = out_dir / "vision-celer"
    shutil.copy2(CELER, celer_bin)
    if (CELER.parent / "celer-cuda.so").exists():  # its CUDA module goes beside it (CELER_DEVICE=cuda)
        shutil.copy2(CELER.parent / "celer-cuda.so", out_dir / "celer-cuda.so")
    commit = git_commit()
    args.order = engines + list(reversed(engines))
    for k in ("reps", "threads", "prompt"):
        setattr(args, k, str(getattr(args, k)))

    started = datetime.datetime.now(datetime.timezone.utc)
    args.load_before = loadavg()
    check = None
    if not args.no_check:
        log("correctness check: celer logits --all against transformers float32 (and bfloat16)")
        check = run_check(args, celer_bin, out_dir)
        if "error" in check:
            log(f"check: {check['error']}")
        else:
            log(f"check: celer image rows rel {check['celer']['image']['rel']:.2e}, text rows rel "
                f"{check['celer']['text']['rel']:.2e}, top-1 {100 * check['celer']['all']['top1']:.2f}% "
                f"({check['seconds']:.0f} s)")
    runs = {e: [] for e in engines}
    n = 0
    for k in range(args.rounds):
        for e in args.order:
            n += 1
            log(f"round {k + 1}/{args.rounds}, {e} ({n}/{args.rounds * len(args.order)})")
            r = run_engine(e, args, celer_bin)
            r["round"] = k
            runs[e].append(r)
            if "error" in r:
                log(f"  {e} failed: {r['error'][:300]}")
            else:
                log(f"  encode {r['encode_ms']:.0f} ms, pp{args.prompt}+img {r['pp_ts']:.0f} rows/s, "
                    f"{r['image_rows']} rows, peak RSS {r['peak_rss'] / 2**20:.0f} MiB ({r['seconds']:.0f} s)")
    finished = datetime.datetime.now(datetime.timezone.utc)
    rows = {r["image_rows"] for e in runs for r in ok(runs[e])}
    if len(rows) > 1:
        log(f"WARNING: the engines disagree on the image's rows: {sorted(rows)}")
    if check and "rows" in check:
        rows.add(check["rows"])
    (out_dir / "vision.json").write_text(json.dumps({"command": args.command, "commit": commit, "check": check,
                                                      "runs": runs}, indent=1) + "\n")
    report = write_report(args, runs, check, started, finished, commit)
    (out_dir / "vision.md").write_text(report)
    print(report)
    log(f"wrote {out_dir / 'vision.md'} and {out_dir / 'vision.json'} "
        f"({(finished - started).total_seconds() / 60:.1f} min)")
    if any("error" in r for e in runs for r in runs[e]) or (check and "error" in check) or len(rows) > 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
