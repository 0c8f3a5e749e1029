#!/usr/bin/env python3
"""Prefill and decode speed of mlx-lm on the CPU, printed as llama-bench's JSON.

bench/run.py runs this as the mlx-lm engine. One invocation loads the model with
mlx_lm.load (tokenizer included, as a user of mlx-lm would), then for each test runs one
warm-up and R timed repetitions:

  ppN   prefill of N random token ids into a fresh KV cache (make_prompt_cache), done the
        way mlx_lm.generate.generate_step does it: the first N-1 ids in chunks of
        --prefill-step (2048, its default) with mx.eval of the cache state after each
        chunk (the LM head of those rows is never evaluated), then the last id through
        the model and the argmax of its logits, evaluated.
  tgN   N decode steps of one token each from an empty cache, pipelined as
        generate_step does (the next step is built and mx.async_eval'ed before the
        previous token is read back); greedy argmax, first token the BOS id.

Warm-up: one short run before the timed ones (pp: min(N, 32) ids, tg: 4 steps), enough
to touch every weight; mlx is slow enough on x86 that a full-size warm-up would double
the cost of every invocation.

--dtype float32 (the default) upcasts the floating parameters (fp16 scales, biases and
norms) to float32 after loading: the same values, since fp16 -> fp32 is exact, and the
fastest mlx path on this CPU (quantized_matmul measured here: fp16 0.04, bf16 0.19,
fp32 2.0 GFLOP/s single-threaded). --dtype native keeps the checkpoint's dtype, which is
what plain mlx_lm.generate does.

mlx's CPU backend has no thread-count setting: its kernels run on the one evaluation
thread of the stream (the Linux wheel links the reference BLAS), so n_threads is
reported as 1 whatever run.py asked for.

Run: build/bench-venv/bin/python bench/mlx_bench.py -m DIR -p 512 -n 0 -r 3 -o json
"""
import argparse
import json
import resource
import statistics
import sys
import time
from importlib import metadata


def parse_list(s):
    return [int(x) for x in s.split(",") if x.strip() != "" and int(x) > 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", default="512", help="comma-separated prompt lengths (0: none)")
    ap.add_argument("-n", "--n-gen", default="128", help="comma-separated decode lengths (0: none)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--prefill-step", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("float32", "native"), default="float32")
    ap.add_argument("-o", "--output", choices=("json", "md"), default="md")
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    mx.set_default_device(mx.cpu)
    t0 = time.perf_counter()
    model, tokenizer = load(args.model)
    if args.dtype == "float32":
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    load_ms = (time.perf_counter() - t0) * 1e3
    cfg = json.load(open(f"{args.model}/config.json"))
    vocab = cfg["vocab_size"]
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 0
    rng = mx.random.key(args.seed)

    def prefill(n):
        ids = mx.random.randint(0, vocab, (n,), key=rng).astype(mx.uint32)
        mx.eval(ids)
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        done = 0
        while n - done > 1:
            k = min(args.prefill_step, n - done - 1)
            model(ids[done : done + k][None], cache=cache)
            mx.eval([c.state for c in cache])
            done += k
        logits = model(ids[done:][None], cache=cache)[:, -1, :]
        y = mx.argmax(logits, axis=-1)
        mx.eval(y)
        return time.perf_counter() - start

    def decode(n):
        cache = make_prompt_cache(model)

        def step(tok):
            return mx.argmax(model(tok[None], cache=cache)[:, -1, :], axis=-1)

        start = time.perf_counter()
        y = step(mx.array([bos], dtype=mx.uint32))
        mx.async_eval(y)
        for _ in range(n - 1):
            nxt = step(y)
            mx.async_eval(nxt)
            y.item()
            y = nxt
        y.item()
        return time.perf_counter() - start

    tests = [(p, 0) for p in parse_list(args.n_prompt)] + [(0, g) for g in parse_list(args.n_gen)]
    results = []
    for n_prompt, n_gen in tests:
        fn, n = (prefill, n_prompt) if n_prompt else (decode, n_gen)
        fn(min(n, 32) if n_prompt else min(n, 4))  # warm-up
        secs = [fn(n) for _ in range(args.repetitions)]
        ns = [int(s * 1e9) for s in secs]
        ts = [n / s for s in secs]
        results.append(
            {
                "test": f"pp{n_prompt}" if n_prompt else f"tg{n_gen}",
                "model_filename": args.model,
                "model_type": f"{cfg['model_type']} {cfg.get('quantization', {}).get('bits', 16)}-bit "
                f"g{cfg.get('quantization', {}).get('group_size', '-')}",
                "n_threads": 1,
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "prefill_step": args.prefill_step,
                "dtype": args.dtype,
                "avg_ns": int(statistics.mean(ns)),
                "stddev_ns": int(statistics.stdev(ns)) if len(ns) > 1 else 0,
                "avg_ts": statistics.mean(ts),
                "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
                "samples_ns": ns,
                "samples_ts": ts,
                "load_ms": load_ms,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "mlx_peak_memory_bytes": mx.get_peak_memory(),
                "mlx_version": metadata.version("mlx"),
                "mlx_lm_version": metadata.version("mlx-lm"),
            }
        )
    if args.output == "json":
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print("| model | test | t/s |\n| --- | --- | ---: |")
        for r in results:
            print(f"| {r['model_filename']} | {r['test']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")


if __name__ == "__main__":
    main()
