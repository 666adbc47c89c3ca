#!/usr/bin/env python3
"""Benchmarks of kvmesh's HTTP API (run by hand, not in CI). Starts `kvmesh serve` itself.

  bench/http_bench.py overhead [--bin build/bin/kvmesh] [--requests 30]
      TTFT seen by an HTTP client (request sent -> first streamed token) against the engine's own
      TTFT for the same request (reported in the response's "kvmesh.engine_ttft_ms"): the API's
      overhead, median and p90.
  bench/http_bench.py overload [--bin ...] [--seconds 60] [--max-seqs 4] [--clients 40]
      10x more concurrent clients than max_num_seqs, each sending streamed requests back to back:
      every admitted request must complete, the rest get 429 at once; reports counts, p50/p99 TTFT
      of admitted requests and the server's resident memory over time.
  bench/http_bench.py documents [--bin ...] [--dp 2] [--docs 4] [--questions 3]
      docs x questions chat requests sent at once, each a question over one of `docs` documents
      of ~850 tokens, to a fresh `kvmesh serve --dp DP --threads 1` (under mpirun when DP > 1):
      prompt tokens computed (each document once is the least), every request's cached tokens,
      the requests per data-parallel replica, and the wall time.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def start(binary, extra, dp=1):
    cmd = [binary, "serve", "--port", "0", *extra]
    if dp > 1:  # one rank per replica
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", *root, "-np", str(dp), *cmd,
               "--dp", str(dp)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, f"http://127.0.0.1:{m.group(1)}"
    sys.exit("server did not start")


def stream(base, body):
    """Sends a streamed chat request; returns (status, client TTFT s, engine TTFT ms, tokens)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                                 data=json.dumps(body).encode())
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            ttft, engine, tokens = None, None, 0
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    ttft = ttft or time.monotonic() - t0
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                    engine = chunk.get("kvmesh", {}).get("engine_ttft_ms")
            return 200, ttft, engine, tokens
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, None, None, 0


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def overhead(a):
    p, base = start(a.bin, ["--threads", str(a.threads)])
    try:
        questions = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?",
                     "Write one sentence about the sea.", "Say hello in Spanish."]
        diffs, client, engine = [], [], []
        for i in range(a.requests):
            code, ttft, eng, _ = stream(base, {"messages": [{"role": "user", "content":
                                                             questions[i % len(questions)]}],
                                               "temperature": 0, "max_tokens": 8})
            if code != 200 or ttft is None or eng is None:
                sys.exit(f"request {i}: status {code}")
            if i == 0:
                continue  # warm-up
            client.append(ttft * 1e3)
            engine.append(eng)
            diffs.append(ttft * 1e3 - eng)
        print(f"TTFT over HTTP (client, streamed): median {statistics.median(client):.2f} ms")
        print(f"TTFT inside the engine:            median {statistics.median(engine):.2f} ms")
        print(f"API overhead (client - engine), {len(diffs)} requests: median "
              f"{statistics.median(diffs):.2f} ms, p90 {pct(diffs, 0.9):.2f} ms, max {max(diffs):.2f} ms"
              f"  (goal: within 5 ms)")
    finally:
        p.terminate()
        p.wait()


def overload(a):
    p, base = start(a.bin, ["--threads", str(a.threads), "--max-seqs", str(a.max_seqs),
                            "--max-waiting", str(a.max_seqs)])
    stop = time.monotonic() + a.seconds
    lock = threading.Lock()
    ok, rejected, other, ttfts, incomplete = 0, 0, 0, [], 0

    def client(k):
        nonlocal ok, rejected, other, incomplete
        while time.monotonic() < stop:
            code, ttft, _, tokens = stream(base, {
                "messages": [{"role": "user", "content": f"Client {k}: count to ten."}],
                "temperature": 0, "max_tokens": 32, "ignore_eos": True})
            with lock:
                if code == 200:
                    ok += 1
                    ttfts.append(ttft)
                    incomplete += tokens != 32
                elif code == 429:
                    rejected += 1
                else:
                    other += 1
            if code == 429:
                time.sleep(0.05)

    rss = [rss_mib(p.pid)]
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    while time.monotonic() < stop:
        time.sleep(5)
        rss.append(rss_mib(p.pid))
    for t in threads:
        t.join()
    rss.append(rss_mib(p.pid))
    p.terminate()
    p.wait()
    print(f"{a.clients} clients for {a.seconds} s against max_num_seqs {a.max_seqs} "
          f"(+{a.max_seqs} queued): {ok} admitted and completed ({incomplete} short), "
          f"{rejected} answered 429, {other} other")
    ms = [t * 1e3 for t in ttfts]
    print(f"TTFT of admitted requests: p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms")
    print("server RSS (MiB) every 5 s: " + " ".join(f"{r:.0f}" for r in rss))
    if incomplete or other:
        sys.exit("FAIL: some admitted requests did not complete")


def metric_lines(base, prefix):
    text = urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
    return [l for l in text.splitlines() if l.startswith(prefix)]


def documents(a):
    p, base = start(a.bin, ["--threads", "1", "--rpc-port", "0"], a.dp)
    try:
        docs = [" ".join(f"Record {d}-{i}: item {i} of set {d} sits in bin {(i * 7 + d) % 13}."
                         for i in range(40)) for d in range(a.docs)]
        got = {}

        def ask(d, q):
            body = {"messages": [{"role": "user", "content":
                                  docs[d] + f"\nWhich bin holds item {q * 5 + 1}?"}],
                    "max_tokens": 8, "temperature": 0}
            req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=600) as r:
                u = json.load(r)["usage"]
            got[(d, q)] = (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])

        t0 = time.monotonic()
        threads = [threading.Thread(target=ask, args=(d, q))
                   for q in range(a.questions) for d in range(a.docs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        if len(got) != len(threads):
            sys.exit("FAIL: some requests did not complete")
        prompt = sum(v[0] for v in got.values())
        computed = float(metric_lines(base, "kvmesh:prompt_tokens_total{")[0].rsplit(" ", 1)[1])
        print(f"{len(threads)} requests ({a.docs} documents x {a.questions} questions, dp {a.dp}) "
              f"in {wall:.1f} s: {computed:.0f} of {prompt} prompt tokens computed")
        for d in range(a.docs):
            print(f"  document {d}: (prompt, cached) {[got[(d, q)] for q in range(a.questions)]}")
        per = [l.rsplit(" ", 1)[1] for l in metric_lines(base, "kvmesh:replica_requests_total{")]
        if per:
            print("  requests per replica: " + " ".join(per))
    finally:
        p.terminate()
        p.wait()


ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["overhead", "overload", "documents"])
ap.add_argument("--bin", default="build/bin/kvmesh")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--requests", type=int, default=31)
ap.add_argument("--seconds", type=int, default=60)
ap.add_argument("--max-seqs", type=int, default=4)
ap.add_argument("--clients", type=int, default=40)
ap.add_argument("--dp", type=int, default=2)
ap.add_argument("--docs", type=int, default=4)
ap.add_argument("--questions", type=int, default=3)
a = ap.parse_args()
{"overhead": overhead, "overload": overload, "documents": documents}[a.mode](a)
