#!/usr/bin/env python3
"""Serving benchmark: `celer serve` against llama.cpp's `llama-server` on the same machine,
the same GGUF, the same thread count and the same number of parallel slots
(docs/benchmarks.md "Serving", DESIGN.md section 8).

For each concurrency C (default 1, 8, 16) and each temperature T (default 0, greedy, and 0.8,
sampled with each server's defaults for everything else) the two servers run R rounds; a round is the
palindrome A B B A. A run starts the server on a free loopback port with -np C and
-c C x CTX (context per slot), waits for /health, warms up with C + 2 requests of their own
prompts, then sends N(C) streamed chat completions from C client tasks (closed loop: each
task sends its next request when the previous one ends), reads VmHWM of the server and
stops it. Per request it records the time to the first content chunk (TTFT), the gaps
between content chunks (inter-token latency, ITL) and completion_tokens from the usage
chunk (stream_options.include_usage). Per run: output tok/s = all completion tokens /
wall time from the first request sent to the last one ended; TTFT and ITL p50/p99 over all
requests / gaps of the run. The report gives per server the median over its runs and
[min-max], and the ratios celer / llama-server: ratio of the medians with the [min-max] of
the paired ratios (in each round celer's first run against llama-server's first, the last
against the last).

Prompts are natural text, the same for both servers and every run: a seeded generator
composes requests from a pool of sentences (about 50-400 prompt tokens, a shared system
prompt, max_tokens 64-128, temperature T, seed fixed); the model stops where it stops
(no ignore_eos), and completion_tokens counts what each server really produced. A request
sets only the temperature, as an OpenAI client does: llama-server then samples with its own
defaults (top-k 40, top-p 0.95, min-p 0.05), celer serve with OpenAI's (none of those).

Run (after bash bench/setup_serve.sh and make all):
  build/serve-venv/bin/python bench/serve.py            # full: 2 rounds, ~18 min on 2 cores
  build/serve-venv/bin/python bench/serve.py --quick    # or SERVE_QUICK=1: ~5 min
Writes build/bench-serve/report.md (also printed) and build/bench-serve/results.json.
"""
import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from machine import cpu_model, git_commit

ROOT = Path(__file__).resolve().parent.parent
CELER = ROOT / "build" / "celer"
OUT_DIR = ROOT / "build" / "bench-serve"


def llama_dir():
    setup = (ROOT / "bench" / "lib.sh").read_text()
    for line in setup.splitlines():
        if line.startswith("LLAMA_CPP_PYTHON_VERSION="):
            return ROOT / "build" / ("llama.cpp-" + line.split("=", 1)[1].strip())
    raise SystemExit("serve.py: no LLAMA_CPP_PYTHON_VERSION in bench/lib.sh")


def llama_server_bin():
    return llama_dir() / "build" / "bin" / "llama-server"


def default_model():
    out = subprocess.run(["bash", str(ROOT / "tools" / "fetch_model.sh")], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit("serve.py: tools/fetch_model.sh failed:\n" + out.stderr)
    return out.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------
# Prompts

SYSTEM = ("You are a helpful assistant. Answer clearly and concisely, in plain English, "
          "and stay on the topic of the user's message.")

SENTENCES = [
    "The river town woke slowly on market days, long before the sun cleared the hills.",
    "The baker had already pulled the first loaves from the oven when the street was still dark.",
    "Fishermen sorted their nets on the quay while gulls argued over scraps of bait.",
    "An old ferry creaked against its ropes, waiting for the first passengers of the morning.",
    "Farmers from the valley set out crates of apples, pears and late plums in the square.",
    "A woman sold honey in small glass jars, each labelled by hand with the name of a meadow.",
    "The council had argued for three years about whether to build a second bridge.",
    "Most people walked to work, and the few cars in town belonged to the doctor and the vet.",
    "In winter the river froze at the edges, and children skated where the water was shallow.",
    "The library opened at ten and closed at six, except on Thursdays when it stayed open late.",
    "A solar panel converts sunlight into electricity through the photovoltaic effect.",
    "Batteries store energy chemically and release it as current when a circuit is closed.",
    "Engineers measure the efficiency of a motor as the ratio of mechanical output to electrical input.",
    "Wind turbines turn slowly, but their long blades sweep a very large area of moving air.",
    "A heat pump moves warmth from a cold place to a warm one, using a little work to do it.",
    "Copper wires carry current with little loss, which is why they are used in most buildings.",
    "The grid must balance supply and demand every second, or the frequency drifts away from its target.",
    "Photosynthesis lets plants turn carbon dioxide and water into sugar, using the energy of light.",
    "Bees visit thousands of flowers a day and carry pollen from one plant to the next.",
    "Oak trees can live for several hundred years and support many kinds of insects and birds.",
    "A healthy soil holds water like a sponge and is full of fungi, worms and bacteria.",
    "Migrating birds use the sun, the stars and the magnetic field of the earth to find their way.",
    "The ocean absorbs a large share of the heat and carbon dioxide that human activity adds to the air.",
    "Coral reefs grow slowly, a few millimetres a year, and are sensitive to warm water.",
    "A good recipe lists the ingredients in the order in which they are used.",
    "Bread dough needs time to rise, and a warm kitchen makes the yeast work faster.",
    "Soup tastes better on the second day, once the flavours have had time to mix.",
    "Rice should be rinsed before cooking so that the grains do not stick together.",
    "Fresh herbs are best added at the end, while dried herbs can cook for longer.",
    "A sharp knife is safer than a blunt one because it does not slip on the skin of a tomato.",
    "The team met every Monday morning to plan the work of the week.",
    "Writing short, clear emails saves time for everyone who has to read them.",
    "A project that has no deadline tends to grow until it fills all the time available.",
    "Good managers listen more than they talk and ask questions before giving answers.",
    "The new office had large windows, plants on every desk and a kitchen that was always busy.",
    "Customers often remember how a problem was handled more than the problem itself.",
    "A budget is a plan for money, written before the money is spent rather than after.",
    "The first computers filled whole rooms and used thousands of vacuum tubes.",
    "A program is a list of instructions that a computer follows one after another.",
    "Compilers translate source code written by people into machine code that a processor can run.",
    "A cache keeps recently used data close to the processor so that it can be read again quickly.",
    "Networks split messages into packets, send them separately and put them back together at the end.",
    "Testing a program with many small inputs often finds mistakes that large examples hide.",
    "The history of the town went back to a Roman camp built at the place where the river was narrowest.",
    "In the middle ages the market was held in front of the church, and merchants came from far away.",
    "The old mill was turned into a museum, and its wheel still turns on summer weekends.",
    "Travellers in the past crossed the mountains on foot, with mules carrying their goods.",
    "Every spring the whole village helped to repair the walls of the terraced fields.",
    "Learning a language is easier when you hear it spoken every day.",
    "Children learn to read by sounding out words long before they understand every sentence.",
    "A good teacher explains the same idea in several ways until everyone in the class follows.",
    "Regular exercise improves sleep, mood and the ability to concentrate.",
    "Walking for half an hour a day is one of the simplest ways to stay healthy.",
    "Drinking enough water matters more on hot days and during long walks.",
]

TASKS = [
    "Summarize the following notes in a few sentences.",
    "Read the text below and list its three main ideas.",
    "Write a short title for the following text and explain your choice.",
    "What questions could a student ask about the text below? Give three.",
    "Explain the following passage to a ten-year-old.",
    "Rewrite the main point of the text below as a single clear paragraph.",
]


def make_requests(n, seed, min_words=1, max_words=260, min_tokens=64, max_tokens=128):
    """n chat requests: (messages, max_tokens). Word counts are uniform in
    [min_words, max_words]: about 50-400 prompt tokens with the chat template and the
    system prompt (SmolLM2's tokenizer, ~1.3 tokens a word)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.randint(min_words, max_words)
        text = []
        count = 0
        while count < words:
            s = rng.choice(SENTENCES)
            text.append(s)
            count += len(s.split())
        task = rng.choice(TASKS)
        user = task + "\n\n" + " ".join(text)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        out.append((messages, rng.randint(min_tokens, max_tokens)))
    return out


# ---------------------------------------------------------------------------------------
# Servers

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid, key):
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM) in MiB, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Server:
    """A server process on a loopback port, its output in a log file."""

    def __init__(self, name, argv, port, log_path):
        self.name, self.argv, self.port, self.log_path = name, argv, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "w")
        self.log.write("$ " + " ".join(map(str, self.argv)) + "\n")
        self.log.flush()
        self.proc = subprocess.Popen([str(a) for a in self.argv], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    async def wait_ready(self, session, timeout=120.0):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before "
                                   f"it was ready; see {self.log_path}")
            try:
                async with session.get(self.url + "/health",
                                       timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout} s; see {self.log_path}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def vm(self, key):
        return proc_status(self.proc.pid, key) if self.alive() else None

    def stop(self, timeout=15.0):
        """SIGTERM, then SIGKILL after timeout. The exit status (None if killed)."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
        self.log.close()
        return rc


def celer_argv(model, port, np_, ctx, threads, extra=(), binary=None):
    return [binary or CELER, "serve", "-m", model, "--host", "127.0.0.1", "--port", port, "-np", np_,
            "-c", np_ * ctx, "--ctx-per-seq", ctx, "-t", threads, *extra]


def llama_argv(model, port, np_, ctx, threads, extra=()):
    # -c is the whole KV cache, split over the -np slots; continuous batching is on by
    # default (--cont-batching stated anyway).
    return [llama_server_bin(), "-m", model, "--host", "127.0.0.1", "--port", port,
            "-np", np_, "-c", np_ * ctx, "-t", threads, "-tb", threads, "--cont-batching",
            "--no-webui", *extra]


# ---------------------------------------------------------------------------------------
# Client

class StreamResult:
    __slots__ = ("status", "error", "ttft", "gaps", "t_end", "completion_tokens",
                 "prompt_tokens", "chunks", "finish_reason", "done", "text", "dropped")

    def __init__(self):
        self.status = None
        self.error = None
        self.ttft = None
        self.gaps = []
        self.t_end = None
        self.completion_tokens = None
        self.prompt_tokens = None
        self.chunks = 0
        self.finish_reason = None
        self.done = False
        self.text = []
        self.dropped = False


async def stream_request(session, url, path, body, drop_after=None, timeout=600.0):
    """POST a streaming request and read its server-sent events. drop_after=k closes the
    connection after k content chunks (a client that goes away). Fills a StreamResult;
    error is set for a non-200 answer or a malformed stream."""
    res = StreamResult()
    t0 = time.perf_counter()
    last = None
    chat = path.endswith("/chat/completions")
    try:
        async with session.post(url + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            res.status = r.status
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            async for raw in r.content:
                line = raw.strip()
                if not line or line.startswith(b":"):
                    continue
                if not line.startswith(b"data:"):
                    res.error = f"not an SSE data line: {line[:200]!r}"
                    return res
                data = line[5:].strip()
                if data == b"[DONE]":
                    res.done = True
                    continue
                if res.done:
                    res.error = "data after [DONE]"
                    return res
                try:
                    obj = json.loads(data)
                except ValueError:
                    res.error = f"bad JSON in stream: {data[:200]!r}"
                    return res
                if "error" in obj:
                    res.error = f"error event: {str(obj['error'])[:300]}"
                    return res
                usage = obj.get("usage")
                if usage:
                    res.completion_tokens = usage.get("completion_tokens")
                    res.prompt_tokens = usage.get("prompt_tokens")
                choices = obj.get("choices")
                if choices is None:
                    res.error = f"chunk without choices: {data[:200]!r}"
                    return res
                for ch in choices:
                    if chat:
                        piece = (ch.get("delta") or {}).get("content")
                    else:
                        piece = ch.get("text")
                    if piece:
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - t0
                        else:
                            res.gaps.append(now - last)
                        last = now
                        res.chunks += 1
                        res.text.append(piece)
                    if ch.get("finish_reason"):
                        res.finish_reason = ch["finish_reason"]
                if drop_after is not None and res.chunks >= drop_after:
                    res.dropped = True
                    r.close()  # drops the connection mid-stream
                    return res
            res.t_end = time.perf_counter() - t0
            if not res.done:
                res.error = "stream ended without [DONE]"
            elif res.finish_reason is None:
                res.error = "no finish_reason in the stream"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


def chat_body(messages, max_tokens, temperature, seed=1234):
    return {"model": "default", "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}


async def run_load(url, reqs, concurrency, temperature):
    """The requests from `concurrency` tasks, closed loop. (results, wall seconds)."""
    # A new connection per request: llama-server closes a kept-alive connection after a
    # stream, and a reused one would fail; the connect on loopback costs well under 1 ms.
    connector = aiohttp.TCPConnector(limit=concurrency + 4, force_close=True)
    results = [None] * len(reqs)
    nxt = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker():
            nonlocal nxt
            while nxt < len(reqs):
                i = nxt
                nxt += 1
                messages, max_tokens = reqs[i]
                results[i] = await stream_request(session, url, "/v1/chat/completions",
                                                  chat_body(messages, max_tokens, temperature))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return results, wall


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


# ---------------------------------------------------------------------------------------
# Benchmark

ENGINES = ("celer", "llama")
LABEL = {"celer": "celer serve", "llama": "llama-server"}
METRICS = [  # key, header, better ("hi"/"lo"), format
    ("tok_s", "output tok/s", "hi", "{:.1f}"),
    ("ttft_p50", "TTFT p50 ms", "lo", "{:.0f}"),
    ("ttft_p99", "TTFT p99 ms", "lo", "{:.0f}"),
    ("itl_p50", "ITL p50 ms", "lo", "{:.1f}"),
    ("itl_p99", "ITL p99 ms", "lo", "{:.1f}"),
    ("hwm_mib", "peak RSS MiB", "lo", "{:.0f}"),
]


async def one_run(args, engine, conc, temp, reqs, warm, run_idx):
    port = free_port()
    if engine == "celer":
        argv = celer_argv(args.model, port, conc, args.ctx, args.threads, args.celer_args,
                          args.celer_bin)
    else:
        argv = llama_argv(args.model, port, conc, args.ctx, args.threads, args.llama_args)
    srv = Server(engine, argv, port,
                 OUT_DIR / "logs" / f"c{conc}-t{temp:g}-{run_idx:02d}-{engine}.log")
    srv.start()
    try:
        async with aiohttp.ClientSession() as s:
            ready_s = await srv.wait_ready(s)
        wres, _ = await run_load(srv.url, warm, conc, temp)
        werr = [r.error for r in wres if r.error]
        results, wall = await run_load(srv.url, reqs, conc, temp)
        hwm = srv.vm("VmHWM")
        alive = srv.alive()
    finally:
        rc = srv.stop()
    errors = [r.error for r in results if r.error] + werr
    ok = [r for r in results if not r.error]
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else r.chunks
                 for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    run = {
        "engine": engine, "concurrency": conc, "temperature": temp, "run": run_idx,
        "argv": [str(a) for a in argv],
        "ready_s": ready_s, "wall_s": wall, "requests": len(reqs), "ok": len(ok),
        "errors": errors[:20], "n_errors": len(errors),
        "completion_tokens": tokens,
        "usage_missing": sum(1 for r in ok if r.completion_tokens is None),
        "prompt_tokens": [r.prompt_tokens for r in ok],
        "tok_s": tokens / wall if wall > 0 else float("nan"),
        "ttft_p50": percentile(ttft, 50) * 1e3, "ttft_p99": percentile(ttft, 99) * 1e3,
        "itl_p50": percentile(gaps, 50) * 1e3, "itl_p99": percentile(gaps, 99) * 1e3,
        "hwm_mib": hwm, "alive_at_end": alive, "exit_code": rc,
        "texts": ["".join(r.text) for r in results],
    }
    print(f"  c={conc:<3d} t={temp:<4g} {LABEL[engine]:<13s} {run['tok_s']:7.1f} tok/s  "
          f"TTFT p50/p99 {run['ttft_p50']:6.0f}/{run['ttft_p99']:6.0f} ms  "
          f"ITL p50/p99 {run['itl_p50']:5.1f}/{run['itl_p99']:6.1f} ms  "
          f"{tokens} tok in {wall:.1f} s  HWM {hwm or 0:.0f} MiB"
          + (f"  ERRORS {len(errors)}: {errors[0]}" if errors else ""), flush=True)
    return run


def settings(args):
    """Every (concurrency, temperature) pair measured, in order."""
    return [(c, t) for c in args.concurrency for t in args.temperatures]


def fmt_cell(vals, f):
    vals = [v for v in vals if v is not None and v == v]
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return f.format(med)
    return f"{f.format(med)} [{f.format(min(vals))}-{f.format(max(vals))}]"


def paired_ratios(runs, key, rounds):
    """In each round (A B B A) celer's first run / llama's first, celer's last / llama's
    last."""
    out = []
    for rd in range(rounds):
        c = [r for r in runs if r["engine"] == "celer" and r["round"] == rd]
        l = [r for r in runs if r["engine"] == "llama" and r["round"] == rd]
        for a, b in zip(c, l):
            if a[key] and b[key] and a[key] == a[key] and b[key] == b[key]:
                out.append(a[key] / b[key])
    return out


def report(args, runs, meta):
    lines = []
    w = lines.append
    w(f"### Serving: celer serve vs llama-server, {meta['date']}")
    w("")
    w(f"- machine: {meta['cpu']}, {meta['nproc']} CPUs, {meta['kernel']}")
    w(f"- celer: commit {meta['celer_commit']}; llama.cpp: {meta['llama_version']} "
      f"(llama-cpp-python {meta['llama_cpp_python']} sdist)")
    w(f"- model: {Path(args.model).name}; threads {args.threads}; -np = concurrency; "
      f"context per slot {args.ctx} (-c = np x {args.ctx}); rounds {args.rounds} (A B B A); "
      f"requests per run {meta['requests']}")
    w(f"- command: `{meta['command']}`")
    w("")
    w("Median over runs [min-max]; ratios celer / llama-server: ratio of medians "
      "[min-max of the paired ratios]. tok/s: higher is better; TTFT, ITL, RSS: lower.")
    w("")
    w("| concurrency | temperature | server | " + " | ".join(m[1] for m in METRICS) +
      " | errors |")
    w("| ---: | ---: | --- | " + " | ".join("---:" for _ in METRICS) + " | ---: |")
    ratios = {}
    for conc, temp in settings(args):
        cr = [r for r in runs if r["concurrency"] == conc and r["temperature"] == temp]
        for eng in ENGINES:
            er = [r for r in cr if r["engine"] == eng]
            if not er:
                continue
            cells = [fmt_cell([r[m[0]] for r in er], m[3]) for m in METRICS]
            w(f"| {conc} | {temp:g} | {LABEL[eng]} | " + " | ".join(cells) +
              f" | {sum(r['n_errors'] for r in er)} |")
        if {"celer", "llama"} <= {r["engine"] for r in cr}:
            cells = []
            for key, _, _, _ in METRICS:
                a = [r[key] for r in cr if r["engine"] == "celer" and r[key]]
                b = [r[key] for r in cr if r["engine"] == "llama" and r[key]]
                if not a or not b:
                    cells.append("-")
                    continue
                rmed = statistics.median(a) / statistics.median(b)
                pr = paired_ratios(cr, key, args.rounds)
                ratios[(conc, temp, key)] = (rmed, pr)
                cells.append(f"**{rmed:.2f}** [{min(pr):.2f}-{max(pr):.2f}]" if pr
                             else f"**{rmed:.2f}**")
            w(f"| {conc} | {temp:g} | celer ÷ llama | " + " | ".join(cells) + " | |")
    w("")
    tgt = []

    def target(desc, key, ok):
        if key not in ratios:
            tgt.append(f"- {desc}: not measured")
            return
        r, pr = ratios[key]
        spread = f" (paired {min(pr):.2f}-{max(pr):.2f})" if pr else ""
        tgt.append(f"- {desc}: {r:.2f}{spread}: **{'met' if ok(r) else 'not met'}**")
    for temp in args.temperatures:
        for conc in (8, 16):
            target(f"output tok/s at concurrency {conc}, temperature {temp:g} >= 1.5x "
                   "llama-server", (conc, temp, "tok_s"), lambda r: r >= 1.5)
        target(f"output tok/s at concurrency 1, temperature {temp:g} >= 1.2x llama-server",
               (1, temp, "tok_s"), lambda r: r >= 1.2)
    for conc, temp in settings(args):
        target(f"p99 TTFT lower than llama-server at concurrency {conc}, temperature {temp:g}",
               (conc, temp, "ttft_p99"), lambda r: r < 1.0)
    w("Targets:")
    w("")
    lines.extend(tgt)
    w("")
    # What the two servers produced: completions agree? (greedy, same weights)
    for conc, temp in settings(args):
        cr = [r for r in runs if r["concurrency"] == conc and r["temperature"] == temp]
        toks = {e: [r["completion_tokens"] for r in cr if r["engine"] == e] for e in ENGINES}
        if all(toks.values()):
            a = [r for r in cr if r["engine"] == "celer"][0]["texts"]
            b = [r for r in cr if r["engine"] == "llama"][0]["texts"]
            same = sum(1 for x, y in zip(a, b) if x == y)
            w(f"- concurrency {conc}, temperature {temp:g}: completion tokens per run celer "
              f"{toks['celer']}, "
              f"llama-server {toks['llama']}; identical completions {same}/{len(a)}")
    pt = [p for r in runs for p in r["prompt_tokens"] if p]
    if pt:
        w(f"- prompt tokens per request (usage): min {min(pt)}, median "
          f"{statistics.median(pt):.0f}, max {max(pt)}")
    return "\n".join(lines) + "\n"


def llama_version():
    try:
        out = subprocess.run([str(llama_server_bin()), "--version"], capture_output=True,
                             text=True, timeout=30)
        txt = (out.stdout + out.stderr).strip().splitlines()
        v = [l for l in txt if l.startswith("version")]
        return v[0] if v else (txt[0] if txt else "unknown")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF (default: tools/fetch_model.sh's SmolLM2 Q4_1)")
    ap.add_argument("--concurrency", default="1,8,16",
                    help="comma-separated client counts; each run uses -np = concurrency")
    ap.add_argument("--rounds", type=int, help="A B B A rounds (default 2, quick 1)")
    ap.add_argument("--requests", help="measured requests per run as C=N pairs, "
                    "e.g. 1=16,4=32,16=64 (default that; quick 1=6,4=12,16=32)")
    ap.add_argument("--temperatures", default="0,0.8",
                    help="comma-separated request temperatures (0 = greedy)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot (default 1024)")
    ap.add_argument("--engines", default="celer,llama")
    ap.add_argument("--quick", action="store_true", default=os.environ.get("SERVE_QUICK") == "1",
                    help="a ~5-minute run (also SERVE_QUICK=1)")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--celer", default=str(CELER), help="the celer binary (default build/celer)")
    ap.add_argument("--celer-args", default="", help="extra flags for celer serve")
    ap.add_argument("--llama-args", default="", help="extra flags for llama-server")
    args = ap.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    args.temperatures = [float(x) for x in args.temperatures.split(",") if x]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    spec = args.requests or ("1=6,8=16,16=32" if args.quick else "1=16,8=32,16=64")
    req = dict(tuple(int(v) for v in kv.split("=")) for kv in spec.split(","))
    args.n_requests = {c: req.get(c, max(8, 4 * c)) for c in args.concurrency}
    args.engines = [e for e in args.engines.split(",") if e]
    args.celer_args = args.celer_args.split()
    args.llama_args = args.llama_args.split()
    return args


async def main_async(args):
    if args.model is None:
        args.model = default_model()
    for e in args.engines:
        b = args.celer if e == "celer" else llama_server_bin()
        if not Path(b).exists():
            raise SystemExit(f"serve.py: {b} is missing (make all / bash bench/setup_serve.sh)")
    meta = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_model(), "nproc": os.cpu_count(),
        "kernel": platform.platform(), "celer_commit": git_commit(),
        "llama_version": llama_version(),
        "llama_cpp_python": llama_dir().name.split("-", 1)[1],
        "command": "make bench-serve" + (" SERVE_ARGS=--quick" if args.quick else "")
        if not sys.argv[1:] or sys.argv[1:] == ["--quick"]
        else "build/serve-venv/bin/python bench/serve.py " + " ".join(sys.argv[1:]),
        "requests": ", ".join(f"C={c}: {n}" for c, n in args.n_requests.items()),
    }
    # A copy of build/celer and its CUDA module: a rebuild during the run must not change what is measured.
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    args.celer_bin = OUT_DIR / "celer"
    if "celer" in args.engines:
        shutil.copy2(args.celer, args.celer_bin)
        module = Path(args.celer).parent / "celer-cuda.so"
        if module.exists():  # its CUDA module goes beside it (CELER_DEVICE=cuda)
            shutil.copy2(module, OUT_DIR / "celer-cuda.so")
    print(f"serve.py: {meta['cpu']}, {meta['nproc']} CPUs; celer {meta['celer_commit']}; "
          f"llama.cpp {meta['llama_version']}; model {args.model}", flush=True)
    runs = []
    idx = 0
    t_start = time.monotonic()
    for conc, temp in settings(args):
        n = args.n_requests[conc]
        reqs = make_requests(n, args.seed + conc)
        warm = make_requests(conc + 2, args.seed + 1000 + conc)
        for rd in range(args.rounds):
            order = ["celer", "llama", "llama", "celer"] if len(args.engines) == 2 \
                else args.engines * 2
            for eng in order:
                if eng not in args.engines:
                    continue
                run = await one_run(args, eng, conc, temp, reqs, warm, idx)
                run["round"] = rd
                runs.append(run)
                idx += 1
    elapsed = time.monotonic() - t_start
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    text = report(args, runs, meta)
    text += f"- wall time of the whole benchmark: {elapsed / 60:.1f} min\n"
    (OUT_DIR / "report.md").write_text(text)
    with open(OUT_DIR / "results.json", "w") as f:
        json.dump({"meta": meta, "args": {k: v for k, v in vars(args).items()},
                   "runs": runs}, f, indent=1, default=str)
    print()
    print(text)
    print(f"serve.py: wrote {OUT_DIR / 'report.md'} and results.json")
    bad = [r for r in runs if r["n_errors"] or not r["alive_at_end"]]
    return 1 if bad else 0


def main():
    args = parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
