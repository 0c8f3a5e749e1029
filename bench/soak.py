#!/usr/bin/env python3
"""Soak test of `celer serve` (docs/benchmarks.md "Soak"): many concurrent streams for a
bounded time, then checks that the server gave every resource back.

It starts `build/celer serve --metrics` on a free loopback port (or uses --url), then runs
--streams client tasks (default 64) until --seconds have passed (default 600, or
SOAK_SECONDS). Each task sends request after request, drawn from its own seeded generator:
  - chat completions (most) or legacy completions, streamed with include_usage; a few
    not streamed, a few chat requests with n=2;
  - prompts of 5-400 words of natural text (some repeated from a small shared pool, so
    the prefix cache is hit and released under load), max_tokens 1-256, temperature 0 or
    0.8;
  - about 15% of the clients drop: they close the connection after 1-5 content chunks.
Any non-200 answer, malformed stream (bad JSON, no [DONE], no finish_reason, data after
[DONE], completion_tokens over max_tokens) or connection error of a client that did not
drop is an error. When the time is up no new request starts and the running ones finish
(--grace seconds at most).

Meanwhile it samples the server's VmRSS every --rss-interval seconds. After the warm-up
(the first 40% of the load time, 30 s at least: the KV pool's pages are
touched as blocks are first used) RSS must stay flat: last - first after
warm-up <= --rss-growth-mib. At the end, once idle, /metrics must read
celer_requests_running 0, celer_requests_waiting 0 and celer_kv_cache_usage_ratio 0 (every
KV block back; blocks held only by the prefix cache count as free), the server must still
answer /health, and a greedy request sent before and after the soak is compared.

Exits 1 on any failure, after a summary. Run (after make all and bash bench/setup_serve.sh):
  SOAK_SECONDS=120 build/serve-venv/bin/python bench/soak.py
"""
import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve  # noqa: E402  (the benchmark's server and client helpers)

OUT_DIR = serve.ROOT / "build" / "soak"


def words_text(rng, n):
    out, count = [], 0
    while count < n:
        s = rng.choice(serve.SENTENCES)
        out.append(s)
        count += len(s.split())
    return " ".join(out)


class Stats:
    def __init__(self):
        self.started = 0
        self.completed = 0
        self.dropped = 0
        self.errors = []
        self.tokens = 0
        self.ttft = []
        self.by_kind = {}


async def nonstream_request(session, url, path, body, timeout):
    """A non-streamed request: (error or None, completion_tokens)."""
    try:
        async with session.post(url + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            txt = await r.text()
            if r.status != 200:
                return f"HTTP {r.status}: {txt[:300]}", 0
            try:
                obj = __import__("json").loads(txt)
            except ValueError:
                return f"bad JSON body: {txt[:200]!r}", 0
            ch = obj.get("choices")
            if not ch or any(not c.get("finish_reason") for c in ch):
                return f"no choices/finish_reason: {txt[:200]!r}", 0
            usage = obj.get("usage") or {}
            ct = usage.get("completion_tokens")
            if ct is None:
                return "no usage in a non-streamed answer", 0
            return None, ct
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return f"{type(e).__name__}: {e}", 0


async def client(cid, args, url, deadline, stats, pool):
    rng = random.Random(args.seed * 1000 + cid)
    dropper = rng.random() < args.drop_fraction
    connector = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=connector) as session:
        while time.monotonic() < deadline:
            if rng.random() < 0.15:
                text = rng.choice(pool)
            else:
                text = words_text(rng, rng.randint(5, 400))
            max_tokens = rng.randint(1, 256)
            temperature = rng.choice([0, 0.8])
            chat = rng.random() < 0.8
            stream = rng.random() < 0.95
            n = 2 if (chat and stream and args.engine == "celer" and rng.random() < 0.05) else 1
            drop_after = rng.randint(1, 5) if dropper and rng.random() < 0.5 else None
            if chat:
                path = "/v1/chat/completions"
                body = {"messages": [{"role": "system", "content": serve.SYSTEM},
                                     {"role": "user", "content": text}]}
            else:
                path = "/v1/completions"
                body = {"prompt": text}
            body.update({"model": "default", "max_tokens": max_tokens,
                         "temperature": temperature, "seed": rng.randint(0, 2**31 - 1)})
            if n > 1:
                body["n"] = n
            kind = ("chat" if chat else "completion") + ("" if stream else "-nostream") + \
                (f"-n{n}" if n > 1 else "") + ("-drop" if drop_after else "")
            stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
            stats.started += 1
            if not stream:
                err, ct = await nonstream_request(session, url, path, body, args.timeout)
                if err:
                    stats.errors.append(f"client {cid} {kind}: {err}")
                else:
                    stats.completed += 1
                    stats.tokens += ct
                continue
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            res = await serve.stream_request(session, url, path, body, drop_after=drop_after,
                                             timeout=args.timeout)
            if res.dropped:
                stats.dropped += 1
                continue
            err = res.error
            if not err and res.completion_tokens is None:
                err = "no usage chunk"
            if not err and res.completion_tokens > n * max_tokens:
                err = f"completion_tokens {res.completion_tokens} > n*max_tokens {n * max_tokens}"
            if not err and res.chunks > res.completion_tokens:
                err = f"{res.chunks} content chunks > completion_tokens {res.completion_tokens}"
            if err:
                stats.errors.append(f"client {cid} {kind} (max_tokens {max_tokens}): {err}")
                continue
            stats.completed += 1
            stats.tokens += res.completion_tokens
            if res.ttft is not None:
                stats.ttft.append(res.ttft)


async def fetch_metrics(session, url):
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        if r.status != 200:
            raise RuntimeError(f"/metrics answered {r.status}")
        vals = {}
        for line in (await r.text()).splitlines():
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split()
            if len(parts) >= 2 and "{" not in parts[0]:
                try:
                    vals[parts[0]] = float(parts[1])
                except ValueError:
                    pass
        return vals


async def greedy_probe(session, url):
    body = {"model": "default", "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three things a river town "
                          "market sells, in one sentence."}]}
    async with session.post(url + "/v1/chat/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=120)) as r:
        obj = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"probe answered {r.status}: {obj}")
        return obj["choices"][0]["message"]["content"]


async def rss_sampler(srv, samples, interval, stop):
    t0 = time.monotonic()
    while not stop.is_set():
        v = srv.vm("VmRSS") if srv else None
        if v is not None:
            samples.append((time.monotonic() - t0, v))
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


async def main_async(args):
    failures = []
    srv = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        model = args.model or serve.default_model()
        port = serve.free_port()
        if args.engine == "celer":
            argv = serve.celer_argv(model, port, args.np, args.ctx, args.threads,
                                    ["--metrics", "-c", str(args.kv)] if args.kv else
                                    ["--metrics"])
            if args.kv:  # -c given twice would be ambiguous: drop the helper's default
                i = argv.index("-c")
                del argv[i:i + 2]
        else:
            argv = serve.llama_argv(model, port, args.np, args.ctx, args.threads, ["--metrics"])
        argv += args.server_args.split()
        srv = serve.Server(args.engine, argv, port, OUT_DIR / f"server-{args.engine}.log")
        srv.start()
        url = srv.url
        print("soak: $ " + " ".join(map(str, argv)), flush=True)
    async with aiohttp.ClientSession() as session:
        if srv:
            await srv.wait_ready(session)
        probe_before = await greedy_probe(session, url)
        m0 = await fetch_metrics(session, url) if args.engine == "celer" else {}

        pool = [words_text(random.Random(args.seed + i), 40 + 60 * i) for i in range(6)]
        stats = Stats()
        samples = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(rss_sampler(srv, samples, args.rss_interval, stop))
        t0 = time.monotonic()
        deadline = t0 + args.seconds
        print(f"soak: {args.streams} streams for {args.seconds:.0f} s against {url}", flush=True)

        async def progress():
            while True:
                await asyncio.sleep(max(10.0, args.seconds / 12))
                rss = samples[-1][1] if samples else float("nan")
                print(f"soak: t={time.monotonic() - t0:5.0f} s  started {stats.started}  "
                      f"completed {stats.completed}  dropped {stats.dropped}  "
                      f"errors {len(stats.errors)}  tokens {stats.tokens}  RSS {rss:.0f} MiB",
                      flush=True)
        prog = asyncio.create_task(progress())
        tasks = [asyncio.create_task(client(i, args, url, deadline, stats, pool))
                 for i in range(args.streams)]
        done, pending = await asyncio.wait(tasks, timeout=args.seconds + args.grace)
        t_clients = time.monotonic() - t0
        for t in pending:
            t.cancel()
        if pending:
            failures.append(f"{len(pending)} clients still running {args.grace:.0f} s after "
                            "the deadline")
        for t in done:
            if t.exception():
                failures.append(f"client task raised {t.exception()!r}")
        prog.cancel()

        # Idle: every request ended on the client side; let the server notice the drops.
        end_metrics = {}
        idle_s = 0.0
        if args.engine == "celer":
            t_idle = time.monotonic()
            while True:
                end_metrics = await fetch_metrics(session, url)
                idle = (end_metrics.get("celer_requests_running") == 0
                        and end_metrics.get("celer_requests_waiting") == 0
                        and end_metrics.get("celer_kv_cache_usage_ratio") == 0)
                if idle or time.monotonic() - t_idle > args.idle_timeout:
                    break
                await asyncio.sleep(0.5)
            idle_s = time.monotonic() - t_idle
            for key in ("celer_requests_running", "celer_requests_waiting",
                        "celer_kv_cache_usage_ratio"):
                if end_metrics.get(key) != 0:
                    failures.append(f"{key} = {end_metrics.get(key)} {idle_s:.0f} s after the "
                                    "last request ended (expected 0)")
        stop.set()
        await sampler
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    failures.append(f"/health answered {r.status} at the end")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            failures.append(f"/health failed at the end: {e}")
        try:
            probe_after = await greedy_probe(session, url)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            probe_after = None
            failures.append(f"probe request after the soak failed: {e}")

    if srv:
        if not srv.alive():
            failures.append(f"server exited with {srv.proc.returncode} during the soak "
                            f"(see {srv.log_path})")
        rc = srv.stop(timeout=30)
        if rc not in (0, None) and not failures:
            failures.append(f"server exit status {rc} on SIGTERM")

    # RSS after warm-up
    warm = max(30.0, args.seconds * 0.4)
    after = [v for t, v in samples if warm <= t <= t_clients]
    rss_line = "no samples"
    if after:
        first, last, peak = after[0], after[-1], max(after)
        ts = [t for t, _ in samples if warm <= t <= t_clients]
        slope = 0.0
        if len(after) > 2 and ts[-1] > ts[0]:
            mt, mv = statistics.fmean(ts), statistics.fmean(after)
            slope = 60 * sum((t - mt) * (v - mv) for t, v in zip(ts, after)) / \
                sum((t - mt) ** 2 for t in ts)
        rss_line = (f"first {first:.1f} MiB, last {last:.1f} MiB, max {peak:.1f} MiB after "
                    f"{warm:.0f} s of warm-up ({len(after)} samples every {args.rss_interval:g} s;"
                    f" whole run min {min(v for _, v in samples):.1f}, "
                    f"max {max(v for _, v in samples):.1f}); trend {slope:+.2f} MiB/min")
        if last - first > args.rss_growth_mib:
            failures.append(f"RSS grew {last - first:.1f} MiB after warm-up "
                            f"(limit {args.rss_growth_mib} MiB)")
    elif srv:
        failures.append("no RSS samples after warm-up (run longer than 30 s)")

    if stats.errors:
        failures.insert(0, f"{len(stats.errors)} client errors, e.g.: "
                        + " | ".join(stats.errors[:5]))

    d = lambda k: end_metrics.get(k, 0) - m0.get(k, 0)  # noqa: E731
    print()
    print("soak summary")
    print(f"  duration           {args.seconds:.0f} s of load, clients done at {t_clients:.0f} s")
    print(f"  streams            {args.streams} (server -np {args.np})")
    print(f"  requests           started {stats.started}, completed {stats.completed}, "
          f"dropped by the client {stats.dropped}, errors {len(stats.errors)}")
    print("  request kinds      " + ", ".join(f"{k} {v}" for k, v in sorted(stats.by_kind.items())))
    print(f"  tokens received    {stats.tokens} ({stats.tokens / max(t_clients, 1e-9):.1f} tok/s)")
    if stats.ttft:
        print(f"  TTFT               p50 {serve.percentile(stats.ttft, 50) * 1e3:.0f} ms, "
              f"p99 {serve.percentile(stats.ttft, 99) * 1e3:.0f} ms")
    print(f"  server RSS         {rss_line}")
    if end_metrics:
        print(f"  idle after         {idle_s:.1f} s (the last client request had ended)")
        print(f"  /metrics at end    running {end_metrics.get('celer_requests_running')}, "
              f"waiting {end_metrics.get('celer_requests_waiting')}, kv usage "
              f"{end_metrics.get('celer_kv_cache_usage_ratio')}; during the soak: requests "
              f"{d('celer_requests_total'):.0f}, generated tokens "
              f"{d('celer_generation_tokens_total'):.0f}, preemptions "
              f"{d('celer_preemptions_total'):.0f}, prefix cache hits/queries "
              f"{d('celer_prefix_cache_hits_total'):.0f}/"
              f"{d('celer_prefix_cache_queries_total'):.0f}")
    same = probe_after == probe_before
    print(f"  greedy probe       {'identical' if same else 'DIFFERENT'} before and after")
    if not same and probe_after is not None:
        print(f"    before: {probe_before!r}\n    after:  {probe_after!r}")
    if failures:
        print("soak: FAILED")
        for f in failures:
            print("  - " + f)
        return 1
    print("soak: passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float,
                    default=float(os.environ.get("SOAK_SECONDS", "600")),
                    help="load duration (default 600, or SOAK_SECONDS)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--np", type=int, default=64, help="server -np (default 64)")
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--kv", type=int, default=16384,
                    help="celer -c, total KV positions (default 16384: less than 64 full "
                    "sequences, so pre-emption happens; 0 for np x ctx)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--model")
    ap.add_argument("--engine", choices=["celer", "llama"], default="celer",
                    help="server to start (llama: to check the client itself)")
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--server-args", default="", help="extra server flags")
    ap.add_argument("--drop-fraction", type=float, default=0.3,
                    help="share of clients that drop some of their streams (half of their "
                    "requests): ~15%% of the streams")
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--grace", type=float, default=180.0,
                    help="how long running requests may take after the deadline")
    ap.add_argument("--idle-timeout", type=float, default=30.0,
                    help="how long the server may take to read idle in /metrics")
    ap.add_argument("--rss-interval", type=float, default=2.0)
    ap.add_argument("--rss-growth-mib", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
